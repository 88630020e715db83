"""The data-parallel algorithm: k devices equal one, and every framework agrees."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FRAMEWORKS

import multigpu
from multigpu import models
from multigpu.parallel.agreement import agreement, random_batches, train_steps


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_k_devices_equal_one_device_on_the_full_batch(backend_name, k):
    m = models.lenet()
    start = m.init_params(seed=3)
    batches = random_batches(m, steps=3, batch=30, seed=k)  # 30 rows: uneven for k = 4
    one_losses, one, _ = train_steps(m, backend_name, start, batches, devices="cpu:1", lr=0.3)
    k_losses, many, devs = train_steps(m, backend_name, start, batches, devices=f"cpu:{k}", lr=0.3)
    assert len(devs) == k
    np.testing.assert_allclose(k_losses, one_losses, atol=1e-5)
    for a, b in zip(many, one):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_replicas_stay_identical_and_separate(backend_name):
    m = models.lenet()
    tr = multigpu.DataParallel(m, backend=backend_name, devices="cpu:3", lr=0.2, allreduce="ring")
    X, y = random_batches(m, 1, 12)[0]
    tr.train_batch(X, y)
    for r in (1, 2):
        for a, b in zip(tr.get_params(r), tr.get_params(0)):
            np.testing.assert_array_equal(a, b)
    assert tr.get_params(0)[0] is not tr.get_params(1)[0]


def test_all_frameworks_agree_after_ten_lenet_steps_on_two_devices():
    rows = agreement(models.lenet(), FRAMEWORKS or ["numpy"], steps=10, batch=32, devices=2, lr=0.2)
    for r in rows:
        assert r.max_param_diff <= 1e-5, r
        assert r.max_loss_diff <= 1e-5, r


@pytest.mark.parametrize("algorithm", ["naive", "ring", "fused"])
def test_allreduce_algorithms_train_identically(backend_name, algorithm):
    m = models.lenet()
    start = m.init_params(seed=1)
    batches = random_batches(m, 2, 16)
    _, base, _ = train_steps(m, backend_name, start, batches, devices="cpu:2", allreduce="naive")
    _, got, _ = train_steps(m, backend_name, start, batches, devices="cpu:2", allreduce=algorithm)
    for a, b in zip(got, base):
        np.testing.assert_allclose(a, b, atol=1e-7)


def test_training_learns_and_evaluate_uses_every_device(backend_name):
    m = models.lenet()
    rng = np.random.default_rng(0)
    # Two separable classes: bright top half vs bright bottom half.
    X = rng.random((64, 1, 28, 28), dtype=np.float32) * 0.1
    y = rng.integers(0, 2, 64)
    X[y == 0, :, :14] += 1.0
    X[y == 1, :, 14:] += 1.0
    tr = multigpu.DataParallel(m, backend=backend_name, devices="cpu:2", lr=0.2, seed=0)
    before = tr.evaluate(X, y)
    for _ in range(40):  # the 0.01 init sits on a plateau for about 30 steps
        tr.train_batch(X, y)
    assert tr.evaluate(X, y) == 1.0 and before < 1.0
    assert tr.evaluate(X[:3], y[:3], batch_size=1) == 1.0  # fewer rows than devices*batch


def test_text_book_param_order_is_accepted_and_returned(backend_name):
    m = models.lenet()
    params = m.init_params(seed=7)
    tr = multigpu.DataParallel(m, backend=backend_name, devices=1, params=params)
    for a, b in zip(tr.get_params(), params):
        np.testing.assert_array_equal(a, b)


# -- bad input -------------------------------------------------------------------------


def _tr(**kw):
    return multigpu.DataParallel(models.lenet(), backend="numpy", devices="cpu:2", **kw)


@pytest.mark.parametrize(
    "X, y, match",
    [
        (np.zeros((4, 28, 28), np.float32), np.zeros(4, int), r"shape \(4, 28, 28\).*\(batch, 1, 28, 28\)"),
        (np.zeros((4, 1, 28, 28), np.uint8), np.zeros(4, int), "dtype uint8.*float"),
        (np.zeros((4, 1, 28, 28), np.float32), np.zeros(4, np.float32), "labels must be integers"),
        (np.zeros((4, 1, 28, 28), np.float32), np.array([0, 1, 10, 2]), "label 10 is out of range.*0..9"),
        (np.zeros((4, 1, 28, 28), np.float32), np.array([0, -1, 1, 2]), "label -1 is out of range"),
        (np.zeros((0, 1, 28, 28), np.float32), np.zeros(0, int), "empty"),
        (np.zeros((4, 1, 28, 28), np.float32), np.zeros(3, int), r"y has shape \(3,\)"),
        (np.zeros((1, 1, 28, 28), np.float32), np.zeros(1, int), "1 example.*2 devices"),
        (np.full((2, 1, 28, 28), np.nan, np.float32), np.zeros(2, int), "NaN"),
        # float64 beyond float32's range: finite before the cast, infinite after it (the issue's 1e39 pixel)
        (np.where(np.arange(2 * 784).reshape(2, 1, 28, 28) == 5, 1e39, 0.5), np.zeros(2, int), "float32's range"),
    ],
)
def test_bad_batches_raise_input_error(X, y, match):
    with pytest.raises(multigpu.InputError, match=match):
        _tr().train_batch(X, y)


@pytest.mark.parametrize(
    "X, batch_size, match",
    [
        (np.float32(1), 1024, r"X has shape \(\)"),
        (np.zeros((3, 1, 28, 28), np.float32), 2.5, "batch_size=2.5 must be a positive integer"),
        (np.zeros((3, 1, 28, 28), np.float32), 0, "batch_size=0"),
        (np.zeros((3, 1, 28, 28), np.float32), True, "batch_size=True"),
    ],
)
def test_bad_predict_arguments_raise_input_error(X, batch_size, match):
    """The issue's predict(np.float32(1)) and predict(X, 2.5) ended in a TypeError."""
    with pytest.raises(multigpu.InputError, match=match):
        _tr().predict(X, batch_size)


def test_bad_constructor_arguments():
    with pytest.raises(multigpu.UnknownBackendError, match="'jax'.*available backends: .*numpy"):
        multigpu.DataParallel(models.lenet(), backend="jax")
    with pytest.raises(multigpu.UnknownAlgorithmError, match="'tree'"):
        _tr(allreduce="tree")
    with pytest.raises(multigpu.ParamsError, match="has 2 arrays"):
        _tr(params=[np.zeros((20, 1, 3, 3)), np.zeros(20)])
    with pytest.raises(multigpu.DeviceError, match="'gpu:0,1'"):
        multigpu.DataParallel(models.lenet(), backend="numpy", devices="gpu:0,1")
    with pytest.raises(multigpu.DeviceError, match="devices=0"):
        multigpu.DataParallel(models.lenet(), backend="numpy", devices=0)
    with pytest.raises(multigpu.DeviceError, match="'tpu:3'"):
        multigpu.DataParallel(models.lenet(), backend="numpy", devices="tpu:3")
    with pytest.raises(multigpu.InputError, match="lr=-1"):
        _tr(lr=-1)
    with pytest.raises(multigpu.ModelError, match="Sequential"):
        multigpu.DataParallel("lenet", backend="numpy")


def test_devices_n_falls_back_to_cpu_replicas_with_a_warning():
    with pytest.warns(multigpu.CPUFallbackWarning, match="2 CPU replicas"):
        tr = multigpu.DataParallel(models.lenet(), backend="numpy", devices=2)
    assert [str(d) for d in tr.devices] == ["cpu:0", "cpu:1"]
