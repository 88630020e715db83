"""Cluster and graph files: shipped examples load, and every bad input gets a clear
error naming the bad value and the fix."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from multigpu.errors import ClusterError
from multigpu.partition import (
    Cluster,
    DeviceSpec,
    Graph,
    GraphError,
    LayerSpec,
    Link,
    as_cluster,
    load_cluster,
    load_graph,
    shipped_clusters,
)

GOOD_CLUSTER: dict[str, Any] = {
    "devices": [
        {"name": "pi1", "flops": 38.4e9, "power": 4.0, "memory": 1e9},
        {"name": "desk", "flops": 289e9, "power": 140.0},
    ],
    "links": [{"between": ["pi1", "desk"], "bandwidth": 1e6, "latency": 0.002, "power": 1.0}],
    "default_link": {"bandwidth": 1e7, "latency": 0.0, "power": 0.0},
    "source": "desk",
    "sink": "desk",
}
GOOD_GRAPH: dict[str, Any] = {
    "input_bytes": 618348,
    "layers": [
        {"name": "conv1", "flops": 2.1e8, "param_bytes": 139776, "output_bytes": 1161600},
        {"name": "fc", "flops": 1e6, "param_bytes": 4000, "output_bytes": 4000},
    ],
}


def to_toml(d: dict) -> str:
    """A tiny TOML writer for cluster dicts (scalars, [[devices]], [[links]], [default_link], [engine])."""

    def val(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float) and math.isnan(v):
            return "nan"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        if isinstance(v, dict):  # an inline table
            return "{" + ", ".join(f"{json.dumps(k)} = {val(x)}" for k, x in v.items()) + "}"
        return json.dumps(v)

    lines = [
        f"{k} = {val(v)}"
        for k, v in d.items()
        if not isinstance(v, (list, dict)) or (isinstance(v, list) and not (v and isinstance(v[0], dict)))
    ]
    for key in ("devices", "links"):
        for item in d.get(key, []):
            lines.append(f"[[{key}]]")
            lines += [f"{k} = {val(v)}" for k, v in item.items()]
    if isinstance(d.get("default_link"), dict):
        lines.append("[default_link]")
        lines += [f"{k} = {val(v)}" for k, v in d["default_link"].items()]
    if isinstance(d.get("engine"), dict):
        lines.append("[engine]")
        lines += [f"{k} = {val(v)}" for k, v in d["engine"].items()]
    return "\n".join(lines) + "\n"


def write(tmp_path: Path, data: dict, fmt: str) -> Path:
    p = tmp_path / f"cluster.{fmt}"
    p.write_text(json.dumps(data) if fmt == "json" else to_toml(data))
    return p


def mutate(path: str, value: Any) -> dict:
    d = copy.deepcopy(GOOD_CLUSTER)
    keys = path.split(".")
    obj: Any = d
    for k in keys[:-1]:
        obj = obj[int(k)] if k.isdigit() else obj[k]
    last = keys[-1]
    if value is DELETE:
        del obj[last]
    else:
        obj[int(last) if last.isdigit() else last] = value
    return d


DELETE = object()


@pytest.mark.parametrize("fmt", ["json", "toml"])
def test_good_cluster_round_trips(tmp_path, fmt):
    c = load_cluster(write(tmp_path, GOOD_CLUSTER, fmt))
    assert c.names == ["pi1", "desk"] and c.source == "desk" and c.sink == "desk"
    assert c.link("pi1", "desk").bandwidth == 1e6
    assert Cluster.from_dict(c.to_dict()) == c
    no_sink = mutate("sink", DELETE)
    assert load_cluster(write(tmp_path, no_sink, fmt)).sink == "desk"


def test_small_transfers_take_the_inline_latency_and_round_trip():
    d = copy.deepcopy(GOOD_CLUSTER)
    d["links"][0]["latency"] = 0.02
    d["engine"] = {"inline_bytes": 1024, "inline_latency": [{"between": ["pi1", "desk"], "latency": 0.005}]}
    c = Cluster.from_dict(d)
    assert Cluster.from_dict(c.to_dict()) == c and c.to_dict()["engine"]["inline_bytes"] == 1024
    u, v = c.index("pi1"), c.index("desk")
    bw = c.link("pi1", "desk").bandwidth
    assert c.tables.transfer_time(1024)[u, v] == pytest.approx(0.005 + 1024 / bw)
    assert c.tables.transfer_time(1025)[u, v] == pytest.approx(0.02 + 1025 / bw)
    # Without inline_bytes, inline_latency has nothing to apply to: one latency per link.
    del d["engine"]["inline_bytes"]
    assert Cluster.from_dict(d).tables.transfer_time(10)[u, v] == pytest.approx(0.02 + 10 / bw)


def test_engine_keys_beside_the_hardware_are_moved_with_a_warning_naming_them():
    """An older file's flat engine keys load as the "engine" section they belong in."""
    d = copy.deepcopy(GOOD_CLUSTER)
    d["inline_bytes"] = 1024
    d["links"][0]["inline_latency"] = 0.005
    d["devices"][0]["warm_pass"] = {"lenet(batch=1)": 0.001}
    with pytest.warns(DeprecationWarning) as got:
        old = Cluster.from_dict(d)
    msg = str(got[0].message)
    for word in ("inline_bytes", "links between ['pi1', 'desk']: inline_latency", "devices['pi1']: warm_pass"):
        assert word in msg, (word, msg)
    assert '"engine" section' in msg and "Cluster.to_dict" in msg
    new = old.to_dict()
    assert "inline_bytes" not in new and "warm_pass" not in new["devices"][0]
    assert new["engine"]["inline_latency"] == [{"between": ["pi1", "desk"], "latency": 0.005}]
    assert new["engine"]["warm_pass"] == {"pi1": {"lenet(batch=1)": 0.001}}
    assert Cluster.from_dict(new) == old


