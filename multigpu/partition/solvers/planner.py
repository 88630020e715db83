"""AutoPartition: the exact cheapest placement of a layer chain on a cluster.

* latency objective, no coupling constraint (pins and exclusions are fine): the
  chain DP (O(n k^2));
* latency objective with memory / busy-time / energy constraints: the DP first (if
  its optimum already meets them it is optimal); else the LP relaxation, a
  Lagrangian bound and feasible plans, and (unless they meet) the MILP with the
  provably useless choices fixed (see ``_constrained``);
* throughput objective: the bottleneck MILP, ties broken by cost.

Every reported number comes from ``evaluate`` on the chosen assignment, so a plan's
``time``/``energy``/``cost`` are exactly the cost model's, never a solver's
rounded objective.
"""
from __future__ import annotations

import time as _time
from dataclasses import dataclass
from typing import Any, Mapping, Union

import numpy as np

from multigpu.errors import SolverError
from multigpu.partition.cost.arithmetic import assignment_arrays, bottleneck_of, busy_times, memory_use
from multigpu.partition.cost.evaluate import check_weights, evaluate
from multigpu.partition.cost.records import Breakdown
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.exceptions import PartitionInputError
from multigpu.partition.inputs.cluster import Cluster
from multigpu.partition.inputs.graph import Graph
from multigpu.partition.solvers.constraints import Constraints, ResolvedConstraints
from multigpu.partition.solvers.diagnose import explain_coupled, explain_unreachable, layer_candidates
from multigpu.partition.solvers.dp import solve_chain
from multigpu.partition.solvers.lagrange import cost_if_feasible, fixings, lower_bound, penalise, repair
from multigpu.partition.solvers.milp import build_model, relax, solve_milp
from multigpu.partition.solvers.throughput import solve_throughput
from multigpu.partition.stages import Stage, split_stages

__all__ = ["Plan", "Stage", "autopartition", "OBJECTIVES", "SOLVERS"]

OBJECTIVES = ("latency", "throughput")
# A feasible plan whose cost is within this relative distance of a proven lower
# bound is optimal for every practical purpose (HiGHS would stop there too).
BOUND_GAP = 1e-9
# Seconds for the restricted MILP that looks for a good feasible plan (a heuristic
# step: the exact solve that follows does not depend on it finishing).
RESTRICTED_TIME_LIMIT = 3.0
RESTRICTED_GAP = 1e-2
SOLVERS = ("auto", "dp", "milp")


