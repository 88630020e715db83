"""AutoPartition: the exact cheapest placement of a layer graph (a chain or any DAG) on a
cluster, and which method proved it.

* latency objective (wt*T + we*E), no coupling constraint (pins and exclusions are
  fine): the chain DP (O(n k^2)) on a chain, the fork-join DP on a series-parallel
  graph ("dp", "fork-join dp"), the MILP on any other DAG;
* latency objective with memory / busy-time / energy constraints: the DP first (if
  its optimum already meets them it is optimal); else the LP relaxation, a
  Lagrangian bound and feasible plans, and (unless they meet: "bound") the MILP with
  the provably useless choices fixed (see ``_constrained``);
* makespan objective: on a chain it is T, so the latency path with (wt, we) = (1, 0);
  on a DAG the makespan MILP (``milp_timing``), exact, for graphs of tens of layers;
* throughput objective: the bottleneck MILP, ties broken by cost;
* last, each plan with every layer on one device, priced at that device's ``warm_pass``
  (``_warm_local``).

Every reported number comes from ``evaluate`` on the chosen assignment, so a plan's
``time``/``energy``/``cost`` are exactly the cost model's, never a solver's
rounded objective.
"""

from __future__ import annotations

import time as _time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from multigpu.checks import check_number
from multigpu.errors import SolverError
from multigpu.partition.cost.arithmetic import (
    assignment_arrays,
    bottleneck_of,
    busy_times,
    memory_use,
    single_device,
    warm_pass_of,
)
from multigpu.partition.cost.evaluate import check_weights, evaluate
from multigpu.partition.cost.records import Breakdown
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.exceptions import PartitionInputError, UnusableLinkError
from multigpu.partition.inputs.cluster import Cluster
from multigpu.partition.inputs.graph import Graph
from multigpu.partition.solvers.constraints import Constraints, ResolvedConstraints
from multigpu.partition.solvers.cutoff import solve_in_rounds, tighten
from multigpu.partition.solvers.diagnose import explain_coupled, explain_unreachable, layer_candidates
from multigpu.partition.solvers.free import FreeSolver, free_solver
from multigpu.partition.solvers.lagrange import cost_if_feasible, lower_bound, penalise, repair
from multigpu.partition.solvers.milp import build_model, relax, solve_milp
from multigpu.partition.solvers.throughput import solve_throughput
from multigpu.partition.stages import Stage

__all__ = ["Plan", "Stage", "autopartition", "OBJECTIVES", "SOLVERS"]

OBJECTIVES = ("latency", "makespan", "throughput")
# A feasible plan whose cost is within this relative distance of a proven lower
# bound is optimal for every practical purpose (HiGHS would stop there too).
BOUND_GAP = 1e-9
# Seconds for the restricted MILP that looks for a good feasible plan (a heuristic
# step: the exact solve that follows does not depend on it finishing).
RESTRICTED_TIME_LIMIT = 3.0
RESTRICTED_GAP = 1e-2
SOLVERS = ("auto", "dp", "milp")
# Seconds for the penalised-DP repair (a heuristic: the rounds that follow find the optimum
# without it). Each of its rounds is one DP, 0.4 s for GoogLeNet on 16 devices, where 15
# rounds gave a plan 12% above the optimum in 6 s.
REPAIR_SECONDS = 1.0


