"""Lagrangian bounds, a repair heuristic and reduced-cost fixing for the MILP.

Move the coupling rows into the cost with non-negative multipliers (taken from the
LP relaxation's duals, which are optimal for the Lagrangian dual): the memory rows
``sum_i p_i x[i,d] + m_d <= mem_d`` and ``act_i x[i,d] <= m_d``, the busy-time rows
and the energy budget. What remains is a chain again, so the DP solves it exactly,
and its value minus the multipliers' constant is a lower bound on the constrained
optimum, valid for *any* non-negative multipliers (so inexact duals cost strength,
never correctness).

Forward/backward DP tables under the penalised costs bound the cost of every
solution that uses a given choice (layer i on d, or edge e from u to v). A choice
whose bound exceeds the cost of a known feasible plan cannot be in an optimal plan,
so the MILP fixes it to 0. The feasible plan comes from ``repair``: re-solve the
penalised chain, each time forbidding the heaviest layer on an over-full device.

The bound and the repair need only the graph's DP (``free``), so they serve fork-join
graphs as well; the reduced-cost fixing walks a chain's forward and backward tables.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from multigpu.partition.cost.arithmetic import assignment_arrays, busy_times, memory_use
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.solvers.constraints import ResolvedConstraints
from multigpu.partition.solvers.free import FreeSolver
from multigpu.partition.solvers.milp import Multipliers

__all__ = ["FIX_MARGIN", "Penalised", "cost_if_feasible", "fixings", "lower_bound", "penalise", "repair"]

# Fix a choice only when its bound beats the incumbent by this relative margin, so
# floating-point noise in the DP sums can never remove an optimal choice.
FIX_MARGIN = 1e-7


@dataclass(frozen=True)
class Penalised:
    """Penalised chain costs: ``node`` (n x k, +inf where forbidden), the energy weight
    ``we`` of the edges, and ``const`` (subtract it from a path's cost to get the
    Lagrangian value)."""

    node: np.ndarray
    we: float
    const: float


def penalise(tables: CostTables, cons: ResolvedConstraints, wt: float, we: float,
             mult: Multipliers, m_ub: float = 1.0 + 1e-6) -> Penalised:
    """Fold the multipliers into the chain's costs (rows divided by their limits)."""
    graph = tables.graph
    # Choices that break a limit on their own are infeasible: leaving them out only
    # strengthens the bound.
    alone = ((graph.param_bytes + graph.activation_bytes)[:, None] > cons.memory[None, :] * (1 + 1e-9)) \
        | (tables.comp > cons.busy[None, :] * (1 + 1e-9))
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


def _solve(tables: CostTables, free: FreeSolver, wt: float, pen: Penalised, forbid: Optional[np.ndarray] = None
           ) -> tuple[np.ndarray, float]:
    node = pen.node if forbid is None else np.where(forbid, np.inf, pen.node)
    return free(tables, node, wt, pen.we)


def lower_bound(tables: CostTables, free: FreeSolver, wt: float, pen: Penalised) -> tuple[float, np.ndarray]:
    """The Lagrangian bound for these multipliers, and the relaxed optimum (``free`` is the
    graph's DP)."""
    a, val = _solve(tables, free, wt, pen)
    return val - pen.const, a


def cost_if_feasible(tables: CostTables, cons: ResolvedConstraints, wt: float, we: float,
                     a: np.ndarray) -> tuple[float, list[int], list[int], bool]:
    """(cost, over-full-memory devices, over-busy devices, over energy?) of ``a``."""
    graph, cluster = tables.graph, tables.cluster
    x = assignment_arrays(graph, cluster, a, tables.ship_params, warm=False)
    energy = x.energy
    busy = busy_times(graph, cluster, tables.comp, a)
    over_mem = list(np.flatnonzero(memory_use(graph, cluster, a) > cons.memory))
    over_busy = list(np.flatnonzero(busy > cons.busy))
    return wt * x.time + we * energy, over_mem, over_busy, energy > cons.energy_budget


def repair(tables: CostTables, free: FreeSolver, cons: ResolvedConstraints, wt: float, we: float,
           pen: Penalised) -> tuple[float, Optional[np.ndarray]]:
    """A strictly feasible assignment near the penalised optimum, and its true cost
    (inf/None if the heuristic fails). Each round forbids the heaviest layer on every
    over-full device and raises the energy weight while over budget, so it stops
    within n*k rounds."""
    graph = tables.graph
    n, k = graph.n, tables.cluster.k
    forbid = np.zeros((n, k), dtype=bool)
    node, we_eff = pen.node, pen.we
    for _ in range(n * k + 8):
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


def fixings(tables: CostTables, wt: float, pen: Penalised, upper: float
            ) -> tuple[np.ndarray, np.ndarray]:
    """(fix_x, fix_y): choices every solution through which costs more than ``upper``
    (plus a safety margin) under the Lagrangian bound (a chain's forward and backward DP
    tables: chains only)."""
    graph = tables.graph
    n, k = pen.node.shape
    nbytes = graph.output_bytes[:-1]
    alpha, beta, blocked = tables.edge(wt, pen.we, nbytes)
    edges = nbytes[:, None, None] * alpha[None] + (beta if beta.ndim == 3 else beta[None])
    edges[:, np.arange(k), np.arange(k)] = 0.0
    edges[:, blocked] = np.inf
    F = np.empty((n, k))
    B = np.empty((n, k))
    F[0] = tables.first_edge(wt, pen.we) + pen.node[0]
    for i in range(1, n):
        F[i] = pen.node[i] + (F[i - 1][:, None] + edges[i - 1]).min(axis=0)
    B[-1] = pen.node[-1] + tables.last_edge(wt, pen.we)
    for i in range(n - 2, -1, -1):
        B[i] = pen.node[i] + (edges[i] + B[i + 1][None, :]).min(axis=1)
    threshold = upper + FIX_MARGIN * abs(upper) + 1e-300
    with np.errstate(invalid="ignore"):
        # NaN (inf - inf on forbidden choices) compares False, so it is fixed too.
        fix_x = ~(F + B - pen.node - pen.const <= threshold)
        fix_y = ~(F[:-1, :, None] + edges + B[1:, None, :] - pen.const <= threshold)
    return fix_x, fix_y
