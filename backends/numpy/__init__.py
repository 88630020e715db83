"""NumPy reference backend: forward ops with a hand-written backward for each."""
from __future__ import annotations

from typing import Any

FRAMEWORK = None  # numpy is a core dependency
EXTRA = None


def load() -> Any:
    """Return the NumPy reference adapter."""
    from multigpu.backends.numpy.adapter import NumpyBackend

    return NumpyBackend()


def launch_plan(job: Any) -> Any:
    """Return the variables and service processes a job on NumPy reference needs (no framework import)."""
    from multigpu.backends.numpy.process_group import launch_plan as plan

    return plan(job)


def process_group(device: Any, timeout: float, init_timeout: float) -> Any:
    """Join the job this process was launched into with NumPy reference (imports the framework)."""
    from multigpu.backends.numpy.process_group import join

    return join(device, timeout, init_timeout)
