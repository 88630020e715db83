"""Helpers for the rank scripts that ``multigpu launch`` runs in the tests (``dist_scenarios.py``,
``lab_rank.py``): they import this module from their own folder."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from multigpu.distributed.job import ENV_RANK


@contextlib.contextmanager
def outside_the_job() -> Iterator[None]:
    """Run a single-process reference inside a rank: hide the launcher's variables."""
    saved = os.environ.pop(ENV_RANK)
    try:
        yield
    finally:
        os.environ[ENV_RANK] = saved
