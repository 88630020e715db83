"""Exact constrained placement as a MILP, solved by HiGHS through ``scipy.optimize.milp``:
solving a built model (``milp_model.build_model``, the formulation) and its LP
relaxation, whose duals become Lagrange multipliers.

scipy is imported here, lazily, so the core imports numpy and the standard library only.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Collection, Optional

import numpy as np

from multigpu.partition.cost.tables import CostTables
from multigpu.partition.solvers.constraints import ResolvedConstraints
from multigpu.partition.solvers.milp_model import FAMILIES, Model, build_model

__all__ = ["FAMILIES", "MilpResult", "Model", "Multipliers", "build_model", "relax", "solve_milp",
           "solve_model"]


@dataclass(frozen=True)
class MilpResult:
    """Outcome of one MILP solve: ``status`` is HiGHS's (0 optimal, 2 infeasible, ...);
    ``a`` the device column per layer when a solution exists; ``value`` the optimum in
    the problem's own units (seconds of bottleneck, or cost); ``bound`` HiGHS's proven
    lower bound in the same units (-inf when it reports none)."""

    status: int
    message: str
    a: Optional[np.ndarray]
    value: float
    bound: float = -math.inf


def solve_milp(tables: CostTables, cons: ResolvedConstraints, wt: float, we: float, *,
               objective: str = "latency", scale: float = 1.0,
               bottleneck_cap: Optional[float] = None, b_scale: Optional[float] = None,
               b_upper: Optional[float] = None,
               families: Collection[str] = FAMILIES, verbose: bool = False,
               fix_x: Optional[np.ndarray] = None, fix_y: Optional[np.ndarray] = None,
               zero_load: bool = False, options: Optional[dict] = None) -> MilpResult:
    """Build and solve the placement MILP (see ``build_model`` for the arguments; its
    valid inequalities included); ``options`` are passed on to HiGHS (e.g. ``time_limit``)."""
    model = build_model(tables, cons, wt, we, objective=objective, scale=scale,
                        bottleneck_cap=bottleneck_cap, b_scale=b_scale, b_upper=b_upper, families=families,
                        fix_x=fix_x, fix_y=fix_y, zero_load=zero_load)
    return solve_model(model, verbose=verbose, options=options)


def solve_model(model: Model, verbose: bool = False, options: Optional[dict] = None) -> MilpResult:
    """Solve a built model with HiGHS, demanding a zero relative gap. ``options`` go
    to HiGHS, e.g. ``time_limit`` or ``objective_bound`` (in the model's scaled units)."""
    from scipy.optimize import Bounds, LinearConstraint, milp  # lazy: scipy is heavy

    if model.empty_layer:
        return MilpResult(2, "a layer has no feasible device", None, math.inf)
    opts = {"disp": bool(verbose), "mip_rel_gap": 0.0, "presolve": True, **(options or {})}

    def run(o: dict) -> Any:
        with warnings.catch_warnings():
            # scipy warns that it passes HiGHS-only options (objective_bound) on
            # verbatim; that is what we want.
            warnings.filterwarnings("ignore", message="Unrecognized options", category=RuntimeWarning)
            return milp(model.c, integrality=model.integrality, bounds=Bounds(model.lb, model.ub),
                        constraints=LinearConstraint(model.A, model.lo, model.hi), options=o)

    res = run(opts)
    if res.status == 2 and opts["presolve"]:
        # HiGHS 1.8's MIP presolve can wrongly declare a tightly bounded model
        # infeasible (seen with a bottleneck cap 1e-7 above a feasible plan).
        # "Infeasible" decides what we tell the user, so confirm it without presolve.
        res = run({**opts, "presolve": False})
    dual = getattr(res, "mip_dual_bound", None)
    # HiGHS's dual bound at a time limit: what the "not proven" message can quote.
    bound = float(dual) / model.scale if dual is not None and math.isfinite(dual) else -math.inf
    if res.x is None:
        return MilpResult(int(res.status), str(res.message), None, math.inf, bound)
    n, k = model.n, model.k
    xv = _full(model, res.x)[:model.nx].reshape(n, k)
    a = xv.argmax(axis=1).astype(np.intp)
    if np.any(xv[np.arange(n), a] < 0.5):  # pragma: no cover - HiGHS returns integral x
        return MilpResult(4, "solver returned a fractional assignment", None, math.inf)
    return MilpResult(int(res.status), str(res.message), a, float(res.fun) / model.scale, bound)


@dataclass(frozen=True)
class Multipliers:
    """Non-negative multipliers of the coupling rows (rows divided by their limits),
    in cost units: ``lam`` (k,) memory parameters, ``pi`` (n, k) largest-activation
    rows, ``nu`` (k,) busy time, ``mu`` the energy budget."""

    lam: np.ndarray
    pi: np.ndarray
    nu: np.ndarray
    mu: float


def relax(model: Model) -> tuple[Optional[float], Optional[Multipliers], Optional[np.ndarray]]:
    """Solve the LP relaxation. Return its value (cost units), the duals of the
    coupling rows as Lagrange multipliers, and the fractional x (n x k); all None if
    the relaxation is infeasible."""
    from scipy.optimize import linprog

    if model.empty_layer:
        return None, None, None
    from scipy.sparse import vstack

    eq = np.flatnonzero(model.lo == model.hi)
    le = np.flatnonzero((model.lo != model.hi) & np.isfinite(model.hi))   # "<= hi" (the coupling rows)
    ge = np.flatnonzero((model.lo != model.hi) & np.isfinite(model.lo))   # ">= lo", as "-row <= -lo"
    A = model.A
    res = linprog(model.c, A_ub=vstack([A[le], -A[ge]]).tocsr(), b_ub=np.concatenate([model.hi[le], -model.lo[ge]]),
                  A_eq=A[eq], b_eq=model.lo[eq], bounds=np.column_stack([model.lb, model.ub]), method="highs")
    if res.status != 0:
        return None, None, None
    dual = np.zeros(A.shape[0])
    # HiGHS reports <= rows' duals as <= 0 for a minimisation; the multipliers are their negation.
    dual[le] = np.maximum(0.0, -np.asarray(res.ineqlin.marginals)[:len(le)]) / model.scale
    n, k = model.n, model.k
    lam = np.zeros(k)
    pi = np.zeros((n, k))
    nu = np.zeros(k)
    mu = 0.0
    if model.mem_rows >= 0:
        m = len(model.mem_devs)
        lam[model.mem_devs] = dual[model.mem_rows:model.mem_rows + m]
        pi[:, model.mem_devs] = dual[model.act_rows:model.act_rows + m * n].reshape(m, n).T
    if model.busy_rows >= 0:
        nu[model.busy_devs] = dual[model.busy_rows:model.busy_rows + len(model.busy_devs)]
    if model.energy_row >= 0:
        mu = float(dual[model.energy_row])
    x = _full(model, res.x)[:model.nx].reshape(n, k)
    return float(res.fun) / model.scale, Multipliers(lam, pi, nu, mu), x


def _full(model: Model, values: Any) -> np.ndarray:
    """Values of every column of the full model (0 for the dropped ones)."""
    full = np.zeros(model.nvar)
    full[model.cols] = np.asarray(values)
    return full
