"""The placement methods behind the ``Solver`` interface (``solver``): the exact DPs
(the chain DP and the fork-join DP, for the latency objective without coupling
constraints), the contiguous DP over the graph's ideals (``ideals``) and the MILP path
(HiGHS, with the DP, the Lagrangian and the rounds of cutoffs around it; the bottleneck
MILP for throughput; the makespan MILP on graphs with branches).

Every method returns a ``Solution``: its plan, value and a proven lower bound, so the
planner can report the gap whatever stopped the solve.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from multigpu.errors import SolverError
from multigpu.partition.cost.arithmetic import assignment_arrays, bottleneck_of, weighted_cost
from multigpu.partition.cost.schedule import makespan_of
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.exceptions import UnusableLinkError
from multigpu.partition.solvers.constraints import ResolvedConstraints, violations
from multigpu.partition.solvers.cost_search import search_in_child as cost_search_in_child
from multigpu.partition.solvers.cutoff import solve_in_rounds, tighten
from multigpu.partition.solvers.diagnose import explain_coupled, explain_unreachable, layer_candidates
from multigpu.partition.solvers.fill import fill_plan
from multigpu.partition.solvers.free import FreeSolver
from multigpu.partition.solvers.ideals import IDEAL_LIMIT, TooManyIdeals, contiguous_optimum, ideals, why_not_contiguous
from multigpu.partition.solvers.lagrange import cost_if_feasible, lower_bound, penalise, repair
from multigpu.partition.solvers.makespan_bound import makespan_floor, path_bound
from multigpu.partition.solvers.makespan_milp import collect, solve_makespan_milp, start_in_child
from multigpu.partition.solvers.milp import LpTimeLimit, MilpResult, build_model, none_below_cutoff, relax, solve_milp
from multigpu.partition.solvers.search_beside import SearchBeside
from multigpu.partition.solvers.solver import DEFAULT_GAP, PROVE_GAP, Budget, Objective, Solution, Solver
from multigpu.partition.solvers.throughput import solve_throughput

__all__ = ["AUTO_IDEALS", "DPSolver", "IdealSolver", "MilpSolver", "contiguous_plan", "violations"]

# Seconds for the restricted MILP that looks for a good feasible plan (a heuristic
# step: the exact solve that follows does not depend on it finishing).
RESTRICTED_TIME_LIMIT = 3.0
RESTRICTED_GAP = 1e-2
# Seconds for the penalised-DP repair (a heuristic: the rounds that follow find the optimum
# without it). Each of its rounds is one DP, 0.4 s for GoogLeNet on 16 devices, where 15
# rounds gave a plan 12% above the optimum in 6 s.
REPAIR_SECONDS = 1.0
# Seconds the heuristics that look for a first plan may take even once the time limit has
# passed: a time limit returns a plan (the target: within 10% or 1 s of the limit).
FIRST_PLAN_SECONDS = 0.5
# The local search on the cost (``cost_search``) sleeps this share of the time left, at most
# this many seconds (and these seconds without a time limit), before its imports: a solve
# proven by then pays nothing for it. A shorter cap than the throughput search's (10 s): the
# latency proofs it speeds up take seconds, and its plan must reach the rounds early.
COST_SEARCH_DELAY = (0.1, 1.0)


def _first(budget: Budget) -> float:
    """Seconds for a heuristic looking for the first plan: what is left, at least FIRST_PLAN_SECONDS."""
    return max(budget.left(), FIRST_PLAN_SECONDS)


# The planner runs the contiguous DP for a starting plan on graphs up to this many ideals
# (its work grows with their square: ResNet-50's 240 take about a second on 5 devices).
AUTO_IDEALS = 1_000


def contiguous_plan(
    tables: CostTables, cons: ResolvedConstraints, objective: Objective, budget: Budget, limit: int = AUTO_IDEALS
) -> np.ndarray | None:
    """The contiguous DP's plan (``ideals``) for the objective (the latency weights for the
    makespan), or None where the DP does not apply, the graph has more than ``limit``
    ideals, or its plan breaks a constraint the DP does not see (an energy budget)."""
    name = "throughput" if objective.name == "throughput" else "latency"
    if why_not_contiguous(tables, name) is not None:
        return None
    lw, le = _weights(objective)
    try:
        found = contiguous_optimum(tables, cons, name, lw, le, limit=limit)
    except TooManyIdeals:
        return None
    if found is None or violations(tables, cons, found.a):
        return None
    budget.say(f"contiguous DP over the ideals: a plan at {found.value:.6g} (its own price, an upper bound)")
    return found.a


def single_device_plans(tables: CostTables, cons: ResolvedConstraints) -> list[np.ndarray]:
    """Every plan that runs the whole graph on one device (pinned layers on their pin) and
    breaks no constraint: starting plans the MILP can always have, so that a time limit
    returns a plan even where no DP applies (a DAG with too many ideals)."""
    n, k = cons.allowed.shape
    out = []
    for d in range(k):
        if cons.excluded and d in cons.excluded:
            continue
        a = np.full(n, d, dtype=int)
        for i, pin in cons.pins.items():
            a[i] = pin
        if not cons.allowed[np.arange(n), a].all():
            continue
        if _runs(tables, cons, a):
            out.append(a)
    return out


def _runs(tables: CostTables, cons: ResolvedConstraints, a: np.ndarray) -> bool:
    """Whether plan ``a`` breaks no constraint and every transfer of it has a link."""
    try:
        if violations(tables, cons, a):
            return False
        assignment_arrays(tables.graph, tables.cluster, a, tables.ship_params, warm=False)
    except UnusableLinkError:  # the input, or an activation, cannot reach a device
        return False
    return True


def _weights(objective: Objective) -> tuple[float, float]:
    """The latency weights a DP or the latency MILP uses: the makespan on a chain is T."""
    return (1.0, 0.0) if objective.name == "makespan" else (objective.wt, objective.we)


class DPSolver(Solver):
    """The exact DP of the graph's form (``free.FreeSolver``: "dp" for a chain, "fork-join
    dp"): the optimum of wt*T + we*E (or of T, the makespan on a chain) with pins and
    exclusions, no coupling constraint."""

    def __init__(self, free: FreeSolver) -> None:
        self.free = free
        self.name = free.method

    def why_not(self, tables: CostTables, cons: ResolvedConstraints, objective: Objective) -> str | None:
        """Why the DP cannot prove this problem (an objective or a coupling constraint), or None."""
        if objective.name == "throughput":
            return "the DP minimises wt*T + we*E, not the throughput bottleneck"
        if objective.name == "makespan" and not tables.graph.is_chain:
            return "branches overlap in time, which the DP does not model (on a chain the makespan is T)"
        if cons.coupling:
            return "the DP cannot enforce memory, busy-time or energy constraints"
        return None

    def run(self, tables: CostTables, cons: ResolvedConstraints, objective: Objective) -> Solution:
        """The DP's optimum with pins and exclusions but without coupling constraints (a lower
        bound when they bind). Raises the unreachable-device InfeasibleError when no
        assignment is allowed."""
        lw, le = _weights(objective)
        a, value = self.free(tables, np.where(cons.allowed, tables.node(lw, le), np.inf), lw, le)
        if not np.isfinite(value):
            raise explain_unreachable(tables, cons)
        return Solution(a, value, value, self.name)

    def solve(self, tables: CostTables, cons: ResolvedConstraints, objective: Objective, budget: Budget) -> Solution:
        """The exact optimum (a DP takes no time limit: it is polynomial)."""
        return self.run(tables, cons, objective)


class IdealSolver(Solver):
    """The contiguous DP over the graph's ideals (``ideals``): the best plan in which each
    device holds one convex stage, priced with each transfer at its dearest link. A heuristic
    for the full problem (no lower bound), exact among contiguous plans where links into and
    out of each device cost the same (latency)."""

    name = "ideal dp"

    def why_not(self, tables: CostTables, cons: ResolvedConstraints, objective: Objective) -> str | None:
        """Why the contiguous DP does not apply (objective, engine terms, too many ideals), or None."""
        why = why_not_contiguous(tables, objective.name)
        if why is None:
            try:
                ideals(tables.graph, IDEAL_LIMIT)
            except TooManyIdeals as e:
                why = str(e)
        return why

    def solve(self, tables: CostTables, cons: ResolvedConstraints, objective: Objective, budget: Budget) -> Solution:
        """The contiguous optimum, priced by the solvers' model; the bound is -inf (heuristic)."""
        a = contiguous_plan(tables, cons, objective, budget, limit=IDEAL_LIMIT)
        if a is None:
            raise _infeasible(tables, cons, objective.wt, objective.we, budget.verbose)
        return Solution(a, _value(tables, objective, a), -np.inf, self.name)


