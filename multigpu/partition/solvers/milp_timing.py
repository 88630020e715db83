"""The makespan objective's rows: the schedule ``cost.schedule`` defines, written over the
placement MILP's choice columns, so that its least solution is the simulated schedule.

Times are continuous columns in units of ``unit`` seconds: a layer's start S_i and
finish F_i, the start R[p, v] of producer p's transfer to device v, and the makespan.
With ``M`` (in those units) above any time of the least schedule of any assignment:

  duration     F_i = S_i + sum_d comp[i,d] x[i,d] + its stage start's overhead
  precedence   S_c >= F_p for every edge p -> c, R[p,v] >= F_p
  arrival      S_c >= R[p,v] + sum_u t_p(u,v) send[p,u,v] - M (1 - x[c,v])  (every input p of c)
  output       makespan >= R[n-1,sink] + its transfer's time, makespan >= F_{n-1}
  device order S_j >= F_i - M (2 - x[i,d] - x[j,d]) for i before j with no path between
               them (on a path the precedence rows already order them)
  link order   R[q,w] >= R[p,v] + t_p(u,v) - M (2 - send[p,u,v] - send[q,u',w]) for every
               producer p before q whose transfers share the link {u,v} = {u',w}

A row whose choices are not taken is slack by M, so each assignment's least solution is
its simulated schedule, and minimising the makespan over the model is exact. The big-M
rows make the LP relaxation weak: the model suits graphs of tens of layers (the brute
force tests use up to 8); the planner says so when HiGHS does not prove it in time.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from multigpu.partition.cost.tables import CostTables
from multigpu.partition.solvers.constraints import ResolvedConstraints
from multigpu.partition.solvers.makespan_bound import fastest_paths
from multigpu.partition.solvers.milp_rows import Layout, Rows, Terms

__all__ = ["BuildTimeLimit", "horizon", "outlasting", "timing_rows", "unordered_pairs"]


class BuildTimeLimit(Exception):
    """The time limit struck while the rows were being written (on ResNet-50 on 16 devices
    they take about half a minute)."""


def _check(deadline: float | None) -> None:
    if deadline is not None and time.perf_counter() > deadline:
        raise BuildTimeLimit("the time limit struck while the makespan MILP was being built")


def horizon(tables: CostTables, lay: Layout, tm: Terms, open_: np.ndarray) -> float:
    """Seconds no time of any assignment's least schedule exceeds: every layer's slowest
    open compute plus stage start, one after another, then every transfer a producer can
    make (at most one per other device it may reach) on its slowest link."""
    cluster = tables.cluster
    ox = open_[lay.xi]
    comp = np.where(ox, tables.comp + cluster.stage_overhead[None, :], 0.0)
    tab = cluster.tables
    t = np.where(tab.usable[tm.t_u, tm.t_v], tab.hop_seconds(tm.t_bytes, tm.t_u, tm.t_v), 0.0)
    t = np.where(open_[tm.t_col], t, 0.0)
    worst = np.zeros(lay.n + 1)
    np.maximum.at(worst, tm.t_prod + 1, t)
    reach = np.minimum(np.array([len(graph_consumers) for graph_consumers in _reach(tables)]), lay.k - 1)
    return float(comp.max(axis=1).sum() + (worst * np.maximum(reach, 1)).sum())


def outlasting(tables: CostTables, cons: ResolvedConstraints, cap: float) -> np.ndarray:
    """(n, k) bool: the placements of layer i on device d that no plan of makespan at most
    ``cap`` seconds holds: the longest path through i, every other layer at its fastest
    allowed compute time and i at d's, exceeds it."""
    graph = tables.graph
    fastest, finish, _ = fastest_paths(tables, cons)
    head = finish - fastest  # the earliest start of each layer
    tail = np.zeros(graph.n)  # the least time from each layer's finish to the end
    for i in range(graph.n - 1, -1, -1):
        tail[i] = max((fastest[c] + tail[c] for c in graph.consumers[i]), default=0.0)
    return (head + tail)[:, None] + tables.comp > cap * (1 + 1e-9)


def _reach(tables: CostTables) -> list[list[int]]:
    graph = tables.graph
    out = [list(graph.input_consumers)] + [list(c) for c in graph.consumers]
    out[-1] = [graph.n]  # the last layer's output goes to the sink
    return out


def unordered_pairs(producers: tuple[tuple[int, ...], ...]) -> list[tuple[int, int]]:
    """(i, j), i < j, with no path between layers i and j."""
    n = len(producers)
    anc = [0] * n
    for c, prods in enumerate(producers):
        for p in prods:
            if p >= 0:
                anc[c] |= anc[p] | (1 << p)
    return [(i, j) for j in range(n) for i in range(j) if not (anc[j] >> i) & 1]


