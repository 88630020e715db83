"""AutoPartition on DAGs against brute force (``dag_oracle.brute``), for each objective,
with and without constraints: the fork-join DP, the MILP for any DAG, the makespan
MILP; which method proved the optimum; and what a solver refuses because it cannot
prove it."""

from __future__ import annotations

import math

import pytest
from dag_oracle import brute, clusters, dags, fork_joins
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_partition_oracle import SETTINGS

from multigpu.partition import Cluster, Graph, InfeasibleError, PartitionInputError, autopartition, load_cluster
from multigpu.partition.solvers.forkjoin import NotForkJoin, structure

SMALL = dict(max_examples=50, **SETTINGS)
weights = st.sampled_from([(1.0, 0.0), (0.0, 1.0), (1.0, 0.3)])


def rel(a: float, b: float, tol: float = 1e-6) -> bool:
    return math.isclose(a, b, rel_tol=tol, abs_tol=1e-12) or (math.isinf(a) and math.isinf(b))


def _limits(draw, gd: dict, cd: dict) -> dict:
    """Sometimes a memory limit that binds, a busy-time limit, an energy budget, a pin."""
    out: dict = {}
    kind = draw(st.sampled_from(["none", "memory", "busy", "energy", "pin"]))
    if kind == "memory":
        total = sum(x["param_bytes"] for x in gd["layers"]) + max(x["output_bytes"] for x in gd["layers"])
        out["memory"] = total * draw(st.sampled_from([0.6, 0.9]))
    elif kind == "busy":
        busy = sum(x["flops"] for x in gd["layers"]) / max(d["flops"] for d in cd["devices"]) * 0.6
        if busy > 0:
            out["busy"] = busy
    elif kind == "energy":
        out["energy"] = draw(st.sampled_from([0.05, 0.5, 5.0]))
    elif kind == "pin":
        out["pins"] = {gd["layers"][-1]["name"]: draw(st.sampled_from([d["name"] for d in cd["devices"]]))}
    return out


def _solve(gd: dict, cd: dict, limits: dict, **kw):
    for d in cd["devices"]:
        if "memory" in limits:
            d["memory"] = limits["memory"]
    cons = {"busy_time": limits.get("busy"), "energy_budget": limits.get("energy"), "pinned": limits.get("pins", {})}
    return autopartition(Graph.from_dict(gd), Cluster.from_dict(cd), constraints=cons, **kw)


def _check(
    gd: dict, cd: dict, limits: dict, objective: str, w: tuple[float, float], ship: bool = False, gap: float = 0.0
) -> None:
    """The plan's value is the brute-force minimum (gap 0), or within ``gap`` of it; its
    bound is at most the minimum and its reported gap is its distance from the bound."""
    mem = {d["name"]: limits["memory"] for d in cd["devices"]} if "memory" in limits else None
    best = brute(
        gd, cd, *w, ship=ship, memory=mem, busy=limits.get("busy"), energy=limits.get("energy"), pins=limits.get("pins")
    )
    key = {"latency": "cost", "throughput": "bottleneck", "makespan": "makespan"}[objective]
    try:
        plan = _solve(gd, cd, limits, wt=w[0], we=w[1], objective=objective, ship_params=ship, gap=gap)
    except InfeasibleError:
        assert math.isinf(best[key]), f"refused, but brute force found {best[key]}"
        event("infeasible")
        return
    got = {"latency": plan.cost, "throughput": plan.bottleneck, "makespan": plan.makespan}[objective]
    assert got == plan.value
    if gap == 0:
        assert rel(got, best[key]), (objective, plan.solver, got, best[key])
    else:
        assert best[key] * (1 - 1e-6) - 1e-12 <= got <= best[key] / (1 - gap) * (1 + 1e-6) + 1e-12, (got, best[key])
    assert plan.bound <= best[key] * (1 + 1e-6) + 1e-12, (plan.bound, best[key])
    assert plan.gap <= max(gap, 1e-9) * (1 + 1e-6) + 1e-9, (plan.gap, gap)
    assert math.isclose(plan.gap, (got - plan.bound) / got if got > 0 else 0.0, rel_tol=1e-9, abs_tol=1e-12)
    event(f"{objective}: {plan.solver}, {plan.proof}")


gaps = st.sampled_from([0.0, 0.001, 0.05])


@settings(**SMALL)
@given(st.one_of(dags(5), fork_joins(6)), clusters(), weights, st.booleans(), st.data())
def test_latency_reaches_the_brute_force_minimum(gd, cd, w, ship, data):
    _check(gd, cd, _limits(data.draw, gd, cd), "latency", w, ship, gap=data.draw(gaps))


@settings(**SMALL)
@given(st.one_of(dags(5), fork_joins(6)), clusters(shared=True), weights, st.data())
def test_throughput_reaches_the_brute_force_bottleneck(gd, cd, w, data):
    _check(gd, cd, _limits(data.draw, gd, cd), "throughput", w, gap=data.draw(gaps))