def _value(tables: CostTables, objective: Objective, a: np.ndarray) -> float:
    """Plan ``a``'s value of the objective as the solvers price it (per-layer times)."""
    if objective.name == "throughput":
        return bottleneck_of(tables.graph, tables.cluster, a, warm=False)
    if objective.name == "makespan":
        return _makespan(tables, a)
    return weighted_cost(tables.graph, tables.cluster, a, tables.ship_params, objective.wt, objective.we, warm=False)


class MilpSolver(Solver):
    """The MILP path for every objective and constraint: for latency, the DP (when the graph
    has one) as a start, then the LP, the Lagrangian, a restricted MILP and the rounds of
    cutoffs (``_constrained``); the bottleneck MILP with a tie-break by cost for throughput;
    the makespan MILP on a graph with branches. ``forced`` (``solver="milp"``) names every
    plan "milp" and skips the shortcuts that return a plan meeting the LP bound. ``search``
    runs the local search on the cost beside a latency solve where memory binds (not when
    forced: the answer is then the MILP's alone)."""

    name = "milp"

    def __init__(self, free: FreeSolver | None, forced: bool = False, search: bool = True) -> None:
        self.free = free
        self.forced = forced
        self.search = search and not forced

    def why_not(self, tables: CostTables, cons: ResolvedConstraints, objective: Objective) -> str | None:
        """The MILP takes every problem."""
        return None

    def solve(self, tables: CostTables, cons: ResolvedConstraints, objective: Objective, budget: Budget) -> Solution:
        """The best plan within the budget and its proven bound."""
        wt, we = objective.wt, objective.we
        lw, le = _weights(objective)
        dp = DPSolver(self.free).run(tables, cons, objective) if self.free is not None else None
        dp_ok = dp is not None and (not cons.coupling or not violations(tables, cons, dp.a))
        # The latency weights (and the makespan on a chain, which is T): the DP's optimum
        # meets the coupling constraints, so it is the optimum.
        latency_like = objective.name == "latency" or (objective.name == "makespan" and tables.graph.is_chain)
        if dp_ok and latency_like and not self.forced:
            assert dp is not None
            return dp
        _check_candidates(tables, cons, wt, we, budget.verbose)
        ideal = contiguous_plan(tables, cons, objective, budget)
        # The DPs' plans, and every single-device plan: whatever the time limit, a plan to return.
        dp_plans = ([dp.a] if dp_ok and dp is not None else []) + ([ideal] if ideal is not None else [])
        # Where memory binds, no single device may hold the graph; the memory fill is a plan in
        # milliseconds, so that the steps before HiGHS's first plan can stop at the time limit.
        filled = _filled(tables, cons) if budget.time_limit is not None else None
        starts = dp_plans
        if objective.name in ("throughput", "makespan"):
            starts = starts + single_device_plans(tables, cons) + ([filled] if filled is not None else [])
        if objective.name == "throughput":
            priced = [(a, _value(tables, objective, a)) for a in starts]
            finite = [(a, v) for a, v in priced if np.isfinite(v)]
            # Only a DP's plan, near the optimum, caps HiGHS's bottleneck column; a single-device plan
            # stands by for a time limit (``solve_throughput``).
            cap = min((v for _, v in priced[: len(dp_plans)] if np.isfinite(v)), default=None)
            return solve_throughput(
                tables,
                cons,
                wt,
                we,
                _scale(dp.value if dp is not None else 0.0),
                min(finite, key=lambda av: av[1], default=None),
                lambda: explain_coupled(tables, cons, wt, we, budget.verbose),
                budget,
                cap=cap,
                # A second start for the local search: the fill spreads the parameters over the
                # devices in order, another basin than the best start's few devices.
                search_from=[filled] if filled is not None else [],
            )
        start: tuple[np.ndarray, str] | None = None
        if ideal is not None:
            start = (ideal, "ideal dp")
        elif filled is not None:
            start = (filled, "fill")
        if objective.name == "makespan" and not tables.graph.is_chain:
            return self._makespan(tables, cons, objective, dp if dp_ok else None, dp, start, starts, budget)
        # The local search beside the MILP starts from the best starting plan (the memory fill
        # where there is none); from one only, so that its plan comes early enough for the rounds.
        first = start[0] if start is not None else _filled(tables, cons)
        search_from = [first] if first is not None and self.search else None
        return _constrained(tables, cons, lw, le, dp, self.forced, self.free, budget, start, search_from)

    def _makespan(
        self,
        tables: CostTables,
        cons: ResolvedConstraints,
        objective: Objective,
        free_optimum: Solution | None,
        dp: Solution | None,
        start: tuple[np.ndarray, str] | None,
        starts: list[np.ndarray],
        budget: Budget,
    ) -> Solution:
        """The makespan on a graph with branches: the makespan MILP, beside the plan of least T.

        Every plan's makespan is at most its T (its layers can always run one after another),
        so the least-T plan, which the latency path finds fast, is a makespan plan, and often
        a good one: the makespan MILP's big-M rows give a weak LP, and on ResNet-sized graphs
        it does not finish its root in a minute. Under a time limit, with a plan in hand, the
        MILP runs in a child process (``makespan_milp``) while this one looks for the least-T
        plan; the best makespan of all the plans is the answer."""
        plans = list(starts)
        cutoff = min((_makespan(tables, a) for a in plans), default=np.inf)  # what the MILP must beat
        child = None
        if budget.deadline is not None and plans:
            budget.say("makespan MILP, in a child process")
            child = start_in_child(tables, cons, objective.wt, objective.we, budget, cutoff)
        try:
            # The critical path's bound gets a third of the time left; it is a chain, and its
            # solve is usually done long before. It is only a bound: the default gap will do,
            # even for a proof (which the MILP gives).
            floor = path_bound(tables, cons, _solve_chain, dataclasses.replace(_share(budget, 3), gap=DEFAULT_GAP))
            # Alone, the least-T search leaves the MILP half the time.
            least = self._least_time(tables, cons, free_optimum, dp, start, _share(budget, 1 if child else 2))
            spans = [_makespan(tables, a) for a in plans + ([least] if least is not None else [])]
            floor = max(floor, makespan_floor(tables, cons))
            if spans and budget.done(min(spans), floor):
                # The critical path's bound already proves a plan in hand: the MILP has nothing to add.
                res, lp_bound = (
                    MilpResult(1, "not needed: a plan is proven by the critical path", None, np.inf),
                    -np.inf,
                )
            elif child is not None:
                assert budget.deadline is not None
                res, lp_bound = collect(child, budget.deadline)
            else:
                if least is not None:
                    cutoff = min(cutoff, _makespan(tables, least))
                budget.say("makespan MILP")
                res, lp_bound = solve_makespan_milp(
                    tables,
                    cons,
                    objective.wt,
                    objective.we,
                    budget,
                    has_plan=bool(plans) or least is not None,
                    cutoff=cutoff,
                )
        finally:
            if child is not None:
                child.cancel()  # an interrupt, or an error above: the child goes too
        if least is not None:
            plans.append(least)
        if res.status == 2 and not plans:
            raise _infeasible(tables, cons, objective.wt, objective.we, budget.verbose)
        # With a cutoff, HiGHS's bound covers only the plans below it.
        held = min(res.bound if np.isfinite(res.bound) else -np.inf, cutoff)
        if np.isfinite(cutoff) and none_below_cutoff(res):
            held = cutoff  # HiGHS searched every plan below the cutoff and found none
        elif res.a is not None and res.status == 0:
            held = max(held, res.value * (1 - max(budget.gap, PROVE_GAP)))
        bound = max(held, lp_bound, floor)
        if res.a is not None:
            plans.append(res.a)
        if not plans:
            raise _no_plan(res, "makespan", bound)
        spans = [_makespan(tables, a) for a in plans]
        best = int(np.argmin(spans))
        return Solution(plans[best], spans[best], min(bound, spans[best]), "milp")

    def _least_time(
        self,
        tables: CostTables,
        cons: ResolvedConstraints,
        free_optimum: Solution | None,
        dp: Solution | None,
        start: tuple[np.ndarray, str] | None,
        budget: Budget,
    ) -> np.ndarray | None:
        """The plan of least T (latency weights (1, 0)) within ``budget``: the DP's where it
        meets the constraints (``free_optimum``), else the latency path's best plan; None where
        that found no plan in time."""
        if free_optimum is not None:
            return free_optimum.a
        budget.say("the plan of least T (its makespan is at most its T)")
        try:
            return _constrained(tables, cons, 1.0, 0.0, dp, False, self.free, budget, start).a
        except SolverError:  # no plan by the time limit, or HiGHS failed: the MILP's plans remain
            return None


