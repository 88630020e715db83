"""Torch backend adapter. The framework is imported on first use, in load()."""
from __future__ import annotations

from typing import Any

FRAMEWORK = "torch"
EXTRA = "torch"


def load() -> Any:
    """Return the Torch adapter (imports the framework)."""
    from .adapter import TorchBackend

    return TorchBackend()
