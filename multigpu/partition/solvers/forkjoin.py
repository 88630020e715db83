"""Exact DP for fork-join (series-parallel) graphs: the cheapest wt*T + we*E without
coupling constraints, where residual blocks, Inception modules and U-Net skips nest.

The class. A graph is **fork-join** when it reads as a series of layers from the input to
the sink, where between two consecutive layers there is either one edge or a *bundle*:
a fork layer whose consumers start branches that all end at one join layer (its
immediate post-dominator), each branch a fork-join series of its own whose first layer
consumes only the fork and whose last layer feeds only the join (a branch may also be
the edge fork -> join itself, as a ResNet identity shortcut). Every chain is one;
DenseNet's all-to-all skips are not, and neither is a layer whose branches end at two
different joins (``structure`` says which layer breaks the form).

The DP. For a series, a table over (first layer's device, current layer's device)
advances layer by layer, ``P'[h, w] = min_u P[h, u] + link(u, w) + node(w)``, with
back-pointers. A single edge costs its transfer and the consumer's stage start. A
bundle from a fork on u to a join on w costs, exactly as the cost model counts it:

* the fork's output once to each distinct device among the branches' first layers
  (and the join, for a direct edge): an uncapacitated facility location over the
  branches, solved by trying every set of at most m devices (m = the bundle's
  branches), which is exact because a branch head on an unopened device is never
  cheaper than one on an opened device of the set that is optimal;
* each branch's own table (head on h, tail on l), its tail's transfer to the join, a
  stage start at each head off the fork's device;
* the join's stage start, unless every input of it is on w.

Cost: O(k^2) per layer on the top series (its first "layer" is the input, fixed on the
source), O(k^3) per layer inside a branch (an all-pairs table), and O(k^2 C(k, <= m) m)
per bundle of m branches: for ResNet (m <= 2) and Inception (m = 4) on 16 devices a few
milliseconds per block. Ties go to the lowest device index.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from multigpu.partition.cost.tables import CostTables
from multigpu.partition.inputs.graph import Graph

__all__ = ["Bundle", "NotForkJoin", "Series", "solve_fork_join", "structure"]


class NotForkJoin(ValueError):
    """The graph is not fork-join; the message names the layer that breaks the form."""


@dataclass
class Bundle:
    """Branches from a fork to a join; None is the direct edge fork -> join."""

    branches: list[Series | None]


@dataclass
class Series:
    """Layers ``nodes`` (-1: the graph's input; n: the sink) joined by ``links``:
    ``links[i]`` joins ``nodes[i]`` to ``nodes[i + 1]`` (None: one edge)."""

    nodes: list[int]
    links: list[Bundle | None] = field(default_factory=list)


def _post_dominators(graph: Graph) -> dict[int, int]:
    """Immediate post-dominator of every layer and of the input (-1), with the sink n as
    the exit. Layers come in a topological order, so one backward pass does it."""
    n = graph.n
    ipdom: dict[int, int] = {n: n}
    depth = {n: 0}

    def lca(a: int, b: int) -> int:
        while a != b:
            if depth[a] >= depth[b]:
                a = ipdom[a]
            else:
                b = ipdom[b]
        return a

    for v in range(n - 1, -2, -1):
        cons = _consumers(graph, v)
        p = cons[0]
        for c in cons[1:]:
            p = lca(p, c)
        ipdom[v], depth[v] = p, depth[p] + 1
    return ipdom


def _consumers(graph: Graph, v: int) -> list[int]:
    if v < 0:
        return [int(c) for c in graph.input_consumers]
    return list(graph.consumers[v]) if v < graph.n - 1 else [graph.n]


def structure(graph: Graph) -> Series:
    """The graph as a fork-join series from the input (-1) to the sink (n); NotForkJoin
    naming the layer where it is not one."""
    ipdom = _post_dominators(graph)
    names = graph.names
    n = graph.n

    def name(v: int) -> str:
        return "the input" if v < 0 else f"layer {names[v]!r}"

    def series(v: int, stop: int | None) -> Series:
        out = Series([v])
        while True:
            cons = _consumers(graph, v)
            if stop is not None and cons == [stop]:
                return out
            if len(cons) == 1:
                w = cons[0]
                if w == n:
                    out.nodes.append(n)
                    out.links.append(None)
                    return out
                if graph.producers[w] != (v,):
                    raise NotForkJoin(f"{name(w)} joins inputs that do not fork at one layer")
                out.nodes.append(w)
                out.links.append(None)
                v = w
                continue
            t = ipdom[v]
            if t == stop or t >= n:
                raise NotForkJoin(f"the branches from {name(v)} end at the join of an enclosing fork")
            branches: list[Series | None] = []
            for c in cons:
                if c == t:
                    branches.append(None)
                    continue
                if graph.producers[c] != (v,):
                    raise NotForkJoin(f"{name(c)} consumes {name(v)} and another layer, but starts a branch")
                branches.append(series(c, t))
            tails = sorted([b.nodes[-1] for b in branches if b is not None] + ([v] if None in branches else []))
            if sorted(graph.producers[t]) != tails:
                raise NotForkJoin(f"{name(t)} joins more than the branches that fork at {name(v)}")
            out.nodes.append(t)
            out.links.append(Bundle(branches))
            v = t

    return series(-1, None)


# -- the DP --------------------------------------------------------------------------------
@dataclass
class _Solved:
    P: np.ndarray  # (r, k): first node's device (row) -> last node's
    back: list[np.ndarray]  # per link: (r, k) argmin previous device


class _DP:
    def __init__(self, tables: CostTables, node: np.ndarray, wt: float, we: float) -> None:
        self.tables, self.graph, self.cluster = tables, tables.graph, tables.cluster
        self.node, self.wt, self.we = node, wt, we
        self.k = self.cluster.k
        self.stage = tables.stage(wt, we)
        self.solved: dict[int, _Solved] = {}
        self.bundles: dict[int, tuple[np.ndarray, dict]] = {}

    # costs
    def node_cost(self, v: int) -> np.ndarray:
        k, n = self.k, self.graph.n
        if 0 <= v < n:
            return self.node[v]
        fixed = self.cluster.source_index if v < 0 else self.cluster.sink_index
        out = np.full(k, np.inf)
        out[fixed] = 0.0
        return out

    def out_bytes(self, v: int) -> float:
        return self.graph.input_bytes if v < 0 else float(self.graph.output_bytes[v])

    def send(self, v: int) -> np.ndarray:
        """k x k: moving v's output from u to w (0 on the diagonal, +inf if unusable)."""
        return self.tables.edge_matrix(self.out_bytes(v), self.wt, self.we, stage=False)

    def edge(self, p: int, c: int) -> np.ndarray:
        """k x k: the single edge p -> c, with c's stage start."""
        if c >= self.graph.n:
            return self.send(p)
        m = self.tables.edge_matrix(self.out_bytes(p), self.wt, self.we, stage=True)
        if p < 0:  # consuming the input always starts a stage
            m = m + np.where(np.eye(self.k, dtype=bool), self.stage[None, :], 0.0)
        return m

    # forward
    def solve(self, s: Series, rows: int) -> _Solved:
        k = self.k
        first = self.node_cost(s.nodes[0])
        P = np.diag(first) if rows == k else first[None, :].copy()
        if rows == k:
            P[~np.eye(k, dtype=bool)] = np.inf
        back = []
        for i, link in enumerate(s.links):
            p, c = s.nodes[i], s.nodes[i + 1]
            L = self.edge(p, c) if link is None else self.bundle(p, c, link)
            tmp = P[:, :, None] + L[None, :, :]  # (r, u, w)
            arg = tmp.argmin(axis=1)
            P = np.take_along_axis(tmp, arg[:, None, :], axis=1)[:, 0, :] + self.node_cost(c)[None, :]
            back.append(arg)
        out = _Solved(P, back)
        self.solved[id(s)] = out
        return out

    def bundle(self, s: int, t: int, b: Bundle) -> np.ndarray:
        """k x k: cost of the bundle from s on u to t on w (t's node cost excluded)."""
        k = self.k
        direct = any(x is None for x in b.branches)
        heads = [x for x in b.branches if x is not None]
        send = self.send(s)
        eye = np.eye(k, dtype=bool)
        hs = np.where(eye & (s >= 0), 0.0, self.stage[None, :])  # [u, h]: head's stage start
        any_, on = [], []
        for br in heads:
            P = self.solve(br, k).P  # [h, l]
            xfer = self.send(br.nodes[-1])  # [l, w]
            T = P[:, :, None] + xfer[None, :, :]  # [h, l, w]
            any_.append(T.min(axis=1))
            on.append(P)  # the tail on w: no transfer
        subsets = [()] + [c for r in range(1, len(heads) + 1) for c in itertools.combinations(range(k), r)]
        S = np.full((len(subsets), max(len(heads), 1)), k, dtype=np.intp)  # k pads
        for i, c in enumerate(subsets):
            S[i, : len(c)] = c
        send_pad = np.concatenate([send, np.zeros((k, 1))], axis=1)  # [u, v], v = k pads
        opened = send_pad[:, S].sum(axis=2).T  # [S, u]
        in_s = np.zeros((len(subsets), k + 1), dtype=bool)
        np.put_along_axis(in_s, S, True, axis=1)
        in_s = in_s[:, :k]  # [S, w]
        total = opened[:, :, None] + np.zeros((1, 1, k))  # [S, u, w]
        if direct:
            extra = np.where(eye, 0.0, send)  # send s -> the join on w
            total = total + np.where(in_s[:, None, :], 0.0, extra[None, :, :])

        def branch_min(B: np.ndarray) -> np.ndarray:
            C = hs.T[:, :, None] + B[:, None, :]  # [h, u, w]
            Cp = np.concatenate([C, np.full((1, k, k), np.inf)], axis=0)
            best = Cp[S].min(axis=1)  # [S, u, w]
            free = C[np.arange(k), np.arange(k), :]  # h = u: [u, w]
            best = np.minimum(best, free[None])
            if direct:
                best = np.minimum(best, C[np.arange(k)[None, :], np.arange(k)[:, None], np.arange(k)[None, :]][None])
            return best

        with_stage = total + self.stage[None, None, :]
        for B in any_:
            with_stage = with_stage + branch_min(B)
        Q = with_stage.min(axis=0)
        if self.stage.any() and (not direct or s >= 0):
            local = total.copy()
            for B in on:
                local = local + branch_min(B)
            if direct:
                local = np.where(eye[None], local, np.inf)  # the fork feeds the join: same device
            Q = np.minimum(Q, local.min(axis=0))
        self.bundles[id(b)] = (S, {"hs": hs, "any": any_, "on": on, "direct": direct, "heads": heads})
        return Q

    # backward
    def trace(self, s: Series, row: int, last: int, out: np.ndarray) -> None:
        """Fill ``out`` with the devices of s's layers, s's first node on ``row``'s device
        (the row of its table) and its last on ``last``."""
        solved = self.solved[id(s)]
        w = last
        for i in range(len(s.links) - 1, -1, -1):
            c = s.nodes[i + 1]
            u = int(solved.back[i][row, w])
            if 0 <= c < self.graph.n:
                out[c] = w
            link = s.links[i]
            if link is not None:
                self.trace_bundle(s.nodes[i], link, u, w, out)
            w = u
        if 0 <= s.nodes[0] < self.graph.n:
            out[s.nodes[0]] = w

    def trace_bundle(self, s: int, b: Bundle, u: int, w: int, out: np.ndarray) -> None:
        """Fill in the branches of bundle ``b`` from the fork on ``u`` to the join on ``w``:
        the forward pass's minimum for (u, w), recomputed over the device sets."""
        S, info = self.bundles[id(b)]
        send = self.send(s)
        hs, direct, heads = info["hs"], info["direct"], info["heads"]
        send_pad = np.append(send[u], 0.0)
        opened = send_pad[S].sum(axis=1)
        if direct and w != u:
            opened = opened + np.where((S == w).any(axis=1), 0.0, send[u, w])
        # Devices a head may use: the set's, the fork's (free) and, with a direct edge, the join's.
        free = [u] + ([w] if direct else [])

        def picks(tables: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
            total = np.zeros(len(S))
            choice = np.zeros((len(S), len(tables)), dtype=np.intp)
            for j, B in enumerate(tables):
                C = np.append(hs[u] + B[:, w], np.inf)  # by head device; k pads
                cand = np.concatenate([S, np.broadcast_to(np.array(free), (len(S), len(free)))], axis=1)
                vals = C[cand]
                arg = vals.argmin(axis=1)
                choice[:, j] = cand[np.arange(len(S)), arg]
                total += vals[np.arange(len(S)), arg]
            return total, choice

        any_total, any_choice = picks(info["any"])
        options = [(opened + self.stage[w] + any_total, any_choice, False)]
        if self.stage.any() and not (direct and (s < 0 or u != w)):
            on_total, on_choice = picks(info["on"])
            options.append((opened + on_total, on_choice, True))
        best_val, best = np.inf, None
        for total, choice, local in options:
            r = int(np.argmin(total))
            if total[r] < best_val:
                best_val, best = total[r], (choice[r], local)
        if best is None:  # pragma: no cover - the forward pass found a finite value here
            return
        chosen, local = best
        for br, h in zip(heads, chosen):
            h = int(h)
            if local:
                tail = w
            else:
                P = self.solved[id(br)].P
                tail = int(np.argmin(P[h] + self.send(br.nodes[-1])[:, w]))
            self.trace(br, h, tail, out)


def solve_fork_join(
    tables: CostTables, node: np.ndarray, wt: float, we: float, shape: Series | None = None
) -> tuple[np.ndarray, float]:
    """Minimise wt*T + we*E over fork-join graph ``tables.graph`` with node costs ``node``
    (n x k, +inf where forbidden) and edges weighted by (wt, we). Returns (device column
    per layer, optimal value); the value is +inf when every assignment is forbidden.
    Raises NotForkJoin when the graph is not fork-join (``structure``)."""
    s = structure(tables.graph) if shape is None else shape
    dp = _DP(tables, node, wt, we)
    solved = dp.solve(s, 1)
    sink = tables.cluster.sink_index
    value = float(solved.P[0, sink])
    a = np.zeros(tables.graph.n, dtype=np.intp)
    if np.isfinite(value):
        dp.trace(s, 0, sink, a)
    return a, value
