"""Building the placement MILP: which choices stay open, the objective, and the rows
(one family at a time, from ``milp_rows``), assembled into a ``Model``.

Variables
  x[i, d] in {0, 1}     layer i runs on device d
  y[e, u, v] in [0, 1]  the edge between layer e and e+1 goes from u to v
  m_d in [0, 1]         the largest activation on memory-limited device d, over its memory
  B >= 0                the throughput bottleneck (when it is the objective or capped)

Rows (see ``milp_rows``)
  assignment   sum_d x[i,d] = 1
  flow         sum_v y[e,u,v] = x[e,u],  sum_u y[e,u,v] = x[e+1,v]
  memory       sum_i p_i x[i,d] + m_d <= mem_d,   m_d >= act_i x[i,d]   (largest activation)
  busy         sum_i comp[i,d] x[i,d] <= busy_d
  energy       E(x, y) <= budget
  bottleneck   load_d(x, y) <= B (every device: compute, stage overheads and transfer
               CPU), load_{u,v}(x, y) <= B (every usable pair but two devices of one host
               with transfer_cpu: that is CPU work), sum_{d on h} load_d / cores_h <= B
               (every host of two or more devices, or of fewer than one core)

The flow rows force y to be the product x[e,u] * x[e+1,v] once x is integral, and make
the LP relaxation of the unconstrained problem a shortest path (integral), so HiGHS
spends its effort on the coupling rows only. scipy is imported lazily, so the core
imports numpy and the standard library only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Collection, Optional

import numpy as np

from multigpu.partition.cost.tables import CostTables
from multigpu.partition.solvers.constraints import ResolvedConstraints
from multigpu.partition.solvers.milp_rows import (
    Layout,
    LoadTerms,
    Rows,
    assignment_rows,
    busy_rows,
    cost_coefficients,
    device_load_rows,
    energy_row,
    flow_rows,
    host_load_rows,
    link_load_rows,
    load_terms,
    memory_rows,
)

__all__ = ["FAMILIES", "Model", "build_model"]

FAMILIES = ("memory", "busy", "energy")
OBJECTIVES = ("latency", "bottleneck", "feasibility")
# A choice whose coefficient alone breaks a limit by more than this relative slack is fixed to 0.
SLACK = 1 + 1e-9


@dataclass(frozen=True)
class Model:
    """A built MILP: ``c``, ``A`` (csr), row bounds ``lo``/``hi``, variable bounds
    ``lb``/``ub`` and ``integrality``, plus where things live: ``nx`` x columns
    (layer-major), ``scale`` (objective multiplier) and the first row of each
    coupling family (-1 when absent): ``energy_row``; ``busy_rows`` for ``busy_devs``;
    ``mem_rows`` (parameter rows) and ``act_rows`` (n rows per device, layer-major)
    for ``mem_devs``; ``m_ub``, the bound of the largest-activation variables."""

    c: np.ndarray
    A: Any
    cols: np.ndarray          # full-model index of each kept column
    nvar: int                 # columns before fixed ones were dropped
    empty_layer: bool         # some layer has no open choice: trivially infeasible
    lo: np.ndarray
    hi: np.ndarray
    lb: np.ndarray
    ub: np.ndarray
    integrality: np.ndarray
    n: int
    k: int
    nx: int
    scale: float
    energy_row: int
    busy_devs: np.ndarray
    busy_rows: int
    mem_devs: np.ndarray
    mem_rows: int
    act_rows: int
    m_ub: float


def _clamp(scale: float, biggest: float) -> float:
    # Keep every scaled coefficient below 1e9: HiGHS treats costs near 1e20 as
    # infinite and loses accuracy long before. Only degenerate inputs (costs spanning
    # more than 1e6 between the optimum and the dearest choice) reach this clamp.
    if biggest > 0 and scale * biggest > 1e9:
        return 1e9 / biggest
    return scale if math.isfinite(scale) and scale > 0 else 1.0


def _biggest_cost(tables: CostTables, forbid: np.ndarray, y_open: np.ndarray, nbytes: np.ndarray,
                  wt: float, we: float) -> float:
    open_x = ~forbid
    node = tables.node(wt, we)
    vals = [node[open_x], tables.first_edge(wt, we)[open_x[0]], tables.last_edge(wt, we)[open_x[-1]]]
    if len(nbytes):
        alpha, beta, _ = tables.edge(wt, we)
        vals.append((nbytes[:, None, None] * alpha[None] + beta[None])[y_open])
    return max(float(np.max(v[np.isfinite(v)], initial=0.0)) for v in vals)


def _open_choices(tables: CostTables, cons: ResolvedConstraints, lay: Layout, use: dict[str, bool],
                  fix_x: Optional[np.ndarray], fix_y: Optional[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(forbid (n, k), y_open (ne, k, k)): the choices fixed to 0 up front. Forbid impossible
    choices instead of giving them huge costs; a choice that breaks a limit on its own can
    never be part of a feasible plan, and fixing it to 0 keeps every constraint
    coefficient <= ~1, so a tiny limit cannot produce badly scaled rows."""
    graph = tables.graph
    forbid = ~cons.allowed | ~np.isfinite(tables.node_time)
    forbid[0] |= ~np.isfinite(tables.first_edge(1.0, 0.0))
    forbid[-1] |= ~np.isfinite(tables.last_edge(1.0, 0.0))
    if use["memory"]:
        need = graph.param_bytes + graph.activation_bytes
        forbid |= need[:, None] > cons.memory[None, :] * SLACK
    if use["busy"]:
        forbid |= tables.comp > cons.busy[None, :] * SLACK
    y_open = np.broadcast_to(tables.cluster.tables.usable, (lay.ne, lay.k, lay.k)).copy()
    if use["energy"]:
        budget = cons.energy_budget * SLACK
        forbid |= tables.node_energy > budget
        forbid[0] |= tables.first_edge(0.0, 1.0) > budget
        forbid[-1] |= tables.last_edge(0.0, 1.0) > budget
        if lay.ne:
            alpha_e, beta_e, _ = tables.edge(0.0, 1.0)
            y_open &= lay.nbytes[:, None, None] * alpha_e[None] + beta_e[None] <= budget
    if fix_x is not None:
        forbid |= fix_x
    if fix_y is not None and lay.ne:
        y_open &= ~fix_y
    return forbid, y_open


