"""The throughput MILP in its compact form: communication per producer and device, not per
device pair (after Tarnawski et al.'s ``comm_in``/``comm_out`` columns).

The pairwise model (``milp_rows``) prices a transfer on a column per (producer, sending
device, receiving device): k^2 columns per producer, and an LP relaxation that spreads
each one thinly. Where no cost depends on the pair, the same plans and loads follow from
2k columns per producer q (the graph's input is q = -1, sent from the source):

  in[q, v] in [0, 1]    some consumer of q runs on v and q does not: in >= x[c, v] - x[q, v]
  out[q, u] in [0, M]   the devices q's output goes to, charged to q's device u:
                        out >= x[q, u] - x[c, u] for each consumer c, and
                        out >= sum_v in[q, v] - M (1 - x[q, u]), M = min(consumers, k - 1)

(with one consumer the first row alone is exact). A device's load is its compute (at the
busy rate), plus the sender's transfer CPU on out and the receiver's on in; the last
layer's output to the sink is priced on x. With uniform links a transfer's time is one
figure, so the tie-break's latency is linear in in as well.

It applies (``why_not_compact``) when no cost depends on the pair: no relay, no stage
overheads, no host rows, uniform links (all usable, one bandwidth, latency and power, no
inline latency), and no link that could bind: every transfer on one link together takes
no longer than the lower bound on the bottleneck. Busy-time and energy budgets keep the
pairwise model (their rows are written there). Elsewhere ``throughput`` uses the pairwise
form.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, cast

import numpy as np

from multigpu.partition.cost.tables import CostTables
from multigpu.partition.solvers.constraints import ResolvedConstraints
from multigpu.partition.solvers.milp_model import Model
from multigpu.partition.solvers.milp_rows import Rows, memory_rows

__all__ = ["build_compact", "why_not_compact"]


def why_not_compact(tables: CostTables, cons: ResolvedConstraints, lower_bound: float) -> str | None:
    """Why the compact form cannot model this problem exactly, or None when it can."""
    cluster = tables.cluster
    tab = cluster.tables
    k = cluster.k
    if tables.has_relay:
        return "a relay's CPU depends on the pair"
    if cluster.stage_overhead.any():
        return "stage overheads start on a change of device (per pair)"
    if cluster.hosts:
        return "hosts share their CPU among devices"
    if cons.has_busy or cons.has_energy:
        return "busy-time and energy budgets are written in the pairwise form"
    if k > 1:
        off = ~np.eye(k, dtype=bool)
        if not tab.usable[off].all():
            return "some pair has no link"
        if tables.two_latencies:
            return "links price small transfers apart"
        for arr in (tab.inv_bandwidth, tab.latency, tab.power):
            vals = arr[off]
            if np.ptp(vals) > 1e-12 * max(np.abs(vals).max(), 1e-300):
                return "link figures differ between pairs"
        graph = tables.graph
        nb = np.concatenate([[graph.input_bytes], graph.output_bytes])
        u, v = np.zeros(len(nb), dtype=np.intp), np.ones(len(nb), dtype=np.intp)
        if float(tab.occupancy_seconds(nb, u, v).sum()) > lower_bound:
            return "a link's load could bind"
    return None


def _senders_receivers(tables: CostTables, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(m, k) serial transfer CPU seconds of sending (on the sender) and of receiving (on
    the receiver) ``nbytes[j]``, per device: with no relay neither depends on the other end."""
    cluster = tables.cluster
    k, m = cluster.k, len(nbytes)
    send, recv = np.zeros((m, k)), np.zeros((m, k))
    if k < 2 or not m or not tables.has_transfer_cpu:
        return send, recv
    d = np.tile(np.arange(k), m)
    other = (d + 1) % k
    b = np.repeat(nbytes, k)
    for to, dev, peer in ((send, d, other), (recv, other, d)):
        u, v = (dev, peer) if to is send else (peer, dev)
        j, dv, _, ser = tables.transfer_cpu(u, v, b)
        on = dv == dev[j]  # the sender's part (send) or the receiver's part (recv)
        np.add.at(to.reshape(-1), (j[on] // k) * k + dv[on], ser[on])
    return send, recv


def build_compact(
    tables: CostTables,
    cons: ResolvedConstraints,
    wt: float,
    we: float,
    *,
    objective: str,
    scale: float,
    b_scale: float,
    bottleneck_cap: float | None = None,
    b_upper: float | None = None,
) -> Model:
    """The compact throughput MILP: ``objective="bottleneck"`` minimises the bottleneck
    (scaled by ``scale``); ``"latency"`` minimises wt*T + we*E (times ``scale``) with the
    bottleneck at most ``bottleneck_cap``. ``b_scale`` scales the load rows; ``b_upper``
    (a known plan's bottleneck) bounds B. Check ``why_not_compact`` first."""
    from scipy.sparse import coo_matrix

    graph, cluster = tables.graph, tables.cluster
    n, k = graph.n, cluster.k
    src, sink = cluster.source_index, cluster.sink_index
    producers = [q for q in range(n) if graph.consumers[q]]
    cons_of = {q: list(graph.consumers[q]) for q in producers}
    cons_of[-1] = [int(c) for c in graph.input_consumers]
    prods = [-1, *producers]
    p_of = {q: i for i, q in enumerate(prods)}
    npq = len(prods)
    nx = n * k
    xi = np.arange(nx).reshape(n, k)
    ini = nx + np.arange(npq * k).reshape(npq, k)
    outi = nx + npq * k + np.arange(npq * k).reshape(npq, k)
    # A device that holds every parameter and the largest activation needs no memory row.
    need = float(graph.param_bytes.sum() + graph.activation_bytes.max())
    mem_devs = np.flatnonzero(np.isfinite(cons.memory) & (cons.memory < need))
    m_off = nx + 2 * npq * k
    b_idx = m_off + len(mem_devs)
    nvar = b_idx + 1
    rows = Rows()
    # Each layer on one device.
    rows.add(np.repeat(np.arange(n), k), xi.ravel(), np.ones(nx), n, 1.0, 1.0)
    lb, ub = np.zeros(nvar), np.ones(nvar)
    ub[xi] = np.where(cons.allowed & np.isfinite(tables.node_time), 1.0, 0.0)
    ub[ini[0, src]] = 0.0  # the input starts on the source
    for q in prods:
        cs, p = cons_of[q], p_of[q]
        ar = np.arange(k)
        for cl in cs:
            # in[q, v] - x[cl, v] + x[q, v] >= 0 (the input: x[-1, v] = [v == src]).
            if q >= 0:
                r = np.repeat(ar, 3)
                cols = np.stack([ini[p], xi[cl], xi[q]], axis=1).ravel()
                vals = np.tile([1.0, -1.0, 1.0], k)
                rows.add(r, cols, vals, k, 0.0, np.inf)
                # out[q, u] - x[q, u] + x[cl, u] >= 0: q on u and cl elsewhere sends once at least.
                cols = np.stack([outi[p], xi[q], xi[cl]], axis=1).ravel()
                rows.add(r, cols, np.tile([1.0, -1.0, 1.0], k), k, 0.0, np.inf)
            else:
                others = ar[ar != src]
                r = np.repeat(np.arange(len(others)), 2)
                cols = np.stack([ini[p, others], xi[cl, others]], axis=1).ravel()
                rows.add(r, cols, np.tile([1.0, -1.0], len(others)), len(others), 0.0, np.inf)
        big = min(len(cs), k - 1)
        ub[outi[p]] = big
        if q < 0:
            ub[outi[p]] = 0.0
            ub[outi[p, src]] = big
            # out[-1, src] = the devices the input goes to.
            cols = np.concatenate([[outi[p, src]], ini[p]])
            rows.add(np.zeros(k + 1, dtype=np.int64), cols, np.concatenate([[1.0], -np.ones(k)]), 1, 0.0, np.inf)
        elif len(cs) > 1:
            # out[q, u] - sum_v in[q, v] - M x[q, u] >= -M.
            r = np.repeat(ar, k + 2)
            cols = np.concatenate([outi[p][:, None], np.tile(ini[p], (k, 1)), xi[q][:, None]], axis=1).ravel()
            vals = np.tile(np.concatenate([[1.0], -np.ones(k), [-float(big)]]), k)
            rows.add(r, cols, vals, k, -float(big), np.inf)
    if len(mem_devs):
        lay = SimpleNamespace(n=n, mem_devs=mem_devs, m_off=m_off, xi=xi)
        memory_rows(rows, tables, cons, cast(Any, lay))
        ub[m_off : m_off + len(mem_devs)] = 1.0 + 1e-6
    # Device loads: compute at the busy rate, the sender's CPU on out, the receiver's on in.
    busy = tables.busy
    comp = np.where(np.isfinite(tables.comp), tables.comp, 0.0) * busy[None, :]
    nb = np.array([graph.input_bytes if q < 0 else graph.output_bytes[q] for q in prods], dtype=float)
    send, recv = _senders_receivers(tables, nb)
    last_send, last_recv = _senders_receivers(tables, np.array([float(graph.output_bytes[-1])]))
    load_r, load_c, load_v = [], [], []
    for d in range(k):
        load_r.append(np.full(n + 2 * npq, d))
        load_c.append(np.concatenate([xi[:, d], outi[:, d], ini[:, d]]))
        load_v.append(np.concatenate([comp[:, d], send[:, d], recv[:, d]]))
        if d != sink:  # the last layer's output leaves d for the sink
            load_r.append(np.array([d, sink]))
            load_c.append(np.array([xi[n - 1, d], xi[n - 1, d]]))
            load_v.append(np.array([last_send[0, d], last_recv[0, sink]]))
    load_r.append(np.arange(k))
    load_c.append(np.full(k, b_idx))
    load_v.append(np.full(k, -1.0 / b_scale))
    rows.add(np.concatenate(load_r), np.concatenate(load_c), np.concatenate(load_v) * b_scale, k, -np.inf, 0.0)
    ub[b_idx] = np.inf
    for upper in (b_upper, bottleneck_cap):
        if upper is not None and math.isfinite(upper):
            ub[b_idx] = min(ub[b_idx], upper * b_scale)
    c = np.zeros(nvar)
    if objective == "bottleneck":
        c[b_idx] = scale / b_scale
    else:
        c[xi] = np.where(ub[xi] > 0, tables.node(wt, we), 0.0) * scale
        if k > 1:
            # Uniform links: one transfer's cost per byte size, the same on every pair.
            cost = np.array([tables.edge_matrix(b, wt, we, stage=False)[0, 1] for b in nb])
            c[ini] += cost[:, None] * scale
            last = tables.edge_matrix(float(graph.output_bytes[-1]), wt, we, stage=False)[0, 1]
            others = np.arange(k) != sink
            c[xi[n - 1, others]] += last * scale
    integrality = np.zeros(nvar, dtype=np.uint8)
    integrality[:nx] = 1
    A, lo, hi = _matrix(rows, nvar, coo_matrix)
    x_ub = ub[:nx].reshape(n, k)
    return Model(
        c=c,
        A=A,
        cols=np.arange(nvar),
        nvar=nvar,
        empty_layer=bool((x_ub == 0).all(axis=1).any()),
        lo=lo,
        hi=hi,
        lb=lb,
        ub=ub,
        integrality=integrality,
        n=n,
        k=k,
        nx=nx,
        scale=scale,
        energy_row=-1,
        busy_devs=np.zeros(0, dtype=np.intp),
        busy_rows=-1,
        mem_devs=mem_devs,
        mem_rows=-1,
        act_rows=-1,
        m_ub=1.0 + 1e-6,
        lay=cast(Any, None),
    )


def _matrix(rows: Rows, nvar: int, coo_matrix: Any) -> tuple[Any, np.ndarray, np.ndarray]:
    """The accumulated rows as a csr matrix and its bounds."""
    r, c, v = (np.concatenate(x) if x else np.zeros(0) for x in (rows.r, rows.c, rows.v))
    A = coo_matrix((v, (r.astype(np.int64), c.astype(np.int64))), shape=(rows.count, nvar)).tocsr()
    return A, np.concatenate(rows.lo), np.concatenate(rows.hi)