def test_the_cluster_holds_hardware_and_the_engine_apart():
    """DeviceSpec, Link and Cluster hold no engine field; the engine's figures are the profile's."""
    import dataclasses

    from multigpu.partition.inputs.cluster import DeviceSpec, Link, LinkSpec

    engine_words = ("inline", "relay", "transfer_cpu", "warm_pass", "message_bytes")
    for cls in (Cluster, DeviceSpec, Link, LinkSpec):
        names = [f.name for f in dataclasses.fields(cls)]
        assert not [n for n in names if any(w in n for w in engine_words)], (cls, names)
    assert [f.name for f in dataclasses.fields(Cluster)][-2:] == ["engine", "name"]


BAD_CLUSTERS = [
    # (mutation path, value, words the message must contain)
    ("links.0.bandwidth", 0, ["bandwidth=0", "greater than 0", "bytes/s"]),
    ("links.0.bandwidth", -5.0, ["bandwidth=-5.0", "greater than 0"]),
    ("default_link.bandwidth", 0.0, ["default_link: bandwidth", "greater than 0"]),
    ("devices.0.flops", 0, ["'pi1'", "flops=0", "greater than 0", "FLOP/s"]),
    ("devices.1.flops", -289e9, ["'desk'", "flops", "-289000000000.0", "greater than 0"]),
    ("devices.0.flops", float("nan"), ["'pi1'", "flops=nan must be a finite number"]),
    ("links.0.latency", float("nan"), ["latency=nan must be a finite number"]),
    ("devices.0.power", -1.0, ["power=-1.0", "at least 0"]),
    ("devices.0.memory", 0, ["memory=0", "leave the key out"]),
    ("devices.0.flops", "38.4e9", ["must be a number", "'38.4e9'"]),
    ("devices.0.flops", True, ["must be a number", "True"]),
    ("links.0.between", ["pi1", "gpu"], ["unknown device 'gpu'", "known devices: pi1, desk"]),
    ("links.0.between", ["pi1", "pi1"], ["joins a device to itself"]),
    ("links.0.between", ["pi1"], ["exactly two device names"]),
    ("devices.1.name", "pi1", ["duplicate device name 'pi1'", "unique"]),
    ("devices.0.name", "", ["device name must be a non-empty string"]),
    ("source", "gpu", ["source 'gpu' is not a device", "pi1, desk"]),
    ("sink", "gpu", ["sink 'gpu' is not a device"]),
    ("devices", [], ['"devices" is empty']),
    ("devices.0.flop", 1e9, ["unknown key 'flop'", "check the spelling"]),
    ("devices.0.power", DELETE, ["missing the key 'power'"]),
    ("links.0.latency", DELETE, ["missing the key 'latency'"]),
    ("notes", "x", ["unknown key 'notes'", "allowed keys"]),
    ("source", DELETE, ["missing the key 'source'"]),
    ("engine", {"inline_bytes": -1}, ["inline_bytes=-1", "whole number of bytes", "max_direct_call_object_size"]),
    ("engine", {"inline_bytes": 1.5}, ["inline_bytes=1.5", "whole number of bytes"]),
    (
        "engine",
        {"inline_latency": [{"between": ["pi1", "desk"], "latency": -0.01}]},
        ["inline_latency between ['pi1', 'desk']=-0.01", "at least 0", "leave it out"],
    ),
    (
        "engine",
        {"inline_latency": [{"between": ["pi1", "imac"], "latency": 0.01}]},
        ["inline_latency between ['pi1', 'imac']", "no link", "default_inline_latency"],
    ),
    ("engine", {"transfer_cpu": {"imac": {"fixed": 0.0}}}, ["transfer_cpu['imac']", "not a device", "pi1, desk"]),
    ("engine", {"inline": 1}, ["engine has unknown key 'inline'", "'inline_bytes'"]),
]


