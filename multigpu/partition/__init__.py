"""Cost model and AutoPartition: place a network's layers (a chain or any DAG) on heterogeneous devices.

Layers: ``inputs/`` (clusters, graphs, hosts, the checks of file values), ``cost/``
(the cost model), ``solvers/`` (DP, MILP, Lagrangian bounds, throughput, the planner,
diagnosis, baselines), then ``stages`` and ``report``. Every public name is here.

``load_cluster`` / ``load_graph`` read the inputs, ``evaluate`` prices one
assignment (time, energy, weighted cost, per layer / device / link, and the matrix
form), and ``autopartition`` finds the exact optimum: a vectorized DP without
coupling constraints, a HiGHS MILP with memory / busy-time / energy constraints or
for the throughput objective. Imports numpy and the standard library only; scipy is
loaded on the first MILP solve.
"""

from __future__ import annotations

from multigpu.partition.cost.evaluate import evaluate
from multigpu.partition.cost.matrix import MatrixForm
from multigpu.partition.cost.records import Breakdown, DeviceCost, LayerCost, LinkCost, TransferCost
from multigpu.partition.exceptions import (
    ClusterError,
    GraphError,
    InfeasibleError,
    PartitionInputError,
    UnusableLinkError,
)
from multigpu.partition.inputs.cluster import (
    Cluster,
    DeviceSpec,
    EngineProfile,
    Link,
    LinkSpec,
    LinkTables,
    as_cluster,
    load_cluster,
    shipped_clusters,
)
from multigpu.partition.inputs.graph import Graph, LayerSpec, graph_from_model, load_graph, shipped_graphs
from multigpu.partition.report import format_report
from multigpu.partition.solvers.baselines import BASELINES, BaselineResult, baselines
from multigpu.partition.solvers.constraints import Constraints
from multigpu.partition.solvers.planner import OBJECTIVES, Plan, autopartition
from multigpu.partition.stages import Stage

__all__ = [
    "BASELINES",
    "BaselineResult",
    "Breakdown",
    "Cluster",
    "ClusterError",
    "Constraints",
    "DeviceCost",
    "DeviceSpec",
    "EngineProfile",
    "Graph",
    "GraphError",
    "InfeasibleError",
    "LayerCost",
    "LayerSpec",
    "Link",
    "LinkCost",
    "LinkSpec",
    "LinkTables",
    "MatrixForm",
    "OBJECTIVES",
    "PartitionInputError",
    "Plan",
    "Stage",
    "UnusableLinkError",
    "as_cluster",
    "autopartition",
    "baselines",
    "evaluate",
    "format_report",
    "TransferCost",
    "graph_from_model",
    "load_cluster",
    "load_graph",
    "shipped_clusters",
    "shipped_graphs",
]
