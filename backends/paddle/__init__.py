"""Paddle backend adapter. The framework is imported on first use, in load()."""
from __future__ import annotations

from typing import Any

FRAMEWORK = "paddle"
EXTRA = "paddle"


def load() -> Any:
    """Return the Paddle adapter (imports the framework)."""
    from multigpu.backends.paddle.adapter import PaddleBackend

    return PaddleBackend()


def launch_plan(job: Any) -> Any:
    """Return the variables and service processes a job on paddle.distributed needs (no framework import)."""
    from multigpu.backends.paddle.process_group import launch_plan as plan

    return plan(job)


def process_group(device: Any, timeout: float, init_timeout: float) -> Any:
    """Join the job this process was launched into with paddle.distributed (imports the framework)."""
    from multigpu.backends.paddle.process_group import join

    return join(device, timeout, init_timeout)