def _close_over_bound(terms: LoadTerms, forbid: np.ndarray, y_open: np.ndarray, lay: Layout, upper: float) -> None:
    """Fix to 0 every choice whose bottleneck coefficient alone exceeds ``upper`` (a known
    bound on B: a feasible plan's, or the cap). Every coefficient is >= 0 and a lower
    bound on B once its choice is taken, so this is exact, and it keeps absurd choices'
    huge coefficients away from HiGHS (1.8 declared a feasible model infeasible with
    coefficients near 1e9)."""
    lim = upper * (1 + 1e-9)
    col, nx = terms.col, lay.nx
    over = np.concatenate([col[terms.serial > lim], col[terms.host_of_term >= 0][terms.host_val > lim]])
    flat_x, flat_y = forbid.reshape(-1), y_open.reshape(-1)
    flat_x[over[over < nx]] = True
    flat_y[over[over >= nx] - nx] = False
    forbid[0] |= terms.t_first > lim
    forbid[-1] |= terms.t_last > lim
    y_open &= ~(terms.t_edge > lim)


def build_model(tables: CostTables, cons: ResolvedConstraints, wt: float, we: float, *,
                objective: str = "latency", scale: float = 1.0,
                bottleneck_cap: Optional[float] = None, b_scale: Optional[float] = None,
                b_upper: Optional[float] = None, families: Collection[str] = FAMILIES,
                fix_x: Optional[np.ndarray] = None, fix_y: Optional[np.ndarray] = None) -> Model:
    """Build the placement MILP.

    ``objective="latency"`` minimises wt*T + we*E; ``"bottleneck"`` minimises the
    throughput bottleneck; ``"feasibility"`` only looks for a feasible point.
    ``bottleneck_cap`` (seconds) adds B <= cap to a latency solve (the tie-break
    phase of the throughput objective). ``b_upper`` (seconds) is the bottleneck of
    a known feasible plan: choices that alone exceed it are fixed to 0. ``families`` selects which coupling
    constraints to include (used to find the binding one). ``scale`` multiplies the
    objective so its optimum is well above HiGHS's absolute gap (1e-6); the caller
    picks it from a lower bound. ``b_scale`` scales the bottleneck rows (default
    ``scale``) so their feasibility tolerance is relative to the bottleneck, whatever
    the cost objective's size. ``fix_x``/``fix_y`` mark choices proven useless
    (Lagrangian reduced-cost fixing); they are fixed to 0.
    Raises ValueError for an unknown objective (a programming error: callers check).
    """
    from scipy.sparse import coo_matrix

    if objective not in OBJECTIVES:
        raise ValueError(f"unknown MILP objective {objective!r}")
    use = {"memory": "memory" in families and cons.has_memory, "busy": "busy" in families and cons.has_busy,
           "energy": "energy" in families and cons.has_energy}
    need_b = objective == "bottleneck" or bottleneck_cap is not None
    mem_devs = np.flatnonzero(np.isfinite(cons.memory)) if use["memory"] else np.array([], dtype=np.intp)
    lay = Layout.of(tables, mem_devs, need_b)
    nx, ny, ne = lay.nx, lay.ny, lay.ne

    forbid, y_open = _open_choices(tables, cons, lay, use, fix_x, fix_y)
    terms = load_terms(tables, forbid, lay) if need_b else None
    if terms is not None:
        upper = min(math.inf if b_upper is None else b_upper, math.inf if bottleneck_cap is None else bottleneck_cap)
        if math.isfinite(upper):
            _close_over_bound(terms, forbid, y_open, lay, upper)
    if ne:
        # An edge can only carry flow between choices that are still open.
        y_open &= ~forbid[:-1, :, None] & ~forbid[1:, None, :]

    # Bounds.
    lb = np.zeros(lay.nvar)
    ub = np.ones(lay.nvar)
    ub[:nx][forbid.ravel()] = 0.0
    if ne:
        ub[nx:nx + ny] = y_open.ravel().astype(float)
    # m_d is the largest activation on d as a fraction of its memory: at most 1 once
    # over-sized layers are forbidden (the bound keeps the Lagrangian finite).
    m_ub = 1.0 + 1e-6
    ub[lay.m_off:lay.m_off + len(mem_devs)] = m_ub
    if b_scale is None or objective == "bottleneck":
        b_scale = scale
    if objective == "latency":
        scale = _clamp(scale, _biggest_cost(tables, forbid, y_open, lay.nbytes, wt, we))
    if terms is not None:
        is_open = ub[terms.col] != 0
        biggest = max(float(np.max(terms.serial[is_open], initial=0.0)),
                      float(np.max(terms.host_val[is_open[terms.host_of_term >= 0]], initial=0.0)),
                      float(np.max(terms.t_first[~forbid[0]], initial=0.0)),
                      float(np.max(terms.t_last[~forbid[-1]], initial=0.0)),
                      float(np.max(terms.t_edge[y_open], initial=0.0)))
        b_scale = _clamp(b_scale, biggest)
        if objective == "bottleneck":
            scale = b_scale
        ub[lay.b_idx] = np.inf if bottleneck_cap is None else bottleneck_cap * b_scale

    # Objective.
    c = np.zeros(lay.nvar)
    if objective == "bottleneck":
        c[lay.b_idx] = 1.0
    elif objective == "latency":
        cx, cy = cost_coefficients(tables, forbid, lay, wt, we)
        c[:nx] = scale * cx.ravel()
        c[nx:nx + ny] = scale * cy.ravel()

    # Rows, family by family.
    rows = Rows()
    assignment_rows(rows, lay)
    flow_rows(rows, lay)
    energy_first = busy_first = mem_first = act_first = -1
    busy_devs = np.array([], dtype=np.intp)
    if use["energy"]:
        energy_first = energy_row(rows, tables, cons, forbid, lay)
    if use["busy"]:
        busy_first, busy_devs = busy_rows(rows, tables, cons, lay)
    if len(mem_devs):
        mem_first, act_first = memory_rows(rows, tables, cons, lay)
    if terms is not None:
        device_load_rows(rows, terms, lay, b_scale)
        host_load_rows(rows, terms, lay, b_scale)
        link_load_rows(rows, tables, lay, b_scale)

    A = coo_matrix((np.concatenate(rows.v), (np.concatenate(rows.r), np.concatenate(rows.c))),
                   shape=(rows.count, lay.nvar)).tocsr()
    # Variables fixed at 0 contribute nothing; dropping them keeps huge numbers (a
    # choice that is absurdly expensive) away from the solver.
    # Drop them from the model altogether: HiGHS's presolve would, but only after
    # paying for the full size (the restricted and fixed solves remove most columns).
    cols = np.flatnonzero(ub != 0)
    A = A.tocsc()[:, cols].tocsr()
    integrality = np.zeros(lay.nvar)
    integrality[:nx] = 1
    return Model(c=c[cols], A=A, lo=np.concatenate(rows.lo), hi=np.concatenate(rows.hi), lb=lb[cols],
                 ub=ub[cols], integrality=integrality[cols], cols=cols, nvar=lay.nvar,
                 empty_layer=bool(forbid.all(axis=1).any()),
                 n=lay.n, k=lay.k, nx=nx, scale=scale, energy_row=energy_first,
                 busy_devs=busy_devs, busy_rows=busy_first, mem_devs=mem_devs, mem_rows=mem_first,
                 act_rows=act_first, m_ub=m_ub)
