"""No host read inside a step: every device is queued before anything returns to the host.

A recording wrapper around each installed adapter logs every protocol call and
every host read of a tensor (``to_numpy``, ``float(t)``, ``t.item()``, ...). On GPUs a
host read waits for the device, so one inside the step would run the replicas one
after another instead of side by side.
"""

from __future__ import annotations

import numpy as np
import pytest
from recording_backend import Recording, host_reads

import multigpu
from multigpu import models
from multigpu.optim import SGD, AdamW
from multigpu.parallel.agreement import random_batches
from multigpu.parallel.allreduce import ALGORITHMS

CROSSING = {"add_", "assign_", "copy_to", "native_allreduce"}
UPDATES = {"sgd_", "axpby_", "addcmul_", "addcdiv_sqrt_", "scale_"}


def check_step(events: list[str], devices: int, computations: int | None = None, updates: int | None = None) -> None:
    """Assert the train_batch rule on one step's events (raises AssertionError).

    ``computations`` is the number of value_and_grad calls (one per device, or one for all
    of them with synchronized BatchNorm); ``updates`` the whole-buffer update calls.
    """
    computations = devices if computations is None else computations
    forwards = [i for i, e in enumerate(events) if e == "forward"]
    backwards = [i for i, e in enumerate(events) if e == "backward"]
    assert len(forwards) == len(backwards) == computations, events
    first, last = forwards[0], backwards[-1]
    inside = [events[i] for i in host_reads(events) if first <= i <= last]
    assert not inside, f"host reads between the first forward and the last backward: {inside}"
    if computations == devices:  # with one computation for all devices, copies are part of it
        crossing = [e for e in events[first:last] if e in CROSSING]
        assert not crossing, f"cross-device work before every device was queued: {crossing}"
    assert "synchronize" not in events, "the step waits for a device"
    reads = host_reads(events)
    done = [i for i, e in enumerate(events) if e in UPDATES]
    assert len(done) == (devices if updates is None else updates), events
    # The loss is the one host read, and it comes after the update on every replica.
    assert [events[i] for i in reads] == ["to_numpy"] and reads[0] > done[-1], [events[i] for i in reads]


def _trainer(backend_name: str, devices: int, allreduce: str = "fused"):
    rec = Recording(multigpu.backend(backend_name))
    tr = multigpu.DataParallel(
        models.lenet(), backend=rec, devices=f"cpu:{devices}", lr=0.2, allreduce=allreduce, seed=1
    )
    return rec, tr


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_train_batch_reads_the_host_once_after_the_update(backend_name, devices):
    inner = multigpu.backend(backend_name)
    algorithms = [a for a in ALGORITHMS if a != "native" or hasattr(inner, "native_allreduce")]
    X, y = random_batches(models.lenet(), 1, 24, seed=devices)[0]
    for algorithm in algorithms:
        rec, tr = _trainer(backend_name, devices, algorithm)
        rec.log.clear()
        loss = tr.train_batch(X, y)
        check_step(list(rec.log), devices)
        # The wrapper is transparent: the plain adapter gives the same loss and parameters.
        plain = multigpu.DataParallel(
            models.lenet(), backend=backend_name, devices=f"cpu:{devices}", lr=0.2, allreduce=algorithm, seed=1
        )
        assert loss == pytest.approx(plain.train_batch(X, y), abs=1e-6), algorithm
        for a, b in zip(tr.get_params(), plain.get_params()):
            np.testing.assert_allclose(a, b, atol=1e-7, err_msg=algorithm)


class _ReadsPerDevice(multigpu.DataParallel):
    """The old step: each device's loss was read back before the next device started."""

    def train_batch(self, X, y):
        b, losses, flats = self.backend, [], []
        for d, params, (xs, ys) in zip(self.devices, self.replicas, self.local_shards(X, y)):
            flat = b.value_and_grad(self._loss, params, b.from_numpy(xs, d), b.from_numpy(ys, d))
            loss = b.unflatten(flat, [*self.model.param_shapes, (1,)])[-1]
            losses.append(float(b.to_numpy(loss).reshape(())))
            flats.append(flat)
        grads, _ = self._sum(flats)
        for p, g in zip(self.flat_params, grads):
            b.sgd_([p], [g], self.lr / len(X))
        return sum(losses) / len(X)


def test_the_check_catches_a_per_device_loss_read(backend_name):
    rec = Recording(multigpu.backend(backend_name))
    tr = _ReadsPerDevice(models.lenet(), backend=rec, devices="cpu:2", lr=0.2)
    X, y = random_batches(tr.model, 1, 8)[0]
    rec.log.clear()
    tr.train_batch(X, y)
    with pytest.raises(AssertionError, match="host reads between"):
        check_step(list(rec.log), 2)


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_predict_queues_every_device_before_reading(backend_name, devices):
    rec, tr = _trainer(backend_name, devices)
    X, y = random_batches(tr.model, 1, 23, seed=5)[0]  # 23 rows, batch 4: rounds of 4*devices, the last short
    rec.log.clear()
    acc = tr.evaluate(X, y, batch_size=4)
    events = [e for e in rec.log if e in ("argmax", "to_numpy") or e.startswith("host:")]
    expected: list[str] = []
    step = 4 * devices
    for start in range(0, len(X), step):
        parts = min(devices, len(X) - start)
        expected += ["argmax"] * parts + ["to_numpy"] * parts
    assert events == expected
    assert "synchronize" not in rec.log
    plain = multigpu.DataParallel(models.lenet(), backend=backend_name, devices=f"cpu:{devices}", seed=1)
    assert acc == plain.evaluate(X, y, batch_size=4)


def _tiny_resnet() -> models.Model:
    return models.resnet((1, 1), (4, 8), 5, (3, 12, 12), "tiny")


@pytest.mark.parametrize("sync_bn", [False, True], ids=["per-device", "synchronized"])
@pytest.mark.parametrize(
    "optimizer, per_replica", [(SGD(momentum=0.9, weight_decay=5e-4), 3), (AdamW(), 4)], ids=["momentum", "adamw"]
)
def test_a_batchnorm_step_with_an_optimizer_reads_the_host_once(backend_name, sync_bn, optimizer, per_replica):
    """BatchNorm's statistics, the optimizer and the running-statistics update add no host read; with
    synchronized statistics the devices' forwards meet inside one computation."""
    m = _tiny_resnet()
    rec = Recording(multigpu.backend(backend_name))
    tr = multigpu.DataParallel(m, backend=rec, devices="cpu:2", lr=0.1, optimizer=optimizer, sync_bn=sync_bn, seed=1)
    X, y = random_batches(m, 1, 10, seed=1)[0]
    rec.log.clear()
    loss = tr.train_batch(X, y)
    # per replica: the optimizer's calls and one fold of the batch statistics into the running ones
    check_step(list(rec.log), 2, computations=1 if sync_bn else 2, updates=2 * (per_replica + 1))
    if sync_bn:
        assert "batch_norm_stats" in rec.log and "batch_norm_train" in rec.log
    plain = multigpu.DataParallel(
        m, backend=backend_name, devices="cpu:2", lr=0.1, optimizer=optimizer, sync_bn=sync_bn, seed=1
    )
    assert loss == pytest.approx(plain.train_batch(X, y), abs=1e-6)
    for a, b in zip(tr.get_state(1), plain.get_state(1)):
        np.testing.assert_allclose(a, b, atol=1e-7)
