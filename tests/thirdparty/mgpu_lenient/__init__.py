"""A third-party multigpu backend, registered by entry point (``mgpu_lenient-0.1.dist-info``).

The conformance suite puts this folder on ``sys.path``; ``importlib.metadata`` then
finds the distribution and ``multigpu.backend("lenient")`` loads it like any
installed adapter, without a line of multigpu knowing its name.
"""
from __future__ import annotations

from typing import Any

FRAMEWORK = None  # needs numpy only
EXTRA = None


def load() -> Any:
    """Return the adapter."""
    from .adapter import LenientBackend

    return LenientBackend()
