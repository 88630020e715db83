"""Graphs with branches: graph files with ``inputs``, every bad one refused by name, the
cost model, the makespan and the throughput bottleneck over DAGs against the independent
oracle (``dag_oracle``), the matrix form with one transition matrix per edge, and the
stages a plan forms (a DAG)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from dag_oracle import clusters, dags, fork_joins, producers, ref_bottleneck, ref_makespan, ref_sum, starts
from hypothesis import given, settings
from hypothesis import strategies as st
from test_partition_oracle import SETTINGS, Unusable, close

from multigpu.partition import (
    Cluster,
    ClusterError,
    Graph,
    PartitionInputError,
    UnusableLinkError,
    evaluate,
    load_cluster,
    load_graph,
)
from multigpu.partition.stages import split_stages

RESIDUAL = {
    "input_bytes": 4000,
    "layers": [
        {"name": "stem", "flops": 2e8, "param_bytes": 1e4, "output_bytes": 8000},
        {"name": "conv1", "flops": 4e8, "param_bytes": 4e4, "output_bytes": 8000},
        {"name": "conv2", "flops": 4e8, "param_bytes": 4e4, "output_bytes": 8000},
        {"name": "add", "flops": 2e3, "param_bytes": 0, "output_bytes": 8000, "inputs": ["conv2", "stem"]},
        {"name": "fc", "flops": 1e6, "param_bytes": 4e3, "output_bytes": 40},
    ],
}


def write(tmp_path: Path, data: dict, name: str = "g.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


# -- graph files ---------------------------------------------------------------------------------
def test_a_residual_graph_file_loads_with_its_edges(tmp_path):
    g = load_graph(write(tmp_path, RESIDUAL))
    assert not g.is_chain
    assert g.producers == ((-1,), (0,), (1,), (2, 0), (3,))
    assert g.consumers[0] == (1, 3)
    assert list(g.edge_src) == [0, 1, 2, 0, 3] and list(g.edge_dst) == [1, 2, 3, 3, 4]
    assert g.input_bytes_per_layer[3] == 16000  # the add holds both of its inputs
    assert Graph.from_dict(g.to_dict()) == g
    assert "inputs" not in g.to_dict()["layers"][1]  # the default is not written out


def test_a_chain_with_inputs_spelt_out_is_the_chain(tmp_path):
    chain = {
        "input_bytes": 100,
        "layers": [
            {"name": f"l{i}", "flops": 1e6 * (i + 1), "param_bytes": 10, "output_bytes": 50 + i} for i in range(4)
        ],
    }
    spelt = json.loads(json.dumps(chain))
    for i, layer in enumerate(spelt["layers"]):
        layer["inputs"] = ["input"] if i == 0 else [f"l{i - 1}"]
    a, b = Graph.from_dict(chain), Graph.from_dict(spelt)
    assert a == b and b.is_chain
    cluster = load_cluster("lab")
    plan = ["pi1", "desk-gpu", "desk-gpu", "pi1"]
    assert evaluate(a, cluster, plan).cost == evaluate(b, cluster, plan).cost


def test_a_toml_graph_file_loads(tmp_path):
    p = tmp_path / "g.toml"
    p.write_text(
        'input_bytes = 10\n[[layers]]\nname = "a"\nflops = 1e6\nparam_bytes = 0\noutput_bytes = 5\n'
        '[[layers]]\nname = "b"\nflops = 1e6\nparam_bytes = 0\noutput_bytes = 5\ninputs = ["a", "input"]\n'
    )
    assert load_graph(p).producers == ((-1,), (0, -1))


def _with(**changes):
    data = json.loads(json.dumps(RESIDUAL))
    for name, inputs in changes.items():
        layer = next(x for x in data["layers"] if x["name"] == name)
        if inputs is None:
            layer.pop("inputs", None)
        else:
            layer["inputs"] = inputs
    return data


@pytest.mark.parametrize(
    "data, words",
    [
        (_with(add=["conv2", "stme"]), r"layer 'add' lists input 'stme', which is no layer of the graph.*'stem'"),
        (_with(conv1=["conv2"]), r"cycle: 'conv1' -> 'conv2' -> 'conv1'.*remove one of these inputs"),
        (_with(conv1=["add"]), r"cycle: .*'conv1'"),
        (_with(stem=["fc"]), r"cycle"),
        (_with(conv1=[]), r"layer 'conv1': inputs is empty, so no path from the input reaches layer 'conv1'"),
        (_with(add=["conv2", "conv2"]), r"layer 'add': inputs lists 'conv2' twice"),
        (_with(add=["add"]), r"lists the layer itself"),
        (_with(add="conv2"), r"layer 'add': inputs must be a list of layer names"),
        (_with(fc=["conv2"]), r"the output of layer 'add' goes to no layer.*only the last layer \('fc'\)"),
    ],
)
def test_bad_graph_files_are_refused_by_name(tmp_path, data, words):
    with pytest.raises(ClusterError, match=words):
        load_graph(write(tmp_path, data))


def test_a_layer_listed_twice_or_named_input_or_out_of_order_is_refused(tmp_path):
    twice = json.loads(json.dumps(RESIDUAL))
    twice["layers"].insert(2, dict(twice["layers"][1]))
    with pytest.raises(ClusterError, match=r"duplicate layer name 'conv1' \(layers\[1\] and layers\[2\]\).*rename"):
        load_graph(write(tmp_path, twice))
    named = _with()
    named["layers"][0]["name"] = "input"
    with pytest.raises(ClusterError, match="a layer is named 'input'"):
        load_graph(write(tmp_path, named))
    late = json.loads(json.dumps(RESIDUAL))
    late["layers"][1]["inputs"] = ["stem", "conv2"]
    late["layers"][2]["inputs"] = ["stem"]
    with pytest.raises(ClusterError, match=r"'conv1' consumes 'conv2', which is listed after it.*topological"):
        load_graph(write(tmp_path, late))


def test_plans_of_the_wrong_length_or_with_a_layer_on_two_devices_are_refused():
    g, c = Graph.from_dict(RESIDUAL), load_cluster("lab")
    with pytest.raises(PartitionInputError, match="assignment has 3 entries but the graph has 5 layers"):
        evaluate(g, c, ["pi1"] * 3)
    pairs = [("stem", "pi1"), ("conv1", "pi1"), ("conv2", "imac"), ("add", "pi1"), ("fc", "pi1"), ("conv1", "imac")]
    with pytest.raises(PartitionInputError, match="places layer 'conv1' on two devices, 'pi1' and 'imac'"):
        evaluate(g, c, pairs)
    with pytest.raises(PartitionInputError, match="places no device for layer 'fc'"):
        evaluate(g, c, {"stem": "pi1", "conv1": "pi1", "conv2": "pi1", "add": "pi1"})
    by_name = dict(pairs[:5])
    assert evaluate(g, c, by_name).assignment == [d for _, d in pairs[:5]]


# -- the cost model against the oracle -----------------------------------------------------------
@settings(max_examples=80, **SETTINGS)
@given(st.one_of(dags(), fork_joins()), clusters(shared=True), st.booleans(), st.data())
def test_evaluate_over_dags_equals_the_definition(gd, cd, ship, data):
    graph, cluster = Graph.from_dict(gd), Cluster.from_dict(cd)
    names = cluster.names
    a = data.draw(st.lists(st.sampled_from(names), min_size=graph.n, max_size=graph.n))
    try:
        T, E = ref_sum(gd, cd, a, ship)
    except Unusable:
        with pytest.raises(UnusableLinkError, match="no link joins"):
            evaluate(graph, cluster, a, ship_params=ship)
        return
    bd = evaluate(graph, cluster, a, 1.0, 0.5, ship)
    assert close(bd.time, T) and close(bd.energy, E) and close(bd.cost, T + 0.5 * E)
    assert close(bd.bottleneck, ref_bottleneck(gd, cd, a))
    assert close(bd.makespan, ref_makespan(gd, cd, a))
    assert bd.makespan <= bd.time - bd.param_time + 1e-12  # overlapping never takes longer than in turn
    m = bd.matrix
    assert close(m.time(), T) and close(m.energy(), E, 1e-8)
    assert m.L.shape[0] == len(graph.edge_src) + len(graph.input_consumers) + 1
    # Each transfer once: one per producer and other device that consumes it.
    assert len(bd.transfers) == len({(t.producer, t.between[1]) for t in bd.transfers})
    assert close(math.fsum(t.time for t in bd.transfers) + bd.param_time + bd.compute_time + bd.stage_time, T)


@settings(max_examples=60, **SETTINGS)
@given(st.one_of(dags(), fork_joins()), st.integers(1, 3), st.data())
def test_stages_form_a_dag_and_start_where_the_cost_model_charges_them(gd, k, data):
    graph = Graph.from_dict(gd)
    a = data.draw(st.lists(st.sampled_from([f"d{i}" for i in range(k)]), min_size=graph.n, max_size=graph.n))
    stages = split_stages(a, graph.names, graph.producers)
    seen = sorted(i for s in stages for i in s.members)
    assert seen == list(range(graph.n))  # every layer in exactly one stage
    ref = starts(gd, dict(zip(graph.names, a)))
    assert sum(ref.values()) == len(stages)  # one stage per stage start
    stage_of = {i: s.index for s in stages for i in s.members}
    for s in stages:
        assert all(t < s.index for t in s.after)  # a DAG, in index order
        assert len({a[i] for i in s.members}) == 1 and s.device == a[s.members[0]]
        assert ref[graph.names[s.members[0]]]  # it opens at a stage start
        for i in s.members[1:]:
            assert not ref[graph.names[i]]
            assert any(stage_of[p] == s.index for p in graph.producers[i])  # connected
        for p, t in s.inputs:
            assert (p == -1 and t == -1) or stage_of[p] == t != s.index


def test_stages_of_a_residual_block_split_across_devices():
    g = Graph.from_dict(RESIDUAL)
    a = ["pi1", "imac", "imac", "pi1", "pi1"]
    stages = split_stages(a, g.names, g.producers)
    assert [(s.device, s.span, s.after) for s in stages] == [
        ("pi1", "stem", ()),
        ("imac", "conv1..conv2", (0,)),
        ("pi1", "add..fc", (0, 1)),
    ]
    assert stages[2].inputs == ((0, 0), (2, 1))  # the shortcut from stage 1, conv2 from stage 2
    bd = evaluate(g, load_cluster("lab"), a)
    assert [(t.producer, t.to, t.between) for t in bd.transfers] == [
        ("stem", "conv1", ("pi1", "imac")),
        ("conv2", "add", ("imac", "pi1")),
    ]
    assert bd.stages == stages


def test_an_activation_goes_once_to_a_device_however_many_layers_there_consume_it():
    # stem feeds conv1 and the add; with both on the iMac, one transfer serves them.
    g, c = Graph.from_dict(RESIDUAL), load_cluster("lab")
    one = evaluate(g, c, ["pi1", "imac", "imac", "imac", "imac"])
    sent = [t for t in one.transfers if t.producer == "stem"]
    assert len(sent) == 1 and sent[0].to == "conv1"
    assert one.layers[1].transfer_time == sent[0].time and one.layers[3].transfer_time == 0.0


def test_the_makespan_overlaps_branches_and_equals_t_on_a_chain():
    towers = {
        "input_bytes": 1e6,
        "layers": [
            {"name": "stem", "flops": 1e9, "param_bytes": 0, "output_bytes": 1e6},
            {"name": "a", "flops": 1e12, "param_bytes": 0, "output_bytes": 1e6, "inputs": ["stem"]},
            {"name": "b", "flops": 1e12, "param_bytes": 0, "output_bytes": 1e6, "inputs": ["stem"]},
            {"name": "cat", "flops": 0, "param_bytes": 0, "output_bytes": 2e6, "inputs": ["a", "b"]},
        ],
    }
    g, c = Graph.from_dict(towers), load_cluster("gpu-box")
    bd = evaluate(g, c, ["gpu0", "gpu0", "gpu1", "gpu0"])
    s = bd.schedule
    assert s.start[2] == s.arrive[1] > s.finish[0]  # b starts once stem's output is on gpu1
    assert s.start[1] == s.finish[0] and s.start[3] == max(s.finish[1], s.arrive[2])
    assert bd.makespan == s.arrive[-1] < bd.time  # the towers overlap
    assert math.isclose(bd.time - bd.makespan, 1e12 / 15.7e12, rel_tol=1e-3)  # by one tower
    chain, c = load_graph("alexnet"), load_cluster("lab")
    bd = evaluate(chain, c, ["pi1"] * 3 + ["desk-gpu"] * (chain.n - 3))
    assert bd.makespan == bd.time
    with_params = evaluate(chain, c, ["pi1"] * 3 + ["desk-gpu"] * (chain.n - 3), ship_params=True)
    assert math.isclose(with_params.makespan, with_params.time - with_params.param_time, rel_tol=1e-12)


def test_producers_of_the_oracle_and_the_graph_agree():
    g = Graph.from_dict(RESIDUAL)
    names = ["input"] + g.names
    assert [[names[p + 1] for p in prods] for prods in g.producers] == producers(RESIDUAL)
    assert np.array_equal(g.input_consumers, [0])


def test_graph_from_model_takes_each_nodes_inputs():
    # A model whose layer stats name their inputs (as graph models do) gives a DAG graph.
    from types import SimpleNamespace

    from multigpu.partition import graph_from_model

    stats = [
        SimpleNamespace(
            name=x["name"],
            flops=x["flops"] * 2,
            param_bytes=x["param_bytes"],
            output_bytes=x["output_bytes"] * 2,
            inputs=tuple(x.get("inputs", ())),
        )
        for x in RESIDUAL["layers"]
    ]
    for s, prev in zip(stats, ["input"] + [x.name for x in stats]):
        s.inputs = s.inputs or (prev,)
    model = SimpleNamespace(name="toy", layer_stats=lambda batch: stats, input_bytes=lambda batch: 8000)
    g = graph_from_model(model, batch=2)
    assert g.name == "toy(batch=2)" and g.producers == Graph.from_dict(RESIDUAL).producers
    assert g.input_bytes == 8000 and g.flops[0] == 4e8
