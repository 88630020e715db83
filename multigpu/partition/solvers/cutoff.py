"""Proving a memory-constrained optimum fast: tighten the LP with window cuts, then solve
the MILP in rounds of rising cutoffs, each with the choices that cannot beat it fixed.

1. ``tighten``: solve the LP relaxation, add the window rows it breaks (``windows``),
   and repeat until none is broken. Its value L is a lower bound on every plan.
2. Reduced-cost fixing (``fixable``): in the tightened LP, a choice at 0 with reduced
   cost r is in no plan cheaper than L + r (LP duality; the window rows remove no plan).
   Choices are layer placements x and the transfer and stage-start columns (y, z, w, s),
   which an integral plan sets to 0 or 1 (y is the product of two x; z, w and s are
   priced at their lowest, so a plan with one of them fractional has a plan at most as
   dear with it at 0 or 1).
3. ``solve_in_rounds``: for a cutoff U (L times ``CUTOFF_FACTORS``, the best known
   plan's cost last), fix every choice whose bound exceeds U and solve the MILP with U as
   HiGHS's objective cutoff. A plan found is the optimum: every plan left out costs
   more than U. No plan means the optimum is above U, and the next round raises it; a
   round whose next cutoff already reaches the best plan found is skipped. The
   early rounds are small (most choices fixed) and prove fast; on ResNet-50 on the lab
   (each device holding 40% of the parameters) the rounds took 0.1-2.5 s each, where one
   MILP under the best known plan's cost took 9-14 s and a cold one 20-34 s.

Every step removes only plans that cost more than a plan found or a cutoff proven
empty, so the answer is exact.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from multigpu.partition.cost.tables import CostTables
from multigpu.partition.solvers.constraints import ResolvedConstraints
from multigpu.partition.solvers.milp import (
    LpSession,
    LpSolution,
    LpTimeLimit,
    MilpResult,
    Model,
    cutoff_option,
    none_below_cutoff,
    solve_model,
    with_fixed,
)
from multigpu.partition.solvers.solver import PROVE_GAP, Budget
from multigpu.partition.solvers.windows import separate, windows

__all__ = ["RoundsResult", "Tightened", "fixable", "rooms", "solve_in_rounds", "tighten"]

# At most this many rounds of separation (each an LP solve); they stop earlier once no
# window row is broken, or once a round lifts the bound by less than MIN_GAIN (relative):
# on Inception on 16 devices three rounds left it where it was and the fourth cost 9.5 s
# of LP for 2%.
SEPARATION_ROUNDS = 6
MIN_GAIN = 1e-3
# The cutoffs tried, as factors above the tightened LP bound; the best known plan's
# cost is always the last.
CUTOFF_FACTORS = (1.02, 1.04, 1.07, 1.1, 1.14, 1.2, 1.3, 1.45, 1.7, 2.0, 2.5, 3.5, 5.0)
# Once a round has found a plan that costs at most this factor above the next round's cutoff,
# that round and the rest go: the final round (at the best plan's cost) follows at once. Only
# a plan found by a round counts: the starting plans (the heuristics') sit further from the
# optimum, and on the stress chain (15% memory) jumping from them left a worse plan and gap at
# the time limit (6.4% against 5.3%). Near the optimum a
# round costs about as much as the final one, and each round proves again what the rounds
# below it proved: on ResNet-50 on 16 devices (40% memory) the rounds at 1.1 and 1.14 took
# 6 and 11 s and the final one 11 s, where the final round at the 1.07 round's plan (4.8%
# above the optimum) took 12 s; on GoogLeNet the round at 1.3 took 15 s and the final one 27
# s, where the final round at the plan the 1.14 round found (10.4% above) took 19 s.
JUMP = 1.15
# Fix a choice only when its bound beats the cutoff by this relative margin, so
# floating-point noise in the LP can never remove an optimal choice.
FIX_MARGIN = 1e-7
# A column counts as at 0 in the LP solution below this.
AT_ZERO = 1e-9


@dataclass(frozen=True)
class Tightened:
    """The model the LP was built from (without the window rows), the tightened LP's
    optimum (``lp``) and the number of rows added (``cuts``)."""

    model: Model
    lp: LpSolution
    cuts: int

    @property
    def bound(self) -> float:
        """The tightened LP's value: a lower bound on every plan's cost."""
        return self.lp.value


def rooms(tables: CostTables, cons: ResolvedConstraints) -> np.ndarray:
    """(k,) bytes of parameters each device can hold with at least one activation
    (+inf where memory is not limited), a little above the limit for HiGHS's tolerance."""
    floor = float(tables.graph.activation_bytes.min())
    return np.where(np.isfinite(cons.memory), cons.memory * (1 + 1e-6) - floor, np.inf)


