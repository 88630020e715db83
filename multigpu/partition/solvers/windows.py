"""Window cuts: valid inequalities that stop the LP relaxation from running a
memory-limited device's share of the graph as a fraction of a whole single-device plan.

The LP relaxation of the placement MILP is a mixture of plans. With every device's
memory below the graph's parameters, it mixes plans that each keep everything on one
device (each weighted by the share of the parameters that device holds) and so pays for
almost no transfer, while every real plan pays for some. On ResNet-50 on the lab with
each device holding 40% of the parameters the LP bound sat 17% below the optimum.

A **window** is a set W of layers, connected through the edges inside it, whose
parameters exceed what device d can hold (its memory, a little more for the solver's
tolerance, less the smallest activation: a device that holds a layer holds at least
that much activation). Not all of W fits on d, so if layer i of W runs on d, some layer
of W runs elsewhere, and on a path inside W between them an edge has exactly one end on
d. The flow rows make that edge's mass with one end on d ``x[src,d] + x[dst,d] - 2
y[e,d,d]``, so for every i in W::

    x[i,d] <= sum_{e in E(W)} (x[src_e,d] + x[dst_e,d] - 2 y[e,d,d])

Every integral plan that fits in memory satisfies it, whatever its cost. The windows are
the connected parts of the shortest runs of layers (in topological order) whose
parameters overflow d: on a chain, every minimal run. ``separate`` returns the rows the
LP solution breaks most, one per (window, device), with the layer i that breaks it most.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from multigpu.partition.inputs.graph import Graph

__all__ = ["Window", "windows", "separate", "MAX_CUTS", "VIOLATION"]

# A row counts as broken when its left side exceeds its right by this much (x is a
# fraction of 1): smaller breaks move the bound by less than the LP's own tolerance.
VIOLATION = 1e-4
# Rows added per round: the most broken first, so each LP stays small.
MAX_CUTS = 300
# How many layers a run may grow past its shortest overflowing length while looking for a
# connected part that overflows on its own (a run across a block's branches splits).
MAX_GROWTH = 8


@dataclass(frozen=True)
class Window:
    """Layers ``members`` (connected through ``edges``, indices into the graph's edge
    list) whose parameters exceed ``room`` bytes: they cannot all run on a device with that
    much room for parameters."""

    room: float
    members: np.ndarray
    edges: np.ndarray


def _components(graph: Graph, lo: int, hi: int) -> list[np.ndarray]:
    """The connected parts of layers lo..hi through the edges inside that range."""
    parent = list(range(hi - lo + 1))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    src, dst = graph.edge_src, graph.edge_dst
    inside = np.flatnonzero((src >= lo) & (dst <= hi))  # src < dst: layers are in topological order
    for e in inside:
        ra, rb = find(int(src[e]) - lo), find(int(dst[e]) - lo)
        if ra != rb:
            parent[ra] = rb
    roots = np.array([find(i) for i in range(hi - lo + 1)])
    return [lo + np.flatnonzero(roots == r) for r in np.unique(roots)]


def windows(graph: Graph, rooms: np.ndarray) -> list[Window]:
    """The windows for each distinct finite value in ``rooms`` (bytes of parameters a
    memory-limited device can hold): for each first layer, the connected parts of the
    shortest run from it whose parameters exceed the room (growing the run by up to
    ``MAX_GROWTH`` layers when no part overflows alone)."""
    params = graph.param_bytes
    pref = np.concatenate([[0.0], np.cumsum(params)])
    src, dst = graph.edge_src, graph.edge_dst
    out: list[Window] = []
    n = graph.n
    for room in np.unique(rooms[np.isfinite(rooms)]):
        seen: set[tuple[int, ...]] = set()
        for a in range(n):
            # The shortest run a..b whose parameters exceed the room.
            b = max(a, int(np.searchsorted(pref, pref[a] + room, side="right")) - 1)
            if b >= n:
                break  # the rest of the graph fits: so does every later run
            for hi in range(b, min(n, b + MAX_GROWTH + 1)):
                parts = [
                    m
                    for m in ([np.arange(a, hi + 1)] if graph.is_chain else _components(graph, a, hi))
                    if params[m].sum() > room
                ]
                for m in parts:
                    key = tuple(int(i) for i in m)
                    if key in seen:
                        continue
                    seen.add(key)
                    inside = np.isin(src, m) & np.isin(dst, m)
                    out.append(Window(float(room), m, np.flatnonzero(inside)))
                if parts:
                    break
    return out


def separate(
    graph: Graph,
    wins: list[Window],
    rooms: np.ndarray,
    x: np.ndarray,
    y_diag: np.ndarray,
    xi: np.ndarray,
    y_diag_cols: np.ndarray,
    limit: int = MAX_CUTS,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The broken window rows for an LP solution: ``x`` (n, k) and ``y_diag`` (edges, k),
    the flow of each edge staying on each device. Returns COO (row, column, value) in the
    full model's columns (``xi`` (n, k), ``y_diag_cols`` (edges, k)) and the number of
    rows, each ``<= 0``; at most ``limit``, the most broken first."""
    src, dst = graph.edge_src, graph.edge_dst
    # The mass of each edge's flow with exactly one end on each device.
    cross = x[src] + x[dst] - 2.0 * y_diag
    found = []
    for w in wins:
        devs = np.flatnonzero(rooms == w.room)
        if not len(devs):
            continue
        sub = x[np.ix_(w.members, devs)]
        at = sub.argmax(axis=0)
        broken = sub[at, np.arange(len(devs))] - cross[np.ix_(w.edges, devs)].sum(axis=0)
        for j in np.flatnonzero(broken > VIOLATION):
            found.append((float(broken[j]), w, int(w.members[at[j]]), int(devs[j])))
    found.sort(key=lambda t: -t[0])
    rs, cs, vs = [], [], []
    for r, (_, w, i, d) in enumerate(found[:limit]):
        # Coefficients of x[j, d]: minus the number of W's edges at j; plus 1 at i.
        deg = np.zeros(graph.n)
        np.add.at(deg, src[w.edges], 1.0)
        np.add.at(deg, dst[w.edges], 1.0)
        coef = -deg[w.members]
        coef[np.searchsorted(w.members, i)] += 1.0
        rs.append(np.full(len(w.members) + len(w.edges), r))
        cs.append(np.concatenate([xi[w.members, d], y_diag_cols[w.edges, d]]))
        vs.append(np.concatenate([coef, np.full(len(w.edges), 2.0)]))
    count = min(len(found), limit)
    if not count:
        empty = np.zeros(0)
        return empty.astype(np.int64), empty.astype(np.int64), empty, 0
    return np.concatenate(rs), np.concatenate(cs), np.concatenate(vs), count
