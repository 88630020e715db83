"""The exact DP for a graph without coupling constraints, whichever fits its shape: the
chain DP (``dp.solve_chain``) for a chain, the fork-join DP (``forkjoin``) for a
series-parallel graph, none for any other DAG (the MILP takes those).

Each takes node costs (n x k, +inf where forbidden: pins, exclusions, a Lagrangian's
penalties) and the weights of the edges, so the planner, the Lagrangian bounds and the
diagnosis share one call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from multigpu.partition.cost.tables import CostTables
from multigpu.partition.inputs.graph import Graph
from multigpu.partition.solvers.dp import solve_chain
from multigpu.partition.solvers.forkjoin import NotForkJoin, Series, solve_fork_join, structure

__all__ = ["FreeSolver", "free_solver"]


@dataclass(frozen=True)
class FreeSolver:
    """An exact DP for one graph: ``method`` is what the plan reports ("dp" for the
    chain DP, "fork-join dp"); call it with (tables, node, wt, we)."""

    method: str
    shape: Series | None

    def __call__(self, tables: CostTables, node: np.ndarray, wt: float, we: float) -> tuple[np.ndarray, float]:
        """(device column per layer, optimal value): the minimum of sum node[i, a_i] plus every
        transfer and stage start weighted by (wt, we); +inf when every assignment is forbidden."""
        if self.shape is None:
            alpha, beta, blocked = tables.edge(wt, we, tables.graph.output_bytes[:-1])
            return solve_chain(
                node,
                tables.first_edge(wt, we),
                tables.last_edge(wt, we),
                alpha,
                beta,
                blocked,
                tables.graph.output_bytes[:-1],
            )
        return solve_fork_join(tables, node, wt, we, self.shape)


def free_solver(graph: Graph) -> tuple[FreeSolver | None, str]:
    """The DP for ``graph``, or None and the reason (which layer makes it neither a chain
    nor fork-join)."""
    if graph.is_chain:
        return FreeSolver("dp", None), ""
    try:
        return FreeSolver("fork-join dp", structure(graph)), ""
    except NotForkJoin as e:
        return None, str(e)
