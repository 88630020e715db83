"""The throughput objective for pipelined inference, solved exactly.

With every device and link working on a different inference at once, the steady
state delivers one result per *bottleneck*: the largest of a device's load per item
(compute, stage overheads and the CPU of its transfers), a link's activation
transfer time, and a host's load (the CPU-seconds of its devices' loads: compute times
``Cluster.compute_cores``, all their transfer CPU) over its cores (parameter
shipping is a one-off setup cost, so it does not count).

Phase 1 minimises the bottleneck B with the MILP (B >= every device's load, its compute
at the busy rate (``busy_ratios``),
B >= every link's load, B >= every shared host's load / cores). Many assignments usually share the optimal B (layers off
the critical device can move freely), so phase 2 keeps B within the gap of the proven bound
(``Budget.gap``; 1e-7 of the optimum when proving) and minimises wt*T + we*E among them,
giving a plan that is also sensible per item (with we = 0, a weight of TIE_ENERGY on energy
breaks the ties in latency).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from multigpu.errors import SolverError
from multigpu.partition.cost.arithmetic import assignment_arrays, bottleneck_of
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.exceptions import InfeasibleError
from multigpu.partition.solvers.bottleneck_bound import bottleneck_lower_bound, load_balance_bound
from multigpu.partition.solvers.bottleneck_search import search_in_child
from multigpu.partition.solvers.constraints import ResolvedConstraints
from multigpu.partition.solvers.milp import MilpResult, solve_milp, solve_model
from multigpu.partition.solvers.milp_compact import build_compact, why_not_compact
from multigpu.partition.solvers.search_beside import SearchBeside
from multigpu.partition.solvers.solver import PROVE_GAP, Budget, Solution

__all__ = ["solve_throughput"]

# Phase 2 may exceed the phase-1 bottleneck by this relative slack: enough to absorb
# the solver's feasibility tolerance, far below any difference a user would notice.
CAP_SLACK = 1e-7
# The bottleneck rows are scaled so that the lower bound reads B_REF: 1e3 in the pairwise
# form; 1 in the compact form, where HiGHS then closes a 1e-9 gap that it could not at 1e3
# (BERT-L3: bound and plan 2.6e-9 apart after 120 s at 1e3, proven in 15 s at 1).
B_REF = {"pairwise": 1e3, "compact": 1.0}
# The local search beside the MILP starts after this share of the time left, at most this many
# seconds (``search_beside``): a MILP that proves its plan by then pays nothing for it.
SEARCH_DELAY = (0.1, 10.0)
# Among plans of equal latency the one of least energy wins: energy enters phase 2 with this
# weight relative to the plan's time over its energy.
TIE_ENERGY = 1e-6


def solve_throughput(
    tables: CostTables,
    cons: ResolvedConstraints,
    wt: float,
    we: float,
    cost_scale: float,
    known: tuple[np.ndarray, float] | None,
    explain: Callable[[], InfeasibleError],
    budget: Budget,
    form: str = "auto",
    cap: float | None = None,
    search_from: Sequence[np.ndarray] = (),
) -> Solution:
    """The plan minimising the bottleneck within ``budget`` (its gap and time limit), ties
    broken by cost: among the plans within the gap of the proven bound, the cheapest.

    ``cost_scale`` scales phase 2's cost objective; ``known`` is a feasible
    assignment and its bottleneck, if one is at hand (the answer should the time limit strike
    first); ``cap`` (seconds, a DP's plan's bottleneck) caps HiGHS's bottleneck column. A
    single-device plan is no cap: several times the optimum, it can change HiGHS's search for
    the worse (the design page's rejected alternatives give the measurements). ``explain``
    builds the InfeasibleError if the constraints admit no assignment. The solution's
    value and bound are bottlenecks (seconds per item). ``form`` picks the MILP: "compact"
    (communication per producer and device, ``milp_compact``), "pairwise" (per device
    pair, ``milp_rows``) or "auto" (compact wherever it is exact). Under a time limit a local
    search (``bottleneck_search``) runs beside the MILP from the known plan and then from the plans
    of ``search_from``.
    """
    lb = bottleneck_lower_bound(tables, cons)
    why = why_not_compact(tables, cons, lb)
    if form == "compact" and why is not None:
        raise ValueError(f"the compact throughput MILP does not apply here: {why}")
    compact = form != "pairwise" and why is None

    def milp(wt_: float, we_: float, **kw: Any) -> MilpResult:
        if compact and not kw.get("zero_load"):
            options = kw.pop("options")
            kw.pop("verbose", None)
            kw.setdefault("b_scale", kw.get("scale"))
            model = build_compact(tables, cons, wt_, we_, **kw)
            return solve_model(model, verbose=budget.verbose, options=options)
        return solve_milp(tables, cons, wt_, we_, **kw)

    crude = _crude_upper(tables, cons)
    ref = lb if lb > 0 else (known[1] if known is not None and known[1] > 0 else crude)
    b_scale = min(B_REF["compact" if compact else "pairwise"] / ref, 1e300) if ref > 0 and math.isfinite(ref) else 1.0
    # The simple bound sets the rows' scale and the form (as measured on the published
    # instances); the LP over the layers is the bound the answer quotes.
    bound = load_balance_bound(tables, cons)
    method = "milp"  # which method found the plan phase 2 starts from
    if known is not None and budget.done(known[1], bound):
        # A feasible plan already sits on (or within the gap of) the lower bound.
        first_a, best_b = known
    else:
        search = _start_search(tables, cons, known, search_from, budget)
        budget.say(f"bottleneck MILP (lower bound {bound:.6g} s{_known_text(known)})")
        opts = budget.highs()
        try:
            first = milp(
                wt, we, objective="bottleneck", scale=b_scale, verbose=budget.verbose, b_upper=cap, options=opts
            )
        except BaseException:  # an error or an interrupt: the search's child goes too
            if search is not None:
                search.cancel()
            raise
        found = _collect_search(search, budget, proven=first.status in (0, 2))
        if first.status == 2:
            raise explain()
        bound = max(bound, first.bound) if math.isfinite(first.bound) else bound
        if first.a is None:
            if first.status == 1 and known is not None:
                first_a, best_b = known  # the time limit struck before HiGHS beat the known plan
            elif first.status == 1:
                raise SolverError(
                    f"HiGHS found no plan for the throughput objective within the time limit (the lower "
                    f"bound on the bottleneck is {bound:.6g} s); raise time_limit (--time-limit), relax the "
                    f"constraints, or use a smaller graph"
                )
            else:
                raise SolverError(f"HiGHS did not solve the bottleneck MILP: {first.message}")
        else:
            first_a, best_b = first.a, bottleneck_of(tables.graph, tables.cluster, first.a, warm=False)
            if known is not None and known[1] < best_b:
                first_a, best_b = known
        if first.status == 0:
            # HiGHS stopped at its relative gap: the optimum is at least (1 - gap) of its plan.
            bound = max(bound, best_b * (1 - max(budget.gap, PROVE_GAP)))
        if found is not None and found[1] < best_b:
            (first_a, best_b), method = found, "search"
    bound = min(bound, best_b)
    budget.say(f"bottleneck {best_b:.6g} s, bound {bound:.6g} s; breaking ties by cost")
    if budget.expired:
        return Solution(first_a, best_b, bound, method)
    we2 = we + _energy_weight(tables, first_a, wt, we)
    if best_b <= 0:
        # B = 0 exactly: no choice may create any load. Say so combinatorially rather
        # than through a row whose tolerance would admit tiny loads.
        second = milp(
            wt,
            we2,
            objective="latency",
            scale=cost_scale,
            verbose=budget.verbose,
            zero_load=True,
            options=budget.highs(),
        )
    else:
        # Every plan whose bottleneck is within the gap of the bound is as good as the
        # best one found; among them the cheapest per item wins (a lower latency, where
        # the bottleneck alone would move a layer for a 0.03% gain and a 17% longer pass).
        cap = max(best_b * (1 + CAP_SLACK), bound / (1 - budget.gap) if budget.gap < 1 else math.inf)
        second = milp(
            wt,
            we2,
            objective="latency",
            scale=cost_scale,
            b_scale=b_scale,
            bottleneck_cap=cap,
            verbose=budget.verbose,
            options=budget.highs(),
        )
    if second.a is not None:
        b2 = bottleneck_of(tables.graph, tables.cluster, second.a, warm=False)
        return Solution(second.a, b2, min(bound, b2), "milp")
    return Solution(first_a, best_b, bound, method)  # phase 2 ran out of time


def _start_search(
    tables: CostTables,
    cons: ResolvedConstraints,
    known: tuple[np.ndarray, float] | None,
    search_from: Sequence[np.ndarray],
    budget: Budget,
) -> SearchBeside | None:
    """Under a time limit, the local search on the bottleneck (``bottleneck_search``) from the
    known plan and then the plans of ``search_from``, in a child process beside the MILP
    (``search_beside``)."""
    starts = ([known[0]] if known is not None else []) + list(search_from)
    if not starts or budget.deadline is None:
        return None
    return SearchBeside(search_in_child, (tables, cons, starts), budget, SEARCH_DELAY, "local search on the bottleneck")


def _collect_search(search: SearchBeside | None, budget: Budget, proven: bool) -> tuple[np.ndarray, float] | None:
    """The local search's plan and bottleneck (None without a search, or once the MILP has
    ``proven`` its answer: the search is then ended unheard)."""
    if search is None:
        return None
    if proven:
        search.cancel()
        return None
    assert budget.deadline is not None, "the search runs only under a time limit"
    return search.collect(budget.deadline)


def _energy_weight(tables: CostTables, a: np.ndarray, wt: float, we: float) -> float:
    """The weight on energy that breaks ties in latency (the user's ``we`` when it is set):
    small enough that TIE_ENERGY of the plan's energy moves its cost by TIE_ENERGY of its time,
    so a plan never gives up a visible share of latency for energy."""
    if we > 0 or wt <= 0:
        return 0.0
    x = assignment_arrays(tables.graph, tables.cluster, a, tables.ship_params, warm=False)
    return TIE_ENERGY * wt * x.time / x.energy if x.energy > 0 and x.time > 0 else 0.0


def _known_text(known: tuple[np.ndarray, float] | None) -> str:
    return "" if known is None else f", a starting plan at {known[1]:.6g} s"


def _crude_upper(tables: CostTables, cons: ResolvedConstraints) -> float:
    """An upper bound on any assignment's bottleneck (it sets the rows' scale): all compute
    on the slowest allowed device, a stage start per layer, every transfer on the slowest link and
    every transfer's CPU, over the fewest cores a host has (if below one)."""
    cluster = tables.cluster
    comp = np.where(cons.allowed & np.isfinite(tables.node_time), tables.comp, 0.0)
    tab = cluster.tables
    nb = np.concatenate([[tables.graph.input_bytes], tables.graph.output_bytes])
    t = nb.max() * tab.inv_bandwidth.max() + tab.max_latency if cluster.k > 1 else 0.0
    cpu = 0.0
    if cluster.k > 1:
        u, v = np.nonzero(~np.eye(cluster.k, dtype=bool))
        # Both regimes (an inline transfer's fixed figure may be the larger one).
        _, _, val, _ = tables.transfer_cpu(u, v, np.full(len(u), nb.max()))
        _, _, small, _ = tables.transfer_cpu(u, v, np.zeros(len(u)))
        cpu = 3 * (float(np.max(val, initial=0.0)) + float(np.max(small, initial=0.0)))
    cores = min(1.0, float(np.min(cluster.host_cores, initial=1.0)))
    graph = tables.graph
    # Each producer's output crosses at most once to each other device its consumers use.
    sends = (
        min(len(graph.input_consumers), cluster.k - 1) + 1 + sum(min(len(c), cluster.k - 1) for c in graph.consumers)
    )
    return float(comp.max(axis=1).sum() + len(comp) * cluster.stage_overhead.max() + sends * (t + cpu)) / cores
