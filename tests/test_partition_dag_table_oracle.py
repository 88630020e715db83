"""The DAG solvers against the cost tables they read, not against an engine's behaviour.

The chain version is ``test_partition_table_oracle``; this one prices every plan of small
random DAGs (fork-join and general, ``dag_oracle``'s generators) by brute force from
``CostTables`` alone:

* latency (``wt*T + we*E``): each layer's ``node`` entry, a ``stage`` start where a layer
  consumes the input or an input from another device, one transfer per producer and
  distinct other device among its consumers (the sink for the last layer) at
  ``edge_costs`` of the producer's bytes (so an engine's inline regime is in it), and a
  plan with every layer on one device scaled to that device's ``warm_pass``;
* makespan: ``cost.schedule``'s definition (devices run their layers in layer order,
  a link carries one transfer at a time in producer order) replayed here over the
  tables' compute times (``comp``), stage starts and transfer seconds (``edge_costs``
  at wt=1, we=0);
* throughput: each device's compute and stage starts at its ``busy`` rate plus the serial
  part of its ``transfer_cpu``, each link's occupancy (zero on ``cpu_links``), each
  host's CPU-seconds over its cores.

The planner (auto, the fork-join DP, the MILP) must reach the brute-force minimum with
gap=0, with and without memory limits, pins and exclusions; its bound must hold. (This
oracle found the makespan MILP stopping 0.06% short of gap 0 under HiGHS's default
integrality tolerance; a proof now runs it at 1e-9, and the case is a test below.)
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from dag_oracle import clusters, dags, fork_joins
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_partition_oracle import SETTINGS, draw_warm

from multigpu.partition import Cluster, Graph, InfeasibleError, autopartition, evaluate
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.solvers.forkjoin import NotForkJoin, structure

weights = st.sampled_from([(1.0, 0.0), (0.0, 1.0), (1.0, 0.3)])


def every_plan(n: int, k: int) -> np.ndarray:
    """All k^n assignments, one per row."""
    return np.array(list(itertools.product(range(k), repeat=n)), dtype=np.intp).reshape(-1, n)


def sends_of(graph: Graph, cluster: Cluster, a: np.ndarray) -> list[tuple[int, int, int]]:
    """(producer, u, v) of every transfer of plan ``a``: one per producer (-1: the input)
    and distinct other device among its consumers (the sink for the last layer), in
    producer order."""
    out = []
    for p in range(-1, graph.n):
        users = graph.input_consumers if p < 0 else graph.consumers[p]
        targets = {int(a[c]) for c in users} | ({cluster.sink_index} if p == graph.n - 1 else set())
        u = cluster.source_index if p < 0 else int(a[p])
        out += [(p, u, v) for v in sorted(targets) if v != u]
    return out


def starts_of(graph: Graph, a: np.ndarray) -> np.ndarray:
    """Per layer: whether it starts a stage (consumes the input, or an input from another device)."""
    return np.array([any(p < 0 or a[p] != a[i] for p in graph.producers[i]) for i in range(graph.n)])


def warm_scale(tables: CostTables, a: np.ndarray) -> float:
    """The factor on compute and stage starts of plan ``a``: the warm pass over the cold one
    where every layer is on one device that has a warm pass (never above 1), else 1."""
    d = int(a[0])
    warm = tables.warm_pass(d)
    if warm is None or not (a == d).all():
        return 1.0
    cold = tables.comp[:, d].sum() + len(tables.graph.input_consumers) * tables.stage(1.0, 0.0)[d]
    return 1.0 if cold <= 0 else min(1.0, warm / cold)


def price(tables: CostTables, a: np.ndarray, wt: float, we: float) -> dict[str, float]:
    """Cost, makespan and bottleneck of plan ``a`` from the tables (all +inf where a transfer
    needs a pair with no link)."""
    graph, cluster = tables.graph, tables.cluster
    n, k = graph.n, cluster.k
    nb = np.concatenate([[graph.input_bytes], graph.output_bytes])  # index: producer + 1
    sends = sends_of(graph, cluster, a)
    hop = tables.edge_costs(nb, 1.0, 0.0, stage=False)  # seconds of each producer's transfer
    weighted = tables.edge_costs(nb, wt, we, stage=False)
    if any(math.isinf(hop[p + 1, u, v]) for p, u, v in sends):
        return {"cost": math.inf, "makespan": math.inf, "bottleneck": math.inf}
    starts = starts_of(graph, a)
    scale = warm_scale(tables, a)
    rows = np.arange(n)
    # Latency: node and stage terms (the warm pass scales compute and stage starts, never
    # parameter shipping), then the transfers.
    node, comp = tables.node(wt, we)[rows, a], tables.comp[rows, a]
    weight = wt + we * cluster.power[a]
    stage = np.where(starts, tables.stage(wt, we)[a], 0.0)
    cost = node.sum() + stage.sum() - (1.0 - scale) * (weight * comp + stage).sum()
    cost += sum(weighted[p + 1, u, v] for p, u, v in sends)
    # Makespan: replay the schedule over the tables' seconds.
    work = (comp + np.where(starts, tables.stage(1.0, 0.0)[a], 0.0)) * scale
    ready = {(-1, cluster.source_index): 0.0}
    device_free, link_free = np.zeros(k), np.zeros((k, k))
    by_producer: dict[int, list[tuple[int, int]]] = {}
    for p, u, v in sends:
        by_producer.setdefault(p, []).append((u, v))

    def ship(p: int) -> None:
        for u, v in by_producer.get(p, []):
            t0 = max(ready[(p, u)], link_free[u, v])
            ready[(p, v)] = link_free[u, v] = link_free[v, u] = t0 + hop[p + 1, u, v]

    ship(-1)
    for i in range(n):
        d = int(a[i])
        begin = max([device_free[d]] + [ready[(p, d)] for p in graph.producers[i]])
        ready[(i, d)] = device_free[d] = begin + work[i]
        ship(i)
    makespan = ready[(n - 1, cluster.sink_index)]
    # Throughput: device, link and host loads per item.
    own = np.bincount(a, weights=work, minlength=k)
    load = own if scale != 1.0 else own * tables.busy
    cpu = np.zeros(k)
    link = np.zeros((k, k))
    if sends:
        p_, u_, v_ = (np.array(x, dtype=np.intp) for x in zip(*sends))
        _, dev, seconds, serial = tables.transfer_cpu(u_, v_, nb[p_ + 1])
        load = load + np.bincount(dev, weights=serial, minlength=k)
        cpu = np.bincount(dev, weights=seconds, minlength=k)
        np.add.at(link, (u_, v_), cluster.tables.occupancy_seconds(nb[p_ + 1], u_, v_))
        link = link + link.T
        link[tables.cpu_links] = 0.0
    hosts = np.zeros(len(cluster.hosts))
    on = cluster.host_index >= 0
    np.add.at(hosts, cluster.host_index[on], (own * cluster.compute_cores + cpu)[on])
    bottleneck = max(load.max(), link.max(initial=0.0), (hosts / cluster.host_cores).max(initial=0.0))
    return {"cost": float(cost), "makespan": float(makespan), "bottleneck": float(bottleneck)}


def allowed_plans(tables: CostTables, limits: dict) -> np.ndarray:
    """The plans meeting the pins, exclusions and declared memory (parameters plus the
    largest activation per device)."""
    graph, cluster = tables.graph, tables.cluster
    plans = every_plan(graph.n, cluster.k)
    keep = np.ones(len(plans), dtype=bool)
    for layer, dev in limits.get("pinned", {}).items():
        keep &= plans[:, graph.index(layer)] == cluster.names.index(dev)
    for dev in limits.get("excluded", ()):
        keep &= (plans != cluster.names.index(dev)).all(axis=1)
    cap = cluster.memory
    for row in np.flatnonzero(keep):
        a = plans[row]
        for d in np.unique(a):
            used = graph.param_bytes[a == d].sum() + graph.activation_bytes[a == d].max()
            keep[row] &= bool(used <= cap[d] * (1 + 1e-9))
    return plans[keep]


def brute(tables: CostTables, limits: dict, wt: float, we: float) -> dict[str, float]:
    """The least cost, makespan and bottleneck over the allowed plans (+inf where none runs)."""
    best = {"cost": math.inf, "makespan": math.inf, "bottleneck": math.inf}
    for a in allowed_plans(tables, limits):
        for key, value in price(tables, a, wt, we).items():
            best[key] = min(best[key], value)
    return best


@st.composite
def problems(draw, max_n: int = 6, max_k: int = 3, shared: bool = False) -> tuple[dict, dict, dict]:
    """(graph dict with a branch, cluster dict of two or more devices with sometimes a warm pass and a
    memory limit, limits: sometimes a pin or an exclusion)."""
    # Chains are the chain oracle's (test_partition_table_oracle); here every graph branches.
    gd = draw(st.one_of(dags(max_n - 1), fork_joins(max_n)).filter(lambda g: not Graph.from_dict(g).is_chain))
    cd = draw(clusters(max_k, shared=shared).filter(lambda c: len(c["devices"]) > 1))  # one device: nothing to choose
    draw_warm(draw, gd, cd)
    limits: dict = {}
    kind = draw(st.sampled_from(["none", "memory", "pin", "exclude"]))
    if kind == "memory":
        total = sum(x["param_bytes"] for x in gd["layers"]) + max(x["output_bytes"] for x in gd["layers"])
        for d in cd["devices"]:
            if draw(st.booleans()):
                d["memory"] = total * draw(st.sampled_from([0.4, 0.7, 1.0]))
    elif kind == "pin":
        layer = draw(st.sampled_from([x["name"] for x in gd["layers"]]))
        limits["pinned"] = {layer: draw(st.sampled_from([d["name"] for d in cd["devices"]]))}
    elif kind == "exclude" and len(cd["devices"]) > 1:
        limits["excluded"] = [draw(st.sampled_from([d["name"] for d in cd["devices"]]))]
    return gd, cd, limits


def check(gd: dict, cd: dict, limits: dict, objective: str, w: tuple[float, float], solver: str, ship: bool) -> None:
    """The planner's plan (gap 0) reaches the tables' brute-force minimum of ``objective``."""
    graph, cluster = Graph.from_dict(gd), Cluster.from_dict(cd)
    best = brute(CostTables.build(graph, cluster, ship), limits, *w)
    key = {"latency": "cost", "makespan": "makespan", "throughput": "bottleneck"}[objective]
    try:
        plan = autopartition(
            graph, cluster, *w, objective=objective, constraints=limits, ship_params=ship, solver=solver, gap=0
        )
    except InfeasibleError:
        assert math.isinf(best[key]), f"refused, but brute force found {best[key]}"
        event("infeasible")
        return
    # The bound holds, and the plan is as far from the minimum as its gap says at most.
    assert plan.bound <= best[key] * (1 + 1e-6) + 1e-12, (objective, plan.solver, plan.bound, best)
    assert plan.value <= best[key] / (1 - plan.gap) * (1 + 1e-6) + 1e-12, (objective, plan.value, plan.gap, best)
    assert math.isclose(plan.value, best[key], rel_tol=1e-6, abs_tol=1e-12), (objective, plan.solver, plan.value, best)
    event(f"{objective}: {plan.solver}")
    memory = ["memory"] if any("memory" in d for d in cd["devices"]) else []
    event(f"n={graph.n}, k={cluster.k}, {'chain' if graph.is_chain else 'dag'}, limits: {sorted(limits) + memory}")


def dp_applies(gd: dict, cd: dict) -> bool:
    """Whether the forced DP takes this problem: a fork-join graph, no memory limit."""
    try:
        structure(Graph.from_dict(gd))
    except NotForkJoin:
        return False
    return not any("memory" in d for d in cd["devices"])


@settings(max_examples=100, **SETTINGS)
@given(problems(max_n=7), weights, st.booleans(), st.sampled_from(["auto", "dp", "milp"]))
def test_latency_reaches_the_tables_brute_force_minimum(problem, w, ship, solver):
    gd, cd, limits = problem
    if solver == "dp" and not dp_applies(gd, cd):
        solver = "auto"
    check(gd, cd, limits, "latency", w, solver, ship)


@settings(max_examples=80, **SETTINGS)
@given(problems(max_n=6), st.sampled_from(["auto", "milp"]))
def test_makespan_reaches_the_tables_brute_force_minimum(problem, solver):
    check(*problem, "makespan", (1.0, 0.0), solver, False)


@settings(max_examples=60, **SETTINGS)
@given(problems(max_n=6, shared=True), weights, st.sampled_from(["auto", "milp"]))
def test_throughput_reaches_the_tables_brute_force_bottleneck(problem, w, solver):
    check(*problem, "throughput", w, solver, False)


@settings(max_examples=40, **SETTINGS)
@given(problems(max_n=5, shared=True), weights, st.booleans())
def test_the_tables_price_a_dag_plan_as_the_cost_model_does(problem, w, ship):
    """The oracle's price of every plan is ``evaluate``'s (cost, makespan, bottleneck), so a
    plan the planner returns is compared on the same definition."""
    gd, cd, _ = problem
    graph, cluster = Graph.from_dict(gd), Cluster.from_dict(cd)
    tables = CostTables.build(graph, cluster, ship)
    for a in every_plan(graph.n, cluster.k):
        got = price(tables, a, *w)
        if math.isinf(got["cost"]):
            with pytest.raises(Exception, match="no link"):
                evaluate(graph, cluster, list(a), *w, ship)
            continue
        bd = evaluate(graph, cluster, list(a), *w, ship)
        want = {"cost": bd.cost, "makespan": bd.makespan, "bottleneck": bd.bottleneck}
        for key in want:
            assert math.isclose(got[key], want[key], rel_tol=1e-9, abs_tol=1e-15), (key, a, got, want)


def test_the_makespan_milp_proves_gap_0_where_a_slow_device_sets_the_horizon():
    """Four branches from the input join at l4; l1 is heavy. The optimum runs everything on
    the fast d1 (one transfer in, one out); the MILP's plan sends three branch outputs back
    to d0, which the schedule serialises on the link."""

    def layer(name: str, inputs: list[str], flops: float = 0.0) -> dict:
        return {"name": name, "flops": flops, "param_bytes": 0.0, "output_bytes": 100.0, "inputs": inputs}

    gd = {
        "input_bytes": 100.0,
        "layers": [
            layer("l0", ["input"]),
            layer("l1", ["input", "l0"], 1e10),
            layer("l2", ["input"]),
            layer("l3", ["input"]),
            layer("l4", ["input", "l1", "l2", "l3"]),
        ],
    }
    cd = {
        "devices": [{"name": "d0", "flops": 1e9, "power": 0.0}, {"name": "d1", "flops": 1e12, "power": 0.0}],
        "links": [{"between": ["d0", "d1"], "bandwidth": 10**7.5, "latency": 0.0, "power": 0.0}],
        "source": "d0",
    }
    graph, cluster = Graph.from_dict(gd), Cluster.from_dict(cd)
    best = brute(CostTables.build(graph, cluster, False), {}, 1.0, 0.0)["makespan"]
    assert best == pytest.approx(0.01 + 2 * 100 / 10**7.5, rel=1e-12)  # l1's compute, the input in, the output out
    plan = autopartition(graph, cluster, objective="makespan", gap=0)
    assert plan.makespan == pytest.approx(best, rel=1e-9), (plan.assignment, plan.makespan, plan.gap)


@settings(max_examples=80, **SETTINGS)
@given(problems(max_n=6))
def test_the_critical_paths_least_time_bounds_every_plans_makespan(problem):
    """``makespan_bound``: T of the critical path alone, as a chain with the constraints on its
    layers, is at most the brute-force minimum makespan."""
    from multigpu.partition.solvers.constraints import Constraints
    from multigpu.partition.solvers.makespan_bound import makespan_floor, path_bound
    from multigpu.partition.solvers.methods import _solve_chain
    from multigpu.partition.solvers.solver import Budget

    gd, cd, limits = problem
    graph, cluster = Graph.from_dict(gd), Cluster.from_dict(cd)
    tables = CostTables.build(graph, cluster, False)
    cons = Constraints.coerce(limits).resolve(graph, cluster)
    best = brute(tables, limits, 1.0, 0.0)["makespan"]
    bound = path_bound(tables, cons, _solve_chain, Budget(gap=0.0))
    assert bound <= best * (1 + 1e-6) + 1e-12, (bound, best)
    floor = makespan_floor(tables, cons)
    event(
        "no bound (engine profile)"
        if math.isinf(bound)
        else "above the floor"
        if bound > floor * (1 + 1e-9)
        else "at the floor"
    )


@settings(max_examples=80, **SETTINGS)
@given(problems(max_n=6, shared=True))
def test_the_load_balance_bound_and_the_bottleneck_search_against_brute_force(problem):
    """``load_balance_bound`` is at most the brute-force least bottleneck; the local search
    (``bottleneck_search``) from the worst allowed plan returns an allowed plan, priced as the
    cost model prices it, no worse than where it started."""
    import time

    from multigpu.partition.cost.arithmetic import bottleneck_of
    from multigpu.partition.solvers.bottleneck_bound import bottleneck_lower_bound, load_balance_bound
    from multigpu.partition.solvers.bottleneck_search import improve_bottleneck
    from multigpu.partition.solvers.constraints import Constraints
    from multigpu.partition.solvers.search_moves import relays as _relays

    gd, cd, limits = problem
    graph, cluster = Graph.from_dict(gd), Cluster.from_dict(cd)
    tables = CostTables.build(graph, cluster, False)
    cons = Constraints.coerce(limits).resolve(graph, cluster)
    plans = allowed_plans(tables, limits)
    prices = np.array([price(tables, a, 1.0, 0.0)["bottleneck"] for a in plans])
    best = float(prices.min(initial=math.inf))
    bound = load_balance_bound(tables, cons)
    assert bound >= bottleneck_lower_bound(tables, cons)
    assert bound <= best * (1 + 1e-6) + 1e-12, (bound, best)
    finite = np.flatnonzero(np.isfinite(prices))
    if not finite.size:
        event("no plan")
        return
    start = plans[finite[np.argmax(prices[finite])]]
    before = bottleneck_of(graph, cluster, start, warm=False)
    a, value = improve_bottleneck(tables, cons, start, time.perf_counter() + 60)
    assert any((a == p).all() for p in plans), (a, limits)  # it meets the constraints
    assert value == pytest.approx(bottleneck_of(graph, cluster, a, warm=False), rel=1e-12)
    assert value <= before * (1 + 1e-12)
    event("improved" if value < before * (1 - 1e-9) else "kept")
    event("some pair has a faster relay" if (_relays(tables) >= 0).any() else "no relay")
    event("above the simple bound" if bound > bottleneck_lower_bound(tables, cons) * (1 + 1e-9) else "at it")


@settings(max_examples=80, **SETTINGS)
@given(problems(max_n=6, shared=True), st.sampled_from([(1.0, 0.0), (0.5, 0.5), (0.0, 1.0)]))
def test_the_cost_search_against_brute_force(problem, weights):
    """The local search on the cost (``cost_search``), from the dearest allowed plan, returns an
    allowed plan priced as the latency path prices plans, no dearer than its start and no cheaper
    than the brute-force optimum."""
    import time

    from multigpu.partition.solvers.constraints import Constraints
    from multigpu.partition.solvers.cost_search import improve_cost
    from multigpu.partition.solvers.lagrange import cost_if_feasible

    gd, cd, limits = problem
    wt, we = weights
    graph, cluster = Graph.from_dict(gd), Cluster.from_dict(cd)
    tables = CostTables.build(graph, cluster, False)
    cons = Constraints.coerce(limits).resolve(graph, cluster)
    plans = allowed_plans(tables, limits)
    costs = np.array(
        [
            cost_if_feasible(tables, cons, wt, we, a)[0] if np.isfinite(price(tables, a, wt, we)["cost"]) else math.inf
            for a in plans
        ]
    )
    finite = np.flatnonzero(np.isfinite(costs))
    if not finite.size:
        event("no plan")
        return
    best = min(price(tables, plans[i], wt, we)["cost"] for i in finite)  # the warm pass may only lower it
    start = plans[finite[np.argmax(costs[finite])]]
    before = float(costs[finite].max())
    a, value = improve_cost(tables, cons, wt, we, start, time.perf_counter() + 60)
    assert any((a == p).all() for p in plans), (a, limits)  # it meets the constraints
    assert value == pytest.approx(cost_if_feasible(tables, cons, wt, we, a)[0], rel=1e-12)
    assert best * (1 - 1e-9) - 1e-15 <= value <= before * (1 + 1e-12)
    event("improved" if value < before * (1 - 1e-9) else "kept")
    event("reached the optimum" if value <= costs[finite].min() * (1 + 1e-9) else "a local optimum above it")
