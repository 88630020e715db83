"""A plan of lower cost (wt*T + we*E, the latency objective) by local search, beside the
latency MILP.

Where memory binds, the latency path's first plans are poor and its proof is slow. On GoogLeNet
over the planner benchmark's 16 devices (each holding 40% of the parameters) the memory fill
starts at 3.1 times the optimum and the restricted MILP's plan at 2.1 times; the first round
plan within 11% of it came after 11 s. The optimum there is a handful of contiguous stages, two
of them a single layer on the host relaying between GPUs, which moves of stage boundaries
reach.

The search sweeps the moves of ``search_moves``: every run's prefixes and suffixes, and every
single layer, to each device that allows them and has room for their parameters. Where a moved
run's cost did not drop, it also tries the run's first or last layer on the relay between the
run's new device and its neighbour's (``search_moves.relays``). A move that lowers the cost and
breaks no constraint (``violations``) is kept at once and the sweep goes on; the search stops
after a sweep without a move, or at its deadline. Plans are priced as the latency MILP prices
them (``cost_if_feasible``), so the result is an upper bound and a starting plan; it proves
nothing.

It runs in a child process beside the LP relaxation and the MILP rounds
(``deadline_process.Call``): HiGHS leaves the second core mostly idle.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial

import numpy as np

from multigpu.partition.cost.arithmetic import weighted_cost
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.exceptions import UnusableLinkError
from multigpu.partition.solvers.constraints import ResolvedConstraints, violations
from multigpu.partition.solvers.search_moves import TIE, in_turn, relays, segments

__all__ = ["improve_cost", "search_in_child"]


def _cost(tables: CostTables, wt: float, we: float, a: np.ndarray) -> float:
    """wt*T + we*E of plan ``a`` (``lagrange.cost_if_feasible``'s price); inf where a transfer
    has no link."""
    try:
        return weighted_cost(tables.graph, tables.cluster, a, tables.ship_params, wt, we, warm=False)
    except UnusableLinkError:
        return np.inf


def _relayed(tables: CostTables, wt: float, we: float, a: np.ndarray, seg: np.ndarray, relay: np.ndarray) -> float:
    """The lowest cost with the moved run ``seg`` (already on its new device in ``a``) relayed
    to its neighbour in layer order: its first layer on the relay from the previous layer's
    device, or its last on the relay to the next one's. ``a`` keeps the better choice; inf,
    with ``a`` unchanged, where neither end has a relay."""
    d, n = int(a[seg[0]]), len(a)
    best, choice = np.inf, (-1, -1)
    for end, nb in ((int(seg[0]), int(seg[0]) - 1), (int(seg[-1]), int(seg[-1]) + 1)):
        if not 0 <= nb < n:
            continue
        r = int(relay[a[nb], d] if nb < end else relay[d, a[nb]])
        if r < 0:
            continue
        a[end] = r
        value = _cost(tables, wt, we, a)
        a[end] = d
        if value < best:
            best, choice = value, (end, r)
    if choice[0] >= 0:
        a[choice[0]] = choice[1]
    return best


def improve_cost(
    tables: CostTables, cons: ResolvedConstraints, wt: float, we: float, a: np.ndarray, deadline: float
) -> tuple[np.ndarray, float]:
    """From feasible plan ``a``, the plan of a local search on wt*T + we*E (see the module) and
    its cost, by ``deadline`` (a ``time.perf_counter`` instant)."""
    a = np.asarray(a, dtype=np.intp).copy()
    k = tables.cluster.k
    params = tables.graph.param_bytes
    relay = relays(tables)
    value = _cost(tables, wt, we, a)
    while time.perf_counter() < deadline:
        moved = False
        for seg in segments(a, np.arange(k)):
            here = int(a[seg[0]])
            if not (a[seg] == here).all():
                continue  # a move earlier in this sweep took part of it
            held = np.bincount(a, weights=params, minlength=k)
            room = cons.allowed[seg].all(axis=0) & (held + params[seg].sum() <= cons.memory)
            for d in np.flatnonzero(room):
                if d == here:
                    continue
                a[seg] = d
                v = _cost(tables, wt, we, a)
                if not v < value * (1 - TIE) and len(seg) > 1:
                    v = _relayed(tables, wt, we, a, seg, relay)
                if v < value * (1 - TIE) and not violations(tables, cons, a):
                    value, moved = v, True
                    break
                a[seg] = here  # the relayed end is in the run too
                if time.perf_counter() >= deadline:
                    break
            if time.perf_counter() >= deadline:
                break
        if not moved:
            break
    return a, value


def search_in_child(
    tables: CostTables, cons: ResolvedConstraints, wt: float, we: float, starts: Sequence[np.ndarray], wall: float
) -> tuple[np.ndarray, float]:
    """The best of ``improve_cost`` from each plan of ``starts`` in turn, by ``wall`` (a
    ``time.time`` instant; ``search_moves.in_turn``)."""
    return in_turn(partial(improve_cost, tables, cons, wt, we), starts, wall)
