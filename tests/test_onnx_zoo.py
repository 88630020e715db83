"""Real networks, offline: torchvision's and ``paddle.vision``'s classification models, with random weights and
BatchNorm statistics, exported by their own framework and imported here, give the framework's outputs within
1e-4 on every backend. (Gluon's model zoo, exported by MXNet, and MiniLM, exported by torch, are in
test_onnx_import.py.)"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
from torchvision_models import import_torchvision

import multigpu
from multigpu.contract.protocol import Device
from multigpu.models import RunContext
from multigpu.models.onnx_import import OnnxImport, from_paddle, from_torch

pytest.importorskip("onnx")
CPU = Device("cpu", 0)


@pytest.fixture(autouse=True)
def _quiet_exporters():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's TorchScript exporter and paddle2onnx warn on every export
        yield


def run(imp: OnnxImport, name: str, x: np.ndarray) -> np.ndarray:
    """The imported model's output for input ``x`` on backend ``name``."""
    be = multigpu.backend(name)
    out = imp.model.run(
        be,
        [be.from_numpy(p, CPU) for p in imp.params],
        {imp.model.input_names[0]: be.from_numpy(x, CPU)},
        state=[be.from_numpy(s, CPU) for s in imp.state] or None,
        context=RunContext(devices=[CPU]),
    )
    return be.to_numpy(out[imp.output])


def assert_within_1e4(got: np.ndarray, want: np.ndarray) -> None:
    """``got`` equals ``want`` within 1e-4 of the output's scale (the random weights keep that scale away from 0)."""
    scale = np.abs(want).max()
    assert 0.1 < scale < 1e3
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-4 * max(scale, 1.0)


# -- torchvision, exported by torch -----------------------------------------------------------
@functools.cache
def torchvision_net(name: str, size: int) -> tuple[OnnxImport, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """torchvision's ``name`` (10 classes) with random BatchNorm statistics, imported through ``from_torch``;
    an input batch of two ``size`` x ``size`` images, torch's output on it and torch's parameters by name."""
    torch = pytest.importorskip("torch")
    models = import_torchvision().models
    torch.manual_seed(0)
    net = getattr(models, name)(weights=None, num_classes=10).eval()
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    x = np.random.default_rng(0).standard_normal((2, 3, size, size)).astype(np.float32)
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    params = {k: v.detach().numpy() for k, v in net.named_parameters()}
    return from_torch(net, torch.from_numpy(x)), x, want, params


def test_torchvision_squeezenet_with_ceil_mode_pools_equals_torch_on_every_backend(backend_name):
    # 66 x 66: the stem gives 32 x 32, where the ceil-mode 3/2 pool has a 16th window (15 without ceil mode)
    imp, x, want, params = torchvision_net("squeezenet1_1", 66)
    pools = [n.layer for n in imp.model.nodes if n.layer.kind == "max_pool2d"]
    assert len(pools) == 3 and all(p.ceil_mode for p in pools)
    assert [n.layer.op for n in imp.model.nodes if n.layer.kind == "onnx"].count("concat") == 8  # the fire modules
    assert set(imp.param_names) == set(params)
    assert_within_1e4(run(imp, backend_name, x), want)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_torchvision_networks_equal_torch_on_every_backend(name, backend_name):
    imp, x, want, params = torchvision_net(name, 64)
    assert imp.batch is None and len(imp.state) > 0
    # every torch parameter is a trainable parameter, under torch's name (a Linear's weight stored as (in, out))
    assert set(imp.param_names) == set(params)
    for key, p in zip(imp.param_names, imp.params):
        np.testing.assert_array_equal(p, params[key].T if p.shape != params[key].shape else params[key])
    if name == "mobilenet_v2":  # ReLU6 exports as Clip
        assert sum(getattr(n.layer, "op", None) == "clip" for n in imp.model.nodes) == 35
    assert_within_1e4(run(imp, backend_name, x), want)


# -- paddle.vision, exported by Paddle --------------------------------------------------------
@functools.cache
def paddle_net(name: str) -> tuple[OnnxImport, np.ndarray, np.ndarray]:
    """``paddle.vision.models``' ``name`` (10 classes) with random BatchNorm statistics, imported through
    ``from_paddle`` with a dynamic batch; an input batch of two 64 x 64 images and Paddle's output on it."""
    paddle = pytest.importorskip("paddle")
    pytest.importorskip("paddle2onnx")
    paddle.seed(0)
    net = getattr(paddle.vision.models, name)(num_classes=10)
    net.eval()
    rng = np.random.default_rng(1)
    for key, v in net.state_dict().items():
        if key.endswith("_variance"):
            v.set_value(rng.uniform(0.5, 2.0, v.shape).astype(np.float32))
        elif key.endswith("_mean"):
            v.set_value(rng.uniform(-0.2, 0.2, v.shape).astype(np.float32))
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32)
    want = net(paddle.to_tensor(x)).numpy()
    spec = [paddle.static.InputSpec([None, 3, 64, 64], "float32", "x")]
    return from_paddle(net, spec, input_shapes={"x": x.shape}), x, want


def test_paddle_vision_squeezenet_equals_paddle_on_every_backend(backend_name):
    imp, x, want = paddle_net("squeezenet1_1")
    assert imp.batch is None and imp.model.input_names == ("x",)
    assert_within_1e4(run(imp, backend_name, x), want)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_paddle_vision_networks_equal_paddle_on_every_backend(name, backend_name):
    imp, x, want = paddle_net(name)
    assert imp.batch is None and len(imp.state) > 0
    assert_within_1e4(run(imp, backend_name, x), want)


def test_from_paddle_leaves_the_environment_as_it_was(tmp_path):
    """paddle.onnx.export's Polygraphy step sets POLYGRAPHY_AUTOINSTALL_DEPS=1 and pip-installs what it lacks
    (onnx_graphsurgeon, and numpy 2 with it) into the running environment; from_paddle never takes that step."""
    import os
    import sys

    paddle = pytest.importorskip("paddle")
    pytest.importorskip("paddle2onnx")
    before = os.environ.get("POLYGRAPHY_AUTOINSTALL_DEPS")
    layer = paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.ReLU())
    from_paddle(layer, [paddle.static.InputSpec([None, 4], "float32", "x")], input_shapes={"x": (2, 4)})
    assert os.environ.get("POLYGRAPHY_AUTOINSTALL_DEPS") == before
    assert "onnx_graphsurgeon" not in sys.modules
