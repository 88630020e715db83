"""Exceptions of the cost model and planner.

Everything derives from the project's ``ClusterError`` (bad input) or
``InfeasibleError`` (no assignment satisfies the constraints), so callers can catch
those two, or ``MultigpuError``, without knowing about this module.
"""

from __future__ import annotations

from multigpu.errors import ClusterError, InfeasibleError

__all__ = ["ClusterError", "GraphError", "InfeasibleError", "PartitionInputError", "UnusableLinkError"]


class GraphError(ClusterError):
    """A bad layer graph: a graph file that is missing or malformed, or a graph (from a file,
    a dict or ``LayerSpec``s) with a bad key, value, name or edge. A kind of ``ClusterError``,
    which graph mistakes raised before, so code catching that still catches them (exit 2)."""


class PartitionInputError(ClusterError):
    """A bad argument to ``evaluate`` or ``autopartition``: weights, assignment,
    objective, solver or constraints (as opposed to a bad cluster or graph file)."""


class UnusableLinkError(ClusterError):
    """An assignment sends data between two devices that have no link and the
    cluster has no ``default_link``."""
