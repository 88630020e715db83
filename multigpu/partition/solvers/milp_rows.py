"""The placement MILP's variables and rows, one function per family of rows: assignment,
edge flow, sends (an activation crosses to a device once), stage starts, energy budget,
busy time, memory, and the throughput loads (devices, hosts, links).
``milp_model.build_model`` assembles them.

Variables (a ``Layout`` says where each lives)
  x[i, d] in {0, 1}     layer i runs on device d
  y[e, u, v] in [0, 1]  layer-to-layer edge e (``Graph.edge_src`` -> ``edge_dst``) goes from u to v
  z[q, u, v] in [0, 1]  producer q (a layer with two or more consumers) sends its output from u to v
  w[v] in [0, 1]        the graph's input (when two or more layers consume it) is sent to v
  s[j, v] in [0, 1]     join layer j (two or more inputs) starts a stage on v
                        (only when some device has a stage overhead)
  timing                start and finish of each layer, start of each transfer, the makespan
                        (only for the makespan objective: ``milp_timing``)
  m_d in [0, 1]         the largest activation on memory-limited device d, over its memory
  B >= 0                the throughput bottleneck

A transfer is priced on the one column that says it happens: y (a producer with one
consumer), z (two or more), x (the input's one consumer; the last layer's output to the
sink) or w (the input's two or more consumers). A stage start likewise: y[e, u, v] with
u != v (a layer with one input, a layer), x (a layer whose one input is the graph's),
or s (a join). On a chain only x and y exist, and the model is the chain MILP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from multigpu.partition.cost.tables import CostTables
from multigpu.partition.solvers.constraints import ResolvedConstraints

__all__ = [
    "Layout",
    "LoadTerms",
    "Rows",
    "Terms",
    "Timing",
    "assignment_rows",
    "busy_rows",
    "column_costs",
    "device_load_rows",
    "endpoint_rows",
    "energy_row",
    "flow_rows",
    "host_load_rows",
    "link_load_rows",
    "load_terms",
    "memory_rows",
    "send_rows",
    "start_rows",
    "terms",
]


class Rows:
    """Accumulates sparse rows as COO triplets."""

    def __init__(self) -> None:
        self.r: list[np.ndarray] = []
        self.c: list[np.ndarray] = []
        self.v: list[np.ndarray] = []
        self.lo: list[np.ndarray] = []
        self.hi: list[np.ndarray] = []
        self.count = 0

    def add(
        self,
        rows: np.ndarray,
        cols: np.ndarray,
        vals: np.ndarray,
        nrows: int,
        lo: float | np.ndarray,
        hi: float | np.ndarray,
    ) -> int:
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
class Timing:
    """The makespan objective's columns (seconds, scaled): ``start``/``finish`` (n,) of
    each layer, ``send`` (n+1, k) the start of producer p's transfer to device v (row
    p + 1; p = -1 the input), and ``makespan``; they run from ``first`` to ``end``."""

    first: int
    start: np.ndarray
    finish: np.ndarray
    send: np.ndarray
    makespan: int
    end: int

    @classmethod
    def at(cls, col: int, n: int, k: int) -> Timing:
        """The columns from ``col`` on."""
        start = col + np.arange(n)
        finish = col + n + np.arange(n)
        send = col + 2 * n + np.arange((n + 1) * k).reshape(n + 1, k)
        makespan = col + 2 * n + (n + 1) * k
        return cls(col, start, finish, send, makespan, makespan + 1)


@dataclass(frozen=True)
class Layout:
    """Where the variables live (column indices): ``xi`` (n, k); ``yi`` (ne, k, k) for the
    edges ``esrc`` -> ``edst``; ``zi`` (nz, k, k) for the producers ``zp`` (``z_of[p]``:
    p's row of ``zi``, -1 for a producer with one consumer); ``wi`` (k,) or None; ``si``
    (nj, k) for the join layers ``jl`` (``s_of[c]``); m columns from ``m_off`` for
    ``mem_devs``; ``b_idx`` when ``need_b``; ``nvar`` in all."""

    n: int
    k: int
    nx: int
    xi: np.ndarray
    esrc: np.ndarray
    edst: np.ndarray
    yi: np.ndarray
    zp: np.ndarray
    z_of: np.ndarray
    zi: np.ndarray
    wi: Any
    jl: np.ndarray
    s_of: np.ndarray
    si: np.ndarray
    mem_devs: np.ndarray
    m_off: int
    need_b: bool
    b_idx: int
    nvar: int
    single_in: np.ndarray  # (n,) the layer has one input (its stage start is on x or y)
    timing: Timing | None = None  # the makespan's columns, or None

    @classmethod
    def of(cls, tables: CostTables, mem_devs: np.ndarray, need_b: bool, timing: bool = False) -> Layout:
        """The layout for ``tables``' graph and cluster."""
        graph, cluster = tables.graph, tables.cluster
        n, k = graph.n, cluster.k
        nx = n * k
        esrc, edst = graph.edge_src, graph.edge_dst
        ne = len(esrc)
        col = nx
        yi = col + np.arange(ne * k * k).reshape(ne, k, k)
        col += ne * k * k
        zp = np.array([p for p in range(n) if len(graph.consumers[p]) >= 2], dtype=np.intp)
        z_of = -np.ones(n, dtype=np.intp)
        z_of[zp] = np.arange(len(zp))
        zi = col + np.arange(len(zp) * k * k).reshape(len(zp), k, k)
        col += len(zp) * k * k
        wi = None
        if len(graph.input_consumers) >= 2:
            wi = col + np.arange(k)
            col += k
        single_in = np.array([len(p) == 1 for p in graph.producers])
        jl = np.flatnonzero(~single_in) if cluster.stage_overhead.any() else np.zeros(0, dtype=np.intp)
        s_of = -np.ones(n, dtype=np.intp)
        s_of[jl] = np.arange(len(jl))
        si = col + np.arange(len(jl) * k).reshape(len(jl), k)
        col += len(jl) * k
        times = None
        if timing:
            times = Timing.at(col, n, k)
            col = times.end
        m_off = col
        nvar = col + len(mem_devs) + (1 if need_b else 0)
        return cls(
            n=n,
            k=k,
            nx=nx,
            xi=np.arange(nx).reshape(n, k),
            esrc=esrc,
            edst=edst,
            yi=yi,
            zp=zp,
            z_of=z_of,
            zi=zi,
            wi=wi,
            jl=jl,
            s_of=s_of,
            si=si,
            mem_devs=mem_devs,
            m_off=m_off,
            need_b=need_b,
            b_idx=nvar - 1,
            nvar=nvar,
            single_in=single_in,
            timing=times,
        )

    @property
    def ne(self) -> int:
        """Number of layer-to-layer edges."""
        return len(self.esrc)


# -- what each column costs -----------------------------------------------------------------
@dataclass(frozen=True)
class Terms:
    """The transfers and stage starts columns stand for: transfer term j on column
    ``t_col[j]`` moves ``t_bytes[j]`` from ``t_u[j]`` to ``t_v[j]`` (u != v); stage
    term j on ``s_col[j]`` starts a stage on ``s_dev[j]``; ``t_prod`` and ``s_layer`` say
    whose output moves and which layer starts the stage. Input transfers first, then
    the output to the sink, then the layers' (by edge or producer)."""

    t_col: np.ndarray
    t_u: np.ndarray
    t_v: np.ndarray
    t_bytes: np.ndarray
    t_prod: np.ndarray  # the producer (-1: the graph's input)
    s_col: np.ndarray
    s_dev: np.ndarray
    s_layer: np.ndarray  # the layer that starts the stage


def terms(tables: CostTables, lay: Layout) -> Terms:
    """The transfer and stage-start terms of the layout (see the module docstring)."""
    graph, cluster = tables.graph, tables.cluster
    n, k = lay.n, lay.k
    src, sink = cluster.source_index, cluster.sink_index
    ar = np.arange(k)
    eu, ev = np.nonzero(~np.eye(k, dtype=bool))  # every ordered pair u != v
    cols, us, vs, bs, ps = [], [], [], [], []
    ic = graph.input_consumers
    others = ar[ar != src]
    cols.append(lay.xi[ic[0], others] if lay.wi is None else lay.wi[others])
    us.append(np.full(len(others), src))
    vs.append(others)
    bs.append(np.full(len(others), graph.input_bytes))
    ps.append(np.full(len(others), -1))
    others = ar[ar != sink]
    cols.append(lay.xi[n - 1, others])
    us.append(others)
    vs.append(np.full(len(others), sink))
    bs.append(np.full(len(others), float(graph.output_bytes[-1])))
    ps.append(np.full(len(others), n - 1))
    single = np.flatnonzero(lay.z_of[lay.esrc] < 0)  # edges whose producer has one consumer
    for rows, producers in ((lay.yi[single], lay.esrc[single]), (lay.zi, lay.zp)):
        m = len(producers)
        cols.append(rows[:, eu, ev].ravel())
        us.append(np.tile(eu, m))
        vs.append(np.tile(ev, m))
        bs.append(np.repeat(graph.output_bytes[producers], len(eu)))
        ps.append(np.repeat(producers, len(eu)))
    s_cols, s_devs, s_layers = [], [], []
    only_input = [c for c in ic if lay.single_in[c]]
    s_cols.append(lay.xi[only_input].ravel())
    s_devs.append(np.tile(ar, len(only_input)))
    s_layers.append(np.repeat(only_input, k))
    into_single = np.flatnonzero(lay.single_in[lay.edst])
    s_cols.append(lay.yi[into_single][:, eu, ev].ravel())
    s_devs.append(np.tile(ev, len(into_single)))
    s_layers.append(np.repeat(lay.edst[into_single], len(eu)))
    s_cols.append(lay.si.ravel())
    s_devs.append(np.tile(ar, len(lay.jl)))
    s_layers.append(np.repeat(lay.jl, k))
    cat = np.concatenate
    return Terms(
        cat(cols).astype(np.int64),
        cat(us).astype(np.intp),
        cat(vs).astype(np.intp),
        cat(bs).astype(float),
        cat(ps).astype(np.intp),
        cat(s_cols).astype(np.int64),
        cat(s_devs).astype(np.intp),
        cat(s_layers).astype(np.intp),
    )


def column_costs(tables: CostTables, lay: Layout, wt: float, we: float) -> np.ndarray:
    """The weighted cost wt*T + we*E of each column (nvar,; m and B cost nothing): a layer's
    compute and parameter shipping on x, each transfer and stage start on its column (see
    the module docstring); +inf where a choice cannot be made (an unusable pair). The
    objective uses it with (wt, we), the energy row with (0, 1)."""
    graph, cluster = tables.graph, tables.cluster
    k = lay.k
    src = cluster.source_index
    usable = cluster.tables.usable
    c = np.zeros(lay.nvar)
    cx = tables.node(wt, we).copy()
    stage = tables.stage(wt, we)
    ic = graph.input_consumers
    if lay.wi is None:
        c0 = ic[0]
        cx[c0] += tables.first_edge(wt, we) if lay.single_in[c0] else tables.input_send(wt, we)
    else:
        send = tables.input_send(wt, we)
        send[src] = 0.0
        c[lay.wi] = np.where(usable[src], send, np.inf)
        only_input = [x for x in ic if lay.single_in[x]]
        cx[only_input] += stage[None, :]
    cx[-1] += tables.last_edge(wt, we)
    c[: lay.nx] = cx.ravel()
    if lay.ne:
        nb = graph.output_bytes[lay.esrc]
        with_stage, without = tables.edge_costs(nb, wt, we, True), tables.edge_costs(nb, wt, we, False)
        one_consumer = (lay.z_of[lay.esrc] < 0)[:, None, None]
        one_input = lay.single_in[lay.edst][:, None, None]
        stage_only = np.where(np.eye(k, dtype=bool), 0.0, stage[None, :])[None]
        cy = np.where(one_consumer, np.where(one_input, with_stage, without), np.where(one_input, stage_only, 0.0))
        cy = np.where(usable[None], cy, np.inf)
        c[lay.yi.ravel()] = cy.ravel()
    if len(lay.zp):
        c[lay.zi.ravel()] = tables.edge_costs(graph.output_bytes[lay.zp], wt, we, False).ravel()
    if len(lay.jl):
        c[lay.si.ravel()] = np.tile(stage, len(lay.jl))
    return c


# -- rows ----------------------------------------------------------------------------------
def assignment_rows(rows: Rows, lay: Layout) -> None:
    """Each layer on exactly one device: sum_d x[i, d] = 1."""
    rows.add(np.repeat(np.arange(lay.n), lay.k), lay.xi.ravel(), np.ones(lay.nx), lay.n, 1.0, 1.0)


def flow_rows(rows: Rows, lay: Layout) -> None:
    """Edge e leaves its producer's device and enters its consumer's: sum_v y[e,u,v] =
    x[src_e,u] and sum_u y[e,u,v] = x[dst_e,v]. Once x is integral they force y[e,u,v] =
    x[src_e,u] x[dst_e,v], and on a chain without coupling rows the LP relaxation is a
    shortest path (integral)."""
    ne, k = lay.ne, lay.k
    if not ne:
        return
    ny = ne * k * k
    e_ar = np.arange(ne)
    node_rows = (e_ar[:, None] * k + np.arange(k)[None, :]).ravel()
    r_out = (e_ar[:, None, None] * k + np.arange(k)[None, :, None]) + np.zeros((1, 1, k), dtype=np.int64)
    rows.add(
        np.concatenate([r_out.ravel(), node_rows]),
        np.concatenate([lay.yi.ravel(), lay.xi[lay.esrc].ravel()]),
        np.concatenate([np.ones(ny), -np.ones(ne * k)]),
        ne * k,
        0.0,
        0.0,
    )
    r_in = (e_ar[:, None, None] * k + np.arange(k)[None, None, :]) + np.zeros((1, k, 1), dtype=np.int64)
    rows.add(
        np.concatenate([r_in.ravel(), node_rows]),
        np.concatenate([lay.yi.ravel(), lay.xi[lay.edst].ravel()]),
        np.concatenate([np.ones(ny), -np.ones(ne * k)]),
        ne * k,
        0.0,
        0.0,
    )


def send_rows(rows: Rows, tables: CostTables, lay: Layout) -> None:
    """An activation crosses to a device once: z[q,u,v] >= y[e,u,v] for every edge e out of
    producer q (u != v), and w[v] >= x[c,v] for every consumer c of the graph's input
    (v != source)."""
    k = lay.k
    eu, ev = np.nonzero(~np.eye(k, dtype=bool))
    if len(lay.zp):
        edges = np.flatnonzero(lay.z_of[lay.esrc] >= 0)
        q = lay.z_of[lay.esrc[edges]]
        m = len(edges) * len(eu)
        r = np.arange(m)
        rows.add(
            np.concatenate([r, r]),
            np.concatenate([lay.zi[q][:, eu, ev].ravel(), lay.yi[edges][:, eu, ev].ravel()]),
            np.concatenate([np.ones(m), -np.ones(m)]),
            m,
            0.0,
            np.inf,
        )
    if lay.wi is not None:
        src = tables.cluster.source_index
        others = np.array([v for v in range(k) if v != src], dtype=np.intp)
        ic = tables.graph.input_consumers
        m = len(ic) * len(others)
        r = np.arange(m)
        rows.add(
            np.concatenate([r, r]),
            np.concatenate([np.tile(lay.wi[others], len(ic)), lay.xi[ic][:, others].ravel()]),
            np.concatenate([np.ones(m), -np.ones(m)]),
            m,
            0.0,
            np.inf,
        )


def start_rows(rows: Rows, tables: CostTables, lay: Layout) -> None:
    """A join layer starts a stage on v when an input comes from another device (or is the
    graph's input): s[j,v] >= sum_{u != v} y[e,u,v] for each edge e into it, and
    s[j,v] >= x[c,v] when it consumes the graph's input."""
    k = lay.k
    if not len(lay.jl):
        return
    off = ~np.eye(k, dtype=bool)
    edges = np.flatnonzero(lay.s_of[lay.edst] >= 0)
    if len(edges):
        j = lay.s_of[lay.edst[edges]]
        m = len(edges) * k
        r = np.repeat(np.arange(m), k)
        vv, uu = np.nonzero(off.T)  # for each v, the u != v (v-major)
        cols = np.concatenate([lay.si[j][:, :, None], lay.yi[edges][:, uu, vv].reshape(len(edges), k, k - 1)], axis=2)
        vals = np.concatenate([np.ones((len(edges), k, 1)), -np.ones((len(edges), k, k - 1))], axis=2)
        rows.add(r, cols.ravel(), vals.ravel(), m, 0.0, np.inf)
    ic = [c for c in tables.graph.input_consumers if lay.s_of[c] >= 0]
    if ic:
        m = len(ic) * k
        r = np.arange(m)
        rows.add(
            np.concatenate([r, r]),
            np.concatenate([lay.si[lay.s_of[ic]].ravel(), lay.xi[ic].ravel()]),
            np.concatenate([np.ones(m), -np.ones(m)]),
            m,
            0.0,
            np.inf,
        )


def energy_row(rows: Rows, energy: np.ndarray, open_cols: np.ndarray, budget: float) -> int:
    """E <= budget, as one row divided by the budget (so the solver's tolerance is
    relative), from each open column's energy; return its index."""
    cols = np.flatnonzero(open_cols & np.isfinite(energy))
    return rows.add(np.zeros(len(cols), dtype=np.int64), cols, energy[cols] / budget, 1, -np.inf, 1.0)


def busy_rows(rows: Rows, tables: CostTables, cons: ResolvedConstraints, lay: Layout) -> tuple[int, np.ndarray]:
    """sum_i comp[i,d] x[i,d] <= busy_d for each limited device, divided by the limit;
    return the first row and the devices."""
    devs = np.flatnonzero(np.isfinite(cons.busy))
    vals = (tables.comp[:, devs] / cons.busy[devs][None, :]).T  # (len(devs), n)
    first = rows.add(
        np.repeat(np.arange(len(devs)), lay.n), lay.xi[:, devs].T.ravel(), vals.ravel(), len(devs), -np.inf, 1.0
    )
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
    mem_first = rows.add(
        np.concatenate([np.repeat(np.arange(n_m), n), np.arange(n_m)]),
        np.concatenate([xd, m_cols]),
        np.concatenate([(graph.param_bytes[None, :] / mem[:, None]).ravel(), np.ones(n_m)]),
        n_m,
        -np.inf,
        1.0,
    )
    r = np.arange(n_m * n)
    act_first = rows.add(
        np.concatenate([r, r]),
        np.concatenate([xd, np.repeat(m_cols, n)]),
        np.concatenate([(graph.activation_bytes[None, :] / mem[:, None]).ravel(), -np.ones(n_m * n)]),
        n_m * n,
        -np.inf,
        0.0,
    )
    return mem_first, act_first


def _reaches_last(graph: Any) -> bool:
    """Whether every layer has a path to the last one (whose output goes to the sink)."""
    seen = np.zeros(graph.n, dtype=bool)
    seen[-1] = True
    for i in range(graph.n - 2, -1, -1):  # consumers come later in the layer order
        seen[i] = any(seen[c] for c in graph.consumers[i])
    return bool(seen.all())


def endpoint_rows(rows: Rows, tables: CostTables, cons: ResolvedConstraints, lay: Layout) -> int:
    """Valid inequalities (they remove no integral plan) against the LP relaxation's way of
    dodging the input's and the output's transfers: it runs a fraction of every layer on
    the source (or sink) and the rest elsewhere, each fraction a whole single-device plan
    that would overflow the source's memory.

    The source: take the shortest run of layers 0..j (topological order) whose parameters
    exceed the source's room (its memory, a little more for the solver's tolerance, less
    the smallest activation). Some layer t of the run is off the source, so on a path from
    the input to t either the input is sent off the source or an edge leaves the source;
    every edge of that path joins two layers of 0..j (ancestors come first). So: the
    input's sends off the source + sum_{e in 0..j, v != src} y[e, src, v] >= 1. The sink,
    symmetrically (when every layer has a path to the last): for the shortest run j..n-1
    that overflows the sink, the last layer off the sink (x) + sum_{e in j..n-1, u !=
    sink} y[e, u, sink] >= 1. Return the number of rows."""
    graph, cluster = tables.graph, tables.cluster
    n, k = lay.n, lay.k
    ar = np.arange(k)
    floor = float(graph.activation_bytes.min())
    count = 0
    src, sink = cluster.source_index, cluster.sink_index
    pref = np.concatenate([[0.0], np.cumsum(graph.param_bytes)])
    suff = np.concatenate([np.cumsum(graph.param_bytes[::-1])[::-1], [0.0]])
    for end, dev in (("source", src), ("sink", sink)):
        room = float(cons.memory[dev]) * (1 + 1e-6) - floor
        if not np.isfinite(room) or not cons.allowed[:, dev].any():
            continue
        others = ar[ar != dev]
        if end == "source":
            over = np.flatnonzero(pref[1:] > room)
            if not len(over):
                continue
            j = int(over[0])
            inside = np.flatnonzero(np.maximum(lay.esrc, lay.edst) <= j)
            off = lay.xi[graph.input_consumers[0], others] if lay.wi is None else lay.wi[others]
        else:
            over = np.flatnonzero(suff[:-1] > room)
            if not len(over) or not _reaches_last(graph):
                continue
            j = int(over[-1])
            inside = np.flatnonzero(np.minimum(lay.esrc, lay.edst) >= j)
            off = lay.xi[n - 1, others]
        # The edge where the path leaves the source (enters the sink): y[e, src, v], v != src.
        cross = lay.yi[inside][:, dev, others] if end == "source" else lay.yi[inside][:, others, dev]
        cols = np.concatenate([off, cross.ravel()])
        rows.add(np.zeros(len(cols), dtype=np.int64), cols, np.ones(len(cols)), 1, 1.0, np.inf)
        count += 1
    return count


# -- throughput: the loads the bottleneck B bounds ---------------------------------------
@dataclass(frozen=True)
class LoadTerms:
    """Each device's load per item as terms over the columns: the device ``dev``, the
    column ``col``, ``val`` seconds (all of it: what its host counts) and ``serial``
    seconds (what the device itself counts); ``host_rows`` host rows, ``host_of_term``
    (the host row of each term, -1 if none) and ``host_val`` (the values of the terms on
    a host divided by its cores); ``link_col``/``link_pair``/``link_time``: each transfer
    term's column, pair row (-1: no link row, e.g. CPU work of one host) and seconds."""

    dev: np.ndarray
    col: np.ndarray
    val: np.ndarray
    serial: np.ndarray
    host_rows: int
    host_of_term: np.ndarray
    host_val: np.ndarray
    link_col: np.ndarray
    link_pair: np.ndarray
    link_time: np.ndarray
    npairs: int


def host_terms(
    cluster: Any, load_dev: np.ndarray, load_val: np.ndarray, load_serial: np.ndarray, host_scale: np.ndarray
) -> tuple[int, np.ndarray, np.ndarray]:
    """Host rows: (how many, the host row of each load term or -1, the values of the
    terms on a host, times ``host_scale`` (the CPU-seconds per second of each term:
    ``Cluster.compute_cores`` for wall time computing, 1 for transfer CPU), divided by
    its cores). Only hosts whose share can exceed their devices' own loads get a row:
    two or more devices, fewer than one core, or a device whose transfer CPU is partly
    off its computing thread (counted by the host only)."""
    nh = len(cluster.hosts)
    members = np.bincount(cluster.host_index[cluster.host_index >= 0], minlength=nh)
    h_term = cluster.host_index[load_dev]
    partly = np.bincount(h_term[(h_term >= 0) & (load_val > load_serial)], minlength=nh) > 0
    hosts = np.flatnonzero((members >= 2) | ((members == 1) & ((cluster.host_cores < 1) | partly)))
    row_of_host = -np.ones(nh + 1, dtype=np.int64)  # index -1: no host
    row_of_host[hosts] = np.arange(len(hosts))
    term_row = row_of_host[cluster.host_index[load_dev]]
    on = term_row >= 0
    cores = cluster.host_cores[cluster.host_index[load_dev[on]]] if on.any() else np.zeros(0)
    return len(hosts), term_row, load_val[on] * host_scale[on] / cores


def load_terms(tables: CostTables, forbid: np.ndarray, lay: Layout, tm: Terms) -> LoadTerms:
    """Each device's load per item as terms: compute on x[i,d]; each stage start's
    overhead on its column; the CPU of each transfer (sender, receiver, relay) on its
    column. A device's row counts the serial seconds, its host's row all of them. Each
    transfer's time also loads its link's row."""
    cluster = tables.cluster
    n, k = lay.n, lay.k
    tab = cluster.tables
    comp = np.where(forbid, 0.0, tables.comp).T.ravel()
    # A device's own row counts compute and stage overheads at the busy rate, its host's
    # at the layer times (``arithmetic.busy_ratios``).
    busy = tables.busy
    devs, cols, vals = [np.repeat(np.arange(k), n)], [lay.xi.T.ravel()], [comp]
    serial = [comp * np.repeat(busy, n)]
    # Compute and stage overheads are wall time on the host; transfer CPU is CPU time.
    scale = [cluster.compute_cores[devs[0]]]
    oh = cluster.stage_overhead
    if oh.any():
        devs.append(tm.s_dev)
        cols.append(tm.s_col)
        vals.append(oh[tm.s_dev])
        serial.append(vals[-1] * busy[tm.s_dev])
        scale.append(cluster.compute_cores[tm.s_dev])
    if tables.has_transfer_cpu:
        j, d, val, ser = tables.transfer_cpu(tm.t_u, tm.t_v, tm.t_bytes)
        devs.append(d)
        cols.append(tm.t_col[j])
        vals.append(val)
        serial.append(ser)
        scale.append(np.ones(len(val)))
    dev, col, val, ser = (np.concatenate(devs), np.concatenate(cols), np.concatenate(vals), np.concatenate(serial))
    host_rows, host_of_term, host_val = host_terms(cluster, dev, val, ser, np.concatenate(scale))
    pu, pv = np.nonzero(np.triu(tab.usable & ~tables.cpu_links, 1))
    pair_of = -np.ones((k, k), dtype=np.int64)
    pair_of[pu, pv] = pair_of[pv, pu] = np.arange(len(pu))
    usable = tab.usable[tm.t_u, tm.t_v]
    t = np.where(usable, tab.occupancy_seconds(tm.t_bytes, tm.t_u, tm.t_v), 0.0)
    return LoadTerms(
        dev,
        col,
        val,
        ser,
        host_rows,
        host_of_term,
        host_val,
        tm.t_col,
        np.where(usable, pair_of[tm.t_u, tm.t_v], -1),
        t,
        len(pu),
    )


def device_load_rows(rows: Rows, lt: LoadTerms, lay: Layout, b_scale: float) -> None:
    """b_scale * load of d (its serial transfer CPU) - B <= 0, for every device."""
    k = lay.k
    rows.add(
        np.concatenate([lt.dev, np.arange(k)]),
        np.concatenate([lt.col, np.full(k, lay.b_idx)]),
        np.concatenate([b_scale * lt.serial, -np.ones(k)]),
        k,
        -np.inf,
        0.0,
    )


def host_load_rows(rows: Rows, lt: LoadTerms, lay: Layout, b_scale: float) -> None:
    """b_scale * (the loads of its devices) / cores - B <= 0, for every host that needs a row."""
    nh = lt.host_rows
    if not nh:
        return
    sel = lt.host_of_term >= 0
    rows.add(
        np.concatenate([lt.host_of_term[sel], np.arange(nh)]),
        np.concatenate([lt.col[sel], np.full(nh, lay.b_idx)]),
        np.concatenate([b_scale * lt.host_val, -np.ones(nh)]),
        nh,
        -np.inf,
        0.0,
    )


def link_load_rows(rows: Rows, lt: LoadTerms, lay: Layout, b_scale: float) -> None:
    """b_scale * activation transfer time over {u, v} - B <= 0, for every usable pair
    (but a pair of one host whose transfers are CPU work)."""
    if not lt.npairs:
        return
    on = lt.link_pair >= 0
    rows.add(
        np.concatenate([lt.link_pair[on], np.arange(lt.npairs)]),
        np.concatenate([lt.link_col[on], np.full(lt.npairs, lay.b_idx)]),
        np.concatenate([b_scale * lt.link_time[on], -np.ones(lt.npairs)]),
        lt.npairs,
        -np.inf,
        0.0,
    )
