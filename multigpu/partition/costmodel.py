"""The cost model: time, energy and weighted cost of one assignment of layers to devices.

Definition (a_0 = source, a_{n+1} = sink, a_1..a_n the layers' devices):

* compute time of layer i:  flops_i / flops(a_i), or the time measured for layer i on
  a_i when that device's ``layer_times`` hold this graph (``multigpu profile``);
* a transfer of b bytes from u to v costs 0 if u == v, else b / bandwidth(u,v) + latency(u,v);
  layer 1 receives ``input_bytes`` from a_0, layer i receives ``output_bytes`` of layer
  i-1, and the sink receives ``output_bytes`` of layer n;
* with ``ship_params``, each layer with parameters first receives its ``param_bytes``
  from the source (a layer without parameters ships nothing);
* a stage (a maximal run of consecutive layers on one device) costs its device's
  ``stage_overhead`` once, charged to its first layer (0 unless measured);
* T = sum of compute times + sum of stage overheads + sum of transfer times
* E = sum of power(a_i) * (compute time_i + stage overhead_i) + sum of transfer time * link power
* cost = wt * T + we * E

The throughput objective (pipelined inference) is the *bottleneck*, the largest of:

* each device's load per item: its compute, its stage overheads, and the CPU of the
  transfers it takes part in (``transfer_cpu`` of each end: ``fixed + per_byte * b``
  for every transfer it sends or receives; the ``relay``'s figure for every transfer
  between two other devices when it is the relay), of that CPU only the ``serial``
  part (on its computing thread; all of it without ``serial``);
* each link's activation transfer time per item (not on a pair of devices of one host
  that both have ``transfer_cpu``: moving data between them is that CPU work);
* each host's load: its devices' compute, stage overheads and all their transfer CPU,
  divided by its ``cores``.

Transfer CPU enters nothing but the bottleneck (a transfer's time already holds it).
A pair with no link and no default link cannot be used; ``evaluate`` raises
UnusableLinkError for an assignment that needs one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Optional, Sequence, Union

import numpy as np

from multigpu.checks import check_number
from multigpu.partition.cluster import Cluster
from multigpu.partition.exceptions import ClusterError, PartitionInputError, UnusableLinkError
from multigpu.partition.graph import Graph

__all__ = ["Breakdown", "CostTables", "DeviceCost", "HostCost", "LayerCost", "LinkCost", "MatrixForm",
           "check_weights", "compute_times", "evaluate", "measured_devices", "resolve_assignment",
           "transfer_cpu_loads"]

AssignmentLike = Sequence[Union[str, int]]


def check_weights(wt: Any, we: Any) -> tuple[float, float]:
    """Return (wt, we) as floats; PartitionInputError unless both are finite, >= 0 and not both 0."""
    out = [check_number(v, label, minimum=0.0, example=f"1 (the weight of {kind} in the cost)",
                        error=PartitionInputError)
           for label, v, kind in (("wt", wt, "time"), ("we", we, "energy"))]
    if out[0] == 0 and out[1] == 0:
        raise PartitionInputError("wt=0 and we=0 make every assignment cost 0; give wt > 0 "
                                  "(weight of time, seconds) or we > 0 (weight of energy, joules)")
    return out[0], out[1]


def resolve_assignment(graph: Graph, cluster: Cluster, assignment: AssignmentLike) -> np.ndarray:
    """Device column of each layer as an int array; PartitionInputError on a bad entry."""
    if isinstance(assignment, (str, bytes)) or not isinstance(assignment, (Sequence, np.ndarray)):
        raise PartitionInputError(f"assignment must be a list with one device name per layer, got "
                                  f"{type(assignment).__name__}")
    if len(assignment) != graph.n:
        raise PartitionInputError(f"assignment has {len(assignment)} entries but the graph has "
                                  f"{graph.n} layers; give one device per layer")
    out = np.empty(graph.n, dtype=np.intp)
    for i, dev in enumerate(assignment):
        if isinstance(dev, (int, np.integer)) and not isinstance(dev, bool):
            if not 0 <= int(dev) < cluster.k:
                raise PartitionInputError(f"assignment[{i}] (layer {graph.layers[i].name!r}) = {dev} "
                                          f"is not a device index 0..{cluster.k - 1}")
            out[i] = int(dev)
        elif isinstance(dev, str) and dev in cluster._index:
            out[i] = cluster._index[dev]
        else:
            raise PartitionInputError(f"assignment[{i}] (layer {graph.layers[i].name!r}) = {dev!r} "
                                      f"is not a device; devices are: {', '.join(cluster.names)}")
    return out


def measured_devices(graph: Graph, cluster: Cluster) -> list[str]:
    """Names of the devices whose ``layer_times`` hold ``graph`` (checked: every layer
    of the graph and no other); ClusterError naming the layer otherwise."""
    out = []
    names = set(graph.names)
    for d in cluster.devices:
        times = d.measured(graph.name)
        if times is None:
            continue
        extra = [layer for layer in times if layer not in names]
        if extra:
            raise ClusterError(
                f"device {d.name!r}: layer_times[{graph.name!r}] has a time for layer {extra[0]!r}, which "
                f"graph {graph.name!r} lacks (its layers: {', '.join(graph.names[:12])}"
                f"{', ...' if graph.n > 12 else ''}); re-profile the device for this graph or remove the entry")
        missing = [layer for layer in graph.names if layer not in times]
        if missing:
            raise ClusterError(
                f"device {d.name!r}: layer_times[{graph.name!r}] has no time for layer {missing[0]!r}; a "
                f"profile covers every layer of its graph (mixing measured times with nominal FLOP/s would "
                f"compare unlike figures); re-profile the device for this graph or remove the entry")
        out.append(d.name)
    return out


def compute_times(graph: Graph, cluster: Cluster) -> np.ndarray:
    """n x k seconds of each layer on each device: ``flops / FLOP/s``, replaced by the
    measured time wherever a device's ``layer_times`` hold this graph."""
    table = graph.flops[:, None] / cluster.flops[None, :]
    for name in measured_devices(graph, cluster):
        d = cluster.index(name)
        times = cluster.devices[d].measured(graph.name)
        table[:, d] = [times[layer] for layer in graph.names]  # type: ignore[index]
    return table


