"""The MILP's valid inequalities (``milp_rows.endpoint_rows``): they keep every
memory-feasible plan at its exact cost, and they tighten the LP relaxation where it
time-shares the source with another device. (The brute-force oracles in
``test_partition_dag_solvers.py`` and ``test_partition_constraints.py`` check the optima
with them in place.)"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from dag_oracle import clusters, dags, ref_memory, ref_sum
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_partition_oracle import SETTINGS, Unusable

from multigpu.partition import Cluster, Graph, LayerSpec
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.inputs.cluster import DeviceSpec, Link
from multigpu.partition.solvers.constraints import Constraints
from multigpu.partition.solvers.milp import build_model, relax, solve_milp


def _with_memory(gd: dict, cd: dict, share: float) -> dict:
    """Parameters that outweigh the activations (so no device holds every layer and the
    cuts have rows), and every device holding ``share`` of them plus the largest activation
    (the oracle's own accounting: the whole graph on one device needs params + that)."""
    for x in gd["layers"]:
        x["param_bytes"] += 1e5
        x["output_bytes"] = min(x["output_bytes"], 1e4)
    gd["input_bytes"] = min(gd["input_bytes"], 1e4)
    params = sum(x["param_bytes"] for x in gd["layers"])
    whole = ref_memory(gd, [cd["devices"][0]["name"]] * len(gd["layers"]))[cd["devices"][0]["name"]]
    for d in cd["devices"]:
        d["memory"] = max(whole - (1 - share) * params, 1.0)
    return cd


def memory_instance(gd: dict, cd: dict, share: float) -> tuple[dict, Graph, Cluster, CostTables, Any]:
    """The cluster dict with memory set by ``_with_memory``, and the graph, cluster, cost
    tables and resolved constraints built from the two dicts."""
    cd = _with_memory(gd, cd, share)
    graph, cluster = Graph.from_dict(gd), Cluster.from_dict(cd)
    return cd, graph, cluster, CostTables.build(graph, cluster, False), Constraints().resolve(graph, cluster)


@settings(max_examples=25, **SETTINGS)
@given(dags(max_n=4), clusters(max_k=3), st.sampled_from([0.4, 0.6, 0.9]))
def test_every_memory_feasible_plan_keeps_its_cost(gd: dict, cd: dict, share: float) -> None:
    # Fix x to each assignment in turn: the MILP, cuts included, must accept every plan
    # that fits in memory and price it as the independent oracle does.
    cd, graph, cluster, tables, cons = memory_instance(gd, cd, share)
    names = [d["name"] for d in cd["devices"]]
    mem = {d["name"]: d["memory"] for d in cd["devices"]}
    checked = 0
    for a in itertools.product(range(len(names)), repeat=graph.n):
        plan = [names[i] for i in a]
        if any(used > mem[d] * (1 + 1e-9) for d, used in ref_memory(gd, plan).items()):
            continue
        try:
            want = ref_sum(gd, cd, plan)[0]
        except Unusable:  # a transfer over a pair without a link: no plan to keep
            continue
        fix = np.ones((graph.n, len(names)), dtype=bool)
        fix[np.arange(graph.n), list(a)] = False
        res = solve_milp(tables, cons, 1.0, 0.0, scale=1.0 / max(want, 1e-12), fix_x=fix)
        assert res.status == 0, (plan, res.message)
        assert np.isclose(res.value, want, rtol=1e-6, atol=1e-12), (plan, res.value, want)
        checked += 1
    event(f"plans checked: {min(checked, 10)}{'+' if checked >= 10 else ''}")


def test_cuts_tighten_a_time_shared_source() -> None:
    # The source is slow but sends the input over a slow link; the fast device holds 60%
    # of the parameters, and so does the source. Without the cuts the LP runs 40% of every
    # layer on the source and pays only 60% of the input transfer; in a real plan the data
    # leaves the source somewhere.
    layers = tuple(LayerSpec(f"l{i}", 1e9, 1e6, 1e5) for i in range(6))
    graph = Graph(layers, input_bytes=1e5)
    mem = 0.6 * 6e6 + 1e5
    cluster = Cluster(
        (DeviceSpec("src", 1e9, 1.0, mem), DeviceSpec("fast", 1e12, 1.0, mem)),
        source="src",
        links=(Link(("src", "fast"), 1e5, 1e-3),),
    )
    tables = CostTables.build(graph, cluster, False)
    cons = Constraints().resolve(graph, cluster)
    loose, _, _ = relax(build_model(tables, cons, 1.0, 0.0, cuts=False))
    tight, _, _ = relax(build_model(tables, cons, 1.0, 0.0))
    best = solve_milp(tables, cons, 1.0, 0.0).value
    assert loose is not None and tight is not None
    assert loose < tight - 1e-3 * best
    assert tight <= best * (1 + 1e-9)


def test_milp_prices_a_small_edge_with_the_inline_latency() -> None:
    # A 100-byte edge between devices travels inline (inline_latency, not latency): the
    # MILP's column for it must say so, as the oracle does (it once missed 1e-4 s here).
    gd = {
        "input_bytes": 100.0,
        "layers": [
            {"name": "l0", "flops": 0.0, "param_bytes": 0.0, "output_bytes": 100.0, "inputs": ["input"]},
            {"name": "l1", "flops": 0.0, "param_bytes": 0.0, "output_bytes": 100.0, "inputs": ["input", "l0"]},
        ],
    }
    cd = {
        "devices": [
            {"name": "d0", "flops": 1e9, "power": 0.0, "stage_overhead": 1e-5},
            {"name": "d1", "flops": 1e9, "power": 0.0},
        ],
        "links": [{"between": ["d0", "d1"], "bandwidth": 1e5, "latency": 0.0}],
        "source": "d0",
        "engine": {"inline_bytes": 1000, "inline_latency": [{"between": ["d0", "d1"], "latency": 1e-4}]},
    }
    graph, cluster = Graph.from_dict(gd), Cluster.from_dict(cd)
    tables = CostTables.build(graph, cluster, False)
    cons = Constraints(memory=False).resolve(graph, cluster)
    res = solve_milp(tables, cons, 1.0, 0.0, fix_x=np.array([[False, True], [True, False]]))
    assert np.isclose(res.value, ref_sum(gd, cd, ["d0", "d1"])[0], rtol=1e-9)