def _share(budget: Budget, parts: int) -> Budget:
    """``budget`` with a time limit at 1/``parts`` of the time it has left (the same budget
    without a time limit)."""
    if budget.time_limit is None or parts == 1:
        return budget
    return dataclasses.replace(budget, time_limit=budget.elapsed() + budget.left() / parts)


def _solve_chain(tables: CostTables, cons: ResolvedConstraints, objective: Objective, budget: Budget) -> Solution:
    """The planner's latency solve of a chain (``makespan_bound``'s critical path): a bound only,
    computed while the makespan MILP's child has the second core, so without the local search."""
    return MilpSolver(FreeSolver("dp", None), search=False).solve(tables, cons, objective, budget)


def _filled(tables: CostTables, cons: ResolvedConstraints) -> np.ndarray | None:
    """The memory fill's plan (``fill``) where it breaks no constraint and every transfer has
    a link, else None."""
    a = fill_plan(tables, cons)
    return a if a is not None and _runs(tables, cons, a) else None


def _makespan(tables: CostTables, a: np.ndarray) -> float:
    """The makespan of plan ``a`` as the makespan MILP prices it (per-layer times)."""
    x = assignment_arrays(tables.graph, tables.cluster, a, tables.ship_params, warm=False)
    return makespan_of(tables.graph, tables.cluster, x)


