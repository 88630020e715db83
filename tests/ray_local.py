"""A module-scoped local Ray for the tests that run plans on Ray workers (import ``local_ray`` into the module)."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance, two CPUs, for the importing test module; shut down after it."""
    ray = pytest.importorskip("ray", reason="the executor needs Ray (pip install 'multigpu[cluster]')")
    if ray.is_initialized():  # pragma: no cover - another module left one running
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    yield
    ray.shutdown()
