"""Exact constrained placement as a MILP, solved by HiGHS (``highs``, through highspy):
solving a built model (``milp_model.build_model``, the formulation) and its LP
relaxation, whose duals become Lagrange multipliers.

HiGHS and scipy are imported lazily, so the core imports numpy and the standard library only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from multigpu.partition.cost.tables import CostTables
from multigpu.partition.solvers.constraints import ResolvedConstraints
from multigpu.partition.solvers.milp_model import FAMILIES, Model, build_model
from multigpu.partition.solvers.milp_timing import BuildTimeLimit

__all__ = [
    "FAMILIES",
    "LpSession",
    "LpTimeLimit",
    "LpSolution",
    "MilpResult",
    "Model",
    "Multipliers",
    "build_model",
    "cutoff_option",
    "none_below_cutoff",
    "relax",
    "solve_lp",
    "solve_milp",
    "solve_model",
    "with_fixed",
]


@dataclass(frozen=True)
class MilpResult:
    """Outcome of one MILP solve: ``status`` is HiGHS's (0 optimal, 2 infeasible, ...);
    ``a`` the device column per layer when a solution exists; ``value`` the optimum in
    the problem's own units (seconds of bottleneck, or cost); ``bound`` HiGHS's proven
    lower bound in the same units (-inf when it reports none)."""

    status: int
    message: str
    a: np.ndarray | None
    value: float
    bound: float = -math.inf


def solve_milp(
    tables: CostTables,
    cons: ResolvedConstraints,
    wt: float,
    we: float,
    *,
    objective: str = "latency",
    scale: float = 1.0,
    bottleneck_cap: float | None = None,
    b_scale: float | None = None,
    b_upper: float | None = None,
    families: Collection[str] = FAMILIES,
    verbose: bool = False,
    fix_x: np.ndarray | None = None,
    zero_load: bool = False,
    options: dict | None = None,
) -> MilpResult:
    """Build and solve the placement MILP (see ``build_model`` for the arguments; its
    valid inequalities included); ``options`` are passed on to HiGHS (e.g. ``time_limit``).
    Their ``deadline`` also bounds the build: past it, the result has status 1 (a time
    limit) and no plan."""
    try:
        model = build_model(
            tables,
            cons,
            wt,
            we,
            objective=objective,
            scale=scale,
            bottleneck_cap=bottleneck_cap,
            b_scale=b_scale,
            b_upper=b_upper,
            families=families,
            fix_x=fix_x,
            zero_load=zero_load,
            deadline=(options or {}).get("deadline"),
        )
    except BuildTimeLimit as e:
        return MilpResult(1, str(e), None, math.inf)
    return solve_model(model, verbose=verbose, options=options)


def _highs(model: Model) -> Any:
    from multigpu.partition.solvers.highs import Highs

    return Highs(model.c, model.A, model.lo, model.hi, model.lb, model.ub, model.integrality)


def _until(opts: dict[str, Any], deadline: float | None) -> dict[str, Any]:
    """``opts`` with HiGHS's time limit cut to end at ``deadline`` (time.perf_counter's clock)."""
    if deadline is None:
        return opts
    left = max(deadline - time.perf_counter(), 1e-3)  # HiGHS needs a positive limit
    return {**opts, "time_limit": min(left, float(opts.get("time_limit", math.inf)))}


def cutoff_option(model: Model, cutoff: float) -> dict[str, float]:
    """HiGHS's option to look only for plans costing less than ``cutoff`` (the objective's
    units), a hair above it so that a plan at the cutoff is still found."""
    return {"objective_bound": cutoff * model.scale * (1 + 1e-9) + 1e-9}


def none_below_cutoff(res: MilpResult) -> bool:
    """True when a solve under ``cutoff_option`` found no plan because none beats the cutoff:
    HiGHS says "infeasible", or stops at the bound (the objective bound prunes, it does not
    always forbid)."""
    return res.a is None and (res.status == 2 or "bound" in res.message.lower())


def solve_model(model: Model, verbose: bool = False, options: dict | None = None) -> MilpResult:
    """Solve a built model with HiGHS, demanding a zero relative gap unless ``options``
    say otherwise. ``options`` go to HiGHS, e.g. ``time_limit`` or ``objective_bound`` (in
    the model's scaled units); ``deadline`` (a ``time.perf_counter`` instant) ends the
    solve then, however long building the model took; ``progress`` hears (best plan, bound)
    in the objective's units while HiGHS runs."""
    if model.empty_layer:
        return MilpResult(2, "a layer has no feasible device", None, math.inf)
    opts = {"disp": bool(verbose), "mip_rel_gap": 0.0, "presolve": True, **(options or {})}
    deadline = opts.pop("deadline", None)
    if deadline is not None and time.perf_counter() >= deadline:
        # Handing a large model to HiGHS takes seconds of its own (7 s for the makespan
        # MILP of ResNet-50 on 16 devices), and a spent limit would not stop its presolve.
        return MilpResult(1, "the time limit struck before HiGHS started", None, math.inf)
    report = opts.pop("progress", None)
    # HiGHS's progress is in the model's scaled units; the caller hears the objective's.
    progress = None if report is None else (lambda p, d: report(p / model.scale, d / model.scale))
    res = _highs(model).solve(_until(opts, deadline), progress=progress)
    if res.status == 2 and opts["presolve"] and "objective_bound" not in opts:
        # HiGHS 1.8's MIP presolve once wrongly declared a tightly bounded model
        # infeasible (a bottleneck cap 1e-7 above a feasible plan). "Infeasible" decides
        # what we tell the user, so confirm it without presolve. (Under a cutoff,
        # "infeasible" only says no plan beats it, and the caller raises the cutoff.)
        res = _highs(model).solve(_until({**opts, "presolve": False}, deadline))
    # HiGHS's dual bound at a time limit: what the "not proven" message can quote.
    bound = res.bound / model.scale if math.isfinite(res.bound) else -math.inf
    if res.x is None:
        return MilpResult(int(res.status), res.message, None, math.inf, bound)
    n, k = model.n, model.k
    xv = _full(model, res.x)[: model.nx].reshape(n, k)
    a = xv.argmax(axis=1).astype(np.intp)
    if np.any(xv[np.arange(n), a] < 0.5):  # pragma: no cover - HiGHS returns integral x
        return MilpResult(4, "solver returned a fractional assignment", None, math.inf)
    return MilpResult(int(res.status), res.message, a, res.fun / model.scale, bound)


@dataclass(frozen=True)
class Multipliers:
    """Non-negative multipliers of the coupling rows (rows divided by their limits),
    in cost units: ``lam`` (k,) memory parameters, ``pi`` (n, k) largest-activation
    rows, ``nu`` (k,) busy time, ``mu`` the energy budget."""

    lam: np.ndarray
    pi: np.ndarray
    nu: np.ndarray
    mu: float


@dataclass(frozen=True)
class LpSolution:
    """An LP relaxation's optimum: ``value`` (cost units), ``x`` (every column of the full
    model, 0 where dropped), ``reduced`` (each full column's reduced cost at its lower
    bound, in the model's scaled units; 0 where dropped) and ``duals`` (one per row, >= 0
    for the "<= hi" rows, in cost units)."""

    value: float
    x: np.ndarray
    reduced: np.ndarray
    duals: np.ndarray


class LpTimeLimit(Exception):
    """An LP relaxation reached its deadline before its optimum: it bounds nothing."""


def solve_lp(model: Model, deadline: float | None = None) -> LpSolution | None:
    """Solve the LP relaxation with HiGHS; None if it is infeasible. Raises LpTimeLimit at
    ``deadline`` (a ``time.perf_counter`` instant), also before handing the model to HiGHS
    once it has passed (a second on a million-row model)."""
    if deadline is not None and time.perf_counter() >= deadline:
        raise LpTimeLimit("the time limit struck before the LP relaxation started")
    return LpSession(model).solve(deadline)


class LpSession:
    """The LP relaxation of a model held by one HiGHS instance: ``add_rows`` appends rows
    and the next ``solve`` starts from the last basis (dual simplex), so rounds of cuts
    cost a few pivots each instead of a solve from scratch."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self._h = _highs(model)
        self._pos = -np.ones(model.nvar, dtype=np.int64)
        self._pos[model.cols] = np.arange(len(model.cols))
        self._le = (model.lo != model.hi) & np.isfinite(model.hi)

    def add_rows(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, count: int, lo: float, hi: float) -> None:
        """Append ``count`` rows (COO in the full model's columns) with lo <= row <= hi."""
        from scipy.sparse import csr_matrix

        p = self._pos[cols]
        keep = p >= 0
        extra = csr_matrix((vals[keep], (rows[keep], p[keep])), shape=(count, len(self.model.cols)))
        self._h.add_rows(extra, np.full(count, lo), np.full(count, hi))
        self._le = np.concatenate([self._le, np.full(count, lo != hi and math.isfinite(hi))])

    def solve(self, deadline: float | None = None) -> LpSolution | None:
        """The LP optimum, or None if the LP is infeasible (a layer with no open choice
        included). Raises LpTimeLimit at ``deadline`` (a ``time.perf_counter`` instant)."""
        from multigpu.partition.solvers.highs import LIMIT

        if self.model.empty_layer:
            return None
        # HiGHS keeps an option between solves, so the limit is set on every one.
        res = self._h.solve(_until({"presolve": False, "time_limit": math.inf}, deadline), relax=True)
        if res.status == LIMIT:
            raise LpTimeLimit(f"the LP relaxation stopped at its deadline: {res.message}")
        if res.status != 0 or res.x is None or res.row_dual is None or res.col_dual is None:
            return None
        model = self.model
        # HiGHS reports a "<= hi" row's dual as <= 0 for a minimisation; the multiplier is its negation.
        dual = np.where(self._le, np.maximum(0.0, -res.row_dual), 0.0) / model.scale
        return LpSolution(res.fun / model.scale, _full(model, res.x), _full(model, res.col_dual), dual)


def relax(model: Model, deadline: float | None = None) -> tuple[float | None, Multipliers | None, np.ndarray | None]:
    """Solve the LP relaxation. Return its value (cost units), the duals of the
    coupling rows as Lagrange multipliers, and the fractional x (n x k); all None if
    the relaxation is infeasible. Raises LpTimeLimit at ``deadline``."""
    lp = solve_lp(model, deadline)
    if lp is None:
        return None, None, None
    n, k = model.n, model.k
    dual = lp.duals
    lam = np.zeros(k)
    pi = np.zeros((n, k))
    nu = np.zeros(k)
    mu = 0.0
    if model.mem_rows >= 0:
        m = len(model.mem_devs)
        lam[model.mem_devs] = dual[model.mem_rows : model.mem_rows + m]
        pi[:, model.mem_devs] = dual[model.act_rows : model.act_rows + m * n].reshape(m, n).T
    if model.busy_rows >= 0:
        nu[model.busy_devs] = dual[model.busy_rows : model.busy_rows + len(model.busy_devs)]
    if model.energy_row >= 0:
        mu = float(dual[model.energy_row])
    return lp.value, Multipliers(lam, pi, nu, mu), lp.x[: model.nx].reshape(n, k)


def with_fixed(model: Model, fixed: np.ndarray) -> Model:
    """The model with the full columns marked in ``fixed`` fixed at 0."""
    ub = np.where(fixed[model.cols], 0.0, model.ub)
    x_ub = _full(model, ub)[: model.nx].reshape(model.n, model.k)
    return replace(model, ub=ub, empty_layer=model.empty_layer or bool((x_ub == 0).all(axis=1).any()))


def _full(model: Model, values: Any) -> np.ndarray:
    """Values of every column of the full model (0 for the dropped ones)."""
    full = np.zeros(model.nvar)
    full[model.cols] = np.asarray(values)
    return full
