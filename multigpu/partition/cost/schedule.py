"""The makespan objective: how long one input takes to come out at the sink when branches
on different devices run at the same time.

What is modelled, exactly (the assignment fixes everything; there is no choice left):

* the graph's input is on the source at time 0;
* a **device** runs its layers one at a time, in layer (topological) order: layer i
  starts once every input is on its device and the device has finished the layers
  before it; it takes its compute time plus its device's ``stage_overhead`` if it
  starts a stage (``multigpu.partition.stages``);
* an activation goes once to each other device that consumes it (the cost model's
  transfers, the output to the sink included), as soon as its producer finishes
  (the input: at time 0) and its **link** is free; a link (one per device pair, the
  default link's included) carries one transfer at a time, in either direction, in the
  order of their producers (the input first, then layer order), and a transfer takes
  ``bytes / bandwidth + latency``;
* the makespan is when the last layer's output is on the sink.

On a chain nothing overlaps, so the makespan equals the latency objective's T. Left
out: parameter shipping (the makespan times one pass with the parameters in place),
the CPU of transfers and the hosts' cores (those enter the throughput bottleneck), and
any sharing of bandwidth between links.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from multigpu.partition.cost.arithmetic import AssignmentArrays, assignment_arrays
from multigpu.partition.inputs.cluster import Cluster
from multigpu.partition.inputs.graph import Graph

__all__ = ["Schedule", "makespan_of", "simulate", "simulate_arrays"]


@dataclass(frozen=True)
class Schedule:
    """Seconds from the input's start: each layer's ``start`` and ``finish`` (n,), each
    transfer's ``send`` and ``arrive`` (in ``AssignmentArrays.sends`` order), and the
    ``makespan``."""

    start: np.ndarray
    finish: np.ndarray
    send: np.ndarray
    arrive: np.ndarray
    makespan: float


def simulate(graph: Graph, cluster: Cluster, a: np.ndarray) -> Schedule:
    """The schedule of assignment ``a`` (device columns) as the module defines it;
    UnusableLinkError when it needs a pair with no link."""
    return simulate_arrays(graph, cluster, assignment_arrays(graph, cluster, np.asarray(a, dtype=np.intp), False))


def simulate_arrays(graph: Graph, cluster: Cluster, x: AssignmentArrays) -> Schedule:
    """The schedule from an assignment's arrays (``ship_params`` is not part of it)."""
    n, k = graph.n, cluster.k
    src, sink = cluster.source_index, cluster.sink_index
    a, sd = x.a, x.sends
    work = x.comp + x.t_stage
    # ready[p + 1][v]: when p's output (p = -1: the input) is on device v; -1 = never.
    ready = np.full((n + 1, k), -1.0)
    ready[0, src] = 0.0
    device_free = np.zeros(k)
    link_free = np.zeros((k, k))
    start, finish = np.zeros(n), np.zeros(n)
    send, arrive = np.zeros(len(sd.to)), np.zeros(len(sd.to))
    by_producer = np.searchsorted(sd.producer, np.arange(-1, n + 1))  # sends of p: [by[p+1], by[p+2])

    def ship(p: int) -> None:
        for j in range(by_producer[p + 1], by_producer[p + 2]):
            u, v = int(sd.u[j]), int(sd.v[j])
            send[j] = max(ready[p + 1, u], link_free[u, v])
            arrive[j] = send[j] + sd.time[j]
            link_free[u, v] = link_free[v, u] = arrive[j]
            ready[p + 1, v] = arrive[j]

    ship(-1)
    for i in range(n):
        d = int(a[i])
        start[i] = max(device_free[d], max(ready[p + 1, d] for p in graph.producers[i]))
        finish[i] = device_free[d] = start[i] + work[i]
        ready[i + 1, d] = finish[i]
        ship(i)
    return Schedule(start, finish, send, arrive, float(ready[n, sink]))


def makespan_of(graph: Graph, cluster: Cluster, x: AssignmentArrays) -> float:
    """The makespan of an assignment's arrays: on a chain T without parameter shipping
    (nothing overlaps), else from ``simulate_arrays``."""
    if graph.is_chain:
        return x.time - math.fsum(x.t_param) if x.t_param.any() else x.time
    return simulate_arrays(graph, cluster, x).makespan
