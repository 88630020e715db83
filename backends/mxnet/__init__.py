"""MXNet backend adapter. The framework is imported on first use, in load()."""
from __future__ import annotations

from typing import Any

FRAMEWORK = "mxnet"
EXTRA = "mxnet"


def load() -> Any:
    """Return the MXNet adapter (imports the framework)."""
    from multigpu.backends.mxnet.adapter import MXNetBackend

    return MXNetBackend()


def launch_plan(job: Any) -> Any:
    """Return the variables and service processes a job on kvstore dist_sync needs (no framework import)."""
    from multigpu.backends.mxnet.process_group import launch_plan as plan

    return plan(job)


def process_group(device: Any, timeout: float, init_timeout: float) -> Any:
    """Join the job this process was launched into with kvstore dist_sync (imports the framework)."""
    from multigpu.backends.mxnet.process_group import join

    return join(device, timeout, init_timeout)
