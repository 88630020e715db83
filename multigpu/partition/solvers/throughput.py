"""The throughput objective for pipelined inference, solved exactly.

With every device and link working on a different inference at once, the steady
state delivers one result per *bottleneck*: the largest of a device's load per item
(compute, stage overheads and the CPU of its transfers), a link's activation
transfer time, and a host's load (its devices' loads) over its cores (parameter
shipping is a one-off setup cost, so it does not count).

Phase 1 minimises the bottleneck B with the MILP (B >= every device's load,
B >= every link's load, B >= every shared host's load / cores). Many assignments usually share the optimal B (layers off
the critical device can move freely), so phase 2 keeps B within 1e-7 of the optimum
and minimises wt*T + we*E among them, giving a plan that is also sensible per item.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

import numpy as np

from multigpu.errors import SolverError
from multigpu.partition.cost.arithmetic import bottleneck_of, transfer_cpu_terms
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.exceptions import InfeasibleError
from multigpu.partition.solvers.constraints import ResolvedConstraints
from multigpu.partition.solvers.milp import solve_milp

__all__ = ["solve_throughput", "bottleneck_lower_bound"]

# Phase 2 may exceed the phase-1 bottleneck by this relative slack: enough to absorb
# the solver's feasibility tolerance, far below any difference a user would notice.
CAP_SLACK = 1e-7


def bottleneck_lower_bound(tables: CostTables, cons: ResolvedConstraints) -> float:
    """A lower bound on the optimal bottleneck: each layer's compute lands on some
    device, and all compute is shared by at most k devices (a device's load is at
    least its compute)."""
    comp = np.where(cons.allowed & np.isfinite(tables.node_time), tables.comp, np.inf)
    per_layer = comp.min(axis=1)
    usable_devs = max(int((cons.allowed.any(axis=0)).sum()), 1)
    return float(max(per_layer.max(), per_layer.sum() / usable_devs))


def solve_throughput(tables: CostTables, cons: ResolvedConstraints, wt: float, we: float,
                     cost_scale: float, known: Optional[tuple[np.ndarray, float]],
                     explain: Callable[[], InfeasibleError], verbose: bool = False) -> np.ndarray:
    """Device column per layer minimising the bottleneck (ties broken by cost).

    ``cost_scale`` scales phase 2's cost objective; ``known`` is a feasible
    assignment and its bottleneck, if one is at hand (an upper bound); ``explain``
    builds the InfeasibleError if the constraints admit no assignment.
    """
    lb = bottleneck_lower_bound(tables, cons)
    crude = _crude_upper(tables, cons)
    ref = lb if lb > 0 else (known[1] if known is not None and known[1] > 0 else crude)
    b_scale = min(1e3 / ref, 1e300) if ref > 0 and math.isfinite(ref) else 1.0
    if known is not None and known[1] <= lb:
        # A feasible plan already sits on the lower bound: it is bottleneck-optimal.
        first_a, best_b = known
    else:
        # With no positive lower bound the optimum may be tiny; HiGHS's default
        # absolute gap (1e-6) would then accept a clearly worse plan.
        options = {"mip_abs_gap": 0.0} if lb <= 0 else None
        first = solve_milp(tables, cons, wt, we, objective="bottleneck", scale=b_scale, verbose=verbose,
                           b_upper=None if known is None else known[1], options=options)
        if first.status == 2:
            raise explain()
        if first.status != 0 or first.a is None:
            raise SolverError(f"HiGHS did not solve the bottleneck MILP: {first.message}")
        first_a, best_b = first.a, bottleneck_of(tables.graph, tables.cluster, first.a)
    if best_b <= 0:
        # B = 0 exactly: no choice may create any load. Say so combinatorially rather
        # than through a row whose tolerance would admit tiny loads.
        fix_x, fix_y = _zero_load(tables)
        second = solve_milp(tables, cons, wt, we, objective="latency", scale=cost_scale, verbose=verbose,
                            fix_x=fix_x, fix_y=fix_y, options={"mip_abs_gap": 0.0})
    else:
        cap = best_b * (1 + CAP_SLACK)
        second = solve_milp(tables, cons, wt, we, objective="latency", scale=cost_scale, b_scale=b_scale,
                            bottleneck_cap=cap, verbose=verbose,
                            options={"mip_abs_gap": 0.0} if cost_scale == 1.0 else None)
    if second.status == 0 and second.a is not None:
        return second.a
    return first_a  # pragma: no cover - phase 1's point is feasible for phase 2


def _crude_upper(tables: CostTables, cons: ResolvedConstraints) -> float:
    """An upper bound on any assignment's bottleneck: all compute on the slowest
    allowed device, a stage start per layer, every transfer on the slowest link and
    every transfer's CPU, over the fewest cores a host has (if below one)."""
    cluster = tables.cluster
    comp = np.where(cons.allowed & np.isfinite(tables.node_time), tables.comp, 0.0)
    tab = cluster.tables
    nb = np.concatenate([[tables.graph.input_bytes], tables.graph.output_bytes])
    t = nb.max() * tab.inv_bandwidth.max() + tab.latency.max() if cluster.k > 1 else 0.0
    cpu = 0.0
    if cluster.k > 1:
        u, v = np.nonzero(~np.eye(cluster.k, dtype=bool))
        _, _, val, _ = transfer_cpu_terms(cluster, u, v, np.full(len(u), nb.max()))
        cpu = 3 * float(np.max(val, initial=0.0))
    cores = min(1.0, float(np.min(cluster.host_cores, initial=1.0)))
    return float(comp.max(axis=1).sum() + len(comp) * cluster.stage_overhead.max()
                 + len(nb) * (t + cpu)) / cores


