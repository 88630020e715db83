"""Building the placement MILP: which choices stay open, the objective, and the rows
(one family at a time, from ``milp_rows``, where the variables are described),
assembled into a ``Model``.

Rows
  assignment   sum_d x[i,d] = 1
  flow         sum_v y[e,u,v] = x[src_e,u],  sum_u y[e,u,v] = x[dst_e,v]
  sends        z[q,u,v] >= y[e,u,v] (each edge e out of q),  w[v] >= x[c,v] (each input consumer)
  starts       s[j,v] >= sum_{u != v} y[e,u,v] (each edge e into join j),  s[j,v] >= x[j,v] (input)
  memory       sum_i p_i x[i,d] + m_d <= mem_d,   m_d >= act_i x[i,d]   (largest activation)
  busy         sum_i comp[i,d] x[i,d] <= busy_d
  energy       E <= budget
  bottleneck   load_d <= B (every device: compute, stage overheads and transfer CPU),
               load_{u,v} <= B (every usable pair but two devices of one host with
               transfer_cpu: that is CPU work), sum_{d on h} cpu_d / cores_h <= B (every
               host of two or more devices, or of fewer than one core; cpu_d: d's compute
               and overheads times min(1, cores_h), its transfer CPU in full)

The flow rows force y to be the product x[src_e,u] * x[dst_e,v] once x is integral, and
on a chain make the LP relaxation of the unconstrained problem a shortest path
(integral), so HiGHS spends its effort on the coupling rows only. scipy is imported
lazily, so the core imports numpy and the standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from multigpu.partition.cost.tables import CostTables
from multigpu.partition.solvers.constraints import ResolvedConstraints
from multigpu.partition.solvers.milp_rows import (
    Layout,
    LoadTerms,
    Rows,
    assignment_rows,
    busy_rows,
    column_costs,
    device_load_rows,
    endpoint_rows,
    energy_row,
    flow_rows,
    host_load_rows,
    link_load_rows,
    load_terms,
    memory_rows,
    send_rows,
    start_rows,
    terms,
)
from multigpu.partition.solvers.milp_timing import horizon, outlasting, timing_rows

__all__ = ["FAMILIES", "Model", "build_model"]

FAMILIES = ("memory", "busy", "energy")
OBJECTIVES = ("latency", "bottleneck", "makespan", "feasibility")
# A choice whose coefficient alone breaks a limit by more than this relative slack is fixed to 0.
SLACK = 1 + 1e-9


@dataclass(frozen=True)
class Model:
    """A built MILP: ``c``, ``A`` (csr), row bounds ``lo``/``hi``, variable bounds
    ``lb``/``ub`` and ``integrality``, plus where things live: ``nx`` x columns
    (layer-major), ``scale`` (objective multiplier) and the first row of each
    coupling family (-1 when absent): ``energy_row``; ``busy_rows`` for ``busy_devs``;
    ``mem_rows`` (parameter rows) and ``act_rows`` (n rows per device, layer-major)
    for ``mem_devs``; ``m_ub``, the bound of the largest-activation variables; ``lay``,
    where each variable lives in the full model."""

    c: np.ndarray
    A: Any
    cols: np.ndarray  # full-model index of each kept column
    nvar: int  # columns before fixed ones were dropped
    empty_layer: bool  # some layer has no open choice: trivially infeasible
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
    lay: Layout


def _clamp(scale: float, biggest: float) -> float:
    # Keep every scaled coefficient below 1e9: HiGHS treats costs near 1e20 as
    # infinite and loses accuracy long before. Only degenerate inputs (costs spanning
    # more than 1e6 between the optimum and the dearest choice) reach this clamp.
    if biggest > 0 and scale * biggest > 1e9:
        return 1e9 / biggest
    return scale if math.isfinite(scale) and scale > 0 else 1.0


def _open_columns(
    tables: CostTables,
    cons: ResolvedConstraints,
    lay: Layout,
    use: dict[str, bool],
    time: np.ndarray,
    energy: np.ndarray,
    fix_x: np.ndarray | None,
) -> np.ndarray:
    """(nvar,) bool: the columns not fixed to 0 up front. Impossible choices (pins,
    exclusions, unusable pairs) are closed instead of given huge costs; a choice that
    breaks a limit on its own can never be part of a feasible plan, and closing it keeps
    every constraint coefficient <= ~1, so a tiny limit cannot produce badly scaled rows."""
    graph, cluster = tables.graph, tables.cluster
    k = lay.k
    open_ = np.isfinite(time)
    forbid = ~cons.allowed
    if use["memory"]:
        need = graph.param_bytes + graph.activation_bytes
        forbid |= need[:, None] > cons.memory[None, :] * SLACK
    if use["busy"]:
        forbid |= tables.comp > cons.busy[None, :] * SLACK
    if fix_x is not None:
        forbid |= fix_x
    open_[: lay.nx] &= ~forbid.ravel()
    diag = np.arange(k)
    open_[lay.zi[:, diag, diag].ravel()] = False  # a send from a device to itself is no send
    if lay.wi is not None:
        open_[lay.wi[cluster.source_index]] = False
    if use["energy"]:
        open_ &= ~(energy > cons.energy_budget * SLACK)
    return open_


def _propagate(tables: CostTables, lay: Layout, open_: np.ndarray) -> None:
    """Close the columns whose choice needs a closed x: an edge only carries flow between
    open choices, a producer sends only from a device it may run on to one a consumer
    may run on, and so on."""
    graph = tables.graph
    ox = open_[lay.xi]
    if lay.ne:
        open_[lay.yi] &= ox[lay.esrc][:, :, None] & ox[lay.edst][:, None, :]
    if len(lay.zp):
        reach = np.stack([ox[list(graph.consumers[p])].any(axis=0) for p in lay.zp])
        open_[lay.zi] &= ox[lay.zp][:, :, None] & reach[:, None, :]
    if lay.wi is not None:
        open_[lay.wi] &= ox[graph.input_consumers].any(axis=0)
    if len(lay.jl):
        open_[lay.si] &= ox[lay.jl]


def _close_over_bound(lt: LoadTerms, open_: np.ndarray, upper: float) -> None:
    """Close every column whose bottleneck coefficient alone exceeds ``upper`` (a known
    bound on B: a feasible plan's, or the cap). Every coefficient is >= 0 and a lower
    bound on B once its choice is taken, so this is exact, and it keeps absurd choices'
    huge coefficients away from HiGHS (1.8 declared a feasible model infeasible with
    coefficients near 1e9)."""
    lim = upper * (1 + 1e-9)
    open_[lt.col[lt.serial > lim]] = False
    open_[lt.col[lt.host_of_term >= 0][lt.host_val > lim]] = False
    open_[lt.link_col[(lt.link_pair >= 0) & (lt.link_time > lim)]] = False


def _close_loaded(lt: LoadTerms, open_: np.ndarray) -> None:
    """Close every column that puts any load on a device, host or link (for B = 0)."""
    open_[lt.col[lt.serial > 0]] = False
    open_[lt.col[lt.host_of_term >= 0][lt.host_val > 0]] = False
    open_[lt.link_col[(lt.link_pair >= 0) & (lt.link_time > 0)]] = False


def build_model(
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
    fix_x: np.ndarray | None = None,
    zero_load: bool = False,
    cuts: bool = True,
    deadline: float | None = None,
    horizon_cap: float | None = None,
) -> Model:
    """Build the placement MILP.

    ``objective="latency"`` minimises wt*T + we*E; ``"bottleneck"`` minimises the
    throughput bottleneck; ``"makespan"`` the makespan (``milp_timing``; ``scale`` is
    ignored: times are in units of a thousandth of a horizon); ``"feasibility"`` only
    looks for a feasible point.
    ``bottleneck_cap`` (seconds) adds B <= cap to a latency solve (the tie-break
    phase of the throughput objective); ``zero_load`` closes every choice that loads a
    device, host or link (the tie-break when the bottleneck is 0). ``b_upper`` (seconds)
    is the bottleneck of a known feasible plan: choices that alone exceed it are fixed to
    0. ``families`` selects which coupling constraints to include (used to find the
    binding one). ``scale`` multiplies the objective so its optimum is well above
    HiGHS's absolute gap (1e-6); the caller picks it from a lower bound. ``b_scale``
    scales the bottleneck rows (default ``scale``) so their feasibility tolerance is
    relative to the bottleneck, whatever the cost objective's size. ``fix_x`` (n, k)
    marks layer placements to leave out (fixed to 0): the planner's restricted MILP.
    ``cuts`` adds the memory family's valid inequalities (``endpoint_rows``): they
    tighten the LP relaxation and remove no integral plan; the planner leaves them out
    of the LP whose duals price the Lagrangian (which has no term for them).
    ``deadline`` (a ``time.perf_counter`` instant) stops the makespan rows' loops with
    ``milp_timing.BuildTimeLimit``. ``horizon_cap`` (seconds; the makespan only) keeps only
    the plans whose makespan is at most it: the schedule rows' horizon shrinks to it (M to
    twice it), and a placement or transfer that alone outlasts it is closed
    (``milp_timing.outlasting``).
    Raises ValueError for an unknown objective (a programming error: callers check).
    """
    from scipy.sparse import coo_matrix

    if objective not in OBJECTIVES:
        raise ValueError(f"unknown MILP objective {objective!r}")
    use = {
        "memory": "memory" in families and cons.has_memory,
        "busy": "busy" in families and cons.has_busy,
        "energy": "energy" in families and cons.has_energy,
    }
    need_b = objective == "bottleneck" or bottleneck_cap is not None or zero_load
    mem_devs = np.flatnonzero(np.isfinite(cons.memory)) if use["memory"] else np.array([], dtype=np.intp)
    timed = objective == "makespan"
    capped = timed and horizon_cap is not None and math.isfinite(horizon_cap)
    if capped:
        assert horizon_cap is not None
        late = outlasting(tables, cons, horizon_cap)
        fix_x = late if fix_x is None else (fix_x | late)
    lay = Layout.of(tables, mem_devs, need_b, timing=timed)
    nx = lay.nx
    tm = terms(tables, lay)
    time = column_costs(tables, lay, 1.0, 0.0)
    energy = column_costs(tables, lay, 0.0, 1.0)
    cost = time if (wt, we) == (1.0, 0.0) else column_costs(tables, lay, wt, we)
    open_ = _open_columns(tables, cons, lay, use, time, energy, fix_x)
    if capped:
        # A transfer that alone outlasts the cap is in no plan below it: its column closes, so
        # that no schedule row must stretch over it (the rows' M covers one time plus one
        # transfer, at most twice the cap).
        assert horizon_cap is not None
        tab = tables.cluster.tables
        hop = np.where(tab.usable[tm.t_u, tm.t_v], tab.hop_seconds(tm.t_bytes, tm.t_u, tm.t_v), 0.0)
        open_[tm.t_col[hop > horizon_cap * (1 + 1e-9)]] = False
    open_[lay.m_off :] = True
    if timed:
        assert lay.timing is not None  # Layout.of(timing=True) made it
        open_[lay.timing.first : lay.timing.end] = True
    lt = load_terms(tables, ~open_[lay.xi], lay, tm) if need_b else None
    if lt is not None:
        upper = min(math.inf if b_upper is None else b_upper, math.inf if bottleneck_cap is None else bottleneck_cap)
        if math.isfinite(upper):
            _close_over_bound(lt, open_, upper)
        if zero_load:
            _close_loaded(lt, open_)
    _propagate(tables, lay, open_)
    open_[lay.m_off :] = True

    # Bounds.
    lb = np.zeros(lay.nvar)
    ub = open_.astype(float)
    # m_d is the largest activation on d as a fraction of its memory: at most 1 once
    # over-sized layers are forbidden (the bound keeps the Lagrangian finite).
    m_ub = 1.0 + 1e-6
    ub[lay.m_off : lay.m_off + len(mem_devs)] = m_ub
    if timed:
        assert lay.timing is not None
        ub[lay.timing.first : lay.timing.end] = np.inf
        # Times in thousandths of the horizon: the optimum lands in (0, 1000], well above
        # HiGHS's tolerances, and M = 1000 (a little more) bounds every time (twice that
        # under a cap, below).
        longest = horizon(tables, lay, tm, open_)
        if capped:
            # Every time of a plan below the cap is below it (each layer reaches the last one,
            # whose finish the makespan bounds), and so is every transfer left open: the cap
            # serves as the horizon, and M as twice it. A tighter LP, and a binary's tolerance
            # shaves 1e-6 of the cap, not of the slowest plan.
            assert horizon_cap is not None
            longest = min(longest, horizon_cap)
            ub[lay.timing.makespan] = 1e3 * (1 + 1e-6)
        unit = max(longest, 1e-300) / 1e3
        scale = 1.0 / unit
    if b_scale is None or objective == "bottleneck":
        b_scale = scale
    if objective == "latency":
        vals = cost[open_[: lay.m_off].nonzero()[0]]
        scale = _clamp(scale, float(np.max(vals[np.isfinite(vals)], initial=0.0)))
    if lt is not None:
        is_open = open_[lt.col]
        link_open = open_[lt.link_col] & (lt.link_pair >= 0)
        biggest = max(
            float(np.max(lt.serial[is_open], initial=0.0)),
            float(np.max(lt.host_val[is_open[lt.host_of_term >= 0]], initial=0.0)),
            float(np.max(lt.link_time[link_open], initial=0.0)),
        )
        b_scale = _clamp(b_scale, biggest)
        if objective == "bottleneck":
            scale = b_scale
        ub[lay.b_idx] = np.inf if bottleneck_cap is None else bottleneck_cap * b_scale

    # Objective.
    c = np.zeros(lay.nvar)
    if objective == "bottleneck":
        c[lay.b_idx] = 1.0
    elif objective == "makespan":
        assert lay.timing is not None
        c[lay.timing.makespan] = 1.0
    elif objective == "latency":
        c[: lay.m_off] = scale * np.where(open_[: lay.m_off], cost[: lay.m_off], 0.0)

    # Rows, family by family.
    rows = Rows()
    assignment_rows(rows, lay)
    flow_rows(rows, lay)
    send_rows(rows, tables, lay)
    start_rows(rows, tables, lay)
    energy_first = busy_first = mem_first = act_first = -1
    busy_devs = np.array([], dtype=np.intp)
    if use["energy"]:
        energy_first = energy_row(rows, energy, open_, cons.energy_budget)
    if use["busy"]:
        busy_first, busy_devs = busy_rows(rows, tables, cons, lay)
    if len(mem_devs):
        mem_first, act_first = memory_rows(rows, tables, cons, lay)
        if cuts:
            endpoint_rows(rows, tables, cons, lay)
    if timed:
        timing_rows(rows, tables, lay, tm, open_, unit, (2e3 if capped else 1e3) * (1 + 1e-6), deadline)
    if lt is not None:
        device_load_rows(rows, lt, lay, b_scale)
        host_load_rows(rows, lt, lay, b_scale)
        link_load_rows(rows, lt, lay, b_scale)

    A = coo_matrix(
        (np.concatenate(rows.v), (np.concatenate(rows.r), np.concatenate(rows.c))), shape=(rows.count, lay.nvar)
    ).tocsr()
    # Variables fixed at 0 contribute nothing; dropping them keeps huge numbers (a
    # choice that is absurdly expensive) away from the solver.
    # Drop them from the model altogether: HiGHS's presolve would, but only after
    # paying for the full size (the restricted and fixed solves remove most columns).
    cols = np.flatnonzero(ub != 0)
    A = A.tocsc()[:, cols].tocsr()
    integrality = np.zeros(lay.nvar)
    integrality[:nx] = 1
    return Model(
        c=c[cols],
        A=A,
        lo=np.concatenate(rows.lo),
        hi=np.concatenate(rows.hi),
        lb=lb[cols],
        ub=ub[cols],
        integrality=integrality[cols],
        cols=cols,
        nvar=lay.nvar,
        empty_layer=bool((~open_[lay.xi]).all(axis=1).any()),
        n=lay.n,
        k=lay.k,
        nx=nx,
        scale=scale,
        energy_row=energy_first,
        busy_devs=busy_devs,
        busy_rows=busy_first,
        mem_devs=mem_devs,
        mem_rows=mem_first,
        act_rows=act_first,
        m_ub=m_ub,
        lay=lay,
    )
