"""GPU code paths: run only where a framework sees a GPU (marker ``gpu``)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FRAMEWORKS

import multigpu
from multigpu import models
from multigpu.parallel.agreement import random_batches, train_steps

GPU_BACKENDS = [b for b in FRAMEWORKS if multigpu.backend(b).gpu_count() > 0]
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_BACKENDS, reason="no installed framework sees a GPU")]


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


@pytest.mark.parametrize("name", GPU_BACKENDS)
@pytest.mark.parametrize("sync_bn", [False, True], ids=["per-device", "synchronized"])
def test_gpu_resnet_step_with_batchnorm_and_momentum_matches_the_cpu(name, sync_bn):
    """NOT RUN YET: written on a machine without a GPU. A small ResNet (BatchNorm, a projected
    shortcut, momentum SGD) on the GPUs lands where the same steps on CPU replicas land."""
    from multigpu.optim import SGD
    from multigpu.parallel.agreement import train_run

    k = min(multigpu.backend(name).gpu_count(), 2)
    m = models.resnet((1, 1), (8, 16), 10, (3, 16, 16), "small")
    start, batches = m.init_params(seed=0), random_batches(m, 3, 16)
    kw = dict(lr=0.1, optimizer=SGD(momentum=0.9, weight_decay=5e-4), sync_bn=sync_bn)
    cpu = train_run(m, name, start, batches, devices=f"cpu:{k}", **kw)
    gpu = train_run(m, name, start, batches, devices=k, **kw)
    assert all(d.startswith("gpu:") for d in gpu.devices)
    for a, b in zip([*gpu.params, *gpu.states[0]], [*cpu.params, *cpu.states[0]]):
        np.testing.assert_allclose(a, b, atol=1e-4)
