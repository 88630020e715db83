"""Torch backend adapter. The framework is imported on first use, in load()."""
from __future__ import annotations

from typing import Any

FRAMEWORK = "torch"
EXTRA = "torch"


def load() -> Any:
    """Return the Torch adapter (imports the framework)."""
    from multigpu.backends.torch.adapter import TorchBackend

    return TorchBackend()


def launch_plan(job: Any) -> Any:
    """Return the variables and service processes a job on torch.distributed needs (no framework import)."""
    from multigpu.backends.torch.process_group import launch_plan as plan

    return plan(job)


def process_group(device: Any, timeout: float, init_timeout: float) -> Any:
    """Join the job this process was launched into with torch.distributed (imports the framework)."""
    from multigpu.backends.torch.process_group import join

    return join(device, timeout, init_timeout)