# -- breakdown records -----------------------------------------------------------
@dataclass(frozen=True)
class LayerCost:
    """Cost of one layer block: receiving its input, (shipping its parameters) and computing."""

    name: str
    device: str
    compute_time: float
    compute_energy: float
    transfer_from: Optional[str]   # device the input came from; None when it was local
    transfer_time: float
    transfer_energy: float
    param_time: float
    param_energy: float
    time: float
    energy: float
    cost: float
    stage_overhead: float = 0.0   # > 0 on the first layer of a stage whose device has one


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
    memory_limit: Optional[float]
    stage_overhead: float = 0.0   # the stage overheads of its stages (not in compute_time)
    transfer_cpu: float = 0.0     # CPU of the transfers it sends, receives or relays, per item
    load: float = 0.0             # per item when pipelined: compute + stage overhead + transfer_cpu_serial
    transfer_cpu_serial: float = 0.0   # the part of transfer_cpu on its computing thread


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


@dataclass(frozen=True)
class MatrixForm:
    """The document's matrix form of an assignment.

    ``A`` is the one-hot n x k assignment matrix. ``L`` holds n+1 k x k transition
    matrices: ``L[0]`` from the source to layer 1, ``L[i]`` from layer i to layer i+1
    (1 <= i < n, the document's L_i), and ``L[n]`` from layer n to the sink.
    ``compute_time`` (n x k), ``param_time`` (n x k) and ``transfer_time``
    ((n+1) x k x k, +inf on unusable pairs) are the per-choice costs; ``stage_time``
    ((n+1) x k x k) is the stage overhead a transition starts (on L[0] always, on
    L[i] when the device changes, never on L[n]), so that
    T = <A, compute_time + param_time> + sum_i <L[i], transfer_time[i] + stage_time[i]>.
    """

    A: np.ndarray
    L: np.ndarray
    compute_time: np.ndarray
    param_time: np.ndarray
    param_power: np.ndarray
    transfer_time: np.ndarray
    device_power: np.ndarray
    link_power: np.ndarray
    stage_time: np.ndarray

    def time(self) -> float:
        """Total time T from the matrix form."""
        return float(np.sum(self._chosen(self.compute_time + self.param_time))
                     + np.sum(self._masked(self.transfer_time)) + np.sum(self._masked(self.stage_time)))

    def energy(self) -> float:
        """Total energy E from the matrix form."""
        compute = np.sum(self._chosen(self.compute_time) * self.device_power[None, :])
        params = np.sum(self._chosen(self.param_time) * self.param_power[None, :])
        moves = np.sum(self._masked(self.transfer_time) * self.link_power[None, :, :])
        stages = np.sum(self._masked(self.stage_time) * self.device_power[None, None, :])
        return float(compute + params + moves + stages)

    def cost(self, wt: float = 1.0, we: float = 0.0) -> float:
        """wt * T + we * E from the matrix form."""
        return wt * self.time() + we * self.energy()

    def _chosen(self, per_choice: np.ndarray) -> np.ndarray:
        # Unchosen entries may be inf (unreachable); 0 * inf would be NaN.
        return np.where(self.A > 0, per_choice, 0.0) * self.A

    def _masked(self, per_pair: np.ndarray) -> np.ndarray:
        # L is 0 on unused pairs, whose cost may be inf; 0 * inf would be NaN.
        return np.where(self.L > 0, per_pair, 0.0) * self.L


