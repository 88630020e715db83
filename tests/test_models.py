"""Models as data: shapes, init and per-layer accounting."""

from __future__ import annotations

import numpy as np
import pytest

import multigpu
from multigpu import models


def test_lenet_has_the_textbook_parameters():
    m = models.lenet()
    assert m.param_shapes == [(20, 1, 3, 3), (20,), (50, 20, 5, 5), (50,), (800, 128), (128,), (128, 10), (10,)]
    params = m.init_params(seed=0)
    assert all(p.dtype == np.float32 for p in params)
    for p in params[1::2]:
        assert not p.any()  # zero biases
    big = np.concatenate([p.ravel() for p in params[0::2]])
    assert abs(big.std() - 0.01) < 5e-4 and abs(big.mean()) < 5e-4  # N(0, 0.01^2)
    np.testing.assert_array_equal(params[0], m.init_params(seed=0)[0])
    assert not np.array_equal(params[0], m.init_params(seed=1)[0])


def test_alexnet_matches_the_published_figures():
    m = models.alexnet()
    stats = m.layer_stats(batch=1)
    assert m.num_params() == 60_965_224 == sum(s.params for s in stats)
    macs = sum(s.macs for s in stats)
    assert macs == 724_406_816  # "about 724M multiply-accumulates per image"
    by = {s.name: s for s in stats}
    assert by["conv1"].output_shape == (96, 55, 55)
    assert by["pool5"].output_shape == (256, 6, 6)
    assert by["conv2"].param_bytes == 4 * (256 * 48 * 25 + 256)  # two groups
    assert m.input_bytes(1) == 3 * 227 * 227 * 4


def test_accounting_scales_with_batch():
    m = models.lenet()
    one, eight = m.layer_stats(1), m.layer_stats(8)
    for a, b in zip(one, eight):
        assert b.flops == 8 * a.flops and b.output_bytes == 8 * a.output_bytes
        assert b.param_bytes == a.param_bytes
    assert one[0].flops == 2 * 26 * 26 * 20 * 9


def test_bad_specs_and_params_are_reported():
    with pytest.raises(multigpu.ModelError, match="Flatten"):
        multigpu.Sequential([multigpu.Dense(out_features=3)], input_shape=(1, 4, 4))
    with pytest.raises(multigpu.ModelError, match="does not fit"):
        multigpu.Sequential([multigpu.Conv2d(out_channels=2, kernel=5)], input_shape=(1, 3, 3))
    with pytest.raises(multigpu.ModelError, match="unknown model 'vgg'"):
        models.get("vgg")
    m = models.lenet()
    with pytest.raises(multigpu.ParamsError, match="has 7 arrays but lenet needs 8"):
        m.check_params(m.init_params()[:7])
    bad = m.init_params()
    bad[4] = bad[4].T
    with pytest.raises(multigpu.ParamsError, match=r"params\[4\] has shape \(128, 800\).*\(800, 128\)"):
        m.check_params(bad)


def test_forward_can_run_a_slice_of_the_model(ref):
    m = models.lenet()
    params = [ref.from_numpy(p, multigpu.Device("cpu", 0)) for p in m.init_params()]
    x = ref.from_numpy(np.random.default_rng(0).random((2, 1, 28, 28), dtype=np.float32), multigpu.Device("cpu", 0))
    full = ref.to_numpy(m.forward(ref, params, x))
    mid = m.forward(ref, params, x, 0, 4)
    np.testing.assert_allclose(ref.to_numpy(m.forward(ref, params, mid, 4)), full)
