"""The per-choice costs the solvers share (DP, MILP, Lagrangian bounds, throughput): each
layer on each device, and each edge's cost on each pair, weighted by (wt, we), with what the
cluster's engine profile adds (the latency by a transfer's size, the transfer CPU and relay
terms, the busy rates). A solver reads the engine through this table, never the profile."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from multigpu.partition.cost.arithmetic import busy_ratios, warm_pass_of
from multigpu.partition.cost.choices import compute_times, param_energy, param_times
from multigpu.partition.inputs.cluster import Cluster
from multigpu.partition.inputs.graph import Graph

__all__ = ["CostTables"]


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
    def build(cls, graph: Graph, cluster: Cluster, ship_params: bool) -> CostTables:
        """Compute the node tables (vectorized, O(n k))."""
        comp = compute_times(graph, cluster)
        node_time = comp.copy()
        node_energy = comp * cluster.power[None, :]
        if ship_params:
            cols = np.arange(cluster.k)[None, :]
            pt = param_times(graph, cluster, cols)
            node_time = node_time + pt
            node_energy = node_energy + param_energy(cluster, cols, pt)
        return cls(graph, cluster, bool(ship_params), comp, node_time, node_energy)

    # -- what the engine adds (the profile's figures, read here for every solver) --------
    @cached_property
    def busy(self) -> np.ndarray:
        """(k,) the factor on each device's compute and stage overheads in its own stream
        load (its warm pass over its layer times; 1 without one: ``busy_ratios``)."""
        return busy_ratios(self.graph, self.cluster)

    @property
    def has_transfer_cpu(self) -> bool:
        """True when some transfer costs CPU (a device's transfer CPU or a relay)."""
        return self.cluster.engine_vectors.has_transfer_cpu

    @property
    def has_relay(self) -> bool:
        """True when the engine relays transfers between two other devices through one."""
        return self.cluster.engine_vectors.relay is not None

    @property
    def cpu_links(self) -> np.ndarray:
        """(k, k) True for a pair whose transfers are CPU work of one host, not link load."""
        return self.cluster.engine_vectors.cpu_links

    @property
    def two_latencies(self) -> bool:
        """True when the links price small transfers apart (the profile's inline regime)."""
        return self.cluster.tables.inline_latency is not None

    def warm_pass(self, device: int) -> float | None:
        """The seconds of a whole pass with every layer on ``device`` (a column) run item
        after item, where the profile has one for this graph (``warm_pass_of``), else None."""
        return warm_pass_of(self.graph, self.cluster, device)

    def transfer_cpu(
        self, u: np.ndarray, v: np.ndarray, nbytes: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The CPU of transfers u[j] -> v[j] of nbytes[j] as (j, device, seconds, serial
        seconds) terms: the coefficients of the throughput MILP's device and host rows
        (``EngineVectors.transfer_cpu_terms``)."""
        return self.cluster.engine_vectors.transfer_cpu_terms(u, v, nbytes)

    def node(self, wt: float, we: float) -> np.ndarray:
        """n x k weighted node cost (+inf where impossible)."""
        if we == 0:
            return wt * self.node_time
        if wt == 0:
            return we * self.node_energy
        return wt * self.node_time + we * self.node_energy

    def edge(self, wt: float, we: float, nbytes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(alpha, beta, blocked): edge cost is b * alpha + beta, and +inf where
        ``blocked`` (unusable pairs). alpha and beta are 0 on the diagonal; beta[u, v]
        includes the stage overhead of v (a change of device starts a stage). With
        ``nbytes`` (one size per edge) on a cluster that prices small transfers apart
        (``inline_bytes``), beta is (len(nbytes), k, k): one latency table per edge."""
        return self._edge(wt, we, True, nbytes)

    def _edge(
        self, wt: float, we: float, stage: bool, nbytes: Any | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(alpha, beta, blocked); beta takes the latency by ``nbytes``'s size (one table per
        size) only on a cluster that prices small transfers apart, else it is k x k."""
        tab = self.cluster.tables
        weight = wt + we * tab.power
        alpha = weight * tab.inv_bandwidth
        by_size = nbytes is not None and tab.inline_latency is not None
        beta = weight * (tab.latency_for(nbytes) if by_size else tab.latency)
        if stage:
            beta = beta + self._stage(wt, we)[None, :]
            k = self.cluster.k
            beta[..., np.arange(k), np.arange(k)] = 0.0
        return alpha, beta, ~tab.usable

    def stage(self, wt: float, we: float) -> np.ndarray:
        """(k,) weighted cost of starting a stage on each device."""
        return self._stage(wt, we)

    def input_send(self, wt: float, we: float) -> np.ndarray:
        """Cost (k,) of sending the graph's input from the source to each device (0 on the
        source, +inf where unusable), without any stage start."""
        return self.edge_matrix(self.graph.input_bytes, wt, we, stage=False)[self.cluster.source_index].copy()

    def _stage(self, wt: float, we: float) -> np.ndarray:
        """(k,) weighted cost of starting a stage on each device."""
        return (wt + we * self.cluster.power) * self.cluster.stage_overhead

    def edge_matrix(self, nbytes: float, wt: float, we: float, stage: bool = True) -> np.ndarray:
        """k x k weighted cost of moving ``nbytes`` between each pair (+inf if unusable),
        with the receiver's stage overhead unless ``stage`` is False."""
        alpha, beta, blocked = self._edge(wt, we, stage, nbytes)
        m = nbytes * alpha + beta
        np.fill_diagonal(m, 0.0)
        m[blocked] = np.inf
        return m

    def edge_costs(self, nbytes: np.ndarray, wt: float, we: float, stage: bool) -> np.ndarray:
        """(m, k, k) weighted cost of moving ``nbytes[j]`` between each pair: ``nbytes *
        alpha + beta`` (with the receiver's stage overhead when ``stage``), 0 on the
        diagonal, +inf where unusable."""
        nb = np.asarray(nbytes, dtype=float)
        alpha, beta, blocked = self._edge(wt, we, stage, nb)
        m = nb[:, None, None] * alpha[None] + (beta if beta.ndim == 3 else beta[None])
        m[:, np.arange(self.cluster.k), np.arange(self.cluster.k)] = 0.0
        m[:, blocked] = np.inf
        return m

    def first_edge(self, wt: float, we: float) -> np.ndarray:
        """Cost (k,) of sending the input from the source to layer 1 on each device,
        plus starting the first stage there (for a graph whose input has one consumer)."""
        row = self.edge_matrix(self.graph.input_bytes, wt, we)[self.cluster.source_index].copy()
        src = self.cluster.source_index
        row[src] = self._stage(wt, we)[src]  # the diagonal of edge_matrix is 0, but a stage starts
        return row

    def last_edge(self, wt: float, we: float) -> np.ndarray:
        """Cost (k,) of sending the last layer's output from each device to the sink."""
        # No stage starts at the sink.
        m = self.edge_matrix(float(self.graph.output_bytes[-1]), wt, we, stage=False)
        return m[:, self.cluster.sink_index].copy()
