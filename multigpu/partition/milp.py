"""Exact constrained placement as a MILP, solved by HiGHS through ``scipy.optimize.milp``.

Variables
  x[i, d] in {0, 1}     layer i runs on device d
  y[e, u, v] in [0, 1]  the edge between layer e and e+1 goes from u to v

The flow constraints  sum_v y[e,u,v] = x[e,u]  and  sum_u y[e,u,v] = x[e+1,v]
force y to be the product x[e,u] * x[e+1,v] once x is integral, and make the LP
relaxation of the unconstrained problem a shortest path (integral), so HiGHS
spends its effort on the coupling constraints only:

  memory   sum_i p_i x[i,d] + m_d <= mem_d,   m_d >= act_i x[i,d]   (largest activation)
  busy     sum_i comp[i,d] x[i,d] <= busy_d
  energy   E(x, y) <= budget
  bottleneck (throughput objective)
           load_d(x, y) <= B              for every device: compute, stage overheads
                                          (x[0,d], y[e,u,d]) and transfer CPU (the
                                          transfers d sends, receives or relays)
           load_{u,v}(x, y) <= B          for every usable pair (but two devices of one
                                          host with transfer_cpu: that is CPU work)
           sum_{d on h} load_d / cores_h <= B   for every host of two or more devices
                                          (or of fewer than one core)

scipy is imported here, lazily, so the core imports numpy and the standard library only.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Collection, Optional

import numpy as np

from multigpu.partition.constraints import ResolvedConstraints
from multigpu.partition.costmodel import CostTables, transfer_cpu_terms

__all__ = ["FAMILIES", "MilpResult", "Model", "Multipliers", "build_model", "relax", "solve_milp",
           "solve_model"]

FAMILIES = ("memory", "busy", "energy")


@dataclass(frozen=True)
class MilpResult:
    """Outcome of one MILP solve: ``status`` is HiGHS's (0 optimal, 2 infeasible, ...);
    ``a`` the device column per layer when a solution exists; ``value`` the optimum in
    the problem's own units (seconds of bottleneck, or cost)."""

    status: int
    message: str
    a: Optional[np.ndarray]
    value: float


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