@pytest.mark.parametrize("fmt", ["json", "toml", "dict"])
@pytest.mark.parametrize("path,value,words", BAD_CLUSTERS)
def test_bad_cluster_names_the_value(tmp_path, fmt, path, value, words):
    """The same mistake gets the same message in a JSON file, a TOML file and a dict built in code."""
    data = mutate(path, value)
    with pytest.raises(ClusterError) as exc:
        as_cluster(data) if fmt == "dict" else load_cluster(write(tmp_path, data, fmt))
    msg = str(exc.value)
    for w in words:
        assert w in msg, (w, msg)
    assert "\n" not in msg


def test_duplicate_link_and_duplicate_json_key(tmp_path):
    d = copy.deepcopy(GOOD_CLUSTER)
    d["links"].append({"between": ["desk", "pi1"], "bandwidth": 1e6, "latency": 0.0})
    with pytest.raises(ClusterError, match="listed twice"):
        load_cluster(write(tmp_path, d, "json"))
    p = tmp_path / "dup.json"
    p.write_text('{"devices": [], "devices": [], "source": "a"}')
    with pytest.raises(ClusterError, match="duplicate key 'devices'"):
        load_cluster(p)


def test_malformed_files(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"devices": [ {"name": "a", "flops": 1e9,, } ]}')
    with pytest.raises(ClusterError, match=r"malformed JSON in cluster file .*bad.json' at line 1 column"):
        load_cluster(p)
    p = tmp_path / "bad.toml"
    p.write_text('source = "a"\n[[devices]\nname = "a"\n')
    with pytest.raises(ClusterError, match=r"malformed TOML in cluster file .*bad.toml'"):
        load_cluster(p)
    p = tmp_path / "c.yaml"
    p.write_text("devices: []")
    with pytest.raises(ClusterError, match="suffix '.yaml'; name it .json or .toml"):
        load_cluster(p)
    p = tmp_path / "list.json"
    p.write_text("[1, 2]")
    with pytest.raises(ClusterError, match="must be an object"):
        load_cluster(p)
    with pytest.raises(ClusterError, match=r"no cluster file '.*nope.json'.*lab"):
        load_cluster(tmp_path / "nope.json")
    with pytest.raises(ClusterError, match="is a directory"):
        load_cluster(tmp_path)


def test_a_cluster_is_a_cluster_a_dict_or_a_path():
    good = as_cluster(copy.deepcopy(GOOD_CLUSTER))
    assert good == Cluster.from_dict(GOOD_CLUSTER) and as_cluster(good) is good
    assert as_cluster("lab") == load_cluster("lab")
    for bad in (["pi1", "desk"], 3, None):
        with pytest.raises(ClusterError, match=f"cluster must be a Cluster, a dict .*got {type(bad).__name__}"):
            as_cluster(bad)
    with pytest.raises(ClusterError, match="got dict; a cluster built in code goes to as_cluster"):
        load_cluster(GOOD_CLUSTER)


def test_programmatic_cluster_is_validated_too():
    with pytest.raises(ClusterError, match="bandwidth=0"):
        Link(("a", "b"), 0, 0.0)
    with pytest.raises(ClusterError, match="flops=inf must be a finite number"):
        DeviceSpec("a", math.inf, 1.0)
    with pytest.raises(ClusterError, match="no devices"):
        Cluster(devices=(), source="a")


# -- graphs --------------------------------------------------------------------------------------
def write_graph(tmp_path: Path, data: Any) -> Path:
    p = tmp_path / "graph.json"
    p.write_text(json.dumps(data))
    return p


def test_graph_file_and_builtin_models(tmp_path):
    g = load_graph(write_graph(tmp_path, GOOD_GRAPH))
    assert g.names == ["conv1", "fc"] and g.input_bytes == 618348
    assert Graph.from_dict(g.to_dict()) == g
    a = load_graph("alexnet")
    assert a.n == 19 and a.input_bytes == 3 * 227 * 227 * 4
    assert a.layers[0] == LayerSpec("conv1", 210830400, 139776, 1161600)
    assert sum(x.param_bytes for x in a.layers) > 233e6  # the document's 233 MB
    a8 = load_graph("alexnet", batch=8)
    assert a8.layers[0].flops == 8 * a.layers[0].flops and a8.input_bytes == 8 * a.input_bytes
    assert a8.layers[0].param_bytes == a.layers[0].param_bytes
    assert load_graph("lenet").n == 10


