"""A MILP stopped by its time limit says how far it got: the "not proven" message quotes the
better of the planner's Lagrangian bound and the bound HiGHS proved (its root cuts lift it
above the LP's), and a proven solve's HiGHS bound meets its optimum."""

from __future__ import annotations

import math

import numpy as np
import pytest

from multigpu.errors import SolverError
from multigpu.partition import Cluster, Graph, LayerSpec, LinkSpec
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.inputs.cluster import DeviceSpec
from multigpu.partition.solvers.constraints import Constraints
from multigpu.partition.solvers.milp import MilpResult, solve_milp
from multigpu.partition.solvers.planner import _check_solved


def test_the_message_quotes_the_better_bound() -> None:
    stopped = MilpResult(1, "time limit reached", np.zeros(3, dtype=np.intp), 2.0, 1.5)
    with pytest.raises(SolverError, match=r"best plan it found has value 2; the lower bound is 1\.5\)"):
        _check_solved(stopped, "latency", 1.0)
    with pytest.raises(SolverError, match=r"the lower bound is 1\.75\)"):
        _check_solved(stopped, "latency", 1.75)
    blind = MilpResult(1, "time limit reached", None, math.inf)  # HiGHS reported no bound
    with pytest.raises(SolverError, match=r"it found no plan; the lower bound is 1\)"):
        _check_solved(blind, "latency", 1.0)


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
