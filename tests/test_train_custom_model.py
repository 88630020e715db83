"""train(model=...) with a model of the user's own: every feature a built-in model has."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FRAMEWORKS
from idx_files import write_learnable_set

import multigpu
from multigpu.data import load_fashion_mnist
from multigpu.errors import CheckpointError, ModelError
from multigpu.training.checkpoint import load_checkpoint


def three_layers(width: int = 32) -> multigpu.Sequential:
    """A 3-layer custom model, as the README shows it."""
    return multigpu.Sequential(
        [
            multigpu.Flatten(),
            multigpu.Dense(out_features=width),
            multigpu.ReLU(),
            multigpu.Dense(out_features=10),
        ],
        input_shape=(1, 28, 28),
        name="mlp",
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = write_learnable_set(tmp_path_factory.mktemp("fm"), n_train=256, n_test=64)
    return load_fashion_mnist(folder, verify=False)


@pytest.mark.parametrize("backend", ["torch" if "torch" in FRAMEWORKS else "numpy"])
def test_a_custom_model_trains_with_checkpoints_and_a_plot(data, tmp_path, backend):
    pytest.importorskip("matplotlib")
    ckpt, plot = tmp_path / "ckpt", tmp_path / "acc.png"
    kw = dict(
        backend=backend, devices="cpu:2", batch_size=64, lr=0.5, data=data, progress=False, checkpoint=ckpt, plot=plot
    )
    first = multigpu.train(model=three_layers(), num_epochs=1, **kw)
    assert first.model == "mlp" and plot.stat().st_size > 0
    params, state = load_checkpoint(ckpt)
    assert [p.shape for p in params] == three_layers().param_shapes
    assert state["epoch"] == 1 and state["config"]["model"] == "mlp"
    resumed = multigpu.train(model=three_layers(), num_epochs=3, **kw)  # epochs 2 and 3 from the checkpoint
    straight = multigpu.train(model=three_layers(), num_epochs=3, **{**kw, "checkpoint": None, "plot": None})
    assert resumed.train_loss == pytest.approx(straight.train_loss, rel=1e-5)
    assert resumed.train_loss[-1] < resumed.train_loss[0]
    for a, b in zip(resumed.params, straight.params):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_checkpoint_of_another_model_is_refused(data, tmp_path):
    kw = dict(backend="numpy", devices="cpu:2", batch_size=64, lr=0.5, data=data, progress=False, checkpoint=tmp_path)
    multigpu.train(model=three_layers(32), num_epochs=1, **kw)
    with pytest.raises(CheckpointError, match="different run.*param_shapes"):
        multigpu.train(model=three_layers(16), num_epochs=2, **kw)


def test_a_model_that_does_not_fit_the_data_is_refused_by_name(data):
    kw = dict(backend="numpy", batch_size=64, data=data, progress=False, num_epochs=1)
    wrong_input = multigpu.Sequential(
        [multigpu.Flatten(), multigpu.Dense(out_features=10)], input_shape=(3, 32, 32), name="cifar_mlp"
    )
    with pytest.raises(ModelError, match=r"'cifar_mlp' takes inputs of shape \(3, 32, 32\).*\(1, 28, 28\)"):
        multigpu.train(model=wrong_input, **kw)
    too_few = multigpu.Sequential(
        [multigpu.Flatten(), multigpu.Dense(out_features=4)], input_shape=(1, 28, 28), name="four"
    )
    with pytest.raises(ModelError, match=r"'four' has 4 outputs.*Dense\(out_features=10\)"):
        multigpu.train(model=too_few, **kw)
    with pytest.raises(ModelError, match="neither a built-in model name"):
        multigpu.train(model=42, **kw)
    with pytest.raises(ModelError, match="unknown model 'vgg'"):
        multigpu.train(model="vgg", **kw)