def _constrained(
    tables: CostTables,
    cons: ResolvedConstraints,
    wt: float,
    we: float,
    dp: Solution | None,
    forced: bool,
    free: FreeSolver | None,
    budget: Budget,
    start: tuple[np.ndarray, str] | None = None,
    search_from: list[np.ndarray] | None = None,
) -> Solution:
    """The constrained optimum, to the budget's gap (or its best plan at the time limit).

    1. LP relaxation (HiGHS): a lower bound, duals and a fractional x.
    2. Feasible plans (upper bounds): repair the Lagrangian optimum (the graph's DP under
       penalised costs), and solve the MILP restricted to the LP's support for a few
       seconds.
    3. If a plan meets the Lagrangian bound (to the gap), it is returned. Otherwise tighten
       the LP with window rows, and solve the MILP in rounds of rising cutoffs, each with the
       choices whose reduced-cost bound exceeds it fixed (``cutoff``), the best plan's cost
       last.
    Steps 2-3 only prune what provably cannot be better, so the bound is exact; they
    are what make the MILP fast on realistic sizes. A graph without a DP (neither a chain
    nor fork-join) skips the Lagrangian parts: LP bound, restricted MILP, the rounds.
    ``dp`` is the DP's optimum without the coupling constraints (a lower bound), when there is one;
    ``start`` a feasible starting plan and the method that found it (the contiguous DP, or the
    memory fill where the solve has a time limit), when there is one: once a plan exists,
    every step stops at the time limit. With ``search_from`` (feasible plans), a local search
    (``cost_search``) runs from them in a child process beside all this; the steps hear its
    plan once it has answered, the rounds jump to their final one with it, and at the time limit
    the answer waits for it.
    """
    search = None
    if search_from:
        args = (tables, cons, wt, we, search_from)
        search = SearchBeside(cost_search_in_child, args, budget, COST_SEARCH_DELAY, "local search on the cost")
    try:
        dp_value = dp.value if dp is not None else 0.0
        # The LP whose duals price the Lagrangian leaves out the valid inequalities (the
        # Lagrangian has no term for them: their duals would be lost, and the bound with them).
        model = build_model(tables, cons, wt, we, scale=_scale(dp_value), cuts=False)
        budget.say("LP relaxation")
        # Every step after the first plan stops at the time limit; the steps that look for the
        # first plan may overrun it, so that a time limit returns a plan.
        start_cost = cost_if_feasible(tables, cons, wt, we, start[0])[0] if start is not None else np.inf

        def answer(plan: np.ndarray, value: float, bound: float, how: str) -> Solution:
            if search is not None:
                # At the time limit the search has answered or is about to (``search_beside``).
                deadline = budget.deadline
                got = search.collect(deadline) if budget.expired and deadline is not None else search.heard()
                if got is not None and got[1] < value:
                    plan, value, how = got[0], got[1], "search"
            # A forced MILP reports itself as the method, whatever step found the plan.
            return Solution(plan, value, min(bound, value), "milp" if forced else how)

        def heard(upper: float, best: np.ndarray | None, method: str) -> tuple[float, np.ndarray | None, str]:
            # The search's plan, where it has answered with a better one.
            got = search.heard() if search is not None else None
            return (got[1], got[0], "search") if got is not None and got[1] < upper else (upper, best, method)

        try:
            lp, mult, x_lp = relax(model, budget.deadline if start is not None else None)
        except LpTimeLimit:
            assert start is not None  # without a plan the LP has no deadline
            return answer(start[0], start_cost, min(dp_value, start_cost), start[1])
        if lp is None or mult is None or x_lp is None:  # relax() gives all three or none
            # The LP relaxation is infeasible, so the MILP is too.
            raise _infeasible(tables, cons, wt, we, budget.verbose)
        if free is not None:
            pen = penalise(tables, cons, wt, we, mult, model.m_ub)
            lower, _ = lower_bound(tables, free, wt, pen)
            # Without a plan the answer at a time limit would be an error, so the heuristic that
            # finds the first plan gets FIRST_PLAN_SECONDS even from a spent budget.
            seconds = budget.left() if start is not None else _first(budget)
            upper, best = repair(tables, free, cons, wt, we, pen, seconds=min(REPAIR_SECONDS, seconds))
        else:
            lower, upper, best = float(lp), np.inf, None
        lower = max(dp_value, lower if np.isfinite(lower) else -np.inf, float(lp) if lp is not None else -np.inf)
        method = "bound"
        if start is not None and start_cost < upper:
            upper, best, method = start_cost, start[0], start[1]
        upper, best, method = heard(upper, best, method)
        budget.say(f"lower bound {lower:.6g}" + (f", a feasible plan at {upper:.6g}" if best is not None else ""))
        if best is None or not (budget.done(upper, lower) or budget.expired):
            # A restricted MILP (only the choices the LP uses) usually finds the optimum
            # quickly; it is just a heuristic here, so a time limit is fine.
            opts = {**budget.highs(cap=RESTRICTED_TIME_LIMIT), "mip_rel_gap": max(RESTRICTED_GAP, budget.gap)}
            if best is None:
                opts.pop("deadline", None)
                opts["time_limit"] = min(RESTRICTED_TIME_LIMIT, _first(budget))
            quick = solve_milp(
                tables, cons, wt, we, scale=_scale(lower), fix_x=~(x_lp > 1e-9), verbose=budget.verbose, options=opts
            )
            if quick.a is not None:
                quick_cost = cost_if_feasible(tables, cons, wt, we, quick.a)
                if not (quick_cost[1] or quick_cost[2] or quick_cost[3]) and quick_cost[0] < upper:
                    upper, best, method = quick_cost[0], quick.a, "milp"
        if best is not None and ((budget.done(upper, lower) and not forced) or budget.expired):
            return answer(best, upper, lower, method)
        # The exact solve: the LP tightened by window rows bounds every choice's cost, and the
        # MILP runs in rounds of rising cutoffs with what cannot beat each fixed (``cutoff``).
        base = build_model(tables, cons, wt, we, scale=_scale(lower))
        budget.say("tightening the LP with window rows")
        try:
            tight = tighten(base, tables, cons, deadline=budget.deadline if best is not None else None)
        except LpTimeLimit:
            assert best is not None  # without a plan there is no deadline
            return answer(best, upper, lower, method)
        if tight is None:
            raise _infeasible(tables, cons, wt, we, budget.verbose)
        lower = max(lower, tight.bound)
        upper, best, method = heard(upper, best, method)
        if best is not None and ((budget.done(upper, lower) and not forced) or budget.expired):
            return answer(best, upper, lower, method)

        def cost_of(a: np.ndarray) -> float:
            return cost_if_feasible(tables, cons, wt, we, a)[0]

        # The rounds solve the MILP without the window rows: with them, ResNet-50 took 34 s on
        # 16 devices and 20 s on the lab, against 17 and 5 s without (the rows thicken each LP).
        hear = search.heard if search is not None else None
        out = solve_in_rounds(base, tight, upper, best, cost_of, budget, hear=hear)
        if out.plan is not None:
            got = search.heard() if search is not None else None
            found = method if out.plan is best else "search" if got is not None and out.plan is got[0] else "milp"
            return answer(out.plan, out.cost, max(lower, out.bound), found)
        if out.res is not None and out.res.status == 2:
            raise _infeasible(tables, cons, wt, we, budget.verbose)
        raise _no_plan(out.res, "latency", max(lower, out.bound))

    finally:
        if search is not None:
            search.cancel()  # answered, or no longer needed (also on an error or an interrupt)


