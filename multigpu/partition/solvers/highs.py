"""HiGHS through its own Python API (highspy): a built placement model as a HiGHS model,
MILP and LP solves, and an LP that keeps its basis while rows are added.

Why highspy and not ``scipy.optimize.milp``: scipy 1.15 bundles HiGHS 1.8, whose MIP
solver took 34 s to prove ResNet-50 on the lab (each device holding 40% of the
parameters) where HiGHS 1.16 took 11 s, and scipy's ``linprog`` cannot resume from a
basis, so each round of window cuts re-solved the LP from scratch (43 s of Inception on
16 devices). highspy is imported lazily, so the core imports numpy and the standard
library only.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Highs", "Outcome", "OPTIMAL", "LIMIT", "INFEASIBLE", "OTHER"]

# Status codes, as scipy.optimize.milp numbers them (the planner's messages use them).
OPTIMAL, LIMIT, INFEASIBLE, OTHER = 0, 1, 2, 4


@dataclass(frozen=True)
class Outcome:
    """One solve: ``status`` (OPTIMAL, LIMIT, INFEASIBLE or OTHER), ``message``, the
    column values ``x`` (None without a solution), the objective ``fun``, the MIP's dual
    bound ``bound`` (-inf when none), the row duals and the reduced costs (LP only)."""

    status: int
    message: str
    x: np.ndarray | None
    fun: float
    bound: float = -math.inf
    row_dual: np.ndarray | None = None
    col_dual: np.ndarray | None = None


def _option_items(options: dict[str, Any]) -> list[tuple[str, Any]]:
    """HiGHS option names and values for the planner's options (scipy's spelling)."""
    out: list[tuple[str, Any]] = []
    for key, value in options.items():
        if key == "disp":
            out.append(("output_flag", bool(value)))
        elif key == "presolve":
            out.append(("presolve", ("on" if value else "off") if isinstance(value, bool) else str(value)))
        elif key in ("time_limit", "mip_rel_gap", "mip_abs_gap", "objective_bound"):
            out.append((key, float(value)))
        else:
            out.append((key, value))
    return out


_quiet = False
# Seconds between two progress reports from inside one MIP solve.
PROGRESS_SECONDS = 2.0


def _report_progress(h: Any, progress: Callable[[float, float], None]) -> None:
    """Subscribe ``progress`` to HiGHS's MIP callbacks: each improving plan, and at most
    every PROGRESS_SECONDS from the callback HiGHS calls while it branches."""
    last = [time.perf_counter()]

    def improved(event: Any) -> None:
        last[0] = time.perf_counter()
        progress(float(event.data_out.mip_primal_bound), float(event.data_out.mip_dual_bound))

    def ticking(event: Any) -> None:
        now = time.perf_counter()
        if now - last[0] >= PROGRESS_SECONDS:
            last[0] = now
            progress(float(event.data_out.mip_primal_bound), float(event.data_out.mip_dual_bound))

    h.cbMipImprovingSolution.subscribe(improved)
    h.cbMipInterrupt.subscribe(ticking)


def _new_highs(highspy: Any) -> Any:
    """A highspy.Highs with its output off. HiGHS writes a banner to the process's
    standard output (file descriptor 1, below Python's sys.stdout) the first time one is
    made; it would land in the middle of a command's JSON, so that first one is made with
    descriptor 1 pointed at /dev/null."""
    global _quiet
    if _quiet:
        h = highspy.Highs()
    else:
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
                h = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        _quiet = True
    h.setOptionValue("output_flag", False)
    return h


class Highs:
    """One HiGHS instance holding a model: ``c``, csr ``A`` with row bounds ``lo``/``hi``,
    column bounds ``lb``/``ub`` and ``integrality`` (1 = integer). ``solve`` runs the
    MILP (or, with ``relax=True``, its LP relaxation); ``add_rows`` appends rows, and a
    later LP solve starts from the last basis."""

    def __init__(
        self,
        c: np.ndarray,
        A: Any,
        lo: np.ndarray,
        hi: np.ndarray,
        lb: np.ndarray,
        ub: np.ndarray,
        integrality: np.ndarray,
    ) -> None:
        import highspy  # lazy: a compiled solver, needed only to plan under constraints

        self._hs = highspy
        self._h = _new_highs(highspy)
        inf = highspy.kHighsInf
        lp = highspy.HighsLp()
        csc = A.tocsc()
        lp.num_col_, lp.num_row_ = int(csc.shape[1]), int(csc.shape[0])
        lp.col_cost_ = np.asarray(c, dtype=float)
        lp.col_lower_ = np.asarray(lb, dtype=float)
        lp.col_upper_ = np.where(np.isfinite(ub), ub, inf).astype(float)
        lp.row_lower_ = np.where(np.isfinite(lo), lo, -inf).astype(float)
        lp.row_upper_ = np.where(np.isfinite(hi), hi, inf).astype(float)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = csc.indptr.astype(np.int32)
        lp.a_matrix_.index_ = csc.indices.astype(np.int32)
        lp.a_matrix_.value_ = csc.data.astype(float)
        self._integrality = np.asarray(integrality)
        self._h.passModel(lp)
        self._n = lp.num_col_

    def add_rows(self, A: Any, lo: np.ndarray, hi: np.ndarray) -> None:
        """Append the rows of csr ``A`` with bounds lo <= row <= hi."""
        inf = self._hs.kHighsInf
        csr = A.tocsr()
        self._h.addRows(
            int(csr.shape[0]),
            np.where(np.isfinite(lo), lo, -inf).astype(float),
            np.where(np.isfinite(hi), hi, inf).astype(float),
            int(csr.nnz),
            csr.indptr[:-1].astype(np.int32),
            csr.indices.astype(np.int32),
            csr.data.astype(float),
        )

    def solve(
        self,
        options: dict[str, Any] | None = None,
        relax: bool = False,
        progress: Callable[[float, float], None] | None = None,
    ) -> Outcome:
        """Run HiGHS with ``options`` (scipy's names: disp, presolve, time_limit,
        mip_rel_gap, objective_bound, ...) on the MILP, or on its LP relaxation.
        ``progress`` receives (best plan's objective, dual bound) on each improving plan
        and every PROGRESS_SECONDS while the MIP runs."""
        hs, h = self._hs, self._h
        if progress is not None and not relax:
            _report_progress(h, progress)
        # 0 = continuous, 1 = integer (HighsVarType's values).
        kinds = np.zeros(self._n, dtype=np.uint8) if relax else (self._integrality != 0).astype(np.uint8)
        h.changeColsIntegrality(self._n, np.arange(self._n, dtype=np.int32), kinds)
        for key, value in _option_items(options or {}):
            h.setOptionValue(key, value)
        h.run()
        status = h.getModelStatus()
        ms = hs.HighsModelStatus
        info = h.getInfo()
        text = h.modelStatusToString(status)
        if status == ms.kOptimal:
            code = OPTIMAL
        elif status in (ms.kInfeasible, ms.kObjectiveBound):
            # kObjectiveBound: no solution beats the cutoff given as objective_bound.
            code = INFEASIBLE
            text = f"{text} (no solution under the objective bound)" if status == ms.kObjectiveBound else text
        elif status in (ms.kTimeLimit, ms.kIterationLimit, ms.kSolutionLimit, ms.kInterrupt):
            code = LIMIT
        else:
            code = OTHER
        sol = h.getSolution()
        has_x = code in (OPTIMAL, LIMIT) and info.primal_solution_status >= 2  # kSolutionStatusFeasible
        x = np.asarray(sol.col_value, dtype=float) if has_x else None
        fun = float(info.objective_function_value) if has_x else math.inf
        bound = -math.inf
        if not relax:
            dual = float(info.mip_dual_bound)
            bound = dual if math.isfinite(dual) and abs(dual) < 1e300 else -math.inf
        row_dual = col_dual = None
        if relax and code == OPTIMAL:
            row_dual = np.asarray(sol.row_dual, dtype=float)
            col_dual = np.asarray(sol.col_dual, dtype=float)
        return Outcome(code, f"HiGHS: {text}", x, fun, bound, row_dual, col_dual)