@dataclass(frozen=True, eq=False)
class Breakdown:
    """Everything ``evaluate`` computes for one assignment.

    ``time``, ``energy`` and ``cost`` are the totals of the definition;
    ``layers``/``devices``/``links`` break them down; ``output_time`` and
    ``output_energy`` are the final transfer to the sink; ``bottleneck`` is the
    throughput objective (the largest of a device's load, a link's activation
    transfer time and a host's load over its cores), set by ``bottleneck_at`` (e.g.
    "device 'a'", "link a <-> b", "host 'box' (2 cores)"). ``hosts`` lists each
    host's load. ``matrix`` is the document's matrix form, built on first access (it
    holds (n+1)*k*k numbers).
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
    _graph: Graph = field(repr=False)
    _cluster: Cluster = field(repr=False)
    _columns: np.ndarray = field(repr=False)

    @cached_property
    def matrix(self) -> MatrixForm:
        """The document's matrix form (one-hot A and transition matrices L)."""
        return matrix_form(self._graph, self._cluster, self._columns, self.ship_params)

    def device(self, name: str) -> DeviceCost:
        """The per-device record of ``name``."""
        for d in self.devices:
            if d.name == name:
                return d
        raise PartitionInputError(f"unknown device {name!r}; devices are: "
                                  f"{', '.join(d.name for d in self.devices)}")


# -- the arithmetic ------------------------------------------------------------
@dataclass(frozen=True)
class AssignmentArrays:
    """Per-layer arrays of one assignment (no Python objects: cheap for n = 10,000)."""

    a: np.ndarray            # device column per layer
    prev: np.ndarray         # device the input comes from (a_{i-1}, a_0 = source)
    comp: np.ndarray         # compute time
    comp_energy: np.ndarray
    t_in: np.ndarray         # input transfer time (0 when local)
    e_in: np.ndarray
    t_param: np.ndarray      # parameter shipping time (0 unless ship_params)
    e_param: np.ndarray
    t_out: float             # layer n -> sink
    e_out: float
    t_stage: np.ndarray      # stage overhead, on the first layer of each stage
    e_stage: np.ndarray