def _no_plan(res: MilpResult | None, objective: str, bound: float) -> SolverError:
    """The SolverError for a solve that ended without any plan (a time limit or an error)."""
    if res is None or res.status == 1:  # time limit
        if res is not None and np.isfinite(res.bound):
            bound = max(bound, res.bound)  # the better of ours and HiGHS's (its root cuts lift it)
        return SolverError(
            f"no plan for the {objective} objective was found within the time limit (the lower bound "
            f"is {bound:.6g}); raise time_limit (--time-limit), relax the constraints, or use a smaller graph"
        )
    return SolverError(f"HiGHS did not solve the placement MILP for the {objective} objective: {res.message}")


def _scale(value: float) -> float:
    # Map the optimum (>= value, a lower bound) to >= 1000 so HiGHS's absolute gap
    # of 1e-6 is a relative 1e-9: the MILP then proves the optimum, not "close".
    if value > 0 and np.isfinite(value):
        return min(1e3 / value, 1e300)  # a denormal value would overflow to inf
    return 1.0


def _check_candidates(tables: CostTables, cons: ResolvedConstraints, wt: float, we: float, verbose: bool) -> None:
    if not layer_candidates(tables, cons).any(axis=1).all():
        raise explain_coupled(tables, cons, wt, we, verbose)


def _infeasible(tables: CostTables, cons: ResolvedConstraints, wt: float, we: float, verbose: bool) -> Exception:
    """Why a MILP found no plan: the coupling constraints, or (without them) the links."""
    if cons.coupling:
        return explain_coupled(tables, cons, wt, we, verbose)
    return explain_unreachable(tables, cons)