def tighten(
    model: Model,
    tables: CostTables,
    cons: ResolvedConstraints,
    max_rounds: int = SEPARATION_ROUNDS,
    deadline: float | None = None,
) -> Tightened | None:
    """The LP relaxation with the window rows it breaks, added round after round (each
    LP resumes from the last basis); None if the LP is infeasible (then so is the MILP).
    At ``deadline`` (a ``time.perf_counter`` instant) the rounds stop with the last LP
    solved; if the first has not finished, LpTimeLimit is raised."""
    graph, lay = tables.graph, model.lay
    room = rooms(tables, cons)
    wins = windows(graph, room) if lay.ne else []
    k = lay.k
    diag = lay.yi[:, np.arange(k), np.arange(k)] if lay.ne else np.zeros((0, k), dtype=np.intp)
    cuts = 0
    session = LpSession(model)
    lp = session.solve(deadline)
    for _ in range(max_rounds):
        if lp is None or not wins or (deadline is not None and time.perf_counter() >= deadline):
            break
        x = lp.x[: lay.nx].reshape(lay.n, k)
        r, c, v, count = separate(graph, wins, room, x, lp.x[diag], lay.xi, diag)
        if not count:
            break
        session.add_rows(r, c, v, count, -np.inf, 0.0)
        before = lp.value
        try:
            lp = session.solve(deadline)
        except LpTimeLimit:
            break  # the last LP solved still bounds every plan
        cuts += count
        if lp is not None and lp.value < before + MIN_GAIN * abs(before):
            break
    return None if lp is None else Tightened(model, lp, cuts)


def fixable(t: Tightened, cutoff: float) -> np.ndarray:
    """(nvar,) bool: the choices (columns before the largest-activation ones) at 0 in the
    tightened LP whose reduced-cost bound exceeds ``cutoff`` (cost units)."""
    lay, scale = t.model.lay, t.model.scale
    out = np.zeros(t.model.nvar, dtype=bool)
    m = lay.m_off
    bound = t.lp.value + t.lp.reduced[:m] / scale
    out[:m] = (t.lp.x[:m] <= AT_ZERO) & (bound > cutoff * (1 + FIX_MARGIN) + 1e-300)
    return out


@dataclass(frozen=True)
class RoundsResult:
    """What the rounds ended with: the best ``plan`` (None if none was found), its ``cost``,
    the proven lower ``bound`` on every plan's cost, and ``res``, the last solve (for the
    error message when no plan was found)."""

    plan: np.ndarray | None
    cost: float
    bound: float
    res: MilpResult | None


