"""NumPy reference backend: forward ops with a hand-written backward for each."""
from __future__ import annotations

from typing import Any

FRAMEWORK = None  # numpy is a core dependency
EXTRA = None


def load() -> Any:
    """Return the NumPy reference adapter."""
    from .adapter import NumpyBackend

    return NumpyBackend()
