"""Cost model and AutoPartition: place a chain of layers on heterogeneous devices.

``load_cluster`` / ``load_graph`` read the inputs, ``evaluate`` prices one
assignment (time, energy, weighted cost, per layer / device / link, and the matrix
form), and ``autopartition`` finds the exact optimum: a vectorized DP without
coupling constraints, a HiGHS MILP with memory / busy-time / energy constraints or
for the throughput objective. Imports numpy and the standard library only; scipy is
loaded on the first MILP solve.
"""
from __future__ import annotations

from .baselines import BASELINES, BaselineResult, baselines
from .cluster import Cluster, DeviceSpec, Link, LinkSpec, LinkTables, load_cluster, shipped_clusters
from .constraints import Constraints
from .costmodel import Breakdown, DeviceCost, LayerCost, LinkCost, MatrixForm, evaluate
from .exceptions import ClusterError, InfeasibleError, PartitionInputError, UnusableLinkError
from .graph import Graph, LayerSpec, graph_from_model, load_graph
from .planner import OBJECTIVES, Plan, Stage, autopartition
from .report import format_report

__all__ = [
    "BASELINES", "BaselineResult", "Breakdown", "Cluster", "ClusterError", "Constraints",
    "DeviceCost", "DeviceSpec", "Graph", "InfeasibleError", "LayerCost", "LayerSpec", "Link",
    "LinkCost", "LinkSpec", "LinkTables", "MatrixForm", "OBJECTIVES", "PartitionInputError", "Plan",
    "Stage", "UnusableLinkError", "autopartition", "baselines", "evaluate", "format_report",
    "graph_from_model", "load_cluster", "load_graph", "shipped_clusters",
]
