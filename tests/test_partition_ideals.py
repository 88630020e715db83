"""The contiguous DP over a graph's ideals (``solvers.ideals``) against brute force over the
contiguous plans of small random DAGs: every assignment whose device sets, one stage each,
run in a sequence (the graph of stages has no cycle).

With one link speed everywhere (a default link only) its latency value is exact, checked
against the independent oracle (``dag_oracle.ref_sum``). For the throughput objective it
minimises its own price (a stage's device load, or all its inputs' and outputs' link time,
whichever is larger), recomputed here from the file dicts; that price bounds the plan's true
bottleneck (``dag_oracle.ref_bottleneck``). The planner never returns a plan worse than it.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from dag_oracle import INPUT, dags, fork_joins, producers, ref_bottleneck, ref_memory, ref_sum
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_partition_oracle import SETTINGS, Unusable

from multigpu.partition import Cluster, Graph, PartitionInputError, autopartition, load_cluster, load_graph
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.solvers.constraints import Constraints
from multigpu.partition.solvers.ideals import TooManyIdeals, contiguous_optimum, ideals

SMALL = dict(max_examples=60, **SETTINGS)


@st.composite
def uniform_clusters(draw: Any, max_k: int = 3) -> dict:
    """Two or more devices joined by one default link (every pair alike), sometimes another
    sink and stage overheads."""
    k = draw(st.integers(2, max_k))
    mag = st.floats(0.0, 1.0)
    names = [f"d{i}" for i in range(k)]
    devices = [{"name": nm, "flops": 10 ** (9 + 3 * draw(mag)), "power": draw(st.floats(0, 300))} for nm in names]
    for d in devices:
        if draw(st.integers(0, 2)) == 0:
            d["stage_overhead"] = draw(st.sampled_from([1e-5, 3e-4, 3e-3]))
    link = {
        "bandwidth": 10 ** (5 + 5 * draw(mag)),
        "latency": 1e-3 * draw(mag),
        "power": draw(st.sampled_from([0, 5.0])),
    }
    cd: dict[str, Any] = {"devices": devices, "default_link": link, "source": draw(st.sampled_from(names))}
    if draw(st.booleans()):
        cd["sink"] = draw(st.sampled_from(names))
    return cd


def _contiguous(gd: dict, a: list[str]) -> bool:
    """Whether the stages (one per device) of assignment ``a`` run in a sequence."""
    names = [x["name"] for x in gd["layers"]]
    dev = dict(zip(names, a))
    after = {d: set() for d in set(a)}
    for x, ins in zip(gd["layers"], producers(gd)):
        for p in ins:
            if p != INPUT and dev[p] != dev[x["name"]]:
                after[dev[x["name"]]].add(dev[p])
    done: set[str] = set()
    while len(done) < len(after):
        ready = [d for d in after if d not in done and after[d] <= done]
        if not ready:
            return False
        done |= set(ready)
    return True


def _dp_price(gd: dict, cd: dict, a: list[str]) -> float:
    """The DP's throughput price of a contiguous plan on a one-link cluster, from the dicts."""
    link = cd["default_link"]
    k = len(cd["devices"])

    def hop(b: float) -> float:
        return b / link["bandwidth"] + link["latency"]

    names = [x["name"] for x in gd["layers"]]
    dev = dict(zip(names, a))
    size = {INPUT: gd["input_bytes"], **{x["name"]: x["output_bytes"] for x in gd["layers"]}}
    ins = dict(zip(names, producers(gd)))
    users: dict[str, list[str]] = {}
    for x in names:
        for p in ins[x]:
            users.setdefault(p, []).append(x)
    sink = cd.get("sink", cd["source"])
    worst = 0.0
    for spec in cd["devices"]:
        d = spec["name"]
        stage = [x for x in gd["layers"] if dev[x["name"]] == d]
        if not stage:
            continue
        inside = {x["name"] for x in stage}
        load = 0.0
        moved = 0.0
        feeding: set[str] = set()
        for x in stage:
            outside = [p for p in ins[x["name"]] if p not in inside]
            starts = INPUT in ins[x["name"]] or bool(outside)
            load += x["flops"] / spec["flops"] + (spec.get("stage_overhead", 0.0) if starts else 0.0)
            feeding |= set(outside)
        for p in feeding:
            moved += hop(size[p]) if p != INPUT or d != cd["source"] else 0.0
        for x in inside:
            moved += min(sum(1 for c in users.get(x, []) if c not in inside), k - 1) * hop(size[x])
        if names[-1] in inside and d != sink:
            moved += hop(size[names[-1]])
        worst = max(worst, load, moved)
    return worst


def _setup(gd: dict, cd: dict, memory: float | None):
    if memory is not None:
        for d in cd["devices"]:
            d["memory"] = memory
    graph, cluster = Graph.from_dict(gd), Cluster.from_dict(cd)
    return graph, cluster, CostTables.build(graph, cluster, False), Constraints().resolve(graph, cluster)


def _memory(draw: Any, gd: dict) -> float | None:
    if draw(st.sampled_from([False, False, True])):
        total = sum(x["param_bytes"] for x in gd["layers"]) + max(x["output_bytes"] for x in gd["layers"])
        return total * draw(st.sampled_from([0.6, 0.9]))
    return None


