"""The simple placements every report compares AutoPartition against.

* ``single``: the best single device (all layers on one device);
* ``uniform``: contiguous stages with equal layer counts, one per device in cluster order;
* ``balanced``: contiguous stages whose FLOPs are proportional to each device's FLOP/s,
  in cluster order (so each stage would take the same compute time);
* ``greedy``: each layer on the device with the cheapest compute for it (the fastest
  device when we = 0); ties, such as a layer with no FLOPs, stay on the previous
  layer's device.

Excluded devices are left out of every baseline; greedy also honours pins. A
baseline may break memory/busy/energy limits: ``violations`` lists what it breaks,
and ``reason`` says why one is unusable (a missing link).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from multigpu.partition.cost.arithmetic import memory_use
from multigpu.partition.cost.evaluate import check_weights, evaluate
from multigpu.partition.cost.records import Breakdown
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.exceptions import UnusableLinkError
from multigpu.partition.inputs.cluster import Cluster
from multigpu.partition.inputs.graph import Graph
from multigpu.partition.solvers.constraints import Constraints

__all__ = ["BaselineResult", "baselines", "BASELINES"]

BASELINES = {
    "single": "best single device",
    "uniform": "uniform contiguous split",
    "balanced": "FLOPs-balanced split",
    "greedy": "greedy (fastest device per layer)",
}


@dataclass(frozen=True, eq=False)
class BaselineResult:
    """One baseline: its ``assignment`` and ``breakdown``, or ``reason`` when it
    cannot run; ``violations`` lists the constraints it breaks."""

    name: str
    description: str
    assignment: list[str] | None
    breakdown: Breakdown | None
    reason: str | None = None
    violations: list[str] = field(default_factory=list)

    @property
    def cost(self) -> float:
        """Its cost, or +inf when it cannot run."""
        return self.breakdown.cost if self.breakdown is not None else float("inf")


def _contiguous(n: int, devices: list[int], shares: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Cut the chain so stage j gets about ``shares[j]`` of ``weights`` (by each
    layer's midpoint), stage j on ``devices[j]``."""
    total = weights.sum()
    if total <= 0:
        weights, total = np.ones(n), float(n)
    mid = (np.cumsum(weights) - weights / 2) / total
    bounds = np.cumsum(shares) / shares.sum()
    stage = np.minimum(np.searchsorted(bounds, mid, side="right"), len(devices) - 1)
    return np.asarray(devices, dtype=np.intp)[stage]


def baselines(
    graph: Graph,
    cluster: Cluster,
    wt: float = 1.0,
    we: float = 0.0,
    ship_params: bool = False,
    constraints: None | Constraints | Mapping[str, Any] = None,
) -> list[BaselineResult]:
    """Evaluate the four baselines (see module docstring) under the same cost model."""
    wt, we = check_weights(wt, we)
    cons = Constraints.coerce(constraints).resolve(graph, cluster)
    n = graph.n
    free = [d for d in range(cluster.k) if d not in cons.excluded]
    tables = CostTables.build(graph, cluster, ship_params)

    def run(name: str, a: np.ndarray) -> BaselineResult:
        try:
            bd = evaluate(graph, cluster, a, wt, we, ship_params)
        except UnusableLinkError as e:
            return BaselineResult(name, BASELINES[name], [cluster.names[d] for d in a], None, reason=str(e))
        busy = np.array([d.compute_time for d in bd.devices])
        broken = cons.violations(cluster, memory_use(graph, cluster, a), busy, bd.energy, a)
        return BaselineResult(name, BASELINES[name], bd.assignment, bd, violations=broken)

    singles = [run("single", np.full(n, d, dtype=np.intp)) for d in free]
    # Prefer a single device that can run and meets the constraints, then the cheapest.
    single = min(singles, key=lambda r: (r.breakdown is None, bool(r.violations), r.cost))

    stages = free[:n]
    uniform = run("uniform", _contiguous(n, stages, np.ones(len(stages)), np.ones(n)))
    balanced = run("balanced", _contiguous(n, stages, cluster.flops[stages], graph.flops))

    node = np.where(cons.allowed, tables.node(wt, we), np.inf)
    greedy_a = np.empty(n, dtype=np.intp)
    prev = cluster.source_index
    for i in range(n):
        best = node[i].min()
        ties = np.flatnonzero(node[i] == best)
        prev = prev if prev in ties else int(ties[0])
        greedy_a[i] = prev
    greedy = run("greedy", greedy_a)
    return [single, uniform, balanced, greedy]
