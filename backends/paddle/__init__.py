"""Paddle backend adapter. The framework is imported on first use, in load()."""
from __future__ import annotations

from typing import Any

FRAMEWORK = "paddle"
EXTRA = "paddle"


def load() -> Any:
    """Return the Paddle adapter (imports the framework)."""
    from .adapter import PaddleBackend

    return PaddleBackend()
