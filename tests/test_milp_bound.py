"""A solve stopped by its time limit before any plan says how far it got: the message quotes
the better of the planner's Lagrangian bound and the bound HiGHS proved (its root cuts lift
it above the LP's), and a proven solve's HiGHS bound meets its optimum."""

from __future__ import annotations

import math

import pytest

from multigpu.errors import SolverError
from multigpu.partition import Cluster, Graph, LayerSpec, LinkSpec
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.inputs.cluster import DeviceSpec
from multigpu.partition.solvers.constraints import Constraints
from multigpu.partition.solvers.methods import _no_plan
from multigpu.partition.solvers.milp import MilpResult, solve_milp


def test_the_message_quotes_the_better_bound() -> None:
    # Only a solve that ends with no plan at all is an error; it quotes the better bound.
    stopped = MilpResult(1, "time limit reached", None, math.inf, 1.5)
    with pytest.raises(SolverError, match=r"no plan for the latency objective .*the lower bound is 1\.5\)"):
        raise _no_plan(stopped, "latency", 1.0)
    with pytest.raises(SolverError, match=r"the lower bound is 1\.75\)"):
        raise _no_plan(stopped, "latency", 1.75)
    blind = MilpResult(1, "time limit reached", None, math.inf)  # HiGHS reported no bound
    with pytest.raises(SolverError, match=r"the lower bound is 1\)"):
        raise _no_plan(blind, "latency", 1.0)
    broken = MilpResult(4, "HiGHS: unbounded", None, math.inf)
    with pytest.raises(SolverError, match="did not solve the placement MILP for the throughput objective"):
        raise _no_plan(broken, "throughput", 1.0)


def test_a_proven_solve_reports_its_bound() -> None:
    layers = tuple(LayerSpec(f"l{i}", flops=1e9 * (i + 1), param_bytes=4e6, output_bytes=1e5) for i in range(4))
    graph = Graph(layers, input_bytes=1e5)
    cluster = Cluster(
        (DeviceSpec("a", 1e12, 100.0, 9e6), DeviceSpec("b", 5e11, 50.0, 9e6), DeviceSpec("c", 2e11, 20.0, 9e6)),
        source="a",
        default_link=LinkSpec(1e9, 1e-4, 2.0),
    )
    cons = Constraints().resolve(graph, cluster)
    res = solve_milp(CostTables.build(graph, cluster, False), cons, 1.0, 0.0, scale=1e3 / 0.01)
    assert res.status == 0 and res.a is not None
    assert res.bound == pytest.approx(res.value, rel=1e-6)
