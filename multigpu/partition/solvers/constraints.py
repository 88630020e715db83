"""Constraints on a placement: memory, busy time, energy budget, pins and exclusions.

Pins and exclusions only remove choices, so the DP handles them. Memory, busy time
and the energy budget couple layers together; they need the MILP, unless the
unconstrained optimum already satisfies them (then it is optimal for the
constrained problem too, since the feasible set is a subset).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from multigpu.partition.cost.arithmetic import assignment_arrays, busy_times, memory_use
from multigpu.partition.exceptions import ClusterError, InfeasibleError, PartitionInputError
from multigpu.partition.inputs.cluster import Cluster
from multigpu.partition.inputs.graph import Graph
from multigpu.partition.inputs.validate import check_number

if TYPE_CHECKING:
    from multigpu.partition.cost.tables import CostTables

__all__ = ["Constraints", "ResolvedConstraints", "FEASIBILITY_RTOL", "violations"]

# The MILP solver honours constraints to ~1e-7 relative; verification allows 1e-6
# so that a plan the solver calls feasible is never rejected by rounding.
FEASIBILITY_RTOL = 1e-6


@dataclass(frozen=True)
class Constraints:
    """What a plan must respect.

    * ``memory``: respect each device's declared ``memory`` (parameters of its
      layers plus the largest activation among them). Devices without ``memory`` are
      unlimited. On by default; set False to ignore declared memory.
    * ``busy_time``: the most compute seconds per device: one number for every
      device, or ``{device: seconds}``.
    * ``energy_budget``: the most joules for the whole inference (E).
    * ``pinned``: ``{layer name or index: device}``; the layer must run there.
    * ``excluded``: devices that must run no layer (they may still be source/sink).
    """

    memory: bool = True
    busy_time: None | float | Mapping[str, float] = None
    energy_budget: float | None = None
    pinned: Mapping[str | int, str] = field(default_factory=dict)
    excluded: Collection[str] = ()

    @classmethod
    def coerce(cls, value: None | Constraints | Mapping[str, Any]) -> Constraints:
        """Accept None, a Constraints, or a dict of its fields."""
        if value is None:
            return cls()
        if isinstance(value, Constraints):
            return value
        if isinstance(value, Mapping):
            allowed = ("memory", "busy_time", "energy_budget", "pinned", "excluded")
            unknown = [k for k in value if k not in allowed]
            if unknown:
                raise PartitionInputError(f"unknown constraint {unknown[0]!r}; allowed: {', '.join(allowed)}")
            return cls(**value)
        raise PartitionInputError(f"constraints must be a Constraints or a dict, got {type(value).__name__}")

    def resolve(self, graph: Graph, cluster: Cluster) -> ResolvedConstraints:
        """Check names and numbers against ``graph``/``cluster`` and return arrays.

        Raises PartitionInputError for unknown names or bad numbers and
        InfeasibleError for contradictory pins/exclusions.
        """
        n, k = graph.n, cluster.k
        if not isinstance(self.memory, (bool, np.bool_)):
            raise PartitionInputError(f"memory={self.memory!r} must be True (respect declared memory) or False")
        memory = cluster.memory.copy() if self.memory else np.full(k, np.inf)

        busy = np.full(k, np.inf)
        if self.busy_time is not None:
            if isinstance(self.busy_time, Mapping):
                for dev, limit in self.busy_time.items():
                    d = _device(cluster, dev, "busy_time")
                    busy[d] = _number(limit, f"busy_time[{dev!r}]", "seconds of compute")
            else:
                busy[:] = _number(self.busy_time, "busy_time", "seconds of compute per device")

        budget = math.inf
        if self.energy_budget is not None:
            budget = _number(self.energy_budget, "energy_budget", "joules")

        allowed = np.ones((n, k), dtype=bool)
        if isinstance(self.excluded, (str, bytes)):
            raise PartitionInputError(
                f"excluded={self.excluded!r} must be a list of device names, e.g. [{self.excluded!r}]"
            )
        excluded = sorted({_device(cluster, dev, "excluded") for dev in self.excluded})
        allowed[:, excluded] = False
        if len(excluded) == k:
            raise InfeasibleError(
                f"every device is excluded ({', '.join(cluster.names)}); leave at least one device free to run layers"
            )
        if not isinstance(self.pinned, Mapping):
            raise PartitionInputError(f"pinned must map layer -> device, got {type(self.pinned).__name__}")
        pins: dict[int, int] = {}
        for layer, dev in self.pinned.items():
            try:
                i = graph.index(layer)
            except ClusterError as e:
                raise PartitionInputError(f"pinned: {e}") from None
            d = _device(cluster, dev, f"pinned[{layer!r}]")
            if i in pins and pins[i] != d:
                raise InfeasibleError(
                    f"layer {graph.layers[i].name!r} is pinned to both "
                    f"{cluster.names[pins[i]]!r} and {dev!r}; keep one pin"
                )
            if d in excluded:
                raise InfeasibleError(
                    f"layer {graph.layers[i].name!r} is pinned to {dev!r}, which is "
                    f"excluded; unpin the layer or stop excluding {dev!r}"
                )
            pins[i] = d
            allowed[i, :] = False
            allowed[i, d] = True
        return ResolvedConstraints(
            memory=memory, busy=busy, energy_budget=budget, allowed=allowed, pins=pins, excluded=tuple(excluded)
        )


def _device(cluster: Cluster, dev: Any, what: str) -> int:
    if isinstance(dev, str) and dev in cluster._index:
        return cluster._index[dev]
    raise PartitionInputError(f"{what}: {dev!r} is not a device; devices are: {', '.join(cluster.names)}")


def _number(value: Any, what: str, unit: str) -> float:
    return check_number(value, what, strict=True, unit=unit, error=PartitionInputError)


@dataclass(frozen=True)
class ResolvedConstraints:
    """Constraints as arrays in cluster order (+inf where a limit is absent)."""

    memory: np.ndarray  # (k,) bytes
    busy: np.ndarray  # (k,) seconds
    energy_budget: float
    allowed: np.ndarray  # (n, k) bool: pins and exclusions
    pins: dict[int, int]
    excluded: tuple[int, ...]

    @property
    def has_memory(self) -> bool:
        """True when some device has a finite memory limit."""
        return bool(np.isfinite(self.memory).any())

    @property
    def has_busy(self) -> bool:
        """True when some device has a busy-time limit."""
        return bool(np.isfinite(self.busy).any())

    @property
    def has_energy(self) -> bool:
        """True when an energy budget is set."""
        return math.isfinite(self.energy_budget)

    @property
    def coupling(self) -> bool:
        """True when a constraint couples layers (needs the MILP in general)."""
        return self.has_memory or self.has_busy or self.has_energy

    def violations(
        self, cluster: Cluster, memory_used: np.ndarray, busy_used: np.ndarray, energy: float, a: np.ndarray
    ) -> list[str]:
        """Human-readable list of the constraints an assignment breaks (empty if none)."""
        out = []
        tol = 1 + FEASIBILITY_RTOL
        for d in range(cluster.k):
            if memory_used[d] > self.memory[d] * tol:
                out.append(f"memory of {cluster.names[d]!r}: {memory_used[d]:.6g} B > {self.memory[d]:.6g} B")
            if busy_used[d] > self.busy[d] * tol:
                out.append(f"busy time of {cluster.names[d]!r}: {busy_used[d]:.6g} s > {self.busy[d]:.6g} s")
        if energy > self.energy_budget * tol:
            out.append(f"energy budget: {energy:.6g} J > {self.energy_budget:.6g} J")
        for i, d in self.pins.items():
            if a[i] != d:
                out.append(f"pin of layer {i} to {cluster.names[d]!r}")
        for d in self.excluded:
            if np.any(a == d):
                out.append(f"excluded device {cluster.names[d]!r} runs layers")
        return out


def violations(tables: CostTables, cons: ResolvedConstraints, a: np.ndarray) -> list[str]:
    """What plan ``a`` breaks of the coupling constraints, pins and exclusions (empty: nothing)."""
    graph, cluster = tables.graph, tables.cluster
    # O(n) arrays, not evaluate()'s per-layer records: this runs on every DP answer.
    energy = assignment_arrays(graph, cluster, a, tables.ship_params, warm=False).energy if cons.has_energy else 0.0
    return cons.violations(
        cluster, memory_use(graph, cluster, a), busy_times(graph, cluster, tables.comp, a), energy, a
    )