def assignment_arrays(graph: Graph, cluster: Cluster, a: np.ndarray, ship_params: bool) -> AssignmentArrays:
    tab = cluster.tables
    src, sink = cluster.source_index, cluster.sink_index
    prev = np.concatenate([[src], a[:-1]]).astype(np.intp)
    bad = ~tab.usable[prev, a]
    if bad.any():
        i = int(np.argmax(bad))
        u, v = cluster.names[prev[i]], cluster.names[a[i]]
        origin = "the source" if i == 0 else f"layer {graph.layers[i - 1].name!r}"
        raise UnusableLinkError(
            f"layer {graph.layers[i].name!r} on {v!r} receives its input from {origin} on {u!r}, "
            f"but no link joins {u!r} and {v!r} and the cluster has no default_link; add a link "
            f"between them or a default_link, or assign the layers differently")
    last = int(a[-1])
    if not tab.usable[last, sink]:
        raise UnusableLinkError(
            f"the output of the last layer {graph.layers[-1].name!r} on {cluster.names[last]!r} must "
            f"reach the sink {cluster.sink!r}, but no link joins them and the cluster has no "
            f"default_link; add a link or a default_link, or assign the last layer differently")
    if any(d.measured(graph.name) is not None for d in cluster.devices):
        comp = compute_times(graph, cluster)[np.arange(graph.n), a]
    else:  # the common case, O(n) instead of O(n k): this runs inside the solvers' loops
        comp = graph.flops / cluster.flops[a]
    comp_energy = comp * cluster.power[a]
    local = prev == a
    t_in = np.where(local, 0.0, graph.input_bytes_per_layer * tab.inv_bandwidth[prev, a]
                    + tab.latency[prev, a])
    e_in = t_in * tab.power[prev, a]
    if ship_params:
        ships = (a != src) & (graph.param_bytes > 0)
        bad = ships & ~tab.usable[src, a]
        if bad.any():
            i = int(np.argmax(bad))
            raise UnusableLinkError(
                f"with ship_params, layer {graph.layers[i].name!r} on {cluster.names[a[i]]!r} receives "
                f"its parameters from the source {cluster.source!r}, but no link joins them and the "
                f"cluster has no default_link; add a link or a default_link, or place it elsewhere")
        t_param = np.where(ships, graph.param_bytes * tab.inv_bandwidth[src, a] + tab.latency[src, a], 0.0)
        e_param = t_param * tab.power[src, a]
    else:
        t_param = np.zeros(graph.n)
        e_param = t_param
    if last == sink:
        t_out = e_out = 0.0
    else:
        t_out = float(graph.output_bytes[-1] * tab.inv_bandwidth[last, sink] + tab.latency[last, sink])
        e_out = t_out * float(tab.power[last, sink])
    t_stage = stage_overheads(cluster, a)
    e_stage = t_stage * cluster.power[a]
    return AssignmentArrays(a, prev, comp, comp_energy, t_in, e_in, t_param, e_param, t_out, e_out,
                            t_stage, e_stage)


def stage_overheads(cluster: Cluster, a: np.ndarray) -> np.ndarray:
    """Per layer: its device's ``stage_overhead`` if a stage starts there (layer 1, or a
    change of device), else 0."""
    oh = cluster.stage_overhead
    if not oh.any():
        return np.zeros(len(a))
    starts = np.concatenate([[True], a[1:] != a[:-1]])
    return np.where(starts, oh[a], 0.0)


def _totals(x: AssignmentArrays, wt: float, we: float) -> tuple[float, float, float]:
    # fsum: the totals are compared against independent re-computations, so avoid
    # summation-order noise.
    time = math.fsum(x.comp) + math.fsum(x.t_stage) + math.fsum(x.t_in) + math.fsum(x.t_param) + x.t_out
    energy = (math.fsum(x.comp_energy) + math.fsum(x.e_stage) + math.fsum(x.e_in) + math.fsum(x.e_param)
              + x.e_out)
    return time, energy, wt * time + we * energy


def _link_loads(cluster: Cluster, x: AssignmentArrays) -> np.ndarray:
    """k x k symmetric matrix of activation transfer time per unordered pair, as the
    bottleneck counts it: 0 on a pair whose transfers are CPU work of one host
    (``Cluster.cpu_links``)."""
    k = cluster.k
    load = np.zeros((k, k))
    np.add.at(load, (x.prev, x.a), x.t_in)
    load[int(x.a[-1]), cluster.sink_index] += x.t_out
    load = load + load.T
    np.fill_diagonal(load, 0.0)
    load[cluster.cpu_links] = 0.0
    return load


