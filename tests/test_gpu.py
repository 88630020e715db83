"""GPU code paths: run only where a framework sees a GPU (marker ``gpu``)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import FRAMEWORKS

import multigpu
from multigpu import models
from multigpu.parallel.agreement import random_batches, train_steps

GPU_BACKENDS = [b for b in FRAMEWORKS if multigpu.backend(b).gpu_count() > 0]
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not GPU_BACKENDS, reason="no installed framework sees a GPU")]


@pytest.mark.parametrize("name", GPU_BACKENDS)
def test_gpu_training_matches_cpu_replicas(name):
    gpus = multigpu.backend(name).gpu_count()
    k = min(gpus, 2)
    m = models.lenet()
    start = m.init_params(seed=0)
    batches = random_batches(m, 3, 32)
    _, cpu, _ = train_steps(m, name, start, batches, devices=f"cpu:{k}")
    _, gpu, devs = train_steps(m, name, start, batches, devices=k)
    assert all(d.startswith("gpu:") for d in devs)
    for a, b in zip(gpu, cpu):
        np.testing.assert_allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("name", GPU_BACKENDS)
def test_gpu_copies_are_new_buffers(name):
    be = multigpu.backend(name)
    d = multigpu.Device("gpu", 0)
    t = be.from_numpy(np.zeros(4, np.float32), d)
    c = be.copy_to(t, d)
    be.add_(c, be.from_numpy(np.ones(4, np.float32), d))
    be.synchronize(d)
    assert not be.to_numpy(t).any()