@dataclass(frozen=True, eq=False)
class Plan:
    """The chosen placement. ``assignment`` lists one device name per layer;
    ``time`` (s), ``energy`` (J), ``cost`` and ``bottleneck`` (s per item when
    pipelined) come from ``evaluate``. ``solver`` says what proved it optimal:
    "dp" (the chain DP), "milp" (HiGHS) or "bound" (a feasible plan met the
    LP/Lagrangian lower bound); ``solve_time`` is in seconds."""

    assignment: list[str]
    time: float
    energy: float
    cost: float
    bottleneck: float
    objective: str
    solver: str
    solve_time: float
    wt: float
    we: float
    ship_params: bool
    breakdown: Breakdown
    constraints: Constraints

    @property
    def stages(self) -> list[Stage]:
        """Consecutive layers grouped by device, in chain order."""
        return split_stages(self.assignment, [layer.name for layer in self.breakdown.layers])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: assignment, time, energy, cost and how it was found."""
        return {"assignment": list(self.assignment), "time": self.time, "energy": self.energy,
                "cost": self.cost, "bottleneck": self.bottleneck, "objective": self.objective,
                "solver": self.solver, "wt": self.wt, "we": self.we, "ship_params": self.ship_params,
                "stages": [{"device": s.device, "first": s.first, "last": s.last, "layers": s.layers}
                           for s in self.stages]}


def _dp(tables: CostTables, cons: ResolvedConstraints, wt: float, we: float) -> tuple[np.ndarray, float]:
    node = np.where(cons.allowed, tables.node(wt, we), np.inf)
    alpha, beta, blocked = tables.edge(wt, we)
    return solve_chain(node, tables.first_edge(wt, we), tables.last_edge(wt, we), alpha, beta,
                       blocked, tables.graph.output_bytes[:-1])


def _violations(tables: CostTables, cons: ResolvedConstraints, a: np.ndarray) -> list[str]:
    graph, cluster = tables.graph, tables.cluster
    # O(n) arrays, not evaluate()'s per-layer records: this runs on every DP answer.
    energy = assignment_arrays(graph, cluster, a, tables.ship_params).energy if cons.has_energy else 0.0
    return cons.violations(cluster, memory_use(graph, cluster, a), busy_times(graph, cluster, tables.comp, a),
                           energy, a)


def _constrained(tables: CostTables, cons: ResolvedConstraints, wt: float, we: float, dp_value: float,
                 solver: str, verbose: bool) -> tuple[np.ndarray, str]:
    """The exact constrained optimum.

    1. LP relaxation (HiGHS): a lower bound, duals and a fractional x.
    2. Feasible plans (upper bounds): repair the Lagrangian chain optimum, and solve
       the MILP restricted to the LP's support for a few seconds.
    3. If a plan meets the Lagrangian bound, it is optimal. Otherwise fix every choice
       whose Lagrangian bound exceeds the best plan (they cannot be optimal) and solve
       the full MILP with that plan's cost as HiGHS's objective cutoff.
    Steps 2-3 only prune what provably cannot be better, so the answer is exact; they
    are what make the MILP fast on realistic sizes.
    """
    model = build_model(tables, cons, wt, we, scale=_scale(dp_value))
    _, mult, x_lp = relax(model)
    if mult is None or x_lp is None:
        # The LP relaxation is infeasible, so the MILP is too.
        raise explain_coupled(tables, cons, wt, we, verbose)
    pen = penalise(tables, cons, wt, we, mult, model.m_ub)
    lower, _ = lower_bound(tables, wt, pen)
    upper, best = repair(tables, cons, wt, we, pen)
    floor = max(dp_value, lower if np.isfinite(lower) else 0.0)
    if not (best is not None and lower >= upper - BOUND_GAP * abs(upper)):
        # A restricted MILP (only the choices the LP uses) usually finds the optimum
        # quickly; it is just a heuristic here, so a time limit is fine.
        quick = solve_milp(tables, cons, wt, we, scale=_scale(floor), fix_x=~(x_lp > 1e-9),
                           verbose=verbose, options={"time_limit": RESTRICTED_TIME_LIMIT,
                                                     "mip_rel_gap": RESTRICTED_GAP})
        if quick.a is not None:
            cost = cost_if_feasible(tables, cons, wt, we, quick.a)
            if not (cost[1] or cost[2] or cost[3]) and cost[0] < upper:
                upper, best = cost[0], quick.a
    if best is not None and solver == "auto" and lower >= upper - BOUND_GAP * abs(upper):
        return best, "bound"
    fix_x = fix_y = None
    options: dict[str, Any] = {}
    scale = _scale(floor)
    if best is not None:
        fix_x, fix_y = fixings(tables, wt, pen, upper)
        options["objective_bound"] = upper * scale * (1 + BOUND_GAP) + 1e-9
    res = solve_milp(tables, cons, wt, we, objective="latency", scale=scale, verbose=verbose,
                     fix_x=fix_x, fix_y=fix_y, options=options)
    if res.a is None and best is not None and (res.status == 2 or "bound" in res.message.lower()):
        # Nothing beats the cutoff: the known plan is optimal.
        return best, "milp"
    if res.status == 2:
        raise explain_coupled(tables, cons, wt, we, verbose)
    if res.status != 0 or res.a is None:
        raise SolverError(f"HiGHS did not solve the placement MILP: {res.message}")
    if best is not None and upper < cost_if_feasible(tables, cons, wt, we, res.a)[0]:
        return best, "milp"  # the cutoff's slack let HiGHS stop at an equal-cost plan
    return res.a, "milp"


def _scale(value: float) -> float:
    # Map the optimum (>= value, a lower bound) to >= 1000 so HiGHS's absolute gap
    # of 1e-6 is a relative 1e-9: the MILP then proves the optimum, not "close".
    if value > 0 and np.isfinite(value):
        return min(1e3 / value, 1e300)   # a denormal value would overflow to inf
    return 1.0


def autopartition(graph: Graph, cluster: Cluster, wt: float = 1.0, we: float = 0.0,
                  objective: str = "latency",
                  constraints: Union[None, Constraints, Mapping[str, Any]] = None, *,
                  ship_params: bool = False, solver: str = "auto", verbose: bool = False) -> Plan:
    """Return the cheapest placement of ``graph`` on ``cluster``.

    ``objective="latency"`` minimises ``wt*T + we*E``; ``"throughput"`` minimises the
    pipelined bottleneck (ties broken by ``wt*T + we*E``). ``constraints`` is a
    ``Constraints`` or a dict of its fields; declared device memory is respected
    unless ``memory=False``. ``solver`` forces "dp" or "milp" (default "auto").
    ``verbose`` prints HiGHS's log.

    Raises PartitionInputError for bad arguments, InfeasibleError (naming the
    binding constraint) when no assignment satisfies the constraints.
    """
    wt, we = check_weights(wt, we)
    if objective not in OBJECTIVES:
        raise PartitionInputError(f"objective={objective!r} is unknown; choose one of {', '.join(OBJECTIVES)}")
    if solver not in SOLVERS:
        raise PartitionInputError(f"solver={solver!r} is unknown; choose one of {', '.join(SOLVERS)}")
    if not isinstance(graph, Graph):
        raise PartitionInputError(f"graph must be a Graph (see load_graph), got {type(graph).__name__}")
    if not isinstance(cluster, Cluster):
        raise PartitionInputError(f"cluster must be a Cluster (see load_cluster), got {type(cluster).__name__}")
    spec = Constraints.coerce(constraints)
    cons = spec.resolve(graph, cluster)
    if solver == "dp" and objective == "throughput":
        raise PartitionInputError("the DP minimises wt*T + we*E; the throughput objective needs "
                                  "solver='milp' or 'auto'")
    if solver == "dp" and cons.coupling:
        active = [name for name, on in (("memory", cons.has_memory), ("busy_time", cons.has_busy),
                                        ("energy_budget", cons.has_energy)) if on]
        raise PartitionInputError(f"solver='dp' cannot enforce the coupling constraint(s) {', '.join(active)}; "
                                  f"use solver='auto' or 'milp' (or memory=False to ignore declared memory)")
    tables = CostTables.build(graph, cluster, bool(ship_params))
    t0 = _time.perf_counter()

    a, value = _dp(tables, cons, wt, we)
    if not np.isfinite(value):
        raise explain_unreachable(tables, cons)
    used = "dp"
    dp_ok = not cons.coupling or not _violations(tables, cons, a)

    if objective == "throughput":
        if not layer_candidates(tables, cons).any(axis=1).all():
            raise explain_coupled(tables, cons, wt, we, verbose)
        known = (a, bottleneck_of(graph, cluster, a)) if dp_ok else None
        a = solve_throughput(tables, cons, wt, we, _scale(value), known,
                             lambda: explain_coupled(tables, cons, wt, we, verbose), verbose)
        used = "milp"
    elif solver == "milp" or not dp_ok:
        if not layer_candidates(tables, cons).any(axis=1).all():
            raise explain_coupled(tables, cons, wt, we, verbose)
        a, used = _constrained(tables, cons, wt, we, value, solver, verbose)
    elapsed = _time.perf_counter() - t0

    broken = _violations(tables, cons, a)
    if broken:  # pragma: no cover - would be a solver or formulation bug
        raise RuntimeError(f"internal error: the {used} plan breaks {'; '.join(broken)}")
    bd = evaluate(graph, cluster, a, wt, we, ship_params)
    return Plan(assignment=bd.assignment, time=bd.time, energy=bd.energy, cost=bd.cost,
                bottleneck=bd.bottleneck, objective=objective, solver=used, solve_time=elapsed,
                wt=wt, we=we, ship_params=bool(ship_params), breakdown=bd, constraints=spec)