def _transfers(graph: Graph, cluster: Cluster, x: AssignmentArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sender, receiver, bytes) of every activation transfer of one item (u != v)."""
    moved = x.prev != x.a
    u, v, b = x.prev[moved], x.a[moved], graph.input_bytes_per_layer[moved]
    last, sink = int(x.a[-1]), cluster.sink_index
    if last != sink:
        u = np.append(u, last)
        v = np.append(v, sink)
        b = np.append(b, graph.output_bytes[-1])
    return u, v, b


def transfer_cpu_terms(cluster: Cluster, u: np.ndarray, v: np.ndarray, b: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The CPU of transfers u[j] -> v[j] of b[j] bytes (u != v), as (j, device, seconds,
    serial seconds) quadruples: ``transfer_cpu`` of the sender and of the receiver, and
    the relay's figure where the relay is neither; the serial seconds are the part on
    the device's computing thread. Empty when no transfer costs CPU."""
    u, v, b = np.asarray(u, dtype=np.intp), np.asarray(v, dtype=np.intp), np.asarray(b, dtype=float)
    if not cluster.has_transfer_cpu or len(u) == 0:
        empty = np.zeros(0, dtype=np.intp)
        return empty, empty, np.zeros(0), np.zeros(0)
    f, c = cluster.cpu_fixed, cluster.cpu_per_byte
    sf, sc = cluster.cpu_serial_fixed, cluster.cpu_serial_per_byte
    j = np.arange(len(u))
    parts = [(j, u, f[u] + c[u] * b, sf[u] + sc[u] * b), (j, v, f[v] + c[v] * b, sf[v] + sc[v] * b)]
    r = cluster.relay_index
    if r >= 0:
        via = (u != r) & (v != r)
        relay = cluster.relay
        bv = b[via]
        parts.append((j[via], np.full(int(via.sum()), r), relay.cost(bv), relay.serial_cost(bv)))  # type: ignore[union-attr]
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(4))  # type: ignore[return-value]