@settings(**SMALL)
@given(st.one_of(dags(5), fork_joins(6)), uniform_clusters(), st.sampled_from([(1.0, 0.0), (1.0, 0.3)]), st.data())
def test_the_latency_dp_is_the_least_cost_contiguous_plan(gd, cd, w, data):
    memory = _memory(data.draw, gd)
    graph, cluster, tables, cons = _setup(gd, cd, memory)
    names = [d["name"] for d in cd["devices"]]
    best = math.inf
    for a in itertools.product(names, repeat=graph.n):
        a = list(a)
        if not _contiguous(gd, a):
            continue
        if memory is not None and any(m > memory * (1 + 1e-9) for m in ref_memory(gd, a).values()):
            continue
        try:
            T, E = ref_sum(gd, cd, a)
        except Unusable:
            continue
        best = min(best, w[0] * T + w[1] * E)
    got = contiguous_optimum(tables, cons, "latency", *w)
    if not math.isfinite(best):
        assert got is None
        event("no contiguous plan fits")
        return
    assert got is not None
    plan = [names[d] for d in got.a]
    assert _contiguous(gd, plan)
    T, E = ref_sum(gd, cd, plan)
    assert math.isclose(got.value, best, rel_tol=1e-9, abs_tol=1e-15), (got.value, best)
    assert math.isclose(w[0] * T + w[1] * E, best, rel_tol=1e-9, abs_tol=1e-15)
    event(f"{len(set(plan))} stages")


@settings(**SMALL)
@given(st.one_of(dags(5), fork_joins(6)), uniform_clusters(), st.data())
def test_the_throughput_dp_minimises_its_price_which_bounds_the_bottleneck(gd, cd, data):
    memory = _memory(data.draw, gd)
    graph, cluster, tables, cons = _setup(gd, cd, memory)
    names = [d["name"] for d in cd["devices"]]
    best = math.inf
    for a in itertools.product(names, repeat=graph.n):
        a = list(a)
        if not _contiguous(gd, a):
            continue
        if memory is not None and any(m > memory * (1 + 1e-9) for m in ref_memory(gd, a).values()):
            continue
        best = min(best, _dp_price(gd, cd, a))
    got = contiguous_optimum(tables, cons, "throughput")
    if not math.isfinite(best):
        assert got is None
        event("no contiguous plan fits")
        return
    assert got is not None
    plan = [names[d] for d in got.a]
    assert _contiguous(gd, plan)
    assert math.isclose(got.value, best, rel_tol=1e-9, abs_tol=1e-15), (got.value, best)
    event(f"{len(set(plan))} stages")
    assert ref_bottleneck(gd, cd, plan) <= got.value * (1 + 1e-9) + 1e-15
    # The planner starts from this plan: it never returns a worse one (proving), and within a
    # gap only one within the gap and of lower latency (the tie-break).
    if memory is None:
        mine = ref_bottleneck(gd, cd, plan)
        exact = autopartition(graph, cluster, objective="throughput", gap=0, constraints={"memory": False})
        assert exact.bottleneck <= mine * (1 + 1e-9) + 1e-15
        found = autopartition(graph, cluster, objective="throughput", gap=0.05, constraints={"memory": False})
        assert found.bottleneck <= mine / (1 - 0.05) * (1 + 1e-9) + 1e-15
        if found.bottleneck > mine * (1 + 1e-9):
            assert found.cost <= ref_sum(gd, cd, plan)[0] * (1 + 1e-9)


def test_the_ideals_of_a_chain_and_of_a_fork() -> None:
    chain = Graph.from_dict(
        {
            "input_bytes": 1,
            "layers": [{"name": f"l{i}", "flops": 1, "param_bytes": 0, "output_bytes": 1} for i in range(4)],
        }
    )
    m = ideals(chain)
    assert m.shape == (5, 4) and (m.sum(axis=1) == np.arange(5)).all()
    fork = Graph.from_dict(
        {
            "input_bytes": 1,
            "layers": [
                {"name": "a", "flops": 1, "param_bytes": 0, "output_bytes": 1},
                {"name": "b", "flops": 1, "param_bytes": 0, "output_bytes": 1, "inputs": ["a"]},
                {"name": "c", "flops": 1, "param_bytes": 0, "output_bytes": 1, "inputs": ["a"]},
                {"name": "d", "flops": 1, "param_bytes": 0, "output_bytes": 1, "inputs": ["b", "c"]},
            ],
        }
    )
    got = {tuple(np.flatnonzero(r)) for r in ideals(fork)}
    assert got == {(), (0,), (0, 1), (0, 2), (0, 1, 2), (0, 1, 2, 3)}
    with pytest.raises(TooManyIdeals, match="more than 3 ideals"):
        ideals(fork, limit=3)


def test_the_planner_reports_the_contiguous_dp() -> None:
    graph, lab = load_graph("resnet18"), load_cluster("lab")
    plan = autopartition(graph, lab, objective="throughput", solver="ideal")
    assert plan.solver == "ideal dp" and plan.proof == "heuristic"
    best = autopartition(graph, lab, objective="throughput", gap=0)
    assert best.bottleneck <= plan.bottleneck * (1 + 1e-12)
    with pytest.raises(PartitionInputError, match="solver='ideal'.*latency and throughput"):
        autopartition(graph, lab, objective="makespan", solver="ideal")
