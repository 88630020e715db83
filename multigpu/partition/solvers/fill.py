"""A first plan in milliseconds where memory binds: the layers in topological order fill the
devices one after another, the fastest first.

The latency MILP path needs a plan before its time limit: without one, a limit is an error.
On GoogLeNet on 16 devices (each holding 40% of the parameters) its first plan otherwise
comes after the LP relaxation, which takes longer than a 1 s limit. This plan is no good
(it ignores transfers), but once a plan exists, every later step of the solve stops at the
limit.
"""

from __future__ import annotations

import numpy as np

from multigpu.partition.cost.tables import CostTables
from multigpu.partition.solvers.constraints import ResolvedConstraints

__all__ = ["fill_plan"]


def fill_plan(tables: CostTables, cons: ResolvedConstraints) -> np.ndarray | None:
    """Each layer (in topological order, pins on their device) on the first device, from the
    current one on in order of the whole graph's compute time, that allows it and still has room
    for its parameters and activation. None when the devices run out; the caller checks the
    plan against every constraint (``methods.violations``)."""
    graph = tables.graph
    n, k = cons.allowed.shape
    comp = np.where(np.isfinite(tables.comp), tables.comp, np.inf)
    order = np.argsort(comp.sum(axis=0), kind="stable")
    params = np.zeros(k)
    act = np.zeros(k)
    a = np.full(n, -1, dtype=np.intp)
    at = 0
    for i in range(n):
        p, m = float(graph.param_bytes[i]), float(graph.activation_bytes[i])
        room = cons.allowed[i] & (params + p + np.maximum(act, m) <= cons.memory)
        pin = cons.pins.get(i)
        if pin is not None:
            d = int(pin)
        else:
            step = next((s for s in range(at, k) if room[order[s]]), None)
            if step is None:
                return None
            at, d = step, int(order[step])
        a[i] = d
        params[d] += p
        act[d] = max(act[d], m)
    return a