def solve_in_rounds(
    base: Model,
    t: Tightened,
    known: float,
    known_plan: np.ndarray | None,
    cost_of: Callable[[np.ndarray], float],
    budget: Budget,
    hear: Callable[[], tuple[np.ndarray, float] | None] | None = None,
) -> RoundsResult:
    """Solve ``base`` (the MILP ``t`` was tightened from) in rounds of rising
    cutoffs up to ``known``, the cost of ``known_plan`` (+inf and None if there is none),
    stopping once the best plan is within ``budget.gap`` of the bound, or at its time limit
    with the best plan found and the bound proven so far. ``hear``, asked before each round,
    gives a plan found beside the rounds (a local search's; None while there is none): a
    better one is the best plan, and the rounds jump as after a round's plan (``JUMP``) while
    the time left is at least the time spent."""
    best, best_cost = known_plan, known
    jump = False  # whether a round found the best plan (``JUMP``)
    proven = t.bound  # the optimum is at least this (the LP, then an empty round's cutoff)
    factors = list(CUTOFF_FACTORS if t.bound > 0 else ())
    res: MilpResult | None = None
    while True:
        heard = hear() if hear is not None else None
        heard_cost = cost_of(heard[0]) if heard is not None else math.inf
        if heard is not None and heard_cost <= best_cost:
            # Near the optimum, as a round's plan is: the rounds below it would only prove again
            # what the final round proves (ResNet-50 on 16 devices with its optimum in hand: the
            # rounds from 1.02 to 1.14 took 8 s, the final round alone 6 s). It may already be
            # the known plan (heard before the rounds). Only while the time left is at least the
            # time spent: a final round that the limit cuts short proves less than the rounds
            # below it (that case at 10 s: a gap of 14% against 7.9%, the same plan).
            best, best_cost = heard[0], heard_cost
            jump = jump or budget.left() >= budget.elapsed()
        if best is not None and budget.done(best_cost, proven):
            return RoundsResult(best, best_cost, proven, res)
        # A round whose next one already reaches the best plan's cost is skipped: the
        # final round (at that cost) proves the optimum whatever it finds, and where the
        # best plan is the optimum, as it was on ResNet-50 on 16 devices, the round
        # before it only repeats the proof (3.5 of 14 s).
        while len(factors) >= 2 and t.bound * factors[1] >= best_cost:
            factors.pop(0)
        # A round's plan close above the next cutoff: straight to the final round (``JUMP``).
        while jump and factors and t.bound * factors[0] * JUMP >= best_cost:
            factors.pop(0)
        factor = factors.pop(0) if factors else None
        cutoff = best_cost if factor is None else min(t.bound * factor, best_cost)
        final = cutoff >= best_cost
        opts = budget.highs()
        model = base
        if math.isfinite(cutoff):
            model = with_fixed(base, fixable(t, cutoff))
            opts.update(cutoff_option(base, cutoff))
        budget.say(f"MILP round at cutoff {cutoff:.6g} (best plan {best_cost:.6g}, bound {proven:.6g})")
        res = solve_model(model, verbose=budget.verbose, options=opts)
        if res.a is not None:
            cost = cost_of(res.a)
            if cost < best_cost:
                best, best_cost, jump = res.a, cost, True
            if res.status == 0 and cost <= cutoff * (1 + 1e-6):
                # Every plan left out costs more than the cutoff, and HiGHS proved this one
                # within its gap of what is left.
                held = min(res.bound, cutoff) if math.isfinite(res.bound) else -math.inf
                return RoundsResult(best, best_cost, max(proven, held, min(best_cost, cutoff) * _within(budget)), res)
        beaten = none_below_cutoff(res)
        if not (beaten or res.status == 0):
            # A time limit, or an error: the best plan so far and the best bound proven.
            # The restricted model holds every plan up to the cutoff, so its own bound
            # holds up to there.
            held = min(res.bound, cutoff) if math.isfinite(res.bound) else -math.inf
            return RoundsResult(best, best_cost, max(proven, held), res)
        proven = max(proven, min(cutoff, best_cost))
        if final:
            return RoundsResult(best, best_cost, proven if best is not None else -math.inf, res)


def _within(budget: Budget) -> float:
    """The factor below a plan that HiGHS reports optimal at which the optimum may lie."""
    return 1.0 - max(budget.gap, PROVE_GAP)
