"""The throughput objective for pipelined inference, solved exactly.

With every device and link working on a different inference at once, the steady
state delivers one result per *bottleneck*: the larger of the most loaded device's
compute time and the most loaded link's activation transfer time (parameter
shipping is a one-off setup cost, so it does not count).

Phase 1 minimises the bottleneck B with the MILP (B >= every device's compute time,
B >= every link's load). Many assignments usually share the optimal B (layers off
the critical device can move freely), so phase 2 keeps B within 1e-7 of the optimum
and minimises wt*T + we*E among them, giving a plan that is also sensible per item.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .constraints import ResolvedConstraints
from .costmodel import CostTables
from .exceptions import InfeasibleError
from .milp import solve_milp

__all__ = ["solve_throughput", "bottleneck_lower_bound"]

# Phase 2 may exceed the phase-1 bottleneck by this relative slack: enough to absorb
# the solver's feasibility tolerance, far below any difference a user would notice.
CAP_SLACK = 1e-7


def bottleneck_lower_bound(tables: CostTables, cons: ResolvedConstraints) -> float:
    """A lower bound on the optimal bottleneck: each layer's compute lands on some
    device, and all compute is shared by at most k devices."""
    comp = np.where(cons.allowed & np.isfinite(tables.node_time), tables.comp, np.inf)
    per_layer = comp.min(axis=1)
    usable_devs = max(int((cons.allowed.any(axis=0)).sum()), 1)
    return float(max(per_layer.max(), per_layer.sum() / usable_devs))


def solve_throughput(tables: CostTables, cons: ResolvedConstraints, wt: float, we: float,
                     cost_scale: float, fallback_upper: float,
                     explain: Callable[[], InfeasibleError], verbose: bool = False) -> np.ndarray:
    """Device column per layer minimising the bottleneck (ties broken by cost).

    ``cost_scale`` scales phase 2's cost objective; ``fallback_upper`` is a known
    bottleneck (used to scale phase 1 when the lower bound is 0); ``explain`` builds
    the InfeasibleError if the constraints admit no assignment.
    """
    lb = bottleneck_lower_bound(tables, cons)
    ref = lb if lb > 0 and math.isfinite(lb) else fallback_upper
    scale = 1e3 / ref if ref > 0 and math.isfinite(ref) else 1.0
    first = solve_milp(tables, cons, wt, we, objective="bottleneck", scale=scale, verbose=verbose)
    if first.status == 2:
        raise explain()
    if first.status != 0 or first.a is None:
        raise RuntimeError(f"HiGHS did not solve the bottleneck MILP: {first.message}")
    cap = first.value * (1 + CAP_SLACK) + 1e-300
    second = solve_milp(tables, cons, wt, we, objective="latency", scale=cost_scale,
                        bottleneck_cap=cap, verbose=verbose)
    if second.status == 0 and second.a is not None:
        return second.a
    return first.a  # pragma: no cover - phase 1's point is feasible for phase 2
