"""MXNet backend adapter. The framework is imported on first use, in load()."""
from __future__ import annotations

from typing import Any

FRAMEWORK = "mxnet"
EXTRA = "mxnet"


def load() -> Any:
    """Return the MXNet adapter (imports the framework)."""
    from .adapter import MXNetBackend

    return MXNetBackend()
