"""Per-choice figures every part of the cost model is built from: what running a layer on
a device costs in compute (nominal FLOP/s or the profiled ``layer_times``), and what
shipping its parameters from the source there takes (``ship_params``).

``evaluate``'s per-assignment arithmetic picks entries of these; the matrix form and the
solvers' tables use whole columns. One definition of each, so they cannot disagree.
"""

from __future__ import annotations

import numpy as np

from multigpu.partition.exceptions import ClusterError
from multigpu.partition.inputs.cluster import Cluster
from multigpu.partition.inputs.graph import Graph

__all__ = ["compute_times", "measured_devices", "param_energy", "param_times"]


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
                f"{', ...' if graph.n > 12 else ''}); re-profile the device for this graph or remove the entry"
            )
        missing = [layer for layer in graph.names if layer not in times]
        if missing:
            raise ClusterError(
                f"device {d.name!r}: layer_times[{graph.name!r}] has no time for layer {missing[0]!r}; a "
                f"profile covers every layer of its graph (mixing measured times with nominal FLOP/s would "
                f"compare unlike figures); re-profile the device for this graph or remove the entry"
            )
        out.append(d.name)
    return out


def compute_times(graph: Graph, cluster: Cluster) -> np.ndarray:
    """n x k seconds of each layer on each device: ``flops / FLOP/s``, replaced by the
    measured time wherever a device's ``layer_times`` hold this graph."""
    table = graph.flops[:, None] / cluster.flops[None, :]
    for name in measured_devices(graph, cluster):
        d = cluster.index(name)
        times = cluster.devices[d].measured(graph.name)
        assert times is not None  # measured_devices lists only devices that timed this graph
        table[:, d] = [times[layer] for layer in graph.names]
    return table


def param_times(graph: Graph, cluster: Cluster, cols: np.ndarray) -> np.ndarray:
    """Seconds to ship each layer's parameters from the source to device ``cols`` (shape (n,):
    one device per layer; or broadcastable against (n, 1), e.g. ``np.arange(k)[None, :]`` for
    the n x k table): 0 on the source and for a layer without parameters, +inf where no link
    joins the source and that device."""
    tab = cluster.tables
    src = cluster.source_index
    cols = np.asarray(cols, dtype=np.intp)
    p = graph.param_bytes.reshape((-1,) + (1,) * (cols.ndim - 1))
    ships = (cols != src) & (p > 0)
    t = np.where(ships, p * tab.inv_bandwidth[src, cols] + tab.latency[src, cols], 0.0)
    return np.where(ships & ~tab.usable[src, cols], np.inf, t)


def param_energy(cluster: Cluster, cols: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Joules of the parameter shipping ``times`` to devices ``cols`` (link power x time; +inf
    where the time is)."""
    power = cluster.tables.power[cluster.source_index, np.asarray(cols, dtype=np.intp)]
    with np.errstate(invalid="ignore"):
        return np.where(np.isinf(times), np.inf, times * power)
