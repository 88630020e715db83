"""Pipeline-partitioning instances in the JSON format of Tarnawski et al. (NeurIPS 2020,
``github.com/msr-fiddle/dnn-partitioning``, folder ``throughput-inputs/``), read onto the
throughput objective.

Their format: ``{"maxFPGAs": k, "maxCPUs": c, "maxSizePerFPGA": bytes, "nodes": [...],
"edges": [...]}``. A node has ``id``, ``cpuLatency`` and ``fpgaLatency`` (milliseconds),
``size`` (parameter bytes, default 0), ``supportedOnFpga``, ``isBackwardNode`` and
``colorClass`` (nodes of one class run on one device); an edge has ``sourceId``,
``destId`` and ``cost``: the milliseconds a device spends moving the source's output,
one figure per source node. Their problem: place every node on one of k identical
accelerators or a CPU so that the largest load is least. An accelerator's load is its
compute plus, for each node whose output crosses its boundary, the node's cost (once
for a node it sends, once for a node it receives); the CPU's load is its compute only.

The conversion (``read_pipeline_instance``), onto our throughput objective (the bottleneck
of the device loads):

* devices ``cpu`` (the source and sink, no memory limit, no transfer cost) and ``acc0``
  .. ``acc{k-1}`` (memory ``maxSizePerFPGA`` plus the graph's largest activation, which
  our memory counts and theirs does not); a layer's FLOPs are its accelerator time at
  ``ACC_FLOPS``, and the CPU's rate is the instance's one CPU/accelerator ratio (measured
  ``layer_times`` where the ratio varies);
* a node's transfer cost becomes its ``output_bytes`` at ``BYTES_PER_SECOND``, and each
  accelerator spends ``1 / BYTES_PER_SECOND`` seconds of ``transfer_cpu`` per byte sent and
  per byte received; links are so fast (``LINK_BANDWIDTH``) that no link load binds;
* a colour class becomes one layer (its latencies and sizes summed); a class whose
  outputs leave it from two or more nodes gets the sum of their costs, which is exact
  only when they cross to the same devices (one class in ``bert_l-3_inference``, none
  in the layer graphs). A ``colorClass`` of null is a class of its own;
* the nodes no edge enters consume the graph's input (0 bytes); when several nodes have
  no outgoing edge, a zero-time layer ``output`` consumes them (their outputs cost 0);
* a class holding a node not ``supportedOnFpga`` is pinned to the CPU (``constraints``).

One difference remains, and ``pipeline_max_load`` prices a plan their way to show it: we
charge a sender once per device its output goes to, they charge it once in all. Their
training instances (backward nodes) are read as one graph of forward and backward
nodes; only the inference instances map exactly.
"""

from __future__ import annotations

import heapq
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from multigpu.partition.exceptions import GraphError
from multigpu.partition.inputs.cluster import Cluster, DeviceSpec, EngineProfile, LinkSpec, TransferCpu
from multigpu.partition.inputs.graph import INPUT, Graph, LayerSpec

__all__ = [
    "BYTES_PER_SECOND",
    "PipelineInstance",
    "pipeline_max_load",
    "read_pipeline_instance",
]

MS = 1e-3  # their latencies and costs are milliseconds
BYTES_PER_SECOND = 1e9  # a transfer cost of t seconds is t * BYTES_PER_SECOND output bytes
ACC_FLOPS = 1e12  # an accelerator's FLOP/s: a layer's FLOPs are its accelerator time at this rate
LINK_BANDWIDTH = 1e30  # bytes/s: links never bound a plan (their model has no link loads)
SINK = "output"
INSTANCE_KEYS = ("maxFPGAs", "maxCPUs", "maxSizePerFPGA", "nodes", "edges")


