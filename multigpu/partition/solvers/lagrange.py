"""Lagrangian bounds and a repair heuristic for the MILP.

Move the coupling rows into the cost with non-negative multipliers (taken from the
LP relaxation's duals, which are optimal for the Lagrangian dual): the memory rows
``sum_i p_i x[i,d] + m_d <= mem_d`` and ``act_i x[i,d] <= m_d``, the busy-time rows
and the energy budget. What remains is a chain again, so the DP solves it exactly,
and its value minus the multipliers' constant is a lower bound on the constrained
optimum, valid for *any* non-negative multipliers (so inexact duals cost strength,
never correctness).

A feasible plan comes from ``repair``: re-solve the penalised graph, each time
forbidding the heaviest layer on an over-full device. The bound and the repair need
only the graph's DP (``free``), so they serve chains and fork-join graphs alike.
(Fixing the choices that cannot be optimal is done on the LP tightened by window rows,
in ``cutoff``: its bound is the stronger.)
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from multigpu.partition.cost.arithmetic import assignment_arrays, busy_times, memory_use
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.solvers.constraints import ResolvedConstraints
from multigpu.partition.solvers.free import FreeSolver
from multigpu.partition.solvers.milp import Multipliers

__all__ = ["Penalised", "cost_if_feasible", "lower_bound", "penalise", "repair"]


@dataclass(frozen=True)
class Penalised:
    """Penalised chain costs: ``node`` (n x k, +inf where forbidden), the energy weight
    ``we`` of the edges, and ``const`` (subtract it from a path's cost to get the
    Lagrangian value)."""

    node: np.ndarray
    we: float
    const: float


def penalise(
    tables: CostTables, cons: ResolvedConstraints, wt: float, we: float, mult: Multipliers, m_ub: float = 1.0 + 1e-6
) -> Penalised:
    """Fold the multipliers into the chain's costs (rows divided by their limits)."""
    graph = tables.graph
    # Choices that break a limit on their own are infeasible: leaving them out only
    # strengthens the bound.
    alone = ((graph.param_bytes + graph.activation_bytes)[:, None] > cons.memory[None, :] * (1 + 1e-9)) | (
        tables.comp > cons.busy[None, :] * (1 + 1e-9)
    )
    node = np.where(cons.allowed & ~alone, tables.node(wt, we), np.inf)
    mem_on = np.isfinite(cons.memory)
    if mem_on.any():
        inv = np.where(mem_on, 1.0 / np.where(mem_on, cons.memory, 1.0), 0.0)
        node = node + (mult.lam * inv)[None, :] * graph.param_bytes[:, None]
        node = node + mult.pi * inv[None, :] * graph.activation_bytes[:, None]
    busy_on = np.isfinite(cons.busy)
    if busy_on.any():
        inv = np.where(busy_on, 1.0 / np.where(busy_on, cons.busy, 1.0), 0.0)
        node = node + (mult.nu * inv)[None, :] * tables.comp
    we_eff = we
    if cons.has_energy and mult.mu > 0:
        we_eff = we + mult.mu / cons.energy_budget
        node = node + (mult.mu / cons.energy_budget) * np.where(cons.allowed, tables.node_energy, 0.0)
    # The m_d column's penalised coefficient is lam_d - sum_i pi[i,d]; over
    # 0 <= m_d <= m_ub its minimum is m_ub * min(0, that).
    slack = np.minimum(0.0, mult.lam - mult.pi.sum(axis=0))
    const = float(mult.lam.sum() + mult.nu.sum() + mult.mu - m_ub * slack[mem_on].sum())
    return Penalised(node, we_eff, const)


def _solve(
    tables: CostTables, free: FreeSolver, wt: float, pen: Penalised, forbid: np.ndarray | None = None
) -> tuple[np.ndarray, float]:
    node = pen.node if forbid is None else np.where(forbid, np.inf, pen.node)
    return free(tables, node, wt, pen.we)


def lower_bound(tables: CostTables, free: FreeSolver, wt: float, pen: Penalised) -> tuple[float, np.ndarray]:
    """The Lagrangian bound for these multipliers, and the relaxed optimum (``free`` is the
    graph's DP)."""
    a, val = _solve(tables, free, wt, pen)
    return val - pen.const, a


def cost_if_feasible(
    tables: CostTables, cons: ResolvedConstraints, wt: float, we: float, a: np.ndarray
) -> tuple[float, list[int], list[int], bool]:
    """(cost, over-full-memory devices, over-busy devices, over energy?) of ``a``."""
    graph, cluster = tables.graph, tables.cluster
    x = assignment_arrays(graph, cluster, a, tables.ship_params, warm=False)
    energy = x.energy
    busy = busy_times(graph, cluster, tables.comp, a)
    over_mem = np.flatnonzero(memory_use(graph, cluster, a) > cons.memory).tolist()
    over_busy = np.flatnonzero(busy > cons.busy).tolist()
    return wt * x.time + we * energy, over_mem, over_busy, energy > cons.energy_budget


def repair(
    tables: CostTables,
    free: FreeSolver,
    cons: ResolvedConstraints,
    wt: float,
    we: float,
    pen: Penalised,
    seconds: float = math.inf,
) -> tuple[float, np.ndarray | None]:
    """A strictly feasible assignment near the penalised optimum, and its true cost
    (inf/None if the heuristic fails or runs past ``seconds``). Each round forbids the
    heaviest layer on every over-full device and raises the energy weight while over
    budget, so it stops within n*k rounds."""
    graph = tables.graph
    n, k = graph.n, tables.cluster.k
    forbid = np.zeros((n, k), dtype=bool)
    node, we_eff = pen.node, pen.we
    stop = time.perf_counter() + seconds
    for _ in range(n * k + 8):
        if time.perf_counter() > stop:
            return math.inf, None
        a, val = _solve(tables, free, wt, Penalised(node, we_eff, 0.0), forbid)
        if not math.isfinite(val):
            return math.inf, None
        cost, over_mem, over_busy, over_energy = cost_if_feasible(tables, cons, wt, we, a)
        if not (over_mem or over_busy or over_energy):
            return cost, a
        for d in over_mem:
            on = np.flatnonzero(a == d)
            forbid[on[np.argmax(graph.param_bytes[on] + 1e-9 * graph.activation_bytes[on])], d] = True
        for d in over_busy:
            on = np.flatnonzero(a == d)
            forbid[on[np.argmax(tables.comp[on, d])], d] = True
        if over_energy:
            # Weigh energy more: in the limit the chain minimises energy, which fits
            # the budget whenever any allowed assignment does.
            extra = max(we_eff, 1e-3 * max(abs(val), 1e-300)) * 4.0
            node = node + extra * np.where(np.isfinite(node), tables.node_energy, 0.0)
            we_eff = we_eff + extra
    return math.inf, None
