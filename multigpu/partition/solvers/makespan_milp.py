"""The planner's solve of the makespan MILP (``milp_timing``): HiGHS's options for it and,
under a time limit, its LP relaxation first and the whole solve in a child process that is
ended at the deadline (``deadline_process``).

Why both. HiGHS 1.16's root solves the LP relaxation and, beside it, an analytic centre (an
interior-point solve of the same LP, up to 200 iterations) that no time limit stops, and the
root waits for it. On ResNet-50 over the lab (610,000 rows) our LP took 16 s; HiGHS's presolve
took 5.5 s and its analytic centre 25.6 s, so a 10 s limit ended after 14.5 s. The LP, solved
first, stops at the deadline and bounds the starting plans' gap; HiGHS gets the MILP only if
the time left covers two such LPs. On larger models even HiGHS's setup outlasts a limit (the
makespan MILP of ResNet-50 on 16 devices, 29 million nonzeros: 8 s to hand over, 34 s in an LP
limited to 1 ms), which only ending the process bounds.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

from multigpu.partition.cost.tables import CostTables
from multigpu.partition.solvers.constraints import ResolvedConstraints
from multigpu.partition.solvers.deadline_process import Call, ChildFailed, wall_deadline
from multigpu.partition.solvers.milp import LpTimeLimit, MilpResult, build_model, cutoff_option, solve_lp, solve_model
from multigpu.partition.solvers.milp_timing import BuildTimeLimit
from multigpu.partition.solvers.solver import PROVE_GAP, Budget

__all__ = ["collect", "solve_makespan_milp", "solve_within", "start_in_child"]


def solve_makespan_milp(
    tables: CostTables,
    cons: ResolvedConstraints,
    wt: float,
    we: float,
    budget: Budget,
    has_plan: bool,
    cutoff: float = math.inf,
) -> tuple[MilpResult, float]:
    """The makespan MILP's result and its LP relaxation's bound (-inf without one), looking only
    for plans below ``cutoff`` (a plan in hand's makespan; no plan and status 2 then say that none
    beats it). Under a time limit, when the caller ``has_plan`` to fall back on, a child process
    solves it and a child still running at the deadline is ended (status 1, no plan); otherwise
    this process does, and HiGHS may overrun the limit to find a first plan."""
    deadline = budget.deadline
    if deadline is None or not has_plan:
        return solve_within(tables, cons, wt, we, budget, cutoff)
    return collect(start_in_child(tables, cons, wt, we, budget, cutoff), deadline)


def start_in_child(
    tables: CostTables, cons: ResolvedConstraints, wt: float, we: float, budget: Budget, cutoff: float
) -> Call:
    """Start ``solve_within`` in a child process under ``budget``'s time limit; it runs beside
    this process until ``collect`` (or ``Call.cancel``)."""
    assert budget.deadline is not None, "a child process is ended at the time limit: give one"
    return Call(_in_child, (tables, cons, wt, we, wall_deadline(budget.deadline), budget.gap, budget.verbose, cutoff))


def collect(call: Call, deadline: float) -> tuple[MilpResult, float]:
    """The child's answer (``solve_makespan_milp``'s), or a time-limit result without a plan
    when it has not answered by ``deadline`` (it is then ended), or an error result without a
    plan, with a RuntimeWarning, when the child failed."""
    try:
        answered, out = call.result(deadline)
    except ChildFailed as e:
        # The caller holds a plan (the child runs only then): it goes on without the MILP's.
        warnings.warn(f"{e}; the answer is the best plan found without the makespan MILP", RuntimeWarning, stacklevel=2)
        return MilpResult(4, str(e), None, math.inf), -math.inf
    if not answered:
        return MilpResult(1, "the time limit struck inside HiGHS, whose process was ended", None, math.inf), -math.inf
    return out


def _in_child(
    tables: CostTables,
    cons: ResolvedConstraints,
    wt: float,
    we: float,
    wall: float,
    gap: float,
    verbose: bool,
    cutoff: float,
) -> tuple[MilpResult, float]:
    # The deadline crosses the process boundary as wall-clock time (``wall_deadline``).
    budget = Budget(time_limit=max(0.0, wall - time.time()), gap=gap, verbose=verbose)
    return solve_within(tables, cons, wt, we, budget, cutoff)


def solve_within(
    tables: CostTables, cons: ResolvedConstraints, wt: float, we: float, budget: Budget, cutoff: float = math.inf
) -> tuple[MilpResult, float]:
    """Build and solve the makespan MILP in this process within ``budget``, for plans below
    ``cutoff`` (seconds): under a time limit the LP relaxation first (it stops at the deadline),
    then HiGHS only if the time left covers twice the LP's time. Returns the result and the
    LP's bound (-inf without one)."""
    deadline = budget.deadline
    try:
        cap = cutoff * (1 + 1e-6) if math.isfinite(cutoff) else None
        model = build_model(tables, cons, wt, we, objective="makespan", deadline=deadline, horizon_cap=cap)
    except BuildTimeLimit as e:
        return MilpResult(1, str(e), None, math.inf), -math.inf
    options = _options(budget)
    if math.isfinite(cutoff):
        # HiGHS prunes every node whose bound reaches the plan in hand: with the big-M rows'
        # weak LP, the cutoff is most of what prunes.
        options.update(cutoff_option(model, cutoff))
    if deadline is None:
        return solve_model(model, verbose=budget.verbose, options=options), -math.inf
    budget.say("makespan LP relaxation")
    t0 = time.perf_counter()
    try:
        lp = solve_lp(model, deadline)
    except LpTimeLimit as e:
        return MilpResult(1, str(e), None, math.inf), -math.inf
    # None: HiGHS did not call the LP optimal; the MILP's own answer decides (it confirms an
    # infeasible model without presolve).
    lp_bound = lp.value if lp is not None else -math.inf
    if deadline - time.perf_counter() < 2 * (time.perf_counter() - t0):
        return MilpResult(1, "too little time left for HiGHS's root on the makespan MILP", None, math.inf), lp_bound
    return solve_model(model, verbose=budget.verbose, options=options), lp_bound


def _options(budget: Budget) -> dict[str, Any]:
    options = budget.highs()
    # HiGHS's feasibility jump does not watch the time limit: on ResNet-50's makespan MILP over
    # the lab, solves limited to 12 s took 19-25 s with it and 13-14 s without (HiGHS issue
    # #885 tracks the steps that check the limit too seldom).
    options["mip_heuristic_run_feasibility_jump"] = False
    if budget.gap <= PROVE_GAP:
        # The schedule's big-M rows (M a multiple of the horizon) let a binary that HiGHS calls
        # integral within its default 1e-6 shave about 1e-6 of the horizon off a start time:
        # where a slow device sets a long horizon, enough to return a plan 0.06% above the
        # optimum. A proof asks for the tighter tolerance.
        options["mip_feasibility_tolerance"] = 1e-9
    return options
