"""Lower bounds on the throughput objective's bottleneck, from the layers' compute alone (no
transfers, stage starts or hosts, which only add load): the simple bound, and the LP that
balances the layers over the devices within their memory. The throughput solver quotes them
as its bound; the local search reads the same compute (``busy_compute``)."""

from __future__ import annotations

import numpy as np

from multigpu.partition.cost.tables import CostTables
from multigpu.partition.solvers.constraints import ResolvedConstraints

__all__ = ["bottleneck_lower_bound", "busy_compute", "load_balance_bound"]


def busy_compute(tables: CostTables, cons: ResolvedConstraints) -> np.ndarray:
    """(n, k) seconds of each layer's compute on each device at the device's busy rate
    (``busy_ratios``), +inf where the layer may not run there: the least a layer adds to a
    device's load."""
    return np.where(cons.allowed & np.isfinite(tables.node_time), tables.comp * tables.busy[None, :], np.inf)


def bottleneck_lower_bound(tables: CostTables, cons: ResolvedConstraints) -> float:
    """A lower bound on the optimal bottleneck: each layer's compute lands on some
    device, and all compute is shared by at most k devices (a device's load is at
    least its compute at the busy rate, ``busy_ratios``)."""
    per_layer = busy_compute(tables, cons).min(axis=1)
    usable_devs = max(int((cons.allowed.any(axis=0)).sum()), 1)
    return float(max(per_layer.max(), per_layer.sum() / usable_devs))


def load_balance_bound(tables: CostTables, cons: ResolvedConstraints) -> float:
    """A lower bound on the optimal bottleneck from an LP over the layers alone: each layer's
    share x[l, d] on the devices it may use (summing to 1), each device's compute at the busy
    rate at most B, and each device's parameters within its memory (``cutoff.rooms``). Transfers,
    stage starts and hosts only add load, so every plan is a point of this LP. It is n * k
    columns (HiGHS solves ResNet-50 on 16 devices in 0.03 s), where the bottleneck MILP's root LP
    took 19 s by interior point and more than 120 s by simplex on the same case, for the same
    bound (5.8157e-05 s against 5.8156e-05 s). The LP splits a layer across devices, so the
    result is the larger of its value and ``bottleneck_lower_bound`` (which alone holds where the
    LP is infeasible: the MILP then says why)."""
    from scipy.sparse import csr_matrix, vstack

    from multigpu.partition.solvers.cutoff import rooms
    from multigpu.partition.solvers.highs import OPTIMAL, Highs

    comp = busy_compute(tables, cons)
    n, k = comp.shape
    layer, dev = np.nonzero(np.isfinite(comp))
    m = len(layer)
    simple = bottleneck_lower_bound(tables, cons)
    if m == 0:
        return simple
    cols = np.arange(m)
    # B in units of the simple bound (at most B, so HiGHS's absolute tolerances are relative to
    # B), and each memory row in units of its room: seconds and bytes differ by ten orders of magnitude.
    unit = simple or 1.0
    room = rooms(tables, cons)
    limited = np.flatnonzero(np.isfinite(room))
    per_room = 1.0 / np.maximum(room[limited], 1.0)
    # Rows: each layer placed once; each device's load minus B at most 0; each memory limit.
    once = csr_matrix((np.ones(m), (layer, cols)), shape=(n, m + 1))
    load = csr_matrix(
        (np.r_[comp[layer, dev] / unit, -np.ones(k)], (np.r_[dev, np.arange(k)], np.r_[cols, np.full(k, m)])),
        shape=(k, m + 1),
    )
    params = tables.graph.param_bytes[layer]
    mem = csr_matrix((params, (dev, cols)), shape=(k, m + 1))[limited].multiply(per_room[:, None])
    A = vstack([once, load, csr_matrix(mem)]).tocsr()
    lo = np.r_[np.ones(n), np.full(k + len(limited), -np.inf)]
    hi = np.r_[np.ones(n), np.zeros(k), room[limited] * per_room]
    c = np.zeros(m + 1)
    c[m] = 1.0
    lp = Highs(c, A, lo, hi, np.zeros(m + 1), np.r_[np.ones(m), [np.inf]], np.zeros(m + 1))
    res = lp.solve({"presolve": True}, relax=True)
    if res.status != OPTIMAL or res.x is None:
        return simple
    # HiGHS's feasibility tolerance (1e-7 per row, in units at most B) may leave the LP's value
    # a hair above the true minimum: the shave keeps it a bound.
    return max(simple, float(res.fun) * unit * (1 - 1e-6))
