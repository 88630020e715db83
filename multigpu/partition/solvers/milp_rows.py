"""The placement MILP's rows, one function per family: assignment, edge flow (which pair
each transfer uses), energy budget, busy time, memory, and the throughput loads
(devices, hosts, links). ``milp_model.build_model`` assembles them.

Every function appends its rows to a ``Rows`` accumulator and reads the variable layout
from a ``Layout``: x[i, d] (layer i on device d, layer-major), y[e, u, v] (edge e from u
to v), m_d (the largest activation on memory-limited device d, as a fraction of its
memory) and B (the bottleneck).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from multigpu.partition.cost.arithmetic import transfer_cpu_terms
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.solvers.constraints import ResolvedConstraints

__all__ = ["Layout", "LoadTerms", "Rows", "assignment_rows", "busy_rows", "cost_coefficients", "device_load_rows",
           "energy_row", "flow_rows", "host_load_rows", "host_terms", "link_load_rows", "link_times", "load_terms",
           "memory_rows"]


class Rows:
    """Accumulates sparse rows as COO triplets."""

    def __init__(self) -> None:
        self.r: list[np.ndarray] = []
        self.c: list[np.ndarray] = []
        self.v: list[np.ndarray] = []
        self.lo: list[np.ndarray] = []
        self.hi: list[np.ndarray] = []
        self.count = 0

    def add(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, nrows: int,
            lo: float | np.ndarray, hi: float | np.ndarray) -> int:
        """Append ``nrows`` rows (``rows`` counted from 0) with bounds lo <= A x <= hi; return
        the index of the first."""
        keep = vals != 0
        first = self.count
        self.r.append(np.asarray(rows, dtype=np.int64)[keep] + self.count)
        self.c.append(np.asarray(cols, dtype=np.int64)[keep])
        self.v.append(np.asarray(vals, dtype=float)[keep])
        self.lo.append(np.broadcast_to(np.asarray(lo, dtype=float), (nrows,)))
        self.hi.append(np.broadcast_to(np.asarray(hi, dtype=float), (nrows,)))
        self.count += nrows
        return first


@dataclass(frozen=True)
class Layout:
    """Where the variables live: ``xi`` (n, k) and ``yi`` (ne, k, k) column indices, the
    memory-limited devices ``mem_devs`` and their m columns from ``m_off``, the B column
    ``b_idx`` (when ``need_b``), ``nvar`` columns in all, and ``nbytes`` (ne,) the bytes
    edge e carries (layer e's output, to layer e+1)."""

    n: int
    k: int
    nx: int
    ny: int
    xi: np.ndarray
    yi: np.ndarray
    nbytes: np.ndarray
    mem_devs: np.ndarray
    m_off: int
    need_b: bool
    b_idx: int
    nvar: int

    @classmethod
    def of(cls, tables: CostTables, mem_devs: np.ndarray, need_b: bool) -> "Layout":
        """The layout for ``tables``' graph and cluster."""
        n, k = tables.graph.n, tables.cluster.k
        nx, ne = n * k, n - 1
        ny = ne * k * k
        nvar = nx + ny + len(mem_devs) + (1 if need_b else 0)
        yi = nx + np.arange(ny).reshape(ne, k, k) if ne else np.empty((0, k, k), dtype=np.int64)
        return cls(n=n, k=k, nx=nx, ny=ny, xi=np.arange(nx).reshape(n, k), yi=yi,
                   nbytes=tables.graph.output_bytes[:-1], mem_devs=mem_devs, m_off=nx + ny, need_b=need_b,
                   b_idx=nvar - 1, nvar=nvar)

    @property
    def ne(self) -> int:
        """Number of edges."""
        return self.n - 1


def cost_coefficients(tables: CostTables, forbid: np.ndarray, lay: Layout, wt: float, we: float
                      ) -> tuple[np.ndarray, np.ndarray]:
    """The weighted cost wt*T + we*E as coefficients: (n, k) on x (compute, parameter
    shipping, the input from the source on layer 1 and the output to the sink on layer
    n; 0 on forbidden choices) and (ne, k, k) on y (each edge's transfer; 0 on the
    diagonal and on unusable pairs). The objective uses it with (wt, we), the energy row
    with (0, 1)."""
    k = lay.k
    first, last = tables.first_edge(wt, we), tables.last_edge(wt, we)
    cx = np.where(forbid, 0.0, tables.node(wt, we))
    cx[0] += np.where(np.isfinite(first), first, 0.0)
    cx[-1] += np.where(np.isfinite(last), last, 0.0)
    if not lay.ne:
        return cx, np.zeros((0, k, k))
    alpha, beta, _ = tables.edge(wt, we)
    cy = lay.nbytes[:, None, None] * alpha[None] + beta[None]
    cy[:, ~tables.cluster.tables.usable] = 0.0
    cy[:, np.arange(k), np.arange(k)] = 0.0
    return cx, cy


def assignment_rows(rows: Rows, lay: Layout) -> None:
    """Each layer on exactly one device: sum_d x[i, d] = 1."""
    rows.add(np.repeat(np.arange(lay.n), lay.k), lay.xi.ravel(), np.ones(lay.nx), lay.n, 1.0, 1.0)


def flow_rows(rows: Rows, lay: Layout) -> None:
    """Edge e leaves layer e's device and enters layer e+1's: sum_v y[e,u,v] = x[e,u] and
    sum_u y[e,u,v] = x[e+1,v]. Once x is integral they force y[e,u,v] = x[e,u] x[e+1,v],
    and without coupling rows the LP relaxation is a shortest path (integral)."""
    ne, k, ny = lay.ne, lay.k, lay.ny
    if not ne:
        return
    e_ar = np.arange(ne)
    node_rows = (e_ar[:, None] * k + np.arange(k)[None, :]).ravel()
    r_out = (e_ar[:, None, None] * k + np.arange(k)[None, :, None]) + np.zeros((1, 1, k), dtype=np.int64)
    rows.add(np.concatenate([r_out.ravel(), node_rows]), np.concatenate([lay.yi.ravel(), lay.xi[:-1].ravel()]),
             np.concatenate([np.ones(ny), -np.ones(ne * k)]), ne * k, 0.0, 0.0)
    r_in = (e_ar[:, None, None] * k + np.arange(k)[None, None, :]) + np.zeros((1, k, 1), dtype=np.int64)
    rows.add(np.concatenate([r_in.ravel(), node_rows]), np.concatenate([lay.yi.ravel(), lay.xi[1:].ravel()]),
             np.concatenate([np.ones(ny), -np.ones(ne * k)]), ne * k, 0.0, 0.0)


def energy_row(rows: Rows, tables: CostTables, cons: ResolvedConstraints, forbid: np.ndarray, lay: Layout) -> int:
    """E <= budget, as one row divided by the budget (so the solver's tolerance is
    relative); return its index."""
    ex, ey = cost_coefficients(tables, forbid, lay, 0.0, 1.0)
    cols = np.concatenate([lay.xi.ravel(), lay.yi.ravel()])
    vals = np.concatenate([ex.ravel(), ey.ravel()]) / cons.energy_budget
    return rows.add(np.zeros(len(cols), dtype=np.int64), cols, vals, 1, -np.inf, 1.0)


def busy_rows(rows: Rows, tables: CostTables, cons: ResolvedConstraints, lay: Layout) -> tuple[int, np.ndarray]:
    """sum_i comp[i,d] x[i,d] <= busy_d for each limited device, divided by the limit;
    return the first row and the devices."""
    devs = np.flatnonzero(np.isfinite(cons.busy))
    vals = (tables.comp[:, devs] / cons.busy[devs][None, :]).T          # (len(devs), n)
    first = rows.add(np.repeat(np.arange(len(devs)), lay.n), lay.xi[:, devs].T.ravel(), vals.ravel(),
                     len(devs), -np.inf, 1.0)
    return first, devs


def memory_rows(rows: Rows, tables: CostTables, cons: ResolvedConstraints, lay: Layout) -> tuple[int, int]:
    """For each memory-limited device d: sum_i p_i/mem_d x[i,d] + m_d <= 1 (parameters and
    the largest activation), and act_i/mem_d x[i,d] - m_d <= 0 for every layer (m_d is at
    least each activation on d). Return the first parameter row and the first activation
    row (n per device, layer-major)."""
    graph = tables.graph
    n, mem_devs = lay.n, lay.mem_devs
    n_m = len(mem_devs)
    mem = cons.memory[mem_devs]
    m_cols = lay.m_off + np.arange(n_m)
    xd = lay.xi[:, mem_devs].T.ravel()
    mem_first = rows.add(np.concatenate([np.repeat(np.arange(n_m), n), np.arange(n_m)]),
                         np.concatenate([xd, m_cols]),
                         np.concatenate([(graph.param_bytes[None, :] / mem[:, None]).ravel(), np.ones(n_m)]),
                         n_m, -np.inf, 1.0)
    r = np.arange(n_m * n)
    act_first = rows.add(np.concatenate([r, r]), np.concatenate([xd, np.repeat(m_cols, n)]),
                         np.concatenate([(graph.activation_bytes[None, :] / mem[:, None]).ravel(),
                                         -np.ones(n_m * n)]), n_m * n, -np.inf, 0.0)
    return mem_first, act_first


# -- throughput: the loads the bottleneck B bounds ---------------------------------------
@dataclass(frozen=True)
class LoadTerms:
    """Each device's load per item as terms over x and y: the device ``dev``, the column
    ``col``, ``val`` seconds (all of it: what its host counts) and ``serial`` seconds (what
    the device itself counts); ``host_rows`` host rows, ``host_of_term`` (the host row of
    each term, -1 if none) and ``host_val`` (the values of the terms on a host divided by
    its cores); the link times ``t_first`` (k,), ``t_last`` (k,), ``t_edge`` (ne, k, k)."""

    dev: np.ndarray
    col: np.ndarray
    val: np.ndarray
    serial: np.ndarray
    host_rows: int
    host_of_term: np.ndarray
    host_val: np.ndarray
    t_first: np.ndarray
    t_last: np.ndarray
    t_edge: np.ndarray


def link_times(tables: CostTables, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


def host_terms(cluster: object, load_dev: np.ndarray, load_val: np.ndarray, load_serial: np.ndarray
               ) -> tuple[int, np.ndarray, np.ndarray]:
    """Host rows: (how many, the host row of each load term or -1, the values of the
    terms on a host divided by its cores). Only hosts whose share can exceed their
    devices' own loads get a row: two or more devices, fewer than one core, or a device
    whose transfer CPU is partly off its computing thread (counted by the host only)."""
    nh = len(cluster.hosts)  # type: ignore[attr-defined]
    host_index = cluster.host_index  # type: ignore[attr-defined]
    host_cores = cluster.host_cores  # type: ignore[attr-defined]
    members = np.bincount(host_index[host_index >= 0], minlength=nh)
    h_term = host_index[load_dev]
    partly = np.bincount(h_term[(h_term >= 0) & (load_val > load_serial)], minlength=nh) > 0
    hosts = np.flatnonzero((members >= 2) | ((members == 1) & ((host_cores < 1) | partly)))
    row_of_host = -np.ones(nh + 1, dtype=np.int64)   # index -1: no host
    row_of_host[hosts] = np.arange(len(hosts))
    term_row = row_of_host[host_index[load_dev]]
    on = term_row >= 0
    cores = host_cores[host_index[load_dev[on]]] if on.any() else np.zeros(0)
    return len(hosts), term_row, load_val[on] / cores


def load_terms(tables: CostTables, forbid: np.ndarray, lay: Layout) -> LoadTerms:
    """Each device's load per item as terms over x and y: compute on x[i,d]; the stage
    overhead of the stage a choice starts (x[0,d], and y[e,u,d] for u != d); the CPU of
    the transfer a choice makes (x[0,v] for the input from the source, y[e,u,v],
    x[n-1,u] for the output to the sink). A device's row counts the serial seconds, its
    host's row all of them."""
    graph, cluster = tables.graph, tables.cluster
    n, k, xi, yi = lay.n, lay.k, lay.xi, lay.yi
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
    ne = lay.ne
    eu, ev = np.nonzero(~np.eye(k, dtype=bool))                 # every ordered pair u != v
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
    dev, col, val, ser = (np.concatenate(devs), np.concatenate(cols), np.concatenate(vals),
                          np.concatenate(serial))
    host_rows, host_of_term, host_val = host_terms(cluster, dev, val, ser)
    t_first, t_last, t_edge = link_times(tables, lay.nbytes)
    return LoadTerms(dev, col, val, ser, host_rows, host_of_term, host_val, t_first, t_last, t_edge)


def device_load_rows(rows: Rows, terms: LoadTerms, lay: Layout, b_scale: float) -> None:
    """b_scale * load of d (its serial transfer CPU) - B <= 0, for every device."""
    k = lay.k
    rows.add(np.concatenate([terms.dev, np.arange(k)]), np.concatenate([terms.col, np.full(k, lay.b_idx)]),
             np.concatenate([b_scale * terms.serial, -np.ones(k)]), k, -np.inf, 0.0)


def host_load_rows(rows: Rows, terms: LoadTerms, lay: Layout, b_scale: float) -> None:
    """b_scale * (the loads of its devices) / cores - B <= 0, for every host that needs a row."""
    nh = terms.host_rows
    if not nh:
        return
    sel = terms.host_of_term >= 0
    rows.add(np.concatenate([terms.host_of_term[sel], np.arange(nh)]),
             np.concatenate([terms.col[sel], np.full(nh, lay.b_idx)]),
             np.concatenate([b_scale * terms.host_val, -np.ones(nh)]), nh, -np.inf, 0.0)


def link_load_rows(rows: Rows, tables: CostTables, lay: Layout, b_scale: float) -> None:
    """b_scale * activation transfer time over {u, v} - B <= 0, for every usable pair
    (but a pair of one host whose transfers are CPU work)."""
    graph, cluster = tables.graph, tables.cluster
    tab = cluster.tables
    n, k, ne, xi, yi, nbytes = lay.n, lay.k, lay.ne, lay.xi, lay.yi, lay.nbytes
    src, sink = cluster.source_index, cluster.sink_index
    pu, pv = np.nonzero(np.triu(tab.usable & ~cluster.cpu_links, 1))
    npairs = len(pu)
    if not npairs:
        return
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
    c_parts.append(np.full(npairs, lay.b_idx))
    v_parts.append(-np.ones(npairs))
    rows.add(np.concatenate(r_parts), np.concatenate(c_parts), np.concatenate(v_parts), npairs, -np.inf, 0.0)