@settings(**SMALL)
@given(st.one_of(dags(5), fork_joins(5)), clusters(), st.data())
def test_makespan_reaches_the_brute_force_minimum(gd, cd, data):
    _check(gd, cd, _limits(data.draw, gd, cd), "makespan", (1.0, 0.0), gap=data.draw(gaps))


@settings(**SMALL)
@given(fork_joins(7), clusters(), weights)
def test_the_fork_join_dp_is_exact_and_says_so(gd, cd, w):
    graph = Graph.from_dict(gd)
    structure(graph)  # every drawn graph is fork-join
    best = brute(gd, cd, *w)["cost"]
    try:
        plan = autopartition(graph, Cluster.from_dict(cd), *w, constraints={"memory": False}, solver="dp")
    except InfeasibleError:
        assert math.isinf(best)
        return
    assert rel(plan.cost, best), (plan.cost, best)
    assert plan.solver == ("dp" if graph.is_chain else "fork-join dp")


def test_methods_and_refusals_name_what_cannot_be_proven():
    # A DenseNet-like block: b and c consume a, c and d consume b, d consumes a, b, c: not fork-join
    # (the branches from b end at d, the join of the fork at a).
    dense = Graph.from_dict(
        {
            "input_bytes": 1e4,
            "layers": [
                {"name": "a", "flops": 1e9, "param_bytes": 1e5, "output_bytes": 1e4},
                {"name": "b", "flops": 1e9, "param_bytes": 1e5, "output_bytes": 1e4},
                {"name": "c", "flops": 1e9, "param_bytes": 1e5, "output_bytes": 1e4, "inputs": ["a", "b"]},
                {"name": "d", "flops": 1e9, "param_bytes": 1e5, "output_bytes": 1e4, "inputs": ["a", "b", "c"]},
            ],
        }
    )
    with pytest.raises(NotForkJoin, match="the branches from layer 'b' end at the join of an enclosing fork"):
        structure(dense)
    lab = load_cluster("lab")
    with pytest.raises(
        PartitionInputError,
        match=r"solver='dp' covers chains and fork-join.*graph 'graph' is "
        r"neither: .*layer 'b'.*use solver='milp'",
    ):
        autopartition(dense, lab, constraints={"memory": False}, solver="dp")
    assert autopartition(dense, lab).solver in ("milp", "bound", "ideal dp")
    with pytest.raises(PartitionInputError, match="cannot prove the makespan objective on graph 'graph'.*overlap"):
        autopartition(dense, lab, objective="makespan", constraints={"memory": False}, solver="dp")
    with pytest.raises(PartitionInputError, match="the throughput objective needs solver='milp'"):
        autopartition(dense, lab, objective="throughput", solver="dp")
    with pytest.raises(PartitionInputError, match="ship_params is priced by the latency objective"):
        autopartition(dense, lab, objective="makespan", ship_params=True)
    with pytest.raises(PartitionInputError, match="time_limit=0 must be"):
        autopartition(dense, lab, time_limit=0)
    mk = autopartition(dense, lab, objective="makespan")
    assert mk.solver == "milp" and mk.makespan <= autopartition(dense, lab).makespan + 1e-12


@settings(**SMALL)
@given(fork_joins(6), clusters(), weights, st.sampled_from(["latency", "throughput"]))
def test_each_solver_through_the_interface_reaches_the_brute_force_minimum(gd, cd, w, objective):
    """Every ``Solver`` called directly: the DP (latency) and the MILP prove the brute-force
    optimum; the contiguous DP returns a plan no better than it, with no bound."""
    from multigpu.partition.cost.tables import CostTables
    from multigpu.partition.solvers.constraints import Constraints
    from multigpu.partition.solvers.free import free_solver
    from multigpu.partition.solvers.methods import DPSolver, IdealSolver, MilpSolver
    from multigpu.partition.solvers.solver import Budget, Objective

    graph, cluster = Graph.from_dict(gd), Cluster.from_dict(cd)
    tables = CostTables.build(graph, cluster, False)
    cons = Constraints(memory=False).resolve(graph, cluster)
    goal = Objective(objective, *w)
    best = brute(gd, cd, *w)["cost" if objective == "latency" else "bottleneck"]
    free, _ = free_solver(graph)
    assert free is not None
    methods = [MilpSolver(free, forced=True), IdealSolver()] + ([DPSolver(free)] if objective == "latency" else [])
    for method in methods:
        if method.why_not(tables, cons, goal) is not None:
            event(f"{method.name} refused")
            continue
        try:
            sol = method.solve(tables, cons, goal, Budget(gap=0))
        except InfeasibleError:
            assert math.isinf(best)
            continue
        assert sol.value >= best * (1 - 1e-6) - 1e-12 and sol.bound <= best * (1 + 1e-6) + 1e-12
        if sol.proof == "optimal":
            assert rel(sol.value, best), (method.name, sol.value, best)
        event(f"{method.name}: {sol.proof}")