def transfer_cpu_loads(cluster: Cluster, u: np.ndarray, v: np.ndarray, b: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(k,) CPU seconds each device spends per item on transfers (u[j] -> v[j], b[j]
    bytes), and (k,) the part on its computing thread; see ``transfer_cpu_terms``."""
    _, dev, val, serial = transfer_cpu_terms(cluster, u, v, b)
    return (np.bincount(dev, weights=val, minlength=cluster.k).astype(float),
            np.bincount(dev, weights=serial, minlength=cluster.k).astype(float))


def _loads(graph: Graph, cluster: Cluster, x: AssignmentArrays
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per item when pipelined: (device loads (k,): compute, stage overheads and the
    serial part of their transfer CPU; transfer CPU (k,); its serial part (k,); host
    loads (h,): their devices' compute, stage overheads and all their transfer CPU)."""
    cpu, serial = transfer_cpu_loads(cluster, *_transfers(graph, cluster, x))
    work = np.bincount(x.a, weights=x.comp + x.t_stage, minlength=cluster.k)
    hosts = np.zeros(len(cluster.hosts))
    on = cluster.host_index >= 0
    np.add.at(hosts, cluster.host_index[on], (work + cpu)[on])
    return work + serial, cpu, serial, hosts


def _bottleneck(cluster: Cluster, load: np.ndarray, links: np.ndarray, hosts: np.ndarray) -> tuple[float, str]:
    """The bottleneck and what sets it (the first of device, link, host on a tie)."""
    names = cluster.names
    d = int(np.argmax(load))
    best, at = float(load[d]), f"device {names[d]!r}"
    if links.size and links.max() > best:
        u, v = np.unravel_index(int(np.argmax(links)), links.shape)
        best, at = float(links[u, v]), f"link {names[min(u, v)]} <-> {names[max(u, v)]}"
    if hosts.size:
        share = hosts / cluster.host_cores
        h = int(np.argmax(share))
        if share[h] > best:
            best, at = float(share[h]), f"host {cluster.hosts[h].name!r} ({cluster.hosts[h].cores:g} cores)"
    return best, at


def bottleneck_of(graph: Graph, cluster: Cluster, a: np.ndarray) -> float:
    """The throughput objective of assignment ``a`` (device columns)."""
    x = assignment_arrays(graph, cluster, np.asarray(a, dtype=np.intp), ship_params=False)
    load, _, _, hosts = _loads(graph, cluster, x)
    return _bottleneck(cluster, load, _link_loads(cluster, x), hosts)[0]


def memory_use(graph: Graph, cluster: Cluster, a: np.ndarray) -> np.ndarray:
    """Bytes per device: its layers' parameters plus the largest activation among them."""
    params = np.bincount(a, weights=graph.param_bytes, minlength=cluster.k)
    act = np.zeros(cluster.k)
    np.maximum.at(act, a, graph.activation_bytes)
    return params + act


def evaluate(graph: Graph, cluster: Cluster, assignment: AssignmentLike, wt: float = 1.0,
             we: float = 0.0, ship_params: bool = False) -> Breakdown:
    """Time, energy and cost of ``assignment`` (one device name or index per layer),
    broken down per layer, per device and per link, with the matrix form.

    Raises PartitionInputError for bad weights or a malformed assignment, and
    UnusableLinkError when the assignment moves data over a pair with no link.
    """
    wt, we = check_weights(wt, we)
    a = resolve_assignment(graph, cluster, assignment)
    x = assignment_arrays(graph, cluster, a, bool(ship_params))
    time, energy, cost = _totals(x, wt, we)
    names = cluster.names
    k = cluster.k

    layer_time = x.comp + x.t_stage + x.t_in + x.t_param
    layer_energy = x.comp_energy + x.e_stage + x.e_in + x.e_param
    layers = [LayerCost(
        name=spec.name, device=names[a[i]],
        compute_time=float(x.comp[i]), compute_energy=float(x.comp_energy[i]),
        transfer_from=None if x.prev[i] == a[i] else names[x.prev[i]],
        transfer_time=float(x.t_in[i]), transfer_energy=float(x.e_in[i]),
        param_time=float(x.t_param[i]), param_energy=float(x.e_param[i]),
        time=float(layer_time[i]), energy=float(layer_energy[i]),
        cost=float(wt * layer_time[i] + we * layer_energy[i]), stage_overhead=float(x.t_stage[i]),
    ) for i, spec in enumerate(graph.layers)]

    src, sink = cluster.source_index, cluster.sink_index
    busy = np.bincount(a, weights=x.comp, minlength=k)
    busy_e = np.bincount(a, weights=x.comp_energy + x.e_stage, minlength=k)
    overhead = np.bincount(a, weights=x.t_stage, minlength=k)
    moving = np.bincount(a, weights=x.t_in + x.t_param, minlength=k)       # received
    moving += np.bincount(x.prev, weights=x.t_in, minlength=k)             # sent
    moving[src] += x.t_param.sum()
    moving[int(a[-1])] += x.t_out
    moving[sink] += x.t_out
    params = np.bincount(a, weights=graph.param_bytes, minlength=k)
    act = np.zeros(k)
    np.maximum.at(act, a, graph.activation_bytes)
    counts = np.bincount(a, minlength=k)
    load, cpu, serial, host_load = _loads(graph, cluster, x)
    devices = [DeviceCost(
        name=names[d], layers=int(counts[d]), compute_time=float(busy[d]),
        compute_energy=float(busy_e[d]), transfer_time=float(moving[d]),
        param_bytes=float(params[d]), activation_bytes=float(act[d]),
        memory=float(params[d] + act[d]), memory_limit=cluster.devices[d].memory,
        stage_overhead=float(overhead[d]), transfer_cpu=float(cpu[d]), load=float(load[d]),
        transfer_cpu_serial=float(serial[d]),
    ) for d in range(k)]
    hosts = [HostCost(name=h.name, cores=h.cores, devices=[names[d] for d in np.flatnonzero(cluster.host_index == j)],
                      load=float(host_load[j])) for j, h in enumerate(cluster.hosts)]

    links = _link_records(graph, cluster, x)
    bottleneck, bottleneck_at = _bottleneck(cluster, load, _link_loads(cluster, x), host_load)
    return Breakdown(
        assignment=[names[d] for d in a], time=time, energy=energy, cost=cost, wt=wt, we=we,
        ship_params=bool(ship_params), compute_time=math.fsum(x.comp), stage_time=math.fsum(x.t_stage),
        transfer_time=math.fsum(x.t_in) + math.fsum(x.t_param) + x.t_out,
        param_time=math.fsum(x.t_param), output_time=x.t_out, output_energy=x.e_out,
        bottleneck=bottleneck, layers=layers, devices=devices, links=links, hosts=hosts,
        bottleneck_at=bottleneck_at, _graph=graph, _cluster=cluster, _columns=a,
    )


def _link_records(graph: Graph, cluster: Cluster, x: AssignmentArrays) -> list[LinkCost]:
    k = cluster.k
    nbytes = np.zeros((k, k))
    load = np.zeros((k, k))
    ptime = np.zeros((k, k))
    energy = np.zeros((k, k))
    moved = x.prev != x.a
    np.add.at(nbytes, (x.prev[moved], x.a[moved]), graph.input_bytes_per_layer[moved])
    np.add.at(load, (x.prev, x.a), x.t_in)
    np.add.at(energy, (x.prev, x.a), x.e_in)
    last, sink, src = int(x.a[-1]), cluster.sink_index, cluster.source_index
    if last != sink:
        nbytes[last, sink] += graph.output_bytes[-1]
        load[last, sink] += x.t_out
        energy[last, sink] += x.e_out
    shipped = x.t_param > 0
    np.add.at(nbytes, (np.full(int(shipped.sum()), src), x.a[shipped]), graph.param_bytes[shipped])
    np.add.at(ptime, (np.full(graph.n, src), x.a), x.t_param)
    np.add.at(energy, (np.full(graph.n, src), x.a), x.e_param)
    out = []
    names = cluster.names
    for u in range(k):
        for v in range(u + 1, k):
            b = nbytes[u, v] + nbytes[v, u]
            t = load[u, v] + load[v, u]
            p = ptime[u, v] + ptime[v, u]
            if b > 0 or t > 0 or p > 0:
                out.append(LinkCost(between=(names[u], names[v]), bytes=float(b), load=float(t),
                                    param_time=float(p), energy=float(energy[u, v] + energy[v, u]),
                                    cpu_work=bool(cluster.cpu_links[u, v])))
    return out


def matrix_form(graph: Graph, cluster: Cluster, a: np.ndarray, ship_params: bool) -> MatrixForm:
    """Build the document's matrix form for assignment columns ``a``."""
    n, k = graph.n, cluster.k
    tab = cluster.tables
    src, sink = cluster.source_index, cluster.sink_index
    A = np.zeros((n, k))
    A[np.arange(n), a] = 1.0
    eye = np.eye(k)
    L = np.empty((n + 1, k, k))
    L[0] = np.outer(eye[src], A[0])
    L[1:n] = A[:-1, :, None] * A[1:, None, :]
    L[n] = np.outer(A[-1], eye[sink])
    nbytes = np.concatenate([[graph.input_bytes], graph.output_bytes])   # bytes on edge 0..n
    T = nbytes[:, None, None] * tab.inv_bandwidth[None] + tab.latency[None]
    T[:, np.arange(k), np.arange(k)] = 0.0
    T[:, ~tab.usable] = np.inf
    comp = compute_times(graph, cluster)
    if ship_params:
        ptime = graph.param_bytes[:, None] * tab.inv_bandwidth[src][None, :] + tab.latency[src][None, :]
        ptime[:, src] = 0.0
        ptime[graph.param_bytes == 0, :] = 0.0
        ptime[:, ~tab.usable[src]] = np.where(graph.param_bytes[:, None] > 0, np.inf, 0.0)
    else:
        ptime = np.zeros((n, k))
    S = np.zeros((n + 1, k, k))
    oh = cluster.stage_overhead
    S[0] = oh[None, :]                                   # layer 1 always starts a stage
    S[1:n] = np.where(np.eye(k, dtype=bool), 0.0, oh[None, :])[None]
    return MatrixForm(A=A, L=L, compute_time=comp, param_time=ptime, param_power=tab.power[src].copy(),
                      transfer_time=T, device_power=cluster.power.copy(), link_power=tab.power.copy(),
                      stage_time=S)


# -- tables for the solvers ----------------------------------------------------------
@dataclass(frozen=True)
class CostTables:
    """Per-choice costs the solvers share, for one (graph, cluster, ship_params).

    ``node_time``/``node_energy`` (n x k) are a layer's compute plus parameter
    shipping on each device (+inf where its parameters cannot reach that device).
    An edge carrying b bytes from u to v costs ``b * alpha + beta`` (+inf where
    ``usable`` is False); ``alpha``/``beta`` are built per (wt, we) by ``edge``.
    """

    graph: Graph
    cluster: Cluster
    ship_params: bool
    comp: np.ndarray
    node_time: np.ndarray
    node_energy: np.ndarray

    @classmethod
    def build(cls, graph: Graph, cluster: Cluster, ship_params: bool) -> "CostTables":
        """Compute the node tables (vectorized, O(n k))."""
        tab = cluster.tables
        src = cluster.source_index
        comp = compute_times(graph, cluster)
        node_time = comp.copy()
        node_energy = comp * cluster.power[None, :]
        if ship_params:
            has = graph.param_bytes > 0
            pt = graph.param_bytes[:, None] * tab.inv_bandwidth[src][None, :] + tab.latency[src][None, :]
            pt[:, src] = 0.0
            pt[~has, :] = 0.0
            pt[np.ix_(has, ~tab.usable[src])] = np.inf
            node_time = node_time + pt
            with np.errstate(invalid="ignore"):
                pe = np.where(np.isinf(pt), np.inf, pt * tab.power[src][None, :])
            node_energy = node_energy + pe
        return cls(graph, cluster, bool(ship_params), comp, node_time, node_energy)

    def node(self, wt: float, we: float) -> np.ndarray:
        """n x k weighted node cost (+inf where impossible)."""
        if we == 0:
            return wt * self.node_time
        if wt == 0:
            return we * self.node_energy
        return wt * self.node_time + we * self.node_energy

    def edge(self, wt: float, we: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(alpha, beta, blocked): edge cost is b * alpha + beta, and +inf where
        ``blocked`` (unusable pairs). alpha and beta are 0 on the diagonal; beta[u, v]
        includes the stage overhead of v (a change of device starts a stage)."""
        return self._edge(wt, we, stage=True)

    def _edge(self, wt: float, we: float, stage: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        tab = self.cluster.tables
        weight = wt + we * tab.power
        alpha = weight * tab.inv_bandwidth
        beta = weight * tab.latency
        if stage:
            beta = beta + self._stage(wt, we)[None, :]
            np.fill_diagonal(beta, 0.0)
        return alpha, beta, ~tab.usable

    def _stage(self, wt: float, we: float) -> np.ndarray:
        """(k,) weighted cost of starting a stage on each device."""
        return (wt + we * self.cluster.power) * self.cluster.stage_overhead

    def edge_matrix(self, nbytes: float, wt: float, we: float, stage: bool = True) -> np.ndarray:
        """k x k weighted cost of moving ``nbytes`` between each pair (+inf if unusable),
        with the receiver's stage overhead unless ``stage`` is False."""
        alpha, beta, blocked = self._edge(wt, we, stage)
        m = nbytes * alpha + beta
        np.fill_diagonal(m, 0.0)
        m[blocked] = np.inf
        return m

    def first_edge(self, wt: float, we: float) -> np.ndarray:
        """Cost (k,) of sending the input from the source to layer 1 on each device,
        plus starting the first stage there."""
        row = self.edge_matrix(self.graph.input_bytes, wt, we)[self.cluster.source_index].copy()
        src = self.cluster.source_index
        row[src] = self._stage(wt, we)[src]   # the diagonal of edge_matrix is 0, but a stage starts
        return row

    def last_edge(self, wt: float, we: float) -> np.ndarray:
        """Cost (k,) of sending the last layer's output from each device to the sink."""
        # No stage starts at the sink.
        m = self.edge_matrix(float(self.graph.output_bytes[-1]), wt, we, stage=False)
        return m[:, self.cluster.sink_index].copy()
