"""A local search in a child process beside the MILP (``bottleneck_search`` for the throughput
objective, ``cost_search`` for the latency one): started after a delay, heard without waiting
once it has answered, collected by a deadline, or ended unheard.

The delay spares a MILP that proves its plan early: started at once, the child's imports (0.6 s
of CPU) and search slowed the throughput proof of ResNet-18 on the memory-bound lab from 0.65 to
0.77 s (medians of 5, alternating). A child ended while it sleeps has cost nothing but its start.
Under a time limit the search answers at nine tenths of the time left, so that its plan is in hand
when the MILP stops at the limit; without one, at its local optimum.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from multigpu.partition.solvers.deadline_process import Call, ChildFailed, wall_deadline
from multigpu.partition.solvers.solver import Budget

__all__ = ["SearchBeside"]

# The search answers by this share of the time left under a time limit.
ANSWER_AT = 0.9


class SearchBeside:
    """``fn(*args, wall)`` started in a child process, ``wall`` being the ``time.time`` instant
    it must answer by; it returns (plan, value). ``delay`` is (share of the time left, at most
    so many seconds): the child sleeps that long before its imports (without a time limit, the
    seconds). ``what`` names the search in progress lines and warnings."""

    def __init__(
        self, fn: Callable[..., Any], args: tuple, budget: Budget, delay: tuple[float, float], what: str
    ) -> None:
        left = budget.left()
        pause = min(delay[0] * left, delay[1])
        until = time.perf_counter() + ANSWER_AT * left if math.isfinite(left) else math.inf
        end = f"until {until - budget.start:.2f} s" if math.isfinite(until) else "to its local optimum"
        budget.say(f"{what}, beside HiGHS, {end}")
        self.what = what
        self._budget = budget
        self._call = Call(fn, (*args, wall_deadline(until)), delay=pause)  # inf stays inf
        self._out: tuple[np.ndarray, float] | None = None
        self._done = False

    def heard(self) -> tuple[np.ndarray, float] | None:
        """The search's plan and value if it has answered (without waiting), else None."""
        if not self._done and self._call.answered:
            self._take(time.perf_counter())
        return self._out

    def collect(self, deadline: float) -> tuple[np.ndarray, float] | None:
        """The search's plan and value, waiting for it until ``deadline`` (a ``time.perf_counter``
        instant; None if it has not answered by then, and it is ended)."""
        if not self._done:
            self._take(deadline)
        return self._out

    def cancel(self) -> None:
        """End the child unheard (nothing if it has answered)."""
        self._call.cancel()

    def _take(self, deadline: float) -> None:
        self._done = True
        try:
            answered, out = self._call.result(deadline)
        except ChildFailed as e:
            # The search only improves a plan in hand: the MILP's answer stands without it.
            self._budget.say(f"{self.what}: no answer ({e})")
            warnings.warn(f"{e}; the solve goes on without the {self.what}", RuntimeWarning, stacklevel=3)
            return
        if answered:
            a, value = out
            self._out = (np.asarray(a, dtype=np.intp), float(value))
            self._budget.say(f"{self.what}: a plan at {value:.6g}")