@dataclass(frozen=True, eq=False)
class Plan:
    """The chosen placement. ``assignment`` lists one device name per layer;
    ``time`` (s), ``energy`` (J), ``cost``, ``makespan`` (s, branches overlapping) and
    ``bottleneck`` (s per item when pipelined) come from ``evaluate``. ``solver`` says
    what proved it optimal: "dp" (the chain DP), "fork-join dp", "milp" (HiGHS) or
    "bound" (a feasible plan met the LP/Lagrangian lower bound); ``solve_time`` is in
    seconds.

    For an executor: ``stages`` is a DAG of stages (``multigpu.partition.stages``):
    each names its device, its layers (``members``, in layer order), what it consumes
    from outside (``inputs``) and the stages it waits for (``after``); a stage runs once
    those are done, each activation leaving as soon as its layer is done, and stages on
    different devices whose inputs are ready run at once. ``breakdown.transfers`` lists
    every activation transfer: each producer's output crosses once to each other device
    that consumes it."""

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
    def makespan(self) -> float:
        """When the output reaches the sink, branches on different devices overlapping."""
        return self.breakdown.makespan

    @property
    def stages(self) -> list[Stage]:
        """The stages, a DAG (a chain's are its maximal runs of one device)."""
        return self.breakdown.stages

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: assignment, time, energy, cost, makespan and how it was found,
        the stages (with the layers they hold and the stages they wait for) and the
        transfers."""
        names = [x.name for x in self.breakdown.layers]
        return {
            "assignment": list(self.assignment),
            "time": self.time,
            "energy": self.energy,
            "cost": self.cost,
            "makespan": self.makespan,
            "bottleneck": self.bottleneck,
            "objective": self.objective,
            "solver": self.solver,
            "wt": self.wt,
            "we": self.we,
            "ship_params": self.ship_params,
            "stages": [
                {
                    "device": s.device,
                    "first": s.first,
                    "last": s.last,
                    "layers": s.layers,
                    "members": [names[i] for i in s.members],
                    "after": list(s.after),
                }
                for s in self.stages
            ],
            "transfers": [
                {
                    "producer": t.producer,
                    "to": t.to,
                    "from_device": t.between[0],
                    "to_device": t.between[1],
                    "bytes": t.bytes,
                    "time": t.time,
                }
                for t in self.breakdown.transfers
            ],
        }


def _violations(tables: CostTables, cons: ResolvedConstraints, a: np.ndarray) -> list[str]:
    graph, cluster = tables.graph, tables.cluster
    # O(n) arrays, not evaluate()'s per-layer records: this runs on every DP answer.
    energy = assignment_arrays(graph, cluster, a, tables.ship_params, warm=False).energy if cons.has_energy else 0.0
    return cons.violations(
        cluster, memory_use(graph, cluster, a), busy_times(graph, cluster, tables.comp, a), energy, a
    )


def _constrained(
    tables: CostTables,
    cons: ResolvedConstraints,
    wt: float,
    we: float,
    dp_value: float,
    solver: str,
    verbose: bool,
    free: FreeSolver | None,
    options: dict[str, Any],
) -> tuple[np.ndarray, str]:
    """The exact constrained optimum.

    1. LP relaxation (HiGHS): a lower bound, duals and a fractional x.
    2. Feasible plans (upper bounds): repair the Lagrangian optimum (the graph's DP under
       penalised costs), and solve the MILP restricted to the LP's support for a few
       seconds.
    3. If a plan meets the Lagrangian bound, it is optimal. Otherwise tighten the LP with
       window rows, and solve the MILP in rounds of rising cutoffs, each with the choices
       whose reduced-cost bound exceeds it fixed (``cutoff``), the best plan's cost last.
    Steps 2-3 only prune what provably cannot be better, so the answer is exact; they
    are what make the MILP fast on realistic sizes. A graph without a DP (neither a chain
    nor fork-join) skips the Lagrangian parts: LP bound, restricted MILP, the rounds.
    """
    # The LP whose duals price the Lagrangian leaves out the valid inequalities (the
    # Lagrangian has no term for them: their duals would be lost, and the bound with them).
    model = build_model(tables, cons, wt, we, scale=_scale(dp_value), cuts=False)
    lp, mult, x_lp = relax(model)
    if lp is None or mult is None or x_lp is None:
        # The LP relaxation is infeasible, so the MILP is too.
        raise _infeasible(tables, cons, wt, we, verbose)
    if free is not None:
        pen = penalise(tables, cons, wt, we, mult, model.m_ub)
        lower, _ = lower_bound(tables, free, wt, pen)
        upper, best = repair(tables, free, cons, wt, we, pen, seconds=REPAIR_SECONDS)
    else:
        lower, upper, best = float(lp), np.inf, None
    floor = max(dp_value, lower if np.isfinite(lower) else 0.0)
    if not (best is not None and lower >= upper - BOUND_GAP * abs(upper)):
        # A restricted MILP (only the choices the LP uses) usually finds the optimum
        # quickly; it is just a heuristic here, so a time limit is fine.
        quick = solve_milp(
            tables,
            cons,
            wt,
            we,
            scale=_scale(floor),
            fix_x=~(x_lp > 1e-9),
            verbose=verbose,
            options={"time_limit": RESTRICTED_TIME_LIMIT, "mip_rel_gap": RESTRICTED_GAP},
        )
        if quick.a is not None:
            cost = cost_if_feasible(tables, cons, wt, we, quick.a)
            if not (cost[1] or cost[2] or cost[3]) and cost[0] < upper:
                upper, best = cost[0], quick.a
    if best is not None and solver == "auto" and lower >= upper - BOUND_GAP * abs(upper):
        return best, "bound"
    # The exact solve: the LP tightened by window rows bounds every choice's cost, and the
    # MILP runs in rounds of rising cutoffs with what cannot beat each fixed (``cutoff``).
    base = build_model(tables, cons, wt, we, scale=_scale(floor))
    tight = tighten(base, tables, cons)
    if tight is None:
        raise _infeasible(tables, cons, wt, we, verbose)
    lower = max(lower, tight.bound)
    if best is not None and solver == "auto" and lower >= upper - BOUND_GAP * abs(upper):
        return best, "bound"

    def cost_of(a: np.ndarray) -> float:
        return cost_if_feasible(tables, cons, wt, we, a)[0]

    # The rounds solve the MILP without the window rows: with them, ResNet-50 took 34 s on
    # 16 devices and 20 s on the lab, against 17 and 5 s without (the rows thicken each LP).
    plan, res = solve_in_rounds(base, tight, upper, best, cost_of, options, verbose)
    if plan is not None:
        return plan, "milp"
    assert res is not None
    if res.status == 2:
        raise _infeasible(tables, cons, wt, we, verbose)
    _check_solved(res, "latency", lower)
    raise SolverError(f"HiGHS did not solve the placement MILP for the latency objective: {res.message}")


def _check_solved(res: Any, objective: str, bound: float) -> None:
    """SolverError unless HiGHS proved an optimum (status 0 with a plan)."""
    if res.status == 0 and res.a is not None:
        return
    if res.status == 1:  # time limit
        bound = max(bound, res.bound)  # the better of ours and HiGHS's (its root cuts lift it)
        found = f"the best plan it found has value {res.value:.6g}" if res.a is not None else "it found no plan"
        raise SolverError(
            f"HiGHS did not prove the {objective} optimum within the time limit ({found}; the "
            f"lower bound is {bound:.6g}); raise time_limit (--time-limit), relax the constraints, "
            f"or use a smaller graph"
        )
    raise SolverError(f"HiGHS did not solve the placement MILP for the {objective} objective: {res.message}")


def _scale(value: float) -> float:
    # Map the optimum (>= value, a lower bound) to >= 1000 so HiGHS's absolute gap
    # of 1e-6 is a relative 1e-9: the MILP then proves the optimum, not "close".
    if value > 0 and np.isfinite(value):
        return min(1e3 / value, 1e300)  # a denormal value would overflow to inf
    return 1.0


def _refuse(
    graph: Graph,
    objective: str,
    solver: str,
    ship_params: bool,
    cons: ResolvedConstraints,
    free: FreeSolver | None,
    why_not: str,
) -> None:
    """PartitionInputError for an objective, solver or option the chosen method cannot
    prove or does not model."""
    if objective == "makespan" and ship_params:
        raise PartitionInputError(
            "ship_params is priced by the latency objective (T and E); the makespan times "
            "one pass with the parameters in place: leave out ship_params (--ship-params) or "
            "use objective='latency'"
        )
    if solver != "dp":
        return
    if objective == "throughput":
        raise PartitionInputError(
            "the DP minimises wt*T + we*E; the throughput objective needs solver='milp' or 'auto'"
        )
    if objective == "makespan" and not graph.is_chain:
        raise PartitionInputError(
            f"the DP cannot prove the makespan objective on graph {graph.name!r}: its branches "
            f"overlap in time, which the DP does not model (on a chain the makespan is T); "
            f"use solver='milp' or 'auto'"
        )
    if cons.coupling:
        active = [
            name
            for name, on in (
                ("memory", cons.has_memory),
                ("busy_time", cons.has_busy),
                ("energy_budget", cons.has_energy),
            )
            if on
        ]
        raise PartitionInputError(
            f"solver='dp' cannot enforce the coupling constraint(s) {', '.join(active)}; "
            f"use solver='auto' or 'milp' (or memory=False to ignore declared memory)"
        )
    if free is None:
        raise PartitionInputError(
            f"solver='dp' covers chains and fork-join (series-parallel) graphs, and graph "
            f"{graph.name!r} is neither: {why_not}; use solver='milp' or 'auto'"
        )


def autopartition(
    graph: Graph,
    cluster: Cluster,
    wt: float = 1.0,
    we: float = 0.0,
    objective: str = "latency",
    constraints: None | Constraints | Mapping[str, Any] = None,
    *,
    ship_params: bool = False,
    solver: str = "auto",
    verbose: bool = False,
    time_limit: float | None = None,
) -> Plan:
    """Return the cheapest placement of ``graph`` on ``cluster``.

    ``objective="latency"`` minimises ``wt*T + we*E``; ``"makespan"`` minimises when the
    output reaches the sink with branches running at once (``cost.schedule``);
    ``"throughput"`` minimises the pipelined bottleneck (ties broken by ``wt*T +
    we*E``). ``constraints`` is a ``Constraints`` or a dict of its fields; declared
    device memory is respected unless ``memory=False``. ``solver`` forces "dp" or
    "milp" (default "auto"). ``time_limit`` (seconds, default none) bounds each MILP
    solve. ``verbose`` prints HiGHS's log.

    Raises PartitionInputError for bad arguments (an objective the forced solver cannot
    prove included), InfeasibleError (naming the binding constraint) when no assignment
    satisfies the constraints, SolverError when HiGHS does not prove the optimum in
    ``time_limit``.
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
    options: dict[str, Any] = {}
    if time_limit is not None:
        options["time_limit"] = check_number(
            time_limit, "time_limit", minimum=0.0, strict=True, unit="seconds per MILP solve", error=PartitionInputError
        )
    spec = Constraints.coerce(constraints)
    cons = spec.resolve(graph, cluster)
    free, why_not = free_solver(graph)
    _refuse(graph, objective, solver, bool(ship_params), cons, free, why_not)
    tables = CostTables.build(graph, cluster, bool(ship_params))
    t0 = _time.perf_counter()

    # Latency weights: the makespan on a chain is T.
    lw, le = (1.0, 0.0) if objective == "makespan" else (wt, we)
    if free is not None:
        a, value = free(tables, np.where(cons.allowed, tables.node(lw, le), np.inf), lw, le)
        if not np.isfinite(value):
            raise explain_unreachable(tables, cons)
        used = free.method
        dp_ok = not cons.coupling or not _violations(tables, cons, a)
    else:
        a, value, used, dp_ok = None, 0.0, "milp", False

    if objective == "throughput":
        _check_candidates(tables, cons, wt, we, verbose)
        known = (a, bottleneck_of(graph, cluster, a, warm=False)) if dp_ok and a is not None else None
        a = solve_throughput(
            tables, cons, wt, we, _scale(value), known, lambda: explain_coupled(tables, cons, wt, we, verbose), verbose
        )
        used = "milp"
    elif objective == "makespan" and not graph.is_chain:
        _check_candidates(tables, cons, wt, we, verbose)
        res = solve_milp(
            tables, cons, wt, we, objective="makespan", verbose=verbose, options={"mip_abs_gap": 0.0, **options}
        )
        if res.status == 2:
            raise _infeasible(tables, cons, wt, we, verbose)
        _check_solved(res, "makespan", 0.0)
        a, used = res.a, "milp"
    elif solver == "milp" or not dp_ok:
        _check_candidates(tables, cons, wt, we, verbose)
        a, used = _constrained(tables, cons, lw, le, value, solver, verbose, free, options)
    assert a is not None  # every branch above leaves a plan (dp_ok means the DP's)
    a = _warm_local(graph, cluster, tables, cons, a, objective, wt, we, bool(ship_params))
    elapsed = _time.perf_counter() - t0

    broken = _violations(tables, cons, a)
    if broken:  # pragma: no cover - would be a solver or formulation bug
        raise RuntimeError(f"internal error: the {used} plan breaks {'; '.join(broken)}")
    bd = evaluate(graph, cluster, a, wt, we, ship_params)
    return Plan(
        assignment=bd.assignment,
        time=bd.time,
        energy=bd.energy,
        cost=bd.cost,
        bottleneck=bd.bottleneck,
        objective=objective,
        solver=used,
        solve_time=elapsed,
        wt=wt,
        we=we,
        ship_params=bool(ship_params),
        breakdown=bd,
        constraints=spec,
    )


