"""The contiguous DP over a graph's ideals (Tarnawski et al., NeurIPS 2020): the best plan in
which each device holds one convex stage and the stages run in a sequence.

An *ideal* (down-set) is a set of layers closed under producers. Every contiguous plan is a
chain of ideals, empty = I_0 < I_1 < ... < I_m = all layers, stage t being I_t \\ I_(t-1) on
its own device; and every difference of two nested ideals is convex. The DP visits the
ideals by size, keeping for each ideal and each multiset of used devices the best value of
the stages so far; a step adds one stage J \\ I on an unused device. Identical devices form
one class, so the multiset is a count per class (32 states for 5 distinct devices, 700 for
the planner benchmark's 16 devices, 1 + 1 + 4 + 4 + 6).

What a stage costs depends on where its inputs come from, which the state does not hold. So
a transfer into a stage is priced at its dearest sender (the most any other device could
charge), a transfer out of it at its dearest receiver, once per consumer outside (at most
k - 1): the DP's value is an upper bound on its plan's value, and where every link into
(and out of) a device costs the same, the latency objective's is exact. For the throughput
objective a stage's value is the larger of its device's load (exact) and the transfer time
of all its inputs and outputs, which is at least the load of every link it uses. The plan
comes back priced by the cost model, and the planner uses it as a starting plan and an
upper bound for the MILP (``methods``).

Clusters with engine terms (transfer CPU, a relay, hosts) load a third device or a host with
a stage's transfers, which no stage-local figure bounds: the DP refuses them. It refuses a
graph with more than ``IDEAL_LIMIT`` ideals (a chain of n layers has n + 1, ResNet-50 a few
hundred; wide parallel branches multiply), and clusters whose device classes give more than
``STATE_LIMIT`` states.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from multigpu.partition.cost.tables import CostTables
from multigpu.partition.inputs.graph import Graph
from multigpu.partition.solvers.constraints import ResolvedConstraints

__all__ = ["IDEAL_LIMIT", "STATE_LIMIT", "Contiguous", "contiguous_optimum", "ideals", "why_not_contiguous"]

# The most ideals the DP enumerates (its work grows with their square).
IDEAL_LIMIT = 20_000
# The most states (multisets of used devices) per ideal.
STATE_LIMIT = 4_096
# Activation sizes the memory check tells apart (more are rounded up to these).
ACT_LEVELS = 16


class TooManyIdeals(ValueError):
    """The graph has more ideals than the limit."""


@dataclass(frozen=True)
class Contiguous:
    """The DP's answer: ``a`` (device column per layer) and ``value``, the DP's own price of
    it (an upper bound on its value: the cost, or the bottleneck)."""

    a: np.ndarray
    value: float


def ideals(graph: Graph, limit: int = IDEAL_LIMIT) -> np.ndarray:
    """(m, n) bool: every ideal of ``graph``, by size (the empty one first, all layers last).
    Raises TooManyIdeals past ``limit``."""
    n = graph.n
    need = [sum(1 << p for p in ps if p >= 0) for ps in graph.producers]
    level = {0}
    out = [0]
    while level:
        nxt: set[int] = set()
        for ideal in level:
            for i in range(n):
                bit = 1 << i
                if not ideal & bit and need[i] & ~ideal == 0:
                    nxt.add(ideal | bit)
        out.extend(sorted(nxt))
        if len(out) > limit:
            raise TooManyIdeals(
                f"graph {graph.name!r} has more than {limit} ideals (sets of layers closed under their "
                f"inputs); the contiguous DP stops there"
            )
        level = nxt
    m = np.zeros((len(out), n), dtype=bool)
    for r, ideal in enumerate(out):
        bits = np.frombuffer(ideal.to_bytes((n + 7) // 8 or 1, "little"), dtype=np.uint8)
        m[r] = np.unpackbits(bits, bitorder="little")[:n].astype(bool)
    return m


def why_not_contiguous(tables: CostTables, objective: str) -> str | None:
    """None when the contiguous DP prices this problem, else why not."""
    cluster = tables.cluster
    if objective not in ("latency", "throughput"):
        return f"the contiguous DP prices the latency and throughput objectives, not {objective}"
    if tables.has_transfer_cpu or tables.has_relay or cluster.hosts:
        return "the cluster's transfer CPU, relay or hosts load devices that no stage-local figure bounds"
    return None


def _classes(keys: list[np.ndarray]) -> list[list[int]]:
    """Devices the DP cannot tell apart: those whose columns of every table in ``keys``
    (each (..., k)) are equal."""
    groups: dict[bytes, list[int]] = {}
    k = keys[0].shape[-1]
    for d in range(k):
        key = b"".join(np.ascontiguousarray(np.asarray(t, dtype=float)[..., d]).tobytes() for t in keys)
        groups.setdefault(key, []).append(d)
    return list(groups.values())


def contiguous_optimum(
    tables: CostTables,
    cons: ResolvedConstraints,
    objective: str,
    wt: float = 1.0,
    we: float = 0.0,
    limit: int = IDEAL_LIMIT,
) -> Contiguous | None:
    """The contiguous plan of least DP value (see the module's docstring) for ``objective``
    "latency" (wt*T + we*E) or "throughput", meeting pins, exclusions, memory and busy-time
    limits (an energy budget is left to the caller); None when no contiguous plan does.
    Raises TooManyIdeals past ``limit`` ideals, ValueError where ``why_not_contiguous`` says."""
    why = why_not_contiguous(tables, objective)
    if why is not None:
        raise ValueError(why)
    graph, cluster = tables.graph, tables.cluster
    n, k = graph.n, cluster.k
    M = ideals(graph, limit)
    m = len(M)
    Mf = M.astype(float)
    thr = objective == "throughput"
    # Per layer and device: what it costs where it runs, and whether it may run there.
    if thr:
        busy = tables.busy
        node = tables.comp * busy[None, :]
        start = cluster.stage_overhead * busy
    else:
        node = tables.node(wt, we)
        start = tables.stage(wt, we)
    bad = ~cons.allowed | ~np.isfinite(node)
    node = np.where(bad, 0.0, node)
    NODE, BAD = Mf @ node, Mf @ bad.astype(float)
    COMP = Mf @ tables.comp
    PAR = Mf @ graph.param_bytes
    act = graph.activation_bytes
    # Transfers: (1 + n) producers (the input first); ``link[u, v, j]`` prices producer j's
    # output from u to v (the dearest pair stands for an unknown sender or receiver).
    out_bytes = np.concatenate([[graph.input_bytes], graph.output_bytes])
    if thr:
        u, v = np.meshgrid(np.arange(k), np.arange(k), indexing="ij")
        tab = cluster.tables
        per = np.stack([tab.occupancy_seconds(np.full(u.shape, b), u, v) for b in out_bytes], axis=-1)
        per = np.where(tab.usable[..., None], per, np.inf)
        per[np.arange(k), np.arange(k)] = 0.0
    else:
        per = np.moveaxis(tables.edge_costs(out_bytes, wt, we, stage=False), 0, -1)
    off = ~np.eye(k, dtype=bool)[..., None]
    # (k, 1 + n): the dearest sender into d, the dearest receiver from d (0 with one device).
    into = np.where(off, per, -np.inf).max(axis=0) if k > 1 else np.zeros((k, n + 1))
    outof = np.where(off, per, -np.inf).max(axis=1) if k > 1 else np.zeros((k, n + 1))
    src, sink = cluster.source_index, cluster.sink_index
    input_cost = per[src, :, 0]  # (k,) exact: the input is on the source
    sink_cost = per[:, sink, n]  # (k,) exact: the output goes to the sink
    consumers = graph.consumers
    in_cons = np.zeros(n, dtype=bool)
    in_cons[graph.input_consumers] = True
    # Consumers of each layer outside each ideal, capped at k - 1 devices.
    CNT = np.zeros((m, n))
    for p in range(n):
        if consumers[p]:
            CNT[:, p] = np.minimum(len(consumers[p]) - M[:, list(consumers[p])].sum(axis=1), k - 1)
    # Output transfers of each ideal's layers to consumers outside it: the finite part, and how
    # many go over a missing link (0 * inf would be NaN where no consumer is outside).
    out_fin = np.where(np.isfinite(outof), outof, 0.0)
    out_inf = (~np.isfinite(outof)).astype(float)
    OUTJ = (Mf * CNT) @ out_fin[:, 1:].T  # (m, k)
    BLOCKED = (Mf * CNT) @ out_inf[:, 1:].T
    limits = np.stack([cons.memory, cons.busy, start, src == np.arange(k), sink == np.arange(k)])
    classes = _classes([node, tables.comp, bad, into.T, outof.T, input_cost, sink_cost, limits])
    sizes = [len(c) for c in classes]
    stride = np.cumprod([1, *[s + 1 for s in sizes]])[:-1]
    nstates = int(np.prod([s + 1 for s in sizes]))
    if nstates > STATE_LIMIT:
        raise TooManyIdeals(
            f"cluster {cluster.name!r} has {nstates} multisets of distinct devices, above {STATE_LIMIT}"
        )
    states = np.arange(nstates)
    used = [(states // stride[c]) % (sizes[c] + 1) for c in range(len(classes))]
    val = np.full((m, nstates), np.inf)
    val[0, 0] = 0.0
    back = np.full((m, nstates, 2), -1, dtype=np.int64)  # (previous ideal, class)
    last = n - 1
    # Memory: the largest activation of a stage, from levels of activation (at most
    # ACT_LEVELS; with more distinct sizes each is rounded up to the next level, which only
    # makes the memory check stricter).
    levels = np.unique(act)[::-1]
    if len(levels) > ACT_LEVELS:
        levels = np.quantile(act, np.linspace(1.0, 0.0, ACT_LEVELS), method="higher")
        levels = np.unique(levels)[::-1]
    rounded = np.array([levels[levels >= x].min() for x in act])
    at_least = (rounded[:, None] >= levels[None, :]).astype(np.float32)  # (n, T)
    M32 = M.astype(np.float32)
    producers = [np.array([p for p in ps if p >= 0], dtype=np.intp) for ps in graph.producers]
    for i in range(m - 1):
        live = np.isfinite(val[i])
        if not live.any():
            continue
        Ii = M[i]
        # One product over the larger ideals answers, for each J: is it a superset of I, and
        # how many of its layers outside I start a stage, take the input, consume each
        # frontier layer of I (and fall in each activation level).
        feeds = in_cons | np.array([bool(Ii[ps].any()) if len(ps) else False for ps in producers])
        frontier = [int(p) for p in np.flatnonzero(Ii) if any(not Ii[c] for c in consumers[p])]
        cols = [Ii, feeds & ~Ii, in_cons & ~Ii]
        for p in frontier:
            col = np.zeros(n, dtype=bool)
            col[list(consumers[p])] = True
            cols.append(col & ~Ii)
        Q = np.stack(cols, axis=1).astype(np.float32)
        counts = M32[i + 1 :] @ Q
        sup = np.flatnonzero(counts[:, 0] == Ii.sum()) + i + 1
        counts = counts[sup - i - 1].astype(np.float64)  # whole numbers; float32 would round the costs
        starts = counts[:, 1]
        takes_input = counts[:, 2] > 0
        has_last = M[sup, last] & ~Ii[last]
        hits = [(p, counts[:, 3 + r] > 0) for r, p in enumerate(frontier)]
        if cons.has_memory:
            params = PAR[sup] - PAR[i]
            # The largest activation outside I bounds every stage's; only the stages that this
            # bound would not let fit anywhere need their own.
            biggest = np.full(len(sup), float(rounded[~Ii].max(initial=0.0)))
            tight = np.flatnonzero(params + biggest > np.min(cons.memory))
            if len(tight):
                inside = (M32[sup[tight]] @ (at_least * (~Ii)[:, None])) > 0  # (t, T): a layer at this level
                biggest[tight] = np.where(inside.any(axis=1), levels[inside.argmax(axis=1)], 0.0)
        for c, members in enumerate(classes):
            d = members[0]
            cost = NODE[sup, d] - NODE[i, d] + starts * start[d]
            transfer = np.zeros(len(sup))
            for p, hit in hits:
                transfer += np.where(hit, into[d, p + 1], 0.0)
            transfer += np.where(takes_input, input_cost[d], 0.0) + np.where(has_last, sink_cost[d], 0.0)
            if thr:
                out = OUTJ[sup, d] - sum(CNT[sup, p] * out_fin[d, p + 1] for p in frontier)
                blocked = BLOCKED[sup, d] - sum(CNT[sup, p] * out_inf[d, p + 1] for p in frontier)
                out = np.where(blocked > 0.5, np.inf, out)
                stage = np.maximum(cost, transfer + out)
            else:
                stage = cost + transfer
            ok = (BAD[sup, d] - BAD[i, d]) < 0.5
            if np.isfinite(cons.busy[d]):
                ok &= COMP[sup, d] - COMP[i, d] <= cons.busy[d]
            if cons.has_memory and np.isfinite(cons.memory[d]):
                ok &= params + biggest <= cons.memory[d]
            stage = np.where(ok & ~np.isnan(stage), stage, np.inf)
            fresh = np.flatnonzero(live & (used[c] < sizes[c]))
            if not len(fresh) or not np.isfinite(stage).any():
                continue
            here = val[i, fresh][:, None]
            new = np.maximum(here, stage[None, :]) if thr else here + stage[None, :]
            to = fresh + stride[c]
            cur = val[np.ix_(sup, to)].T
            better = new < cur
            if better.any():
                r, col = np.nonzero(better)
                val[sup[col], to[r]] = new[r, col]
                back[sup[col], to[r]] = np.stack([np.full(len(r), i), np.full(len(r), c)], axis=1)
    end = int(np.argmin(val[m - 1]))
    best = float(val[m - 1, end])
    if not math.isfinite(best):
        return None
    a = np.full(n, -1, dtype=np.intp)
    j, s = m - 1, end
    while j != 0:
        i, c = back[j, s]
        s -= stride[c]
        # The t-th stage placed on class c goes to its t-th device.
        a[M[j] & ~M[i]] = classes[c][used[c][s]]
        j = int(i)
    return Contiguous(a, best)
