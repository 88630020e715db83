"""Progress bars of the profiler (tqdm on stderr, off when quiet)."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["bar"]


def bar(progress: bool, total: int, desc: str) -> Any:
    """A tqdm bar of ``total`` steps on stderr; disabled unless ``progress`` and stderr is a terminal
    (tqdm's ``disable=None``: no carriage-return updates in a log file)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=None if progress else True, file=sys.stderr, leave=False)
