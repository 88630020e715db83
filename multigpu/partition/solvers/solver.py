"""The interface every placement method implements, and the budget it runs under.

A ``Solver`` takes the cost tables, the resolved constraints, an ``Objective`` and a
``Budget`` (a time limit and a relative gap) and returns a ``Solution``: a plan (one device
column per layer), its value in the objective's units, a proven lower bound on every plan's
value and the name of the method that found it. The proof follows from the two numbers:
``optimal`` when the bound meets the value (to ``PROVE_GAP``), ``gap`` when it is finite,
``heuristic`` when there is none. ``autopartition`` picks a solver by the graph and the
constraints (``planner.choose``); a solver that does not apply says why (``why_not``).

To add a method: subclass ``Solver``, give it a ``name``, say in ``why_not`` which
problems it cannot solve (a graph form, an objective, a constraint), return a
``Solution`` from ``solve`` (its ``bound`` a true lower bound, or -inf for a heuristic),
and put it in ``planner.SOLVER_CLASSES`` where ``choose`` should prefer it.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from multigpu.partition.cost.tables import CostTables
from multigpu.partition.solvers.constraints import ResolvedConstraints

__all__ = ["Budget", "DEFAULT_GAP", "Objective", "PROVE_GAP", "Solution", "Solver", "relative_gap"]

# The planner stops once a plan is proven within this relative distance of the optimum:
# far below the cost model's own error (per-part predictions are off by 10-20%).
DEFAULT_GAP = 1e-3
# gap=0 asks for a proof: HiGHS stops at this relative gap (with no absolute gap, so the
# objective's scale does not matter), and a plan this close to its bound is "optimal".
PROVE_GAP = 1e-9


def relative_gap(value: float, bound: float) -> float:
    """(value - bound) / |value|, 0 when the bound meets the value, +inf without a bound."""
    if not math.isfinite(bound):
        return math.inf
    if value <= bound or value == 0:
        return 0.0
    return (value - bound) / abs(value)


@dataclass(frozen=True)
class Objective:
    """What to minimise: ``name`` "latency" (wt*T + we*E), "makespan" or "throughput"
    (the pipelined bottleneck, ties broken by wt*T + we*E)."""

    name: str
    wt: float = 1.0
    we: float = 0.0


@dataclass
class Budget:
    """How long and how exactly to solve: ``time_limit`` seconds in all (None: no limit),
    counted from ``start``; stop at a proven relative ``gap``; ``progress`` receives one
    line per step of a long solve; ``verbose`` prints HiGHS's log."""

    time_limit: float | None = None
    gap: float = DEFAULT_GAP
    progress: Callable[[str], None] | None = None
    verbose: bool = False
    start: float = field(default_factory=time.perf_counter)

    def left(self) -> float:
        """Seconds left (+inf without a limit, never below 0)."""
        if self.time_limit is None:
            return math.inf
        return max(0.0, self.start + self.time_limit - time.perf_counter())

    @property
    def deadline(self) -> float | None:
        """The ``time.perf_counter`` instant of the time limit (None without one)."""
        return None if self.time_limit is None else self.start + self.time_limit

    @property
    def expired(self) -> bool:
        """True once the time limit has passed."""
        return self.left() <= 0.0

    def elapsed(self) -> float:
        """Seconds since ``start``."""
        return time.perf_counter() - self.start

    def done(self, value: float, bound: float) -> bool:
        """True when a plan of ``value`` is proven within the gap of ``bound``."""
        return relative_gap(value, bound) <= max(self.gap, PROVE_GAP)

    def highs(self, cap: float | None = None) -> dict[str, Any]:
        """Options for one MILP solve (``milp.solve_model``): the gap as HiGHS's relative gap
        with no absolute one, and the deadline (and at most ``cap`` seconds)."""
        opts: dict[str, Any] = {"mip_rel_gap": max(self.gap, PROVE_GAP), "mip_abs_gap": 0.0}
        if cap is not None:
            opts["time_limit"] = cap
        if self.time_limit is not None:
            # ``milp.solve_model`` turns the deadline into HiGHS's limit just before the solve,
            # after the model is built (1.3 s for the makespan MILP of ResNet-18).
            opts["deadline"] = self.deadline
        if self.progress is not None:
            opts["progress"] = self._mip_progress
        return opts

    def _mip_progress(self, primal: float, dual: float) -> None:
        if math.isfinite(primal):
            self.say(f"HiGHS: best plan {primal:.6g}, bound {dual:.6g} (gap {relative_gap(primal, dual):.3g})")
        else:
            self.say(f"HiGHS: no plan yet, bound {dual:.6g}")

    def say(self, message: str) -> None:
        """Report one step of the solve to ``progress``, with the seconds so far."""
        if self.progress is not None:
            self.progress(f"[{self.elapsed():7.2f} s] {message}")


@dataclass(frozen=True)
class Solution:
    """A solver's answer: ``a`` (device column per layer), its ``value`` in the objective's
    units (cost, makespan or bottleneck seconds), a proven lower ``bound`` on every plan's
    value (-inf for a heuristic) and the ``method`` that found it."""

    a: np.ndarray
    value: float
    bound: float
    method: str

    @property
    def gap(self) -> float:
        """The proven relative gap (0 when optimal, +inf for a heuristic)."""
        return relative_gap(self.value, self.bound)

    @property
    def proof(self) -> str:
        """ "optimal", "gap" (a finite proven gap) or "heuristic" (no bound)."""
        g = self.gap
        return "optimal" if g <= PROVE_GAP else ("gap" if math.isfinite(g) else "heuristic")


class Solver(ABC):
    """One placement method. ``name`` is what a plan reports as its ``solver``."""

    name: str = ""

    @abstractmethod
    def why_not(self, tables: CostTables, cons: ResolvedConstraints, objective: Objective) -> str | None:
        """None when this method solves the problem, else why not (for the user's message)."""

    @abstractmethod
    def solve(self, tables: CostTables, cons: ResolvedConstraints, objective: Objective, budget: Budget) -> Solution:
        """The best plan found within ``budget`` and its proven bound. Raises InfeasibleError
        when no plan meets the constraints, SolverError when the budget ran out before any
        plan was found."""