@dataclass(frozen=True)
class PipelineInstance:
    """One instance read onto our model: ``graph``, ``cluster`` and ``constraints`` (for
    ``autopartition``), with what is needed to price a plan their way: ``data`` (the
    parsed file), ``layer_of`` (original node id -> layer index) and ``accelerators`` /
    ``cpus`` (their device counts)."""

    name: str
    graph: Graph
    cluster: Cluster
    constraints: dict[str, Any]
    data: dict[str, Any]
    layer_of: dict[int, int]
    accelerators: int
    cpus: int

    def original_assignment(self, assignment: Sequence[str]) -> dict[int, int]:
        """Their device of every original node for a plan's ``assignment`` (device names,
        one per layer): 0 for the CPU, 1..k for the accelerators."""
        dev = [0 if name.startswith("cpu") else int(name[3:]) + 1 for name in assignment]
        return {node: dev[layer] for node, layer in self.layer_of.items()}


def _number(value: Any, what: str, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise GraphError(f"{path}: {what} must be a finite number >= 0, got {value!r}")
    return float(value)


def _check_instance(data: Any, path: str) -> None:
    if not isinstance(data, dict):
        raise GraphError(f"{path}: an instance is a JSON object with keys {', '.join(INSTANCE_KEYS)}")
    missing = [k for k in INSTANCE_KEYS if k not in data]
    if missing:
        raise GraphError(
            f"{path}: missing key(s) {', '.join(missing)}; an instance of Tarnawski et al.'s format has "
            f"{', '.join(INSTANCE_KEYS)} (see throughput-inputs/ in msr-fiddle/dnn-partitioning)"
        )
    k = data["maxFPGAs"]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise GraphError(f"{path}: maxFPGAs must be a whole number >= 1, got {k!r}")
    if data["maxCPUs"] != 1:
        raise GraphError(
            f"{path}: maxCPUs = {data['maxCPUs']!r}; the conversion supports one CPU (it is the cluster's "
            f"source and sink), as in every published instance"
        )
    for key in ("nodes", "edges"):
        if not isinstance(data[key], list) or (key == "nodes" and not data[key]):
            raise GraphError(f"{path}: {key!r} must be a non-empty list")


def read_pipeline_instance(path: str | os.PathLike[str]) -> PipelineInstance:
    """Read one instance file of Tarnawski et al.'s format onto a graph, a cluster and
    constraints (see the module docstring); GraphError for a missing file, a bad key or
    value, two costs for one source node, or a cycle among the colour classes."""
    p = Path(path)
    if not p.is_file():
        raise GraphError(
            f"no instance file {os.fspath(path)!r}; instances live in throughput-inputs/ of "
            f"https://github.com/msr-fiddle/dnn-partitioning"
        )
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise GraphError(f"{p}: cannot read it as JSON ({exc})") from exc
    where = str(p)
    _check_instance(data, where)
    return _convert(data, p.stem, where)


def _convert(data: dict[str, Any], name: str, where: str) -> PipelineInstance:
    nodes: dict[int, dict[str, Any]] = {}
    for i, node in enumerate(data["nodes"]):
        if not isinstance(node, dict) or "id" not in node:
            raise GraphError(f"{where}: nodes[{i}] must be an object with an 'id'")
        nid = node["id"]
        if nid in nodes:
            raise GraphError(f"{where}: node id {nid!r} is listed twice; ids must be unique")
        for key in ("cpuLatency", "fpgaLatency"):
            if key not in node:
                raise GraphError(f"{where}: node {nid!r} has no {key!r} (milliseconds)")
            _number(node[key], f"node {nid!r}: {key}", where)
        _number(node.get("size", 0.0), f"node {nid!r}: size", where)
        nodes[nid] = node
    cost: dict[int, float] = {}
    edges: list[tuple[int, int]] = []
    for i, edge in enumerate(data["edges"]):
        if not isinstance(edge, dict) or any(k not in edge for k in ("sourceId", "destId", "cost")):
            raise GraphError(f"{where}: edges[{i}] must be an object with sourceId, destId and cost")
        u, v = edge["sourceId"], edge["destId"]
        for end in (u, v):
            if end not in nodes:
                raise GraphError(f"{where}: edges[{i}] names node {end!r}, which is not among the nodes")
        c = _number(edge["cost"], f"edges[{i}]: cost", where)
        if u in cost and abs(cost[u] - c) > 1e-6:
            raise GraphError(
                f"{where}: node {u!r} has two outgoing costs ({cost[u]!r} and {c!r}); a node's output costs "
                f"one figure to move, whichever node receives it"
            )
        cost.setdefault(u, c)
        edges.append((u, v))
    # Colour classes: one layer each (a missing or null class is the node's own).
    cls_of = {
        nid: ("class", n["colorClass"]) if n.get("colorClass") is not None else ("node", nid)
        for nid, n in nodes.items()
    }
    classes: dict[Any, list[int]] = {}
    for nid in nodes:
        classes.setdefault(cls_of[nid], []).append(nid)
    succ: dict[Any, set[Any]] = {c: set() for c in classes}
    senders: dict[Any, set[int]] = {c: set() for c in classes}
    for u, v in edges:
        cu, cv = cls_of[u], cls_of[v]
        if cu != cv:
            succ[cu].add(cv)
            senders[cu].add(u)
    order = _topological(list(classes), succ, where)
    pos = {c: i for i, c in enumerate(order)}
    preds: dict[Any, list[Any]] = {c: [] for c in classes}
    for c in order:
        for d in sorted(succ[c], key=pos.__getitem__):
            preds[d].append(c)
    names = _layer_names(order, classes, nodes)
    sinks = [c for c in order if not succ[c]]
    add_sink = len(sinks) > 1
    cpu_ms, acc_ms, layers = {}, {}, []
    pinned: dict[str, str] = {}
    for c in order:
        members = classes[c]
        nm = names[c]
        cpu_ms[nm] = sum(float(nodes[m]["cpuLatency"]) for m in members)
        acc_ms[nm] = sum(float(nodes[m]["fpgaLatency"]) for m in members)
        out_ms = sum(cost.get(m, 0.0) for m in senders[c])
        inputs = tuple(names[d] for d in preds[c]) or (INPUT,)
        layers.append(
            LayerSpec(
                nm,
                flops=acc_ms[nm] * MS * ACC_FLOPS,
                param_bytes=sum(float(nodes[m].get("size", 0.0)) for m in members),
                output_bytes=out_ms * MS * BYTES_PER_SECOND,
                inputs=inputs,
            )
        )
        if not all(nodes[m].get("supportedOnFpga", True) for m in members):
            pinned[nm] = "cpu"
    if add_sink:
        cpu_ms[SINK] = acc_ms[SINK] = 0.0
        layers.append(LayerSpec(SINK, 0.0, 0.0, 0.0, inputs=tuple(names[c] for c in sinks)))
    graph = Graph(tuple(layers), input_bytes=0.0, name=name)
    k = int(data["maxFPGAs"])
    # Our memory also holds a device's largest activation, which their model does not
    # count: room for the graph's largest one keeps their knapsack (a little looser where
    # a device's own largest activation is smaller; activations are bytes of transfer time).
    memory = _number(data["maxSizePerFPGA"], "maxSizePerFPGA", where) + float(graph.activation_bytes.max())
    per_byte = 1.0 / BYTES_PER_SECOND
    cpu_flops, cpu_times = _cpu_rate(cpu_ms, acc_ms, name)
    devices = [DeviceSpec("cpu", cpu_flops, 1.0, layer_times=cpu_times)]
    devices += [DeviceSpec(f"acc{d}", ACC_FLOPS, 1.0, memory) for d in range(k)]
    # Their sender's cost per byte is CPU work of the accelerator: our transfer CPU, which
    # the engine profile carries (here a profile of their model, not of Ray).
    engine = EngineProfile(name="pipeline", transfer_cpu={f"acc{d}": TransferCpu(0.0, per_byte) for d in range(k)})
    cluster = Cluster(
        tuple(devices), source="cpu", default_link=LinkSpec(LINK_BANDWIDTH, 0.0), engine=engine, name=f"{name}-{k}acc"
    )
    index = {c: i for i, c in enumerate(order)}
    layer_of = {nid: index[cls_of[nid]] for nid in nodes}
    constraints: dict[str, Any] = {"pinned": pinned} if pinned else {}
    return PipelineInstance(name, graph, cluster, constraints, data, layer_of, k, int(data["maxCPUs"]))


def _cpu_rate(
    cpu_ms: Mapping[str, float], acc_ms: Mapping[str, float], graph_name: str
) -> tuple[float, dict[str, dict[str, float]] | None]:
    """The CPU's FLOP/s when every layer's CPU time is one multiple of its accelerator
    time (as in every published instance), else measured ``layer_times`` (a zero time
    raised to 1e-15 s, since measured times are positive)."""
    ratios = np.array([cpu_ms[n] / acc_ms[n] for n in acc_ms if acc_ms[n] > 0])
    zeros_agree = all(cpu_ms[n] == 0 for n in acc_ms if acc_ms[n] == 0)
    if len(ratios) and zeros_agree and ratios.min() > 0 and np.ptp(ratios) <= 1e-9 * np.median(ratios):
        return ACC_FLOPS / float(np.median(ratios)), None
    return 1.0, {graph_name: {n: max(t * MS, 1e-15) for n, t in cpu_ms.items()}}


def _topological(classes: list[Any], succ: Mapping[Any, set[Any]], where: str) -> list[Any]:
    """Kahn's order over the classes, ties by first appearance (deterministic)."""
    first = {c: i for i, c in enumerate(classes)}
    indeg = dict.fromkeys(classes, 0)
    for c in classes:
        for d in succ[c]:
            indeg[d] += 1
    ready = sorted((c for c in classes if indeg[c] == 0), key=first.__getitem__)
    order: list[Any] = []
    heap = [(first[c], c) for c in ready]
    heapq.heapify(heap)
    while heap:
        _, c = heapq.heappop(heap)
        order.append(c)
        for d in succ[c]:
            indeg[d] -= 1
            if indeg[d] == 0:
                heapq.heappush(heap, (first[d], d))
    if len(order) != len(classes):
        stuck = [c for c in classes if indeg[c] > 0][:5]
        raise GraphError(
            f"{where}: the colour classes form a cycle (among {stuck}); their nodes must be placeable "
            f"in an order where every edge points forward"
        )
    # A graph's last layer sends to the sink: with one sink, put it last (every node reaches it).
    sinks = [c for c in order if not succ[c]]
    if len(sinks) == 1 and order[-1] != sinks[0]:
        order.remove(sinks[0])
        order.append(sinks[0])
    return order


def _layer_names(
    order: list[Any], classes: Mapping[Any, list[int]], nodes: Mapping[int, dict[str, Any]]
) -> dict[Any, str]:
    """A unique layer name per class: its first node's name (or ``node<id>``), with the id
    appended where two classes would share it."""
    names: dict[Any, str] = {}
    used = {INPUT, SINK}
    for c in order:
        first = classes[c][0]
        base = str(nodes[first].get("name") or f"node{first}")
        nm = base if base not in used else f"{base}#{first}"
        while nm in used:
            nm += "'"
        used.add(nm)
        names[c] = nm
    return names


def pipeline_max_load(data: Mapping[str, Any], device_of: Mapping[int, int]) -> float:
    """The max-load (milliseconds) of a placement in Tarnawski et al.'s own model
    (``computeLoadForResultOrg`` of their DP): ``device_of`` maps every node id to 0 (the
    CPU) or 1..k (an accelerator). An accelerator pays compute plus, for each node with an
    edge crossing its boundary, the node's cost once if it sends and once per receiving
    device; the CPU pays compute only."""
    load: dict[int, float] = {}
    for node in data["nodes"]:
        d = device_of[node["id"]]
        load[d] = load.get(d, 0.0) + float(node["cpuLatency"] if d == 0 else node["fpgaLatency"])
    cost = {e["sourceId"]: float(e["cost"]) for e in data["edges"]}
    receivers: dict[int, set[int]] = {}
    for e in data["edges"]:
        u, v = e["sourceId"], e["destId"]
        if device_of[u] != device_of[v]:
            receivers.setdefault(u, set()).add(device_of[v])
    for u, devs in receivers.items():
        for d in {device_of[u], *devs} - {0}:  # the sender once, each receiving device once
            load[d] = load.get(d, 0.0) + cost[u]
    return max(load.values())
