"""The cost model's arithmetic for one assignment: per-layer arrays (compute, transfers,
parameter shipping, stage overheads, with their energies), the totals T and E, memory
use, and the pipelined loads the throughput bottleneck takes the largest of.

Everything is O(n) numpy, so the solvers can price the assignments they try; the
definition is in ``evaluate``'s module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from multigpu.partition.cost.choices import compute_times, param_energy, param_times
from multigpu.partition.exceptions import UnusableLinkError
from multigpu.partition.inputs.cluster import Cluster
from multigpu.partition.inputs.graph import Graph

__all__ = [
    "AssignmentArrays",
    "Sends",
    "assignment_arrays",
    "bottleneck_of",
    "busy_ratios",
    "busy_times",
    "find_bottleneck",
    "link_loads",
    "loads",
    "memory_parts",
    "memory_use",
    "single_device",
    "stage_overheads",
    "stage_starts",
    "transfer_cpu_loads",
    "transfers",
    "warm_pass_of",
    "warm_scale",
    "weighted_cost",
]


@dataclass(frozen=True)
class Sends:
    """Every activation transfer of one assignment, one per producer and distinct device
    it must reach (``u != v``): ``producer`` (a layer, -1 for the graph's input),
    ``to`` (the first layer on ``v`` that consumes it; n for the sink), ``u`` -> ``v``
    (device columns), ``nbytes``, ``time`` and ``energy``. Ordered by producer, then
    receiving layer."""

    producer: np.ndarray
    to: np.ndarray
    u: np.ndarray
    v: np.ndarray
    nbytes: np.ndarray
    time: np.ndarray
    energy: np.ndarray


@dataclass(frozen=True)
class AssignmentArrays:
    """Per-layer arrays of one assignment, and its transfers (no Python objects: cheap for
    n = 10,000)."""

    a: np.ndarray  # device column per layer
    comp: np.ndarray  # compute time
    comp_energy: np.ndarray
    t_param: np.ndarray  # parameter shipping time (0 unless ship_params)
    e_param: np.ndarray
    t_stage: np.ndarray  # stage overhead, on the first layer of each stage
    e_stage: np.ndarray
    sends: Sends  # the activation transfers, the output to the sink included
    t_in: np.ndarray  # per layer: the transfers it receives first (0 when local)
    e_in: np.ndarray
    t_out: float  # the last layer -> the sink
    e_out: float
    warm: float = 1.0  # the factor applied to comp and t_stage (``warm_scale``; 1: none)

    # fsum: the totals are compared against independent re-computations, so avoid
    # summation-order noise (fsum is exact, so the order of the terms does not matter).
    @property
    def time(self) -> float:
        """T: compute, stage overheads, transfers (the output to the sink included) and
        parameter shipping."""
        return math.fsum(self.comp) + math.fsum(self.t_stage) + math.fsum(self.sends.time) + math.fsum(self.t_param)

    @property
    def energy(self) -> float:
        """E: the energy of every term of ``time``."""
        return (
            math.fsum(self.comp_energy)
            + math.fsum(self.e_stage)
            + math.fsum(self.sends.energy)
            + math.fsum(self.e_param)
        )


def _sends(graph: Graph, cluster: Cluster, a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(producer, receiving layer, u, v) of every transfer of ``a``, one per producer and
    distinct device (u != v), the output to the sink last; not yet checked for links."""
    n, src, sink = graph.n, cluster.source_index, cluster.sink_index
    if graph.is_chain:  # each layer has one producer: no duplicates to remove
        prod = np.arange(-1, n, dtype=np.intp)
        to = np.arange(n + 1, dtype=np.intp)
        u = np.concatenate([[src], a]).astype(np.intp)
        v = np.concatenate([a, [sink]]).astype(np.intp)
    else:
        ic = graph.input_consumers
        # Every (producer, consumer) pair ordered by consumer, the sink last.
        prod = np.concatenate([graph.edge_src, np.full(len(ic), -1, dtype=np.intp), [n - 1]]).astype(np.intp)
        to = np.concatenate([graph.edge_dst, ic, [n]]).astype(np.intp)
        order = np.argsort(to, kind="stable")
        prod, to = prod[order], to[order]
        v = np.where(to < n, a[np.minimum(to, n - 1)], sink).astype(np.intp)
        u = np.where(prod >= 0, a[prod], src).astype(np.intp)
        # One transfer per (producer, device): keep the first (lowest) receiving layer.
        _, first = np.unique((prod + 1) * cluster.k + v, return_index=True)
        keep = np.sort(first)
        prod, to, u, v = prod[keep], to[keep], u[keep], v[keep]
        by_producer = np.argsort(prod, kind="stable")
        prod, to, u, v = prod[by_producer], to[by_producer], u[by_producer], v[by_producer]
    moved = u != v
    return prod[moved], to[moved], u[moved], v[moved]


def _check_links(
    graph: Graph, cluster: Cluster, prod: np.ndarray, to: np.ndarray, u: np.ndarray, v: np.ndarray
) -> None:
    bad = ~cluster.tables.usable[u, v]
    if not bad.any():
        return
    n = graph.n
    j = int(np.flatnonzero(bad)[np.argmin(to[bad])])
    du, dv = cluster.names[u[j]], cluster.names[v[j]]
    if to[j] == n:
        raise UnusableLinkError(
            f"the output of the last layer {graph.layers[-1].name!r} on {du!r} must "
            f"reach the sink {cluster.sink!r}, but no link joins them and the cluster has no "
            f"default_link; add a link or a default_link, or assign the last layer differently"
        )
    origin = "the source" if prod[j] < 0 else f"layer {graph.layers[prod[j]].name!r}"
    raise UnusableLinkError(
        f"layer {graph.layers[to[j]].name!r} on {dv!r} receives its input from {origin} on {du!r}, "
        f"but no link joins {du!r} and {dv!r} and the cluster has no default_link; add a link "
        f"between them or a default_link, or assign the layers differently"
    )


def assignment_arrays(
    graph: Graph, cluster: Cluster, a: np.ndarray, ship_params: bool, warm: bool = True
) -> AssignmentArrays:
    """The per-layer arrays and the transfers of assignment ``a`` (device columns);
    UnusableLinkError when it moves data over a pair with no link. ``warm=False``
    leaves out ``warm_scale`` (the solvers' separable model, in which every plan is
    priced from its per-layer times)."""
    tab = cluster.tables
    n = graph.n
    prod, to, u, v = _sends(graph, cluster, a)
    _check_links(graph, cluster, prod, to, u, v)
    out_bytes = np.concatenate([[graph.input_bytes], graph.output_bytes])  # index: producer + 1
    nb = out_bytes[prod + 1]
    t = tab.hop_seconds(nb, u, v)
    e = t * tab.power[u, v]
    sends = Sends(prod, to, u, v, nb, t, e)
    if any(d.measured(graph.name) is not None for d in cluster.devices):
        comp = compute_times(graph, cluster)[np.arange(n), a]
    else:  # the common case, O(n) instead of O(n k): this runs inside the solvers' loops
        comp = graph.flops / cluster.flops[a]
    comp_energy = comp * cluster.power[a]
    if ship_params:
        t_param = param_times(graph, cluster, a)
        bad = np.isinf(t_param)
        if bad.any():
            i = int(np.argmax(bad))
            raise UnusableLinkError(
                f"with ship_params, layer {graph.layers[i].name!r} on {cluster.names[a[i]]!r} receives "
                f"its parameters from the source {cluster.source!r}, but no link joins them and the "
                f"cluster has no default_link; add a link or a default_link, or place it elsewhere"
            )
        e_param = param_energy(cluster, a, t_param)
    else:
        t_param = np.zeros(n)
        e_param = t_param
    layer = to < n
    t_in = np.bincount(to[layer], weights=t[layer], minlength=n).astype(float)
    e_in = np.bincount(to[layer], weights=e[layer], minlength=n).astype(float)
    t_out = float(t[~layer].sum())
    e_out = float(e[~layer].sum())
    t_stage = stage_overheads(graph, cluster, a)
    only = single_device(a) if warm else None
    scale = 1.0
    if only is not None:
        scale = warm_scale(graph, cluster, comp, t_stage, only)
        if scale < 1.0:
            comp, t_stage = comp * scale, t_stage * scale
            comp_energy = comp * cluster.power[a]
    e_stage = t_stage * cluster.power[a]
    return AssignmentArrays(
        a, comp, comp_energy, t_param, e_param, t_stage, e_stage, sends, t_in, e_in, t_out, e_out, scale
    )


def warm_pass_of(graph: Graph, cluster: Cluster, device: int | None = None) -> float | None:
    """The seconds of a whole pass of ``graph`` on ``device`` (a column; default the
    source) when a plan with every layer there runs item after item: its ``warm_pass``.
    None when it has none for this graph, or for the source when the output goes to
    another device (the sink)."""
    d = cluster.source_index if device is None else int(device)
    warm = None if cluster.engine is None else cluster.engine.warm_pass.get(cluster.names[d])
    if warm is None or (d == cluster.source_index and cluster.sink_index != cluster.source_index):
        return None
    return warm.get(graph.name)


def single_device(a: np.ndarray | Sequence[int]) -> int | None:
    """The device column every layer of assignment ``a`` is on, or None when it uses several."""
    a = np.asarray(a)
    return int(a[0]) if len(a) and bool((a == a[0]).all()) else None


def warm_scale(
    graph: Graph, cluster: Cluster, comp: np.ndarray, t_stage: np.ndarray, device: int | None = None
) -> float:
    """The factor on the compute and stage overhead of the plan with every layer on
    ``device`` (default the source): ``warm_pass_of`` over the layers' sum, at most 1;
    1 without a warm pass.

    Such a plan calls its device item after item with only the hops to and from it in
    between (the driver: no call at all), so it runs at the speed the profile measured
    for passes called so; every stage of a split plan waits while other devices
    compute, as its ``layer_times`` were measured (the devices taking turns).
    """
    t = warm_pass_of(graph, cluster, device)
    total = math.fsum(comp) + math.fsum(t_stage)
    return 1.0 if t is None or total <= 0 else min(1.0, t / total)


def busy_ratios(graph: Graph, cluster: Cluster) -> np.ndarray:
    """Per device (k,): the factor on its compute and stage overheads in a stream's device
    load, ``warm_scale`` of the plan with every layer on it (1 without a warm pass).

    A stream that a device bounds keeps it busy: it takes one call after another, as
    its ``warm_pass`` was timed, not after waiting while the other devices computed, as
    its ``layer_times`` were. Its host's load keeps the layer times: where the host is
    the bound, its devices take turns on its cores.
    """
    comp = compute_times(graph, cluster)
    out = np.ones(cluster.k)
    for d in range(cluster.k):
        local = np.full(graph.n, d, dtype=np.intp)
        out[d] = warm_scale(graph, cluster, comp[:, d], stage_overheads(graph, cluster, local), d)
    return out


def stage_starts(graph: Graph, a: np.ndarray) -> np.ndarray:
    """Per layer: True if it starts a stage (``multigpu.partition.stages``): it consumes
    the graph's input, or one of its inputs comes from another device."""
    starts = np.zeros(graph.n, dtype=bool)
    starts[graph.input_consumers] = True
    if len(graph.edge_src):
        starts[graph.edge_dst[a[graph.edge_src] != a[graph.edge_dst]]] = True
    return starts


def stage_overheads(graph: Graph, cluster: Cluster, a: np.ndarray) -> np.ndarray:
    """Per layer: its device's ``stage_overhead`` if it starts a stage, else 0."""
    oh = cluster.stage_overhead
    if not oh.any():
        return np.zeros(len(a))
    return np.where(stage_starts(graph, a), oh[a], 0.0)


def memory_parts(graph: Graph, cluster: Cluster, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bytes per device (k,): its layers' parameters, and the largest activation among them."""
    params = np.bincount(a, weights=graph.param_bytes, minlength=cluster.k)
    act = np.zeros(cluster.k)
    np.maximum.at(act, a, graph.activation_bytes)
    return params, act


def memory_use(graph: Graph, cluster: Cluster, a: np.ndarray) -> np.ndarray:
    """Bytes per device: its layers' parameters plus the largest activation among them."""
    params, act = memory_parts(graph, cluster, a)
    return params + act


def busy_times(graph: Graph, cluster: Cluster, comp: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Compute seconds per device (k,) of assignment ``a``, from the n x k compute table ``comp``."""
    return np.bincount(a, weights=comp[np.arange(graph.n), a], minlength=cluster.k)


def link_loads(cluster: Cluster, x: AssignmentArrays) -> np.ndarray:
    """k x k symmetric matrix of activation transfer time per unordered pair, as the
    bottleneck counts it (``LinkTables.occupancy_seconds``): 0 on a pair whose transfers
    are CPU work of one host (``EngineVectors.cpu_links``)."""
    k = cluster.k
    load = np.zeros((k, k))
    sd = x.sends
    np.add.at(load, (sd.u, sd.v), cluster.tables.occupancy_seconds(sd.nbytes, sd.u, sd.v))
    load = load + load.T
    np.fill_diagonal(load, 0.0)
    load[cluster.engine_vectors.cpu_links] = 0.0
    return load


def transfers(graph: Graph, cluster: Cluster, x: AssignmentArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sender, receiver, bytes) of every activation transfer of one item (u != v)."""
    return x.sends.u, x.sends.v, x.sends.nbytes


def transfer_cpu_loads(cluster: Cluster, u: np.ndarray, v: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(k,) CPU seconds each device spends per item on transfers (u[j] -> v[j], b[j]
    bytes), and (k,) the part on its computing thread; see ``EngineVectors.transfer_cpu_terms``."""
    _, dev, val, serial = cluster.engine_vectors.transfer_cpu_terms(u, v, b)
    return (
        np.bincount(dev, weights=val, minlength=cluster.k).astype(float),
        np.bincount(dev, weights=serial, minlength=cluster.k).astype(float),
    )


def loads(graph: Graph, cluster: Cluster, x: AssignmentArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per item when pipelined: (device loads (k,): compute and stage overheads at the
    busy rate (``busy_ratios``) and the serial part of their transfer CPU; transfer CPU
    (k,); its serial part (k,); host loads (h,): the CPU-seconds of their devices'
    compute and stage overheads (wall time times ``Cluster.compute_cores``) and all their
    transfer CPU)."""
    cpu, serial = transfer_cpu_loads(cluster, *transfers(graph, cluster, x))
    work = np.bincount(x.a, weights=x.comp + x.t_stage, minlength=cluster.k)
    # A plan priced at its device's warm pass already is (``warm_scale`` is that ratio).
    busy = work if x.warm != 1.0 else work * busy_ratios(graph, cluster)
    hosts = np.zeros(len(cluster.hosts))
    on = cluster.host_index >= 0
    np.add.at(hosts, cluster.host_index[on], (work * cluster.compute_cores + cpu)[on])
    return busy + serial, cpu, serial, hosts


def find_bottleneck(cluster: Cluster, load: np.ndarray, links: np.ndarray, hosts: np.ndarray) -> tuple[float, str]:
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


def bottleneck_of(graph: Graph, cluster: Cluster, a: np.ndarray, warm: bool = True) -> float:
    """The throughput objective of assignment ``a`` (device columns); ``warm`` as in
    ``assignment_arrays``."""
    x = assignment_arrays(graph, cluster, np.asarray(a, dtype=np.intp), ship_params=False, warm=warm)
    load, _, _, hosts = loads(graph, cluster, x)
    return find_bottleneck(cluster, load, link_loads(cluster, x), hosts)[0]


def weighted_cost(
    graph: Graph, cluster: Cluster, a: np.ndarray, ship_params: bool, wt: float, we: float, warm: bool = True
) -> float:
    """The latency objective wt*T + we*E of assignment ``a`` (device columns); ``ship_params`` and
    ``warm`` as in ``assignment_arrays`` (the solvers price plans with ``warm=False``)."""
    x = assignment_arrays(graph, cluster, np.asarray(a, dtype=np.intp), ship_params, warm=warm)
    return wt * x.time + we * x.energy
