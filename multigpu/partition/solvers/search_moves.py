"""What the local searches share (``bottleneck_search`` for the throughput objective,
``cost_search`` for the latency one): the layer sets a move takes to another device, the relay
device between a pair, and running the search from several starting plans in turn.

A move takes a run of consecutive layers on one device cut at any point (a prefix or a suffix:
a stage boundary shifted) or a single layer. Where the move's new transfer has a relay (a third
device whose two hops are each faster than the direct link: GPUs that reach each other through
their host), the searches also try the run's first or last layer on that relay.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from multigpu.partition.cost.tables import CostTables

__all__ = ["TIE", "in_turn", "relays", "segments"]

# Relative changes below this are ties (costs and loads are sums of floats).
TIE = 1e-12


def segments(a: np.ndarray, devices: np.ndarray) -> list[np.ndarray]:
    """The layer sets a move may take off ``devices``: each run of consecutive layers on one of
    them cut at any point (its prefixes and suffixes: a stage boundary shifted, which moves no
    transfer onto a new link), and each single layer; the largest first."""
    out: list[np.ndarray] = []
    on = np.isin(a, devices)
    i, n = 0, len(a)
    while i < n:
        if not on[i]:
            i += 1
            continue
        j = i
        while j + 1 < n and a[j + 1] == a[i]:
            j += 1
        run = np.arange(i, j + 1)
        out += [run[:m] for m in range(1, len(run) + 1)] + [run[m:] for m in range(1, len(run))]
        out += [run[m : m + 1] for m in range(1, len(run) - 1)]
        i = j + 1
    out.sort(key=len, reverse=True)
    return out


def relays(tables: CostTables) -> np.ndarray:
    """(k, k): per ordered pair of devices, the device whose two hops carry a byte faster than
    the pair's own link (the slower hop counts), or -1 where none does."""
    tab = tables.cluster.tables
    k = tables.cluster.k
    inv = np.where(tab.usable, tab.inv_bandwidth, np.inf)
    # two[u, r, v]: the slower of the hops u -> r and r -> v.
    two = np.maximum(inv[:, :, None], inv[None, :, :])
    idx = np.arange(k)
    two[:, idx, idx] = np.inf  # r = v is the direct link
    two[idx, idx, :] = np.inf  # r = u too
    best = two.argmin(axis=1)
    faster = np.take_along_axis(two, best[:, None, :], axis=1)[:, 0, :] < inv * (1 - TIE)
    return np.where(faster, best, -1)


def in_turn(
    improve: Callable[[np.ndarray, float], tuple[np.ndarray, float]], starts: Sequence[np.ndarray], wall: float
) -> tuple[np.ndarray, float]:
    """The best of ``improve(start, deadline)`` from each distinct plan of ``starts`` in turn (the
    next one starts where the last reached its local optimum), by ``wall``, a ``time.time``
    instant (``deadline_process.wall_deadline``): the form in which a deadline crosses into a child
    process. In turn, not in equal shares, which left both throughput searches short of their
    local optima (the design page's rejected alternatives)."""
    deadline = time.perf_counter() + (wall - time.time())
    distinct: list[np.ndarray] = []
    for a in starts:
        if not any(np.array_equal(a, b) for b in distinct):
            distinct.append(np.asarray(a, dtype=np.intp))
    if not distinct:
        raise ValueError("the local search needs a starting plan")
    best: tuple[np.ndarray, float] | None = None
    for a in distinct:
        found = improve(a, deadline)
        if best is None or found[1] < best[1]:
            best = found
        if time.perf_counter() >= deadline:
            break
    assert best is not None
    return best
