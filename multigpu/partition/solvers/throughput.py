"""The throughput objective for pipelined inference, solved exactly.

With every device and link working on a different inference at once, the steady
state delivers one result per *bottleneck*: the largest of a device's load per item
(compute, stage overheads and the CPU of its transfers), a link's activation
transfer time, and a host's load (the CPU-seconds of its devices' loads: compute times
``Cluster.compute_cores``, all their transfer CPU) over its cores (parameter
shipping is a one-off setup cost, so it does not count).

Phase 1 minimises the bottleneck B with the MILP (B >= every device's load, its compute
at the busy rate (``busy_ratios``),
B >= every link's load, B >= every shared host's load / cores). Many assignments usually share the optimal B (layers off
the critical device can move freely), so phase 2 keeps B within 1e-7 of the optimum
and minimises wt*T + we*E among them, giving a plan that is also sensible per item.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from multigpu.errors import SolverError
from multigpu.partition.cost.arithmetic import bottleneck_of, busy_ratios, transfer_cpu_terms
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
    least its compute at the busy rate, ``busy_ratios``)."""
    busy = busy_ratios(tables.graph, tables.cluster)
    comp = np.where(cons.allowed & np.isfinite(tables.node_time), tables.comp * busy[None, :], np.inf)
    per_layer = comp.min(axis=1)
    usable_devs = max(int((cons.allowed.any(axis=0)).sum()), 1)
    return float(max(per_layer.max(), per_layer.sum() / usable_devs))


def solve_throughput(
    tables: CostTables,
    cons: ResolvedConstraints,
    wt: float,
    we: float,
    cost_scale: float,
    known: tuple[np.ndarray, float] | None,
    explain: Callable[[], InfeasibleError],
    verbose: bool = False,
) -> np.ndarray:
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
        first = solve_milp(
            tables,
            cons,
            wt,
            we,
            objective="bottleneck",
            scale=b_scale,
            verbose=verbose,
            b_upper=None if known is None else known[1],
            options=options,
        )
        if first.status == 2:
            raise explain()
        if first.status != 0 or first.a is None:
            raise SolverError(f"HiGHS did not solve the bottleneck MILP: {first.message}")
        first_a, best_b = first.a, bottleneck_of(tables.graph, tables.cluster, first.a, warm=False)
    if best_b <= 0:
        # B = 0 exactly: no choice may create any load. Say so combinatorially rather
        # than through a row whose tolerance would admit tiny loads.
        second = solve_milp(
            tables,
            cons,
            wt,
            we,
            objective="latency",
            scale=cost_scale,
            verbose=verbose,
            zero_load=True,
            options={"mip_abs_gap": 0.0},
        )
    else:
        cap = best_b * (1 + CAP_SLACK)
        second = solve_milp(
            tables,
            cons,
            wt,
            we,
            objective="latency",
            scale=cost_scale,
            b_scale=b_scale,
            bottleneck_cap=cap,
            verbose=verbose,
            options={"mip_abs_gap": 0.0} if cost_scale == 1.0 else None,
        )
    if second.status == 0 and second.a is not None:
        return second.a
    return first_a  # pragma: no cover - phase 1's point is feasible for phase 2


def _crude_upper(tables: CostTables, cons: ResolvedConstraints) -> float:
    """An upper bound on any assignment's bottleneck (it sets the rows' scale): all compute
    on the slowest allowed device, a stage start per layer, every transfer on the slowest link and
    every transfer's CPU, over the fewest cores a host has (if below one)."""
    cluster = tables.cluster
    comp = np.where(cons.allowed & np.isfinite(tables.node_time), tables.comp, 0.0)
    tab = cluster.tables
    nb = np.concatenate([[tables.graph.input_bytes], tables.graph.output_bytes])
    t = nb.max() * tab.inv_bandwidth.max() + tab.max_latency if cluster.k > 1 else 0.0
    cpu = 0.0
    if cluster.k > 1:
        u, v = np.nonzero(~np.eye(cluster.k, dtype=bool))
        # Both regimes (an inline transfer's fixed figure may be the larger one).
        _, _, val, _ = transfer_cpu_terms(cluster, u, v, np.full(len(u), nb.max()))
        _, _, small, _ = transfer_cpu_terms(cluster, u, v, np.zeros(len(u)))
        cpu = 3 * (float(np.max(val, initial=0.0)) + float(np.max(small, initial=0.0)))
    cores = min(1.0, float(np.min(cluster.host_cores, initial=1.0)))
    graph = tables.graph
    # Each producer's output crosses at most once to each other device its consumers use.
    sends = (
        min(len(graph.input_consumers), cluster.k - 1) + 1 + sum(min(len(c), cluster.k - 1) for c in graph.consumers)
    )
    return float(comp.max(axis=1).sum() + len(comp) * cluster.stage_overhead.max() + sends * (t + cpu)) / cores