def timing_rows(
    rows: Rows,
    tables: CostTables,
    lay: Layout,
    tm: Terms,
    open_: np.ndarray,
    unit: float,
    big: float,
    deadline: float | None = None,
) -> None:
    """The module's rows, times in units of ``unit`` seconds and ``big`` the M. Raises
    BuildTimeLimit past ``deadline`` (a ``time.perf_counter`` instant)."""
    graph, cluster = tables.graph, tables.cluster
    tab = cluster.tables
    tg = lay.timing
    assert tg is not None  # the layout was made with timing=True
    n, k = lay.n, lay.k
    sink = cluster.sink_index
    t_sec = np.where(tab.usable[tm.t_u, tm.t_v], tab.hop_seconds(tm.t_bytes, tm.t_u, tm.t_v), 0.0)
    t_unit = t_sec / unit
    live = open_[tm.t_col]

    # duration: F_i - S_i - work = 0
    r: list[Any]  # each block's rows, columns and values: arrays in this one, numbers in the later ones
    c: list[Any]
    v: list[Any]
    r, c, v = [np.arange(n), np.arange(n)], [tg.finish, tg.start], [np.ones(n), -np.ones(n)]
    r.append(np.repeat(np.arange(n), k))
    c.append(lay.xi.ravel())
    v.append(-(tables.comp / unit).ravel())
    oh = cluster.stage_overhead
    if oh.any():
        r.append(tm.s_layer)
        c.append(tm.s_col)
        v.append(-oh[tm.s_dev] / unit)
    rows.add(np.concatenate(r), np.concatenate(c), np.concatenate(v), n, 0.0, 0.0)

    # precedence: S_c - F_p >= 0 per edge; R[p, v] - F_p >= 0
    ne = lay.ne
    if ne:
        e = np.arange(ne)
        rows.add(
            np.concatenate([e, e]),
            np.concatenate([tg.start[lay.edst], tg.finish[lay.esrc]]),
            np.concatenate([np.ones(ne), -np.ones(ne)]),
            ne,
            0.0,
            np.inf,
        )
    m = n * k
    rr = np.arange(m)
    rows.add(
        np.concatenate([rr, rr]),
        np.concatenate([tg.send[1:].ravel(), np.repeat(tg.finish, k)]),
        np.concatenate([np.ones(m), -np.ones(m)]),
        m,
        0.0,
        np.inf,
    )

    # arrival: S_c - R[p, v] - sum_u t send - M x[c, v] >= -M, for every input p of c and device v
    by_slot: dict[tuple[int, int], list[int]] = {}
    for j in np.flatnonzero(live).tolist():
        by_slot.setdefault((int(tm.t_prod[j]), int(tm.t_v[j])), []).append(int(j))
    pairs = [(p, c_) for c_, prods in enumerate(graph.producers) for p in prods]
    r, c, v = [], [], []
    row = 0
    for p, c_ in pairs:
        _check(deadline)
        for d in range(k):
            if not open_[lay.xi[c_, d]]:
                continue
            js = by_slot.get((p, d), [])
            r += [row] * (3 + len(js))
            c += [tg.start[c_], tg.send[p + 1, d], lay.xi[c_, d]] + [tm.t_col[j] for j in js]
            v += [1.0, -1.0, -big] + [-t_unit[j] for j in js]
            row += 1
    if row:
        rows.add(np.array(r), np.array(c), np.array(v), row, -big, np.inf)

    # output: makespan - R[n-1, sink] - transfer >= 0, makespan - F_{n-1} >= 0
    js = by_slot.get((n - 1, sink), [])
    rows.add(
        np.array([0, 0] + [0] * len(js) + [1, 1]),
        np.array([tg.makespan, tg.send[n, sink]] + [tm.t_col[j] for j in js] + [tg.makespan, tg.finish[n - 1]]),
        np.array([1.0, -1.0] + [-t_unit[j] for j in js] + [1.0, -1.0]),
        2,
        0.0,
        np.inf,
    )

    # device order: S_j - F_i - M x[i,d] - M x[j,d] >= -2M for unordered i < j (numpy, in the
    # order of pairs then devices: ResNet-sized graphs on 16 devices give up to a million rows)
    _check(deadline)
    up = np.array(unordered_pairs(graph.producers), dtype=np.intp).reshape(-1, 2)
    ui, ud = np.nonzero(open_[lay.xi[up[:, 0]]] & open_[lay.xi[up[:, 1]]])
    if len(ui):
        i, j = up[ui, 0], up[ui, 1]
        rows.add(
            np.repeat(np.arange(len(ui)), 4),
            np.stack([tg.start[j], tg.finish[i], lay.xi[i, ud], lay.xi[j, ud]], axis=1).ravel(),
            np.tile([1.0, -1.0, -big, -big], len(ui)),
            len(ui),
            -2 * big,
            np.inf,
        )

    # link order: R[q, w] - R[p, v] - M send_p - M send_q >= t_p - 2M, p before q on one link
    on_pair: dict[frozenset, list[int]] = {}
    for j in np.flatnonzero(live).tolist():
        on_pair.setdefault(frozenset((int(tm.t_u[j]), int(tm.t_v[j]))), []).append(int(j))
    cols, los = [], []
    for js in on_pair.values():
        _check(deadline)
        idx = np.array(js, dtype=np.intp)
        prod = tm.t_prod[idx]
        ia, ib = np.nonzero(prod[:, None] < prod[None, :])  # every a before b, in the order a, then b
        a, b = idx[ia], idx[ib]
        send_a, send_b = tg.send[tm.t_prod[a] + 1, tm.t_v[a]], tg.send[tm.t_prod[b] + 1, tm.t_v[b]]
        cols.append(np.stack([send_b, send_a, tm.t_col[a], tm.t_col[b]], axis=1).ravel())
        los.append(t_unit[a] - 2 * big)
    count = sum(len(lo) for lo in los)
    if count:
        rows.add(
            np.repeat(np.arange(count), 4),
            np.concatenate(cols),
            np.tile([1.0, -1.0, -big, -big], count),
            count,
            np.concatenate(los),
            np.inf,
        )
    _check(deadline)  # before the caller assembles the matrix (a second or more at this size)
