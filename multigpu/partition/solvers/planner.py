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

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from multigpu.checks import check_number
from multigpu.partition.cost.arithmetic import single_device
from multigpu.partition.cost.evaluate import check_weights, evaluate
from multigpu.partition.cost.records import Breakdown
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.exceptions import PartitionInputError, UnusableLinkError
from multigpu.partition.inputs.cluster import Cluster
from multigpu.partition.inputs.graph import Graph
from multigpu.partition.solvers.constraints import Constraints, ResolvedConstraints
from multigpu.partition.solvers.free import FreeSolver, free_solver
from multigpu.partition.solvers.methods import DPSolver, IdealSolver, MilpSolver, violations
from multigpu.partition.solvers.solver import DEFAULT_GAP, PROVE_GAP, Budget, Objective, Solver, relative_gap
from multigpu.partition.solvers.throughput import CAP_SLACK
from multigpu.partition.stages import Stage

__all__ = ["DEFAULT_GAP", "OBJECTIVES", "Plan", "SOLVERS", "Stage", "autopartition", "choose"]

OBJECTIVES = ("latency", "makespan", "throughput")
SOLVERS = ("auto", "dp", "milp", "ideal")


@dataclass(frozen=True, eq=False)
class Plan:
    """The chosen placement. ``assignment`` lists one device name per layer;
    ``time`` (s), ``energy`` (J), ``cost``, ``makespan`` (s, branches overlapping) and
    ``bottleneck`` (s per item when pipelined) come from ``evaluate``. ``solver`` names
    the method that found it: "dp" (the chain DP), "fork-join dp", "milp" (HiGHS) or
    "bound" (a feasible plan within the gap of the LP/Lagrangian lower bound);
    ``solve_time`` is in seconds. ``bound`` is a proven lower bound on every plan's value
    of the objective (the cost, makespan or bottleneck) and ``gap`` the plan's relative
    distance from it, (value - bound) / value: ``proof`` is "optimal" when it is at most
    1e-9, "gap" otherwise (the gap asked for, or the time limit struck first).

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
    bound: float = -math.inf
    gap: float = math.inf

    @property
    def proof(self) -> str:
        """ "optimal" (the bound meets the value to 1e-9), "gap" (a finite proven gap) or
        "heuristic" (no bound)."""
        return "optimal" if self.gap <= PROVE_GAP else ("gap" if math.isfinite(self.gap) else "heuristic")

    @property
    def value(self) -> float:
        """The plan's value of its objective: ``cost``, ``makespan`` or ``bottleneck``."""
        return _value_of(self.breakdown, self.objective)

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
            "bound": self.bound if math.isfinite(self.bound) else None,
            "gap": self.gap if math.isfinite(self.gap) else None,
            "proof": self.proof,
            "solve_time": self.solve_time,
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