@pytest.mark.parametrize(
    "data,words",
    [
        ({"input_bytes": 10, "layers": []}, ['"layers" is empty']),
        ({"input_bytes": 10}, ["missing the key 'layers'"]),
        ({"input_bytes": -1, "layers": GOOD_GRAPH["layers"]}, ["input_bytes=-1", "at least 0"]),
        (
            {"input_bytes": 10, "layers": [{"name": "a", "flops": float("nan"), "param_bytes": 0, "output_bytes": 1}]},
            ["layer 'a': flops=nan must be a finite number"],
        ),
        (
            {"input_bytes": 10, "layers": [{"name": "a", "flops": -3, "param_bytes": 0, "output_bytes": 1}]},
            ["layer 'a': flops=-3"],
        ),
        (
            {"input_bytes": 10, "layers": [{"name": "a", "flops": 1, "param_bytes": 0, "output_bytes": 1}] * 2},
            ["duplicate layer name 'a'"],
        ),
        (
            {"input_bytes": 10, "layers": [{"name": "a", "flops": 1, "param_bytes": 0}]},
            ["missing the key 'output_bytes'"],
        ),
        (
            {"input_bytes": 10, "layers": [{"name": "a", "flops": 1, "param_bytes": 0, "output_bytes": 1, "x": 1}]},
            ["unknown key 'x'"],
        ),
    ],
)
def test_bad_graph_names_the_value(tmp_path, data, words):
    """A graph mistake is a GraphError (still a ClusterError, which it was before), from a file or a dict."""
    for read in (lambda: load_graph(write_graph(tmp_path, data)), lambda: Graph.from_dict(data)):
        with pytest.raises(GraphError) as exc:
            read()
        assert isinstance(exc.value, ClusterError)
        for w in words:
            assert w in str(exc.value), (w, str(exc.value))


def test_bad_graph_paths(tmp_path):
    with pytest.raises(GraphError, match=r"no graph file 'resnet'.*alexnet, bert, googlenet, gpt, lenet, minilm"):
        load_graph("resnet")
    p = tmp_path / "g.json"
    p.write_text("{oops")
    with pytest.raises(GraphError, match="malformed JSON in graph file"):
        load_graph(p)
    p.write_text('{"input_bytes": 1, "input_bytes": 2, "layers": []}')
    with pytest.raises(GraphError, match="duplicate key 'input_bytes'"):
        load_graph(p)
    p.with_suffix(".yaml").write_text("layers: []")
    with pytest.raises(GraphError, match="suffix '.yaml'"):
        load_graph(p.with_suffix(".yaml"))
    with pytest.raises(GraphError, match="batch=0 must be a positive integer"):
        load_graph("alexnet", batch=0)
    with pytest.raises(GraphError, match="has no layers"):
        Graph((), 0.0)
    with pytest.raises(GraphError, match="layer name must be a non-empty string"):
        LayerSpec("", 1.0, 0.0, 1.0)
    with pytest.raises(GraphError, match="graph must be a file path or a model name, got dict"):
        load_graph(GOOD_GRAPH)
    tmp = tmp_path / "c.json"  # the cluster reader keeps its ClusterError, not a GraphError
    tmp.write_text("{oops")
    with pytest.raises(ClusterError) as exc:
        load_cluster(tmp)
    assert not isinstance(exc.value, GraphError)


# -- shipped clusters ----------------------------------------------------------------------------
def test_shipped_clusters_load_and_lab_matches_the_document():
    assert {"lab", "gpu-box"} <= set(shipped_clusters())
    for name in shipped_clusters():
        load_cluster(name)
    lab = load_cluster("lab")
    pis = [d for d in lab.devices if d.name.startswith("pi")]
    assert pis and all(d.flops == 38.4e9 for d in pis)  # 8 FLOPs/cycle x 1.2 GHz x 4 cores
    assert all(d.power > 0 for d in lab.devices)
    assert lab.link("pi1", "desk-cpu").bandwidth == 1e6  # WiFi ~1 MB/s
    assert lab.link("desk-cpu", "imac").bandwidth == 1e7  # LAN ~10 MB/s
    assert {d.flops for d in lab.devices} >= {289e9, 70e9}  # i7-5930K and i7-2600K figures
    readme = Path(__file__).resolve().parents[1] / "multigpu" / "partition" / "inputs" / "clusters" / "README.md"
    text = readme.read_text()
    for d in lab.devices + load_cluster("gpu-box").devices:
        assert f"`{d.name}`" in text, f"README.md must give the source of {d.name}'s figures"


def test_core_imports_without_scipy_highspy_or_frameworks():
    code = (
        "import sys, multigpu.partition, multigpu.cli.commands.partition; "
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('scipy', 'highspy', 'torch', 'mxnet', 'paddle', 'tensorflow', 'jax')]; print(bad); sys.exit(bool(bad))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