def _link_times(tables: CostTables, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Activation transfer time a choice puts on its link: (k,) of the input from the
    source to layer 1 on each device, (k,) of the output from each device to the sink,
    (n-1, k, k) of each edge; 0 where nothing moves, the pair is unusable, or its
    transfers are CPU work of one host (``Cluster.cpu_links``)."""
    graph, cluster = tables.graph, tables.cluster
    tab = cluster.tables
    src, sink = cluster.source_index, cluster.sink_index
    t_first = np.where(tab.usable[src], graph.input_bytes * tab.inv_bandwidth[src] + tab.latency[src], 0.0)
    t_last = np.where(tab.usable[:, sink], float(graph.output_bytes[-1]) * tab.inv_bandwidth[:, sink]
                      + tab.latency[:, sink], 0.0)
    t_first[src] = t_last[sink] = 0.0
    t_first[cluster.cpu_links[src]] = 0.0          # CPU work of one host: no link load
    t_last[cluster.cpu_links[:, sink]] = 0.0
    t_edge = nbytes[:, None, None] * tab.inv_bandwidth[None] + tab.latency[None]
    t_edge[:, ~tab.usable | cluster.cpu_links] = 0.0
    t_edge[:, np.arange(cluster.k), np.arange(cluster.k)] = 0.0
    return t_first, t_last, t_edge


def _host_terms(cluster: Any, load_dev: np.ndarray, load_val: np.ndarray, load_serial: np.ndarray
                ) -> tuple[int, np.ndarray, np.ndarray]:
    """Host rows: (how many, the host row of each load term or -1, the values of the
    terms on a host divided by its cores). Only hosts whose share can exceed their
    devices' own loads get a row: two or more devices, fewer than one core, or a device
    whose transfer CPU is partly off its computing thread (counted by the host only)."""
    nh = len(cluster.hosts)
    members = np.bincount(cluster.host_index[cluster.host_index >= 0], minlength=nh)
    h_term = cluster.host_index[load_dev]
    partly = np.bincount(h_term[(h_term >= 0) & (load_val > load_serial)], minlength=nh) > 0
    hosts = np.flatnonzero((members >= 2) | ((members == 1) & ((cluster.host_cores < 1) | partly)))
    row_of_host = -np.ones(len(cluster.hosts) + 1, dtype=np.int64)   # index -1: no host
    row_of_host[hosts] = np.arange(len(hosts))
    term_row = row_of_host[cluster.host_index[load_dev]]
    on = term_row >= 0
    cores = cluster.host_cores[cluster.host_index[load_dev[on]]] if on.any() else np.zeros(0)
    return len(hosts), term_row, load_val[on] / cores


def _load_terms(tables: CostTables, forbid: np.ndarray, xi: np.ndarray, yi: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each device's load per item as (device, column, seconds, serial seconds) over x
    and y: compute on x[i,d]; the stage overhead of the stage a choice starts (x[0,d],
    and y[e,u,d] for u != d); the CPU of the transfer a choice makes (x[0,v] for the
    input from the source, y[e,u,v], x[n-1,u] for the output to the sink). A device's
    row counts the serial seconds, its host's row all of them."""
    graph, cluster = tables.graph, tables.cluster
    n, k = graph.n, cluster.k
    src, sink = cluster.source_index, cluster.sink_index
    comp = np.where(forbid, 0.0, tables.comp).T.ravel()
    devs, cols, vals, serial = [np.repeat(np.arange(k), n)], [xi.T.ravel()], [comp], [comp]
    oh = cluster.stage_overhead
    ar = np.arange(k)
    if oh.any():
        devs.append(ar)
        cols.append(xi[0])
        vals.append(oh)
        serial.append(oh)
    ne = n - 1
    off = ~np.eye(k, dtype=bool)
    eu, ev = np.nonzero(off)                                  # every ordered pair u != v
    if ne and oh.any():
        devs.append(np.tile(ev, ne))
        cols.append(yi[:, eu, ev].ravel())
        vals.append(np.tile(oh[ev], ne))
        serial.append(vals[-1])
    if cluster.has_transfer_cpu:
        # The transfers a single choice makes: input from the source, output to the sink.
        for layer, end, nb, sending in ((0, src, graph.input_bytes, False),
                                        (n - 1, sink, float(graph.output_bytes[-1]), True)):
            others = ar[ar != end]
            u, v = (others, np.full(len(others), end)) if sending else (np.full(len(others), end), others)
            j, d, val, ser = transfer_cpu_terms(cluster, u, v, np.full(len(others), nb))
            devs.append(d)
            cols.append(xi[layer, others[j]])
            vals.append(val)
            serial.append(ser)
        if ne:
            e = np.repeat(np.arange(ne), len(eu))
            u, v = np.tile(eu, ne), np.tile(ev, ne)
            j, d, val, ser = transfer_cpu_terms(cluster, u, v, graph.output_bytes[:-1][e])
            devs.append(d)
            cols.append(yi[e[j], u[j], v[j]])
            vals.append(val)
            serial.append(ser)
    return np.concatenate(devs), np.concatenate(cols), np.concatenate(vals), np.concatenate(serial)


class _Rows:
    """Accumulates sparse rows as COO triplets."""

    def __init__(self) -> None:
        self.r: list[np.ndarray] = []
        self.c: list[np.ndarray] = []
        self.v: list[np.ndarray] = []
        self.lo: list[np.ndarray] = []
        self.hi: list[np.ndarray] = []
        self.count = 0

    def add(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, nrows: int,
            lo: float | np.ndarray, hi: float | np.ndarray) -> None:
        keep = vals != 0
        self.r.append(np.asarray(rows, dtype=np.int64)[keep] + self.count)
        self.c.append(np.asarray(cols, dtype=np.int64)[keep])
        self.v.append(np.asarray(vals, dtype=float)[keep])
        self.lo.append(np.broadcast_to(np.asarray(lo, dtype=float), (nrows,)))
        self.hi.append(np.broadcast_to(np.asarray(hi, dtype=float), (nrows,)))
        self.count += nrows


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


def solve_milp(tables: CostTables, cons: ResolvedConstraints, wt: float, we: float, *,
               objective: str = "latency", scale: float = 1.0,
               bottleneck_cap: Optional[float] = None, b_scale: Optional[float] = None,
               b_upper: Optional[float] = None,
               families: Collection[str] = FAMILIES, verbose: bool = False,
               fix_x: Optional[np.ndarray] = None, fix_y: Optional[np.ndarray] = None,
               options: Optional[dict] = None) -> MilpResult:
    """Build and solve the placement MILP (see ``build_model`` for the arguments);
    ``options`` are passed on to HiGHS (e.g. ``time_limit``)."""
    model = build_model(tables, cons, wt, we, objective=objective, scale=scale,
                        bottleneck_cap=bottleneck_cap, b_scale=b_scale, b_upper=b_upper, families=families,
                        fix_x=fix_x, fix_y=fix_y)
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
    if res.x is None:
        return MilpResult(int(res.status), str(res.message), None, math.inf)
    n, k = model.n, model.k
    xv = _full(model, res.x)[:model.nx].reshape(n, k)
    a = xv.argmax(axis=1).astype(np.intp)
    if np.any(xv[np.arange(n), a] < 0.5):  # pragma: no cover - HiGHS returns integral x
        return MilpResult(4, "solver returned a fractional assignment", None, math.inf)
    return MilpResult(int(res.status), str(res.message), a, float(res.fun) / model.scale)


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
    """
    from scipy.sparse import coo_matrix


    graph, cluster = tables.graph, tables.cluster
    n, k = graph.n, cluster.k
    nx = n * k
    ne = n - 1
    ny = ne * k * k
    tab = cluster.tables
    src, sink = cluster.source_index, cluster.sink_index
    blocked = ~tab.usable
    nbytes = graph.output_bytes[:-1]                     # edge e carries layer e's output

    use_mem = "memory" in families and cons.has_memory
    use_busy = "busy" in families and cons.has_busy
    use_energy = "energy" in families and cons.has_energy
    need_b = objective == "bottleneck" or bottleneck_cap is not None
    mem_devs = np.flatnonzero(np.isfinite(cons.memory)) if use_mem else np.array([], dtype=np.intp)
    n_m = len(mem_devs)
    nvar = nx + ny + n_m + (1 if need_b else 0)
    m_off = nx + ny
    b_idx = nvar - 1

    # Index grids.
    xi = np.arange(nx).reshape(n, k)
    e_ar = np.arange(ne)
    yi = nx + np.arange(ny).reshape(ne, k, k) if ne else np.empty((0, k, k), dtype=np.int64)

    # Bounds: forbid impossible choices instead of giving them huge costs.
    lb = np.zeros(nvar)
    ub = np.ones(nvar)
    if objective not in ("latency", "bottleneck", "feasibility"):
        raise ValueError(f"unknown MILP objective {objective!r}")
    node_t = tables.node_time
    first_t = tables.first_edge(1.0, 0.0)
    last_t = tables.last_edge(1.0, 0.0)
    forbid = ~cons.allowed | ~np.isfinite(node_t)
    forbid[0] |= ~np.isfinite(first_t)
    forbid[-1] |= ~np.isfinite(last_t)
    # A choice that breaks a limit on its own can never be part of a feasible plan.
    # Fixing it to 0 up front keeps every constraint coefficient <= ~1, so a tiny
    # limit cannot produce badly scaled rows.
    slack = 1 + 1e-9
    if use_mem:
        need = graph.param_bytes + graph.activation_bytes
        forbid |= need[:, None] > cons.memory[None, :] * slack
    if use_busy:
        forbid |= tables.comp > cons.busy[None, :] * slack
    y_open = np.broadcast_to(~blocked, (ne, k, k)).copy()
    if use_energy:
        fe, le = tables.first_edge(0.0, 1.0), tables.last_edge(0.0, 1.0)
        forbid |= tables.node_energy > cons.energy_budget * slack
        forbid[0] |= fe > cons.energy_budget * slack
        forbid[-1] |= le > cons.energy_budget * slack
        if ne:
            alpha_e, beta_e, _ = tables.edge(0.0, 1.0)
            y_open &= nbytes[:, None, None] * alpha_e[None] + beta_e[None] <= cons.energy_budget * slack
    if fix_x is not None:
        forbid |= fix_x
    if fix_y is not None and ne:
        y_open &= ~fix_y
    if need_b:
        # Every bottleneck row's coefficient of a choice is a lower bound on B once that
        # choice is taken (all coefficients are >= 0), so a choice whose coefficient alone
        # exceeds a known bound on B (a feasible plan's, or the cap) cannot be optimal.
        # Fixing it to 0 is exact, and keeps absurd choices' huge coefficients away from
        # HiGHS (1.8 declared a feasible model infeasible with coefficients near 1e9).
        load_dev, load_col, load_val, load_serial = _load_terms(tables, forbid, xi, yi)
        host_rows, host_of_term, host_val = _host_terms(cluster, load_dev, load_val, load_serial)
        t_first, t_last, t_edge = _link_times(tables, nbytes)
        upper = min(math.inf if b_upper is None else b_upper,
                    math.inf if bottleneck_cap is None else bottleneck_cap)
        if math.isfinite(upper):
            lim = upper * (1 + 1e-9)
            over = np.concatenate([load_col[load_serial > lim], load_col[host_of_term >= 0][host_val > lim]])
            flat_x, flat_y = forbid.reshape(-1), y_open.reshape(-1)
            flat_x[over[over < nx]] = True
            flat_y[over[over >= nx] - nx] = False
            forbid[0] |= t_first > lim
            forbid[-1] |= t_last > lim
            y_open &= ~(t_edge > lim)
    if ne:
        # An edge can only carry flow between choices that are still open.
        y_open &= ~forbid[:-1, :, None] & ~forbid[1:, None, :]
    ub[:nx][forbid.ravel()] = 0.0
    if ne:
        ub[nx:nx + ny] = y_open.ravel().astype(float)
    # m_d is the largest activation on d as a fraction of its memory: at most 1 once
    # over-sized layers are forbidden (the bound keeps the Lagrangian finite).
    m_ub = 1.0 + 1e-6
    if n_m:
        ub[m_off:m_off + n_m] = m_ub
    if b_scale is None or objective == "bottleneck":
        b_scale = scale
    if objective == "latency":
        scale = _clamp(scale, _biggest_cost(tables, forbid, y_open, nbytes, wt, we))
    if need_b:
        is_open = ub[load_col] != 0
        biggest = max(float(np.max(load_serial[is_open], initial=0.0)),
                      float(np.max(host_val[is_open[host_of_term >= 0]], initial=0.0)),
                      float(np.max(t_first[~forbid[0]], initial=0.0)), float(np.max(t_last[~forbid[-1]], initial=0.0)),
                      float(np.max(t_edge[y_open], initial=0.0)))
        b_scale = _clamp(b_scale, biggest)
        if objective == "bottleneck":
            scale = b_scale
        ub[b_idx] = np.inf if bottleneck_cap is None else bottleneck_cap * b_scale

    # Objective.
    c = np.zeros(nvar)
    if objective == "bottleneck":
        c[b_idx] = 1.0
    elif objective == "latency":
        node_w = tables.node(wt, we)
        first_w = tables.first_edge(wt, we)
        last_w = tables.last_edge(wt, we)
        cx = np.where(forbid, 0.0, node_w)
        cx[0] += np.where(np.isfinite(first_w), first_w, 0.0)
        cx[-1] += np.where(np.isfinite(last_w), last_w, 0.0)
        c[:nx] = scale * cx.ravel()
        if ne:
            alpha, beta, _ = tables.edge(wt, we)
            cy = nbytes[:, None, None] * alpha[None] + beta[None]
            cy[:, blocked] = 0.0
            cy[:, np.arange(k), np.arange(k)] = 0.0
            c[nx:nx + ny] = scale * cy.ravel()

    rows = _Rows()
    # Each layer on exactly one device.
    rows.add(np.repeat(np.arange(n), k), xi.ravel(), np.ones(nx), n, 1.0, 1.0)
    if ne:
        # Flow out of (e, u) and into (e+1, v).
        r_out = (e_ar[:, None, None] * k + np.arange(k)[None, :, None]) + np.zeros((1, 1, k), dtype=np.int64)
        rows.add(np.concatenate([r_out.ravel(), (e_ar[:, None] * k + np.arange(k)[None, :]).ravel()]),
                 np.concatenate([yi.ravel(), xi[:-1].ravel()]),
                 np.concatenate([np.ones(ny), -np.ones(ne * k)]), ne * k, 0.0, 0.0)
        r_in = (e_ar[:, None, None] * k + np.arange(k)[None, None, :]) + np.zeros((1, k, 1), dtype=np.int64)
        rows.add(np.concatenate([r_in.ravel(), (e_ar[:, None] * k + np.arange(k)[None, :]).ravel()]),
                 np.concatenate([yi.ravel(), xi[1:].ravel()]),
                 np.concatenate([np.ones(ny), -np.ones(ne * k)]), ne * k, 0.0, 0.0)

    energy_row = busy_rows = mem_rows = act_rows = -1
    busy_devs = np.array([], dtype=np.intp)
    if use_energy:
        energy_row = rows.count
        # One row, divided by the budget so the solver's tolerance is relative.
        budget = cons.energy_budget
        ex = np.where(forbid, 0.0, tables.node_energy)
        fe, le = tables.first_edge(0.0, 1.0), tables.last_edge(0.0, 1.0)
        ex[0] += np.where(np.isfinite(fe), fe, 0.0)
        ex[-1] += np.where(np.isfinite(le), le, 0.0)
        cols = [xi.ravel()]
        vals = [ex.ravel() / budget]
        if ne:
            alpha, beta, _ = tables.edge(0.0, 1.0)
            ey = nbytes[:, None, None] * alpha[None] + beta[None]
            ey[:, blocked] = 0.0
            ey[:, np.arange(k), np.arange(k)] = 0.0
            cols.append(yi.ravel())
            vals.append(ey.ravel() / budget)
        cc = np.concatenate(cols)
        rows.add(np.zeros(len(cc), dtype=np.int64), cc, np.concatenate(vals), 1, -np.inf, 1.0)

    if use_busy:
        devs = busy_devs = np.flatnonzero(np.isfinite(cons.busy))
        busy_rows = rows.count
        vals = (tables.comp[:, devs] / cons.busy[devs][None, :]).T          # (len(devs), n)
        rows.add(np.repeat(np.arange(len(devs)), n), xi[:, devs].T.ravel(), vals.ravel(),
                 len(devs), -np.inf, 1.0)

    if n_m:
        mem = cons.memory[mem_devs]
        p = graph.param_bytes
        act = graph.activation_bytes
        # sum_i p_i/mem x[i,d] + m_d <= 1   (m_d: the largest activation, as a fraction)
        mem_rows = rows.count
        r = np.concatenate([np.repeat(np.arange(n_m), n), np.arange(n_m)])
        cl = np.concatenate([xi[:, mem_devs].T.ravel(), m_off + np.arange(n_m)])
        vl = np.concatenate([(p[None, :] / mem[:, None]).ravel(), np.ones(n_m)])
        rows.add(r, cl, vl, n_m, -np.inf, 1.0)
        # act_i/mem x[i,d] - m_d <= 0
        act_rows = rows.count
        r = np.arange(n_m * n)
        rows.add(np.concatenate([r, r]),
                 np.concatenate([xi[:, mem_devs].T.ravel(), np.repeat(m_off + np.arange(n_m), n)]),
                 np.concatenate([(act[None, :] / mem[:, None]).ravel(), -np.ones(n_m * n)]),
                 n_m * n, -np.inf, 0.0)

    if need_b:
        # Device rows: b_scale * load of d (serial transfer CPU) - B <= 0.
        rows.add(np.concatenate([load_dev, np.arange(k)]), np.concatenate([load_col, np.full(k, b_idx)]),
                 np.concatenate([b_scale * load_serial, -np.ones(k)]), k, -np.inf, 0.0)
        if host_rows:
            # Host rows: b_scale * (sum of its devices' loads) / cores - B <= 0.
            sel = host_of_term >= 0
            rows.add(np.concatenate([host_of_term[sel], np.arange(host_rows)]),
                     np.concatenate([load_col[sel], np.full(host_rows, b_idx)]),
                     np.concatenate([b_scale * host_val, -np.ones(host_rows)]), host_rows, -np.inf, 0.0)
        # Link rows: b_scale * activation transfer time over {u, v} - B <= 0.
        pu, pv = np.nonzero(np.triu(tab.usable & ~cluster.cpu_links, 1))
        npairs = len(pu)
        if npairs:
            r_parts, c_parts, v_parts = [], [], []
            if ne:
                t = nbytes[None, :] * tab.inv_bandwidth[pu, pv][:, None] + tab.latency[pu, pv][:, None]
                rr = np.repeat(np.arange(npairs), ne)
                r_parts += [rr, rr]
                c_parts += [yi[:, pu, pv].T.ravel(), yi[:, pv, pu].T.ravel()]
                v_parts += [b_scale * t.ravel(), b_scale * t.ravel()]
            pair_of = -np.ones((k, k), dtype=np.int64)
            pair_of[pu, pv] = np.arange(npairs)
            pair_of[pv, pu] = np.arange(npairs)
            for layer, end, nb in ((0, src, graph.input_bytes), (n - 1, sink, float(graph.output_bytes[-1]))):
                others = np.array([d for d in range(k) if d != end and pair_of[end, d] >= 0], dtype=np.int64)
                if len(others):
                    t = nb * tab.inv_bandwidth[end, others] + tab.latency[end, others]
                    r_parts.append(pair_of[end, others])
                    c_parts.append(xi[layer, others])
                    v_parts.append(b_scale * t)
            r_parts.append(np.arange(npairs))
            c_parts.append(np.full(npairs, b_idx))
            v_parts.append(-np.ones(npairs))
            rows.add(np.concatenate(r_parts), np.concatenate(c_parts), np.concatenate(v_parts),
                     npairs, -np.inf, 0.0)

    A = coo_matrix((np.concatenate(rows.v), (np.concatenate(rows.r), np.concatenate(rows.c))),
                   shape=(rows.count, nvar)).tocsr()
    # Variables fixed at 0 contribute nothing; dropping them keeps huge numbers (a
    # choice that is absurdly expensive) away from the solver.
    # Drop them from the model altogether: HiGHS's presolve would, but only after
    # paying for the full size (the restricted and fixed solves remove most columns).
    cols = np.flatnonzero(ub != 0)
    A = A.tocsc()[:, cols].tocsr()
    integrality = np.zeros(nvar)
    integrality[:nx] = 1
    return Model(c=c[cols], A=A, lo=np.concatenate(rows.lo), hi=np.concatenate(rows.hi), lb=lb[cols],
                 ub=ub[cols], integrality=integrality[cols], cols=cols, nvar=nvar,
                 empty_layer=bool(forbid.all(axis=1).any()),
                 n=n, k=k, nx=nx, scale=scale, energy_row=energy_row,
                 busy_devs=busy_devs, busy_rows=busy_rows, mem_devs=mem_devs, mem_rows=mem_rows,
                 act_rows=act_rows, m_ub=m_ub)


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
    eq = np.flatnonzero(model.lo == model.hi)
    le = np.flatnonzero(model.lo != model.hi)            # every other row is "<= hi"
    A = model.A
    res = linprog(model.c, A_ub=A[le], b_ub=model.hi[le], A_eq=A[eq], b_eq=model.lo[eq],
                  bounds=np.column_stack([model.lb, model.ub]), method="highs")
    if res.status != 0:
        return None, None, None
    dual = np.zeros(A.shape[0])
    # HiGHS reports <= rows' duals as <= 0 for a minimisation; the multipliers are their negation.
    dual[le] = np.maximum(0.0, -np.asarray(res.ineqlin.marginals)) / model.scale
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
