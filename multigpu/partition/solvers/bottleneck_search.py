"""A plan of lower bottleneck by local search, for throughput solves under a time limit.

Where the bottleneck MILP's root is out of reach, a time-limited solve could only return its
starting plan: on ResNet-50 over the planner benchmark's 16 devices (each holding 40% of the
parameters) HiGHS ran 60 s without its root LP, and the answer was a three-device plan at 0.846
ms per item. This search starts from a plan and moves layers off the bottleneck (the most
loaded device, link or host) to another device they may use: a prefix or a suffix of a run of
consecutive layers on one device (a stage boundary shifted), or a single layer. Where moving a
run overloads a link that a third device relays faster (two hops, each faster than the link:
GPUs that reach each other through their host), the run's first or last layer goes to that
relay in the same move. It takes the first move that lowers the bottleneck, or keeps it and
lowers the sum of squared loads (so that where two resources share the bottleneck, one is
relieved first), and stops at a plan no such move improves, or at its deadline. Every plan it
keeps meets the constraints (``violations``), and it is priced by the cost model
(``cost.arithmetic``), so the result is an upper bound and a starting plan; it proves nothing.
The planner runs it from its best starting plan, then from the memory fill
(``search_in_child``).

It runs in a child process beside the MILP (``deadline_process.Call``), whose HiGHS leaves the
second core mostly idle, so that a MILP that proves its optimum quickly loses no time to it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial

import numpy as np

from multigpu.partition.cost.arithmetic import assignment_arrays, link_loads, loads
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.exceptions import UnusableLinkError
from multigpu.partition.solvers.bottleneck_bound import busy_compute
from multigpu.partition.solvers.constraints import ResolvedConstraints, violations
from multigpu.partition.solvers.search_moves import TIE, in_turn, relays, segments

__all__ = ["improve_bottleneck", "search_in_child"]


def _resources(tables: CostTables, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every load that bounds the bottleneck of plan ``a`` in one array (devices, then links as
    a flattened k x k table, then hosts' shares), and the device loads."""
    graph, cluster = tables.graph, tables.cluster
    x = assignment_arrays(graph, cluster, a, ship_params=False, warm=False)
    device, _, _, hosts = loads(graph, cluster, x)
    links = link_loads(cluster, x)
    shares = hosts / cluster.host_cores if hosts.size else np.zeros(0)
    return np.concatenate([device, links.ravel(), shares]), device


def _involved(tables: CostTables, a: np.ndarray, every: np.ndarray) -> np.ndarray:
    """The devices whose layers can relieve the most loaded resource: a device itself, a
    link's two ends, or a host's devices."""
    cluster = tables.cluster
    k = cluster.k
    top = int(np.argmax(every))
    if top < k:
        return np.array([top])
    if top < k + k * k:
        return np.array(divmod(top - k, k))
    return np.flatnonzero(cluster.host_index == top - k - k * k)


def _relayed(
    tables: CostTables, a: np.ndarray, seg: np.ndarray, top: int, relay: np.ndarray
) -> tuple[np.ndarray, np.ndarray, float, float] | None:
    """Where the most loaded resource ``top`` (an index into ``_resources``' loads) is a link
    into or out of the moved segment ``seg`` (already on its new device in ``a``) with a relay,
    the loads with the segment's first or last layer on the relay instead, whichever is lower
    (``a`` keeps that choice); None, with ``a`` unchanged, where there is no such relay."""
    k = tables.cluster.k
    if not k <= top < k + k * k:
        return None
    u, v = divmod(top - k, k)
    d, r = int(a[seg[0]]), int(relay[u, v])
    if r < 0 or d not in (u, v):
        return None
    best: tuple[np.ndarray, np.ndarray, float, float] | None = None
    choice = -1
    for end in (seg[0], seg[-1]):
        a[end] = r
        try:
            new, new_device = _resources(tables, a)
        except UnusableLinkError:
            new = None
        a[end] = d
        if new is not None and (best is None or (float(new.max()), float(np.square(new).sum())) < best[2:]):
            best, choice = (new, new_device, float(new.max()), float(np.square(new).sum())), int(end)
    if best is not None:
        a[choice] = r
    return best


def _better(value: float, spread: float, than: float, than_spread: float) -> bool:
    """Whether loads of bottleneck ``value`` and sum of squares ``spread`` improve on the
    current ones: a lower bottleneck, or the same with a lower sum of squares."""
    return value < than * (1 - TIE) or (value <= than * (1 + TIE) and spread < than_spread * (1 - TIE))


def improve_bottleneck(
    tables: CostTables, cons: ResolvedConstraints, a: np.ndarray, deadline: float
) -> tuple[np.ndarray, float]:
    """From feasible plan ``a``, the plan of a local search on the bottleneck (see the module)
    and its bottleneck (seconds per item), by ``deadline`` (a ``time.perf_counter`` instant)."""
    a = np.asarray(a, dtype=np.intp).copy()
    comp = busy_compute(tables, cons)
    params = tables.graph.param_bytes
    every, device = _resources(tables, a)
    value, spread = float(every.max()), float(np.square(every).sum())
    relay = relays(tables)
    while time.perf_counter() < deadline:
        moved = False
        held = np.bincount(a, weights=params, minlength=len(device))
        for seg in segments(a, _involved(tables, a, every)):
            here = int(a[seg[0]])
            # A device that would reach the bottleneck with these layers alone cannot lower it,
            # and one whose memory their parameters overflow cannot take them.
            targets = np.flatnonzero(
                (device + comp[seg].sum(axis=0) < value * (1 - TIE)) & (held + params[seg].sum() <= cons.memory)
            )
            for d in targets[np.argsort(device[targets], kind="stable")]:
                if d == here:
                    continue
                a[seg] = d
                try:
                    new, new_device = _resources(tables, a)
                except UnusableLinkError:  # a transfer between devices that no link joins
                    a[seg] = here
                    continue
                v, s = float(new.max()), float(np.square(new).sum())
                if not _better(v, s, value, spread) and len(seg) > 1:
                    # The move overloads a link: put the segment's end layer on that link's relay.
                    relayed = _relayed(tables, a, seg, int(np.argmax(new)), relay)
                    if relayed is not None:
                        new, new_device, v, s = relayed
                if _better(v, s, value, spread) and not violations(tables, cons, a):
                    every, device, value, spread, moved = new, new_device, v, s, True
                    break
                a[seg] = here
                if time.perf_counter() >= deadline:
                    break
            if moved or time.perf_counter() >= deadline:
                break
        if not moved:
            break
    return a, value


def search_in_child(
    tables: CostTables, cons: ResolvedConstraints, starts: Sequence[np.ndarray], wall: float
) -> tuple[np.ndarray, float]:
    """The best of ``improve_bottleneck`` from each plan of ``starts`` in turn, by ``wall`` (a
    ``time.time`` instant; ``search_moves.in_turn``)."""
    return in_turn(partial(improve_bottleneck, tables, cons), starts, wall)