def choose(
    solver: str,
    graph: Graph,
    objective: Objective,
    cons: ResolvedConstraints,
    free: FreeSolver | None,
    tables: CostTables,
) -> Solver:
    """The method for this problem: the exact DP of the graph's form where it proves the
    objective (latency, or the makespan on a chain, without coupling constraints), else the
    MILP path (which starts from the contiguous DP's plan). ``solver`` "dp", "milp" or "ideal"
    (the contiguous DP alone: the best plan whose stages run in a sequence, one per device,
    with no bound) forces one (``_refuse`` has said why a forced DP cannot apply).
    Raises PartitionInputError when the forced contiguous DP does not apply."""
    dp = DPSolver(free) if free is not None else None
    if solver == "milp":
        return MilpSolver(free, forced=True)
    if solver == "ideal":
        ideal = IdealSolver()
        why = ideal.why_not(tables, cons, objective)
        if why is not None:
            raise PartitionInputError(f"solver='ideal' (the contiguous DP) cannot solve this: {why}; use solver='auto'")
        return ideal
    if dp is not None and (solver == "dp" or dp.why_not(tables, cons, objective) is None):
        return dp
    return MilpSolver(free)


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
    gap: float = DEFAULT_GAP,
    progress: Callable[[str], None] | None = None,
) -> Plan:
    """Return the cheapest placement of ``graph`` on ``cluster``, within a proven gap.

    ``objective="latency"`` minimises ``wt*T + we*E``; ``"makespan"`` minimises when the
    output reaches the sink with branches running at once (``cost.schedule``);
    ``"throughput"`` minimises the pipelined bottleneck (among the plans within the gap,
    the one of least ``wt*T + we*E``). ``constraints`` is a ``Constraints`` or a dict of its
    fields; declared device memory is respected unless ``memory=False``. ``solver`` forces
    "dp", "milp" or "ideal" (the contiguous DP over the graph's ideals; default "auto"). The
    solve stops once its plan is proven within the relative ``gap`` of the optimum (default
    0.1%; 0 proves the optimum, to 1e-9), or at ``time_limit`` seconds in all (default none)
    with the best plan found: ``Plan.gap`` and ``Plan.bound`` say how far from the optimum it
    may be. ``progress`` receives a line per step of the solve; ``verbose`` prints HiGHS's
    log.

    Raises PartitionInputError for bad arguments (an objective the forced solver cannot
    prove included), InfeasibleError (naming the binding constraint) when no assignment
    satisfies the constraints, SolverError when the time limit struck before any plan was
    found.
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
    if time_limit is not None:
        time_limit = check_number(
            time_limit, "time_limit", minimum=0.0, strict=True, unit="seconds", error=PartitionInputError
        )
    gap = check_number(
        gap,
        "gap",
        minimum=0.0,
        maximum=0.5,
        unit="(relative: 0.001 is 0.1%; 0 proves the optimum)",
        example=0.001,
        error=PartitionInputError,
    )
    spec = Constraints.coerce(constraints)
    cons = spec.resolve(graph, cluster)
    free, why_not = free_solver(graph)
    _refuse(graph, objective, solver, bool(ship_params), cons, free, why_not)
    tables = CostTables.build(graph, cluster, bool(ship_params))
    budget = Budget(time_limit=time_limit, gap=gap, progress=progress, verbose=verbose)
    goal = Objective(objective, wt, we)
    method = choose(solver, graph, goal, cons, free, tables)
    sol = method.solve(tables, cons, goal, budget)
    a, bound = _warm_local(graph, cluster, tables, cons, sol.a, sol.bound, goal, bool(ship_params), budget.gap)
    elapsed = budget.elapsed()

    broken = violations(tables, cons, a)
    if broken:  # pragma: no cover - would be a solver or formulation bug
        raise RuntimeError(f"internal error: the {sol.method} plan breaks {'; '.join(broken)}")
    bd = evaluate(graph, cluster, a, wt, we, ship_params)
    value = _value_of(bd, objective)
    bound = min(bound, value)
    budget.say(f"done: {objective} {value:.6g}, bound {bound:.6g} (gap {relative_gap(value, bound):.3g})")
    return Plan(
        assignment=bd.assignment,
        time=bd.time,
        energy=bd.energy,
        cost=bd.cost,
        bottleneck=bd.bottleneck,
        objective=objective,
        solver=sol.method,
        solve_time=elapsed,
        wt=wt,
        we=we,
        ship_params=bool(ship_params),
        breakdown=bd,
        constraints=spec,
        bound=bound,
        gap=relative_gap(value, bound),
    )


def _value_of(bd: Breakdown, objective: str) -> float:
    """A breakdown's value of the objective."""
    return {"throughput": bd.bottleneck, "makespan": bd.makespan}.get(objective, bd.cost)


def _warm_local(
    graph: Graph,
    cluster: Cluster,
    tables: CostTables,
    cons: ResolvedConstraints,
    a: np.ndarray,
    bound: float,
    goal: Objective,
    ship_params: bool,
    gap: float,
) -> tuple[np.ndarray, float]:
    """``a``, or a plan with every layer on one device where that one is better; and the
    lower bound on every plan, ``bound`` (the solver's, over the per-layer prices) lowered
    to the best single-device plan's value where that is less.

    The solvers price every plan from the per-layer times; ``evaluate`` prices a plan
    with every layer on one device that has a ``warm_pass`` at that pass, which is never
    more (``arithmetic.warm_scale``). Every other plan costs the same either way, so the
    best of the solvers' plan and those single-device plans is as close to the optimum as
    the solver's. Among the plans within the gap of the bound, the cheapest per item wins
    (the throughput objective's tie-break). Busy-time and energy constraints are checked on
    the per-layer times (never less than the warm ones), so a plan accepted meets them.
    """

    def key(x: np.ndarray) -> tuple[float, float]:
        bd = evaluate(graph, cluster, x, goal.wt, goal.we, ship_params)
        return _value_of(bd, goal.name), bd.cost

    found: list[tuple[np.ndarray, tuple[float, float]]] = []
    for d in range(cluster.k):
        local = np.full(graph.n, d, dtype=np.intp)
        if tables.warm_pass(d) is None or single_device(a) == d or not cons.allowed[:, d].all():
            continue
        try:
            if not violations(tables, cons, local):
                found.append((local, key(local)))
        except UnusableLinkError:  # no link to or from d: the plan cannot run
            continue
    if not found:
        return a, bound
    found.insert(0, (a, key(a)))
    least = min(k[0] for _, k in found)
    bound = min(bound, least)
    # Plans whose value is within the gap of the bound are ties; the cheapest per item wins,
    # the solver's plan on a tie. A proof keeps the bottleneck MILP's tie slack (``CAP_SLACK``),
    # so that a warm single-device plan 1e-8 below another does not win a 0.2% dearer pass.
    slack = CAP_SLACK if goal.name == "throughput" else 0.0
    within = max(least * (1 + slack), bound / (1 - gap) if gap > 0 else least)
    best, _ = min(((x, k) for x, k in found if k[0] <= within), key=lambda xk: xk[1][1])
    return best, bound
