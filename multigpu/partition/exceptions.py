"""Exceptions of the cost model and planner.

Everything derives from the project's ``ClusterError`` (bad input) or
``InfeasibleError`` (no assignment satisfies the constraints), so callers can catch
those two, or ``MultigpuError``, without knowing about this module.
"""

from __future__ import annotations

from multigpu.errors import ClusterError, InfeasibleError

__all__ = ["ClusterError", "InfeasibleError", "PartitionInputError", "UnusableLinkError"]


class PartitionInputError(ClusterError):
    """A bad argument to ``evaluate`` or ``autopartition``: weights, assignment,
    objective, solver or constraints (as opposed to a bad cluster or graph file)."""


class UnusableLinkError(ClusterError):
    """An assignment sends data between two devices that have no link and the
    cluster has no ``default_link``."""
