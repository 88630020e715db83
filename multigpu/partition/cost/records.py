"""What ``evaluate`` returns: the cost of one assignment, per layer, per device, per link
and per host, with the totals in a ``Breakdown``."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from multigpu.partition.exceptions import PartitionInputError
from multigpu.partition.inputs.cluster import Cluster
from multigpu.partition.inputs.graph import Graph
from multigpu.partition.stages import Stage, split_stages

if TYPE_CHECKING:  # the matrix form and the schedule are built on first access
    from multigpu.partition.cost.matrix import MatrixForm
    from multigpu.partition.cost.schedule import Schedule

__all__ = ["SINK", "Breakdown", "DeviceCost", "HostCost", "LayerCost", "LinkCost", "TransferCost"]

SINK = "(sink)"  # what a transfer of the last layer's output is for


@dataclass(frozen=True)
class LayerCost:
    """Cost of one layer block: receiving its inputs, (shipping its parameters) and computing.

    ``transfer_time`` counts the transfers this layer is the first on its device to
    consume (an activation sent to a device once serves every layer there);
    ``transfer_from`` is the device of the first of them (None when every input was
    local), ``transfers_from`` all of them."""

    name: str
    device: str
    compute_time: float
    compute_energy: float
    transfer_from: str | None  # device the input came from; None when it was local
    transfer_time: float
    transfer_energy: float
    param_time: float
    param_energy: float
    time: float
    energy: float
    cost: float
    stage_overhead: float = 0.0  # > 0 on the first layer of a stage whose device has one
    transfers_from: tuple[str, ...] = ()  # every device it receives a transfer from (first: transfer_from)


@dataclass(frozen=True)
class DeviceCost:
    """Totals of one device. ``transfer_time`` counts every transfer it sends or
    receives; ``memory`` is its parameters plus the largest activation it holds;
    ``stage_overhead`` is its stages' overhead (its energy is in ``compute_energy``)."""

    name: str
    layers: int
    compute_time: float
    compute_energy: float
    transfer_time: float
    param_bytes: float
    activation_bytes: float
    memory: float
    memory_limit: float | None
    stage_overhead: float = 0.0  # the stage overheads of its stages (not in compute_time)
    transfer_cpu: float = 0.0  # CPU of the transfers it sends, receives or relays, per item
    load: float = 0.0  # per item when pipelined: compute + stage overhead + transfer_cpu_serial
    transfer_cpu_serial: float = 0.0  # the part of transfer_cpu on its computing thread


@dataclass(frozen=True)
class HostCost:
    """One host: its ``devices``, their summed ``load`` per item (compute, stage
    overheads and all their transfer CPU) and its ``cores``; ``share`` = load / cores
    is what the throughput bottleneck counts."""

    name: str
    cores: float
    devices: list[str]
    load: float

    @property
    def share(self) -> float:
        """Seconds per item the host's cores need: load / cores."""
        return self.load / self.cores


@dataclass(frozen=True)
class TransferCost:
    """One activation transfer: the output of ``producer`` (``"input"``: the graph's input)
    sent ``between`` (from, to) devices once, for ``to`` (the first layer there that
    consumes it; ``"(sink)"`` for the last layer's output to the sink)."""

    producer: str
    to: str
    between: tuple[str, str]
    bytes: float
    time: float
    energy: float


@dataclass(frozen=True)
class LinkCost:
    """Traffic on one (symmetric) link. ``load`` is the per-inference transfer time of
    activations (what the throughput bottleneck counts, unless ``cpu_work``: both ends
    on one host with ``transfer_cpu``, where moving the data is CPU work already in
    their loads); ``param_time`` is the one-off parameter shipping."""

    between: tuple[str, str]
    bytes: float
    load: float
    param_time: float
    energy: float
    cpu_work: bool = False


@dataclass(frozen=True, eq=False)
class Breakdown:
    """Everything ``evaluate`` computes for one assignment.

    ``time``, ``energy`` and ``cost`` are the totals of the definition;
    ``layers``/``devices``/``links`` break them down; ``output_time`` and
    ``output_energy`` are the final transfer to the sink; ``bottleneck`` is the
    throughput objective (the largest of a device's load, a link's activation
    transfer time and a host's load over its cores), set by ``bottleneck_at`` (e.g.
    "device 'a'", "link a <-> b", "host 'box' (2 cores)"). ``hosts`` lists each
    host's load. ``transfers`` lists every activation transfer (one per producer and
    distinct device its consumers are on). ``makespan`` is the latency objective with
    concurrency (``cost.schedule``): when the output reaches the sink, branches on
    different devices running at once; ``schedule`` gives each layer's start and finish.
    ``stages`` groups the layers into stages (``multigpu.partition.stages``). ``matrix``
    is the document's matrix form, built on first access (it holds (edges)*k*k numbers).
    """

    assignment: list[str]
    time: float
    energy: float
    cost: float
    wt: float
    we: float
    ship_params: bool
    compute_time: float
    transfer_time: float
    param_time: float
    stage_time: float
    output_time: float
    output_energy: float
    bottleneck: float
    layers: list[LayerCost]
    devices: list[DeviceCost]
    links: list[LinkCost]
    hosts: list[HostCost]
    bottleneck_at: str
    transfers: list[TransferCost]
    makespan: float
    _graph: Graph = field(repr=False)
    _cluster: Cluster = field(repr=False)
    _columns: np.ndarray = field(repr=False)

    @cached_property
    def matrix(self) -> MatrixForm:
        """The document's matrix form (one-hot A and transition matrices L)."""
        from multigpu.partition.cost.matrix import matrix_form  # the (n+1) k^2 numbers only when asked for

        return matrix_form(self._graph, self._cluster, self._columns, self.ship_params)

    @cached_property
    def schedule(self) -> Schedule:
        """Each layer's start and finish and each transfer's start and arrival (seconds
        from the input's start), as the makespan objective models them."""
        from multigpu.partition.cost.schedule import simulate

        return simulate(self._graph, self._cluster, self._columns)

    @cached_property
    def stages(self) -> list[Stage]:
        """The plan's stages, a DAG (``multigpu.partition.stages``)."""
        return split_stages(self.assignment, [x.name for x in self.layers], self._graph.producers)

    def device(self, name: str) -> DeviceCost:
        """The per-device record of ``name``."""
        for d in self.devices:
            if d.name == name:
                return d
        raise PartitionInputError(f"unknown device {name!r}; devices are: {', '.join(d.name for d in self.devices)}")