def _loads_something(cluster: Any, dev: np.ndarray, total: np.ndarray, serial: np.ndarray) -> np.ndarray:
    """Which transfer-CPU terms load a resource: a device's serial part, or any CPU of
    a device on a host."""
    return (serial > 0) | ((total > 0) & (cluster.host_index[dev] >= 0))


def _zero_load(tables: CostTables) -> tuple[np.ndarray, np.ndarray]:
    """Choices that would put any load on a device, link or host (for B = 0)."""
    graph, cluster = tables.graph, tables.cluster
    k = cluster.k
    src, sink = cluster.source_index, cluster.sink_index
    oh = cluster.stage_overhead
    fix_x = tables.comp > 0
    fix_x[0] |= oh > 0                       # layer 1 always starts a stage
    first = tables.edge_matrix(tables.graph.input_bytes, 1.0, 0.0, stage=False)[src]
    last = tables.edge_matrix(float(graph.output_bytes[-1]), 1.0, 0.0, stage=False)[:, sink]
    cpu_links = cluster.cpu_links            # their time is CPU work, counted below, not a link load
    fix_x[0] |= (first > 0) & ~cpu_links[src]
    fix_x[-1] |= (last > 0) & ~cpu_links[:, sink]
    off = np.arange(k)
    for layer, end, nb, sending in ((0, src, graph.input_bytes, False),
                                    (graph.n - 1, sink, float(graph.output_bytes[-1]), True)):
        others = off[off != end]
        u, v = (others, np.full(len(others), end)) if sending else (np.full(len(others), end), others)
        j, d, val, ser = transfer_cpu_terms(cluster, u, v, np.full(len(others), nb))
        fix_x[layer, others[j[_loads_something(cluster, d, val, ser)]]] = True
    nb = graph.output_bytes[:-1]
    t = nb[:, None, None] * cluster.tables.inv_bandwidth[None] + cluster.tables.latency[None]
    t[:, cpu_links] = 0.0
    t = t + np.where(np.eye(k, dtype=bool), 0.0, oh[None, :])[None]   # a change of device starts a stage
    if len(nb) and cluster.has_transfer_cpu:
        e, u, v = np.nonzero(np.broadcast_to(~np.eye(k, dtype=bool), t.shape))
        j, d, val, ser = transfer_cpu_terms(cluster, u, v, nb[e])
        np.add.at(t, (e[j], u[j], v[j]), _loads_something(cluster, d, val, ser).astype(float))
    t[:, np.arange(k), np.arange(k)] = 0.0
    return fix_x, t > 0
