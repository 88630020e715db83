"""The solvers against the cost tables they read, not against an engine's behaviour.

Every plan of a chain is priced by brute force from ``CostTables`` alone: a layer on a
device (``node``), the input's hop and first stage (``first_edge``), an activation between
two devices with the receiver's stage start (``edge_matrix``, by the edge's bytes, so an
engine's inline regime is in it), the output's hop (``last_edge``), and for a plan with every
layer on one device the warm pass the table gives (``warm_pass``). The throughput objective
takes each plan's bottleneck from the cost model (``bottleneck_of``) over all plans. The
planner must reach the brute-force minimum. Instances are the model oracle's
(``test_partition_oracle.instances``): random hardware, with and without an engine profile;
that oracle checks the tables' arithmetic against the definition, this one the search.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_partition_oracle import SETTINGS, build, close, instances, weights

from multigpu.partition import Constraints, InfeasibleError, autopartition
from multigpu.partition.cost.arithmetic import bottleneck_of
from multigpu.partition.cost.tables import CostTables


def every_plan(n: int, k: int) -> np.ndarray:
    """All k^n assignments of a chain, one per row."""
    return np.array(list(itertools.product(range(k), repeat=n)), dtype=np.intp).reshape(-1, n)


def table_costs(tables: CostTables, wt: float, we: float) -> np.ndarray:
    """The weighted cost of every plan (``every_plan`` order) from the tables alone (+inf
    where a plan needs a pair with no link)."""
    graph, cluster = tables.graph, tables.cluster
    n, k = graph.n, cluster.k
    plans = every_plan(n, k)
    with np.errstate(invalid="ignore"):
        cost = tables.node(wt, we)[np.arange(n), plans].sum(axis=1) + tables.first_edge(wt, we)[plans[:, 0]]
        for i in range(1, n):
            cost += tables.edge_matrix(float(graph.output_bytes[i - 1]), wt, we)[plans[:, i - 1], plans[:, i]]
        cost += tables.last_edge(wt, we)[plans[:, -1]]
    # A plan with every layer on one device runs at that device's warm pass: its compute and
    # its one stage start are scaled to it (never up), the one term the table gives per plan.
    for d in range(k):
        warm = tables.warm_pass(d)
        row = int(np.flatnonzero((plans == d).all(axis=1))[0])
        cold = float(tables.comp[:, d].sum() + cluster.stage_overhead[d])
        if warm is None or cold <= 0 or not np.isfinite(cost[row]):
            continue
        cost[row] -= (1.0 - min(1.0, warm / cold)) * (wt + we * cluster.power[d]) * cold
    return np.where(np.isnan(cost), np.inf, cost)


@settings(max_examples=60, **SETTINGS)
@given(instances(max_n=6, max_k=3), weights, st.booleans(), st.sampled_from(["auto", "dp", "milp"]))
def test_the_planner_reaches_the_tables_brute_force_minimum(inst, w, ship, solver):
    graph, cluster = build(*inst)
    best = table_costs(CostTables.build(graph, cluster, ship), *w).min()
    cons = Constraints(memory=False)
    if not np.isfinite(best):
        with pytest.raises(InfeasibleError):
            autopartition(graph, cluster, *w, constraints=cons, ship_params=ship, solver=solver, gap=0)
        return
    plan = autopartition(graph, cluster, *w, constraints=cons, ship_params=ship, solver=solver, gap=0)
    assert plan.proof == "optimal" and close(plan.cost, best, rel=1e-7), (plan.cost, best)


@settings(max_examples=30, **SETTINGS)
@given(instances(max_n=5, max_k=3), weights)
def test_the_throughput_planner_reaches_the_brute_force_bottleneck(inst, w):
    graph, cluster = build(*inst)
    values = []
    for a in every_plan(graph.n, cluster.k):
        try:
            values.append(bottleneck_of(graph, cluster, a))
        except Exception as e:  # a plan over a pair with no link cannot run
            assert type(e).__name__ == "UnusableLinkError", e
    cons = {"memory": False}
    if not values:
        with pytest.raises(InfeasibleError):
            autopartition(graph, cluster, *w, objective="throughput", constraints=cons, gap=0)
        return
    plan = autopartition(graph, cluster, *w, objective="throughput", constraints=cons, gap=0)
    assert close(plan.bottleneck, min(values), rel=1e-6), (plan.bottleneck, min(values))


def test_the_table_prices_a_plan_as_the_cost_model_does():
    """On a cluster with an engine profile (an inline regime, a warm pass, stage overheads),
    the tables' price of each plan is ``evaluate``'s."""
    from multigpu.partition import Cluster, Graph, evaluate

    graph = Graph.from_dict(
        {
            "input_bytes": 800.0,
            "layers": [
                {"name": "a", "flops": 2e6, "param_bytes": 0.0, "output_bytes": 500.0},
                {"name": "b", "flops": 4e6, "param_bytes": 0.0, "output_bytes": 5000.0},
                {"name": "c", "flops": 1e6, "param_bytes": 0.0, "output_bytes": 100.0},
            ],
        }
    )
    cluster = Cluster.from_dict(
        {
            "devices": [
                {"name": "d0", "flops": 1e9, "power": 10.0, "stage_overhead": 1e-4},
                {"name": "d1", "flops": 3e9, "power": 30.0, "stage_overhead": 2e-4},
            ],
            "links": [{"between": ["d0", "d1"], "bandwidth": 1e6, "latency": 2e-3, "power": 1.0}],
            "source": "d0",
            "engine": {
                "inline_bytes": 1000,
                "inline_latency": [{"between": ["d0", "d1"], "latency": 5e-4}],
                "warm_pass": {"d1": {graph.name: 1e-3}},
            },
        }
    )
    costs = table_costs(CostTables.build(graph, cluster, False), 1.0, 0.5)
    for row, a in enumerate(every_plan(graph.n, cluster.k)):
        assert costs[row] == pytest.approx(evaluate(graph, cluster, list(a), 1.0, 0.5).cost, rel=1e-12), a