def _warm_local(
    graph: Graph,
    cluster: Cluster,
    tables: CostTables,
    cons: ResolvedConstraints,
    a: np.ndarray,
    objective: str,
    wt: float,
    we: float,
    ship_params: bool,
) -> np.ndarray:
    """``a``, or a plan with every layer on one device where that one is better.

    The solvers price every plan from the per-layer times; ``evaluate`` prices a plan
    with every layer on one device that has a ``warm_pass`` at that pass, which is never
    more (``arithmetic.warm_scale``). Every other plan costs the same either way, so the
    best of the solvers' optimum and those single-device plans is the optimum. Busy-time
    and energy constraints are checked on the per-layer times (never less than the warm
    ones), so a plan accepted meets them.
    """

    def key(x: np.ndarray) -> tuple[float, ...]:
        bd = evaluate(graph, cluster, x, wt, we, ship_params)
        return {"throughput": (bd.bottleneck, bd.cost), "makespan": (bd.makespan,)}.get(objective, (bd.cost,))

    best, best_key = a, None
    for d in range(cluster.k):
        local = np.full(graph.n, d, dtype=np.intp)
        if (
            warm_pass_of(graph, cluster, d) is None
            or single_device(a) == d
            or not cons.allowed[:, d].all()
            or _violations(tables, cons, local)
        ):
            continue
        try:
            got = key(local)
        except UnusableLinkError:  # no link to or from d: the plan cannot run
            continue
        if best_key is None:
            best_key = key(a)
        if got < best_key:
            best, best_key = local, got
    return best


def _check_candidates(tables: CostTables, cons: ResolvedConstraints, wt: float, we: float, verbose: bool) -> None:
    if not layer_candidates(tables, cons).any(axis=1).all():
        raise explain_coupled(tables, cons, wt, we, verbose)


def _infeasible(tables: CostTables, cons: ResolvedConstraints, wt: float, we: float, verbose: bool) -> Exception:
    """Why a MILP found no plan: the coupling constraints, or (without them) the links."""
    if cons.coupling:
        return explain_coupled(tables, cons, wt, we, verbose)
    return explain_unreachable(tables, cons)
