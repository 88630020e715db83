"""The cost model: time, energy and weighted cost of one assignment of layers to devices.

``evaluate`` prices an assignment and returns its ``Breakdown``; the arithmetic is in
``arithmetic.py``, the per-choice figures in ``choices.py``, the matrix form in
``matrix.py`` and the solvers' tables in ``tables.py``.

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
* a plan with every layer on one device runs its items one after another there (on
  the source, which must then also be the sink: back to back in the driver, with no
  transfer; on a worker: one call per item, with the hops to and from it in between):
  where that device has a ``warm_pass`` for this graph, its compute times and stage
  overhead are scaled so they sum to it (never up). Every stage of a split plan waits
  while other devices compute, as ``layer_times`` were measured;
* T = sum of compute times + sum of stage overheads + sum of transfer times
* E = sum of power(a_i) * (compute time_i + stage overhead_i) + sum of transfer time * link power
* cost = wt * T + we * E

The throughput objective (pipelined inference) is the *bottleneck*, the largest of:

* each device's load per item: its compute and its stage overheads, both at its busy
  rate (where it has a ``warm_pass`` for the graph: that pass over its layer times, at
  most 1; a stream this device bounds keeps it busy), and the CPU of the
  transfers it takes part in (``transfer_cpu`` of each end: ``fixed + per_byte * b``
  for every transfer it sends, ``fixed + receive_per_byte * b`` for every one it
  receives (``per_byte`` without one); the ``relay``'s figure for every transfer
  between two other devices when it is the relay), of that CPU only the ``serial``
  part (on its computing thread; all of it without ``serial``);
* each link's activation transfer time per item (not on a pair of devices of one host
  that both have ``transfer_cpu``: moving data between them is that CPU work); with the
  engine's ``message_bytes``, a transfer counts ``(bytes + message_bytes) /
  bandwidth`` there instead of its hop time (a stream keeps the link busy with the
  payload and the engine's messages, while the round trips overlap);
* each host's load: its devices' compute and stage overheads at their layer times (its
  devices take turns on its cores) and all their transfer CPU, divided by its ``cores``.

Transfer CPU enters nothing but the bottleneck (a transfer's time already holds it).
A pair with no link and no default link cannot be used; ``evaluate`` raises
UnusableLinkError for an assignment that needs one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from multigpu.checks import check_number
from multigpu.partition.cost.arithmetic import (
    AssignmentArrays,
    assignment_arrays,
    find_bottleneck,
    link_loads,
    loads,
    memory_parts,
)
from multigpu.partition.cost.records import SINK, Breakdown, DeviceCost, HostCost, LayerCost, LinkCost, TransferCost
from multigpu.partition.cost.schedule import makespan_of
from multigpu.partition.exceptions import ClusterError, PartitionInputError
from multigpu.partition.inputs.cluster import Cluster
from multigpu.partition.inputs.graph import INPUT, Graph

__all__ = ["AssignmentLike", "check_weights", "evaluate", "resolve_assignment"]

AssignmentLike = Sequence[str | int] | Mapping[str, str | int] | Sequence[tuple[str, str | int]] | np.ndarray


def check_weights(wt: Any, we: Any) -> tuple[float, float]:
    """Return (wt, we) as floats; PartitionInputError unless both are finite, >= 0 and not both 0."""
    out = [
        check_number(v, label, minimum=0.0, example=f"1 (the weight of {kind} in the cost)", error=PartitionInputError)
        for label, v, kind in (("wt", wt, "time"), ("we", we, "energy"))
    ]
    if out[0] == 0 and out[1] == 0:
        raise PartitionInputError(
            "wt=0 and we=0 make every assignment cost 0; give wt > 0 "
            "(weight of time, seconds) or we > 0 (weight of energy, joules)"
        )
    return out[0], out[1]


def _by_layer(graph: Graph, pairs: Sequence[Sequence[Any]]) -> list[Any]:
    """One device per layer from (layer, device) pairs; PartitionInputError for a layer
    placed twice, an unknown layer or one left out."""
    placed: dict[int, Any] = {}
    for layer, dev in pairs:
        try:
            i = graph.index(layer)
        except ClusterError as e:
            raise PartitionInputError(f"assignment: {e}") from None
        if i in placed:
            raise PartitionInputError(
                f"assignment places layer {graph.layers[i].name!r} on two devices, "
                f"{placed[i]!r} and {dev!r}; a layer runs on one device: keep one"
            )
        placed[i] = dev
    missing = [graph.layers[i].name for i in range(graph.n) if i not in placed]
    if missing:
        raise PartitionInputError(
            f"assignment has {len(placed)} entries but the graph has {graph.n} layers; "
            f"it places no device for layer {missing[0]!r}: give one device per layer"
        )
    return [placed[i] for i in range(graph.n)]


def resolve_assignment(graph: Graph, cluster: Cluster, assignment: AssignmentLike) -> np.ndarray:
    """Device column of each layer as an int array, from one device name (or index) per
    layer in layer order, a mapping of layer name to device, or a list of (layer, device)
    pairs. PartitionInputError on a bad entry, a plan of the wrong length and a layer
    placed on two devices."""
    if isinstance(assignment, Mapping):
        assignment = _by_layer(graph, list(assignment.items()))
    elif (
        isinstance(assignment, Sequence)
        and not isinstance(assignment, (str, bytes))
        and len(assignment)
        and all(isinstance(x, (tuple, list)) and len(x) == 2 for x in assignment)
    ):
        assignment = _by_layer(graph, [tuple(x) for x in assignment if isinstance(x, (tuple, list))])
    if isinstance(assignment, (str, bytes)) or not isinstance(assignment, (Sequence, np.ndarray)):
        raise PartitionInputError(
            f"assignment must be a list with one device name per layer, got {type(assignment).__name__}"
        )
    if len(assignment) != graph.n:
        raise PartitionInputError(
            f"assignment has {len(assignment)} entries but the graph has {graph.n} layers; give one device per layer"
        )
    out = np.empty(graph.n, dtype=np.intp)
    for i, dev in enumerate(assignment):
        if isinstance(dev, (int, np.integer)) and not isinstance(dev, bool):
            if not 0 <= int(dev) < cluster.k:
                raise PartitionInputError(
                    f"assignment[{i}] (layer {graph.layers[i].name!r}) = {dev} is not a device index 0..{cluster.k - 1}"
                )
            out[i] = int(dev)
        elif isinstance(dev, str) and dev in cluster._index:
            out[i] = cluster._index[dev]
        else:
            raise PartitionInputError(
                f"assignment[{i}] (layer {graph.layers[i].name!r}) = {dev!r} "
                f"is not a device; devices are: {', '.join(cluster.names)}"
            )
    return out


def evaluate(
    graph: Graph,
    cluster: Cluster,
    assignment: AssignmentLike,
    wt: float = 1.0,
    we: float = 0.0,
    ship_params: bool = False,
) -> Breakdown:
    """Time, energy and cost of ``assignment`` (one device name or index per layer),
    broken down per layer, per device and per link, with the matrix form.

    Raises PartitionInputError for bad weights or a malformed assignment, and
    UnusableLinkError when the assignment moves data over a pair with no link.
    """
    wt, we = check_weights(wt, we)
    a = resolve_assignment(graph, cluster, assignment)
    x = assignment_arrays(graph, cluster, a, bool(ship_params))
    time, energy = x.time, x.energy
    cost = wt * time + we * energy
    names = cluster.names
    k = cluster.k

    layer_time = x.comp + x.t_stage + x.t_in + x.t_param
    layer_energy = x.comp_energy + x.e_stage + x.e_in + x.e_param
    sd = x.sends
    senders: list[list[str]] = [[] for _ in range(graph.n + 1)]
    for j in range(len(sd.to)):
        senders[sd.to[j]].append(names[sd.u[j]])
    layers = [
        LayerCost(
            name=spec.name,
            device=names[a[i]],
            compute_time=float(x.comp[i]),
            compute_energy=float(x.comp_energy[i]),
            transfer_from=senders[i][0] if senders[i] else None,
            transfer_time=float(x.t_in[i]),
            transfer_energy=float(x.e_in[i]),
            param_time=float(x.t_param[i]),
            param_energy=float(x.e_param[i]),
            time=float(layer_time[i]),
            energy=float(layer_energy[i]),
            cost=float(wt * layer_time[i] + we * layer_energy[i]),
            stage_overhead=float(x.t_stage[i]),
            transfers_from=tuple(senders[i]),
        )
        for i, spec in enumerate(graph.layers)
    ]
    transfers = [
        TransferCost(
            producer=INPUT if sd.producer[j] < 0 else graph.layers[sd.producer[j]].name,
            to=SINK if sd.to[j] == graph.n else graph.layers[sd.to[j]].name,
            between=(names[sd.u[j]], names[sd.v[j]]),
            bytes=float(sd.nbytes[j]),
            time=float(sd.time[j]),
            energy=float(sd.energy[j]),
        )
        for j in range(len(sd.to))
    ]

    src = cluster.source_index
    busy = np.bincount(a, weights=x.comp, minlength=k)
    busy_e = np.bincount(a, weights=x.comp_energy + x.e_stage, minlength=k)
    overhead = np.bincount(a, weights=x.t_stage, minlength=k)
    moving = np.bincount(a, weights=x.t_param, minlength=k)  # parameters received
    moving += np.bincount(sd.v, weights=sd.time, minlength=k)  # received
    moving += np.bincount(sd.u, weights=sd.time, minlength=k)  # sent
    moving[src] += x.t_param.sum()
    params, act = memory_parts(graph, cluster, a)
    counts = np.bincount(a, minlength=k)
    load, cpu, serial, host_load = loads(graph, cluster, x)
    devices = [
        DeviceCost(
            name=names[d],
            layers=int(counts[d]),
            compute_time=float(busy[d]),
            compute_energy=float(busy_e[d]),
            transfer_time=float(moving[d]),
            param_bytes=float(params[d]),
            activation_bytes=float(act[d]),
            memory=float(params[d] + act[d]),
            memory_limit=cluster.devices[d].memory,
            stage_overhead=float(overhead[d]),
            transfer_cpu=float(cpu[d]),
            load=float(load[d]),
            transfer_cpu_serial=float(serial[d]),
        )
        for d in range(k)
    ]
    hosts = [
        HostCost(
            name=h.name,
            cores=h.cores,
            devices=[names[d] for d in np.flatnonzero(cluster.host_index == j)],
            load=float(host_load[j]),
        )
        for j, h in enumerate(cluster.hosts)
    ]

    links = _link_records(graph, cluster, x)
    bottleneck, bottleneck_at = find_bottleneck(cluster, load, link_loads(cluster, x), host_load)
    return Breakdown(
        assignment=[names[d] for d in a],
        time=time,
        energy=energy,
        cost=cost,
        wt=wt,
        we=we,
        ship_params=bool(ship_params),
        compute_time=math.fsum(x.comp),
        stage_time=math.fsum(x.t_stage),
        transfer_time=math.fsum(sd.time) + math.fsum(x.t_param),
        param_time=math.fsum(x.t_param),
        output_time=x.t_out,
        output_energy=x.e_out,
        bottleneck=bottleneck,
        layers=layers,
        devices=devices,
        links=links,
        hosts=hosts,
        bottleneck_at=bottleneck_at,
        transfers=transfers,
        makespan=makespan_of(graph, cluster, x),
        _graph=graph,
        _cluster=cluster,
        _columns=a,
    )


def _link_records(graph: Graph, cluster: Cluster, x: AssignmentArrays) -> list[LinkCost]:
    k = cluster.k
    nbytes = np.zeros((k, k))
    load = np.zeros((k, k))
    ptime = np.zeros((k, k))
    energy = np.zeros((k, k))
    sd = x.sends
    np.add.at(nbytes, (sd.u, sd.v), sd.nbytes)
    np.add.at(load, (sd.u, sd.v), cluster.tables.occupancy_seconds(sd.nbytes, sd.u, sd.v))
    np.add.at(energy, (sd.u, sd.v), sd.energy)
    src = cluster.source_index
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
                out.append(
                    LinkCost(
                        between=(names[u], names[v]),
                        bytes=float(b),
                        load=float(t),
                        param_time=float(p),
                        energy=float(energy[u, v] + energy[v, u]),
                        cpu_work=bool(cluster.engine_vectors.cpu_links[u, v]),
                    )
                )
    return out
