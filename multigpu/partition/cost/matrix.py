"""The source report's matrix form of an assignment: a one-hot n x k matrix A and k x k
transition matrices L, with the per-choice costs they select."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from multigpu.partition.cost.arithmetic import single_device, stage_overheads, warm_scale
from multigpu.partition.cost.choices import compute_times, param_times
from multigpu.partition.inputs.cluster import Cluster
from multigpu.partition.inputs.graph import Graph

__all__ = ["MatrixForm", "matrix_form"]


@dataclass(frozen=True)
class MatrixForm:
    """The document's matrix form of an assignment, one transition matrix per edge.

    ``A`` is the one-hot n x k assignment matrix. The edges run from a producer
    (``edge_from``: a layer, -1 for the graph's input at the source) to a consumer
    (``edge_to``: a layer, n for the sink), ordered by consumer: on a chain, the source
    to layer 1, layer i to layer i+1, and layer n to the sink. ``L[e]`` is edge e's
    k x k transition matrix (the document's L_i on a chain). ``compute_time`` (n x k),
    ``param_time`` (n x k) and ``transfer_time`` (edges x k x k: the producer's bytes,
    +inf on unusable pairs) are the per-choice costs; ``stage_time`` (edges x k x k) is
    the stage overhead an edge starts (from the source always, between layers when the
    device changes, never into the sink). An activation crosses to a device once, and a
    layer starts a stage once, so

    T = <A, compute_time + param_time> + sum_p <max_{e from p} L[e], transfer_time[e]>
        + sum_c max_{e into c} <L[e], stage_time[e]>

    (elementwise max over a producer's edges; on a chain every max has one term, and T
    is the document's sum of blocks). ``warm`` (at most 1) scales the compute and stage
    terms of a plan with every layer on one device that has a ``warm_pass``
    (``arithmetic.warm_scale``); it is 1 for every other plan.
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
    edge_from: np.ndarray
    edge_to: np.ndarray
    warm: float = 1.0

    def sends(self) -> np.ndarray:
        """(n+1) x k x k: for each producer (row p + 1) the elementwise max of its edges' L,
        1 where its output goes from u to v."""
        out = np.zeros((self.A.shape[0] + 1,) + self.L.shape[1:])
        np.maximum.at(out, self.edge_from + 1, self.L)
        return out

    def _per_producer(self, per_edge: np.ndarray) -> np.ndarray:
        # Every edge of a producer carries the same bytes, so any edge's matrix will do.
        out = np.zeros((self.A.shape[0] + 1,) + self.L.shape[1:])
        out[self.edge_from + 1] = per_edge
        return out

    def _stages(self, per_edge: np.ndarray) -> float:
        # <L[e], per_edge[e]> for each edge, then the max over each consumer's edges.
        vals = np.sum(np.where(self.L > 0, per_edge, 0.0) * self.L, axis=(1, 2))
        best = np.zeros(self.A.shape[0] + 1)
        np.maximum.at(best, self.edge_to, vals)
        return float(np.sum(best))

    def time(self) -> float:
        """Total time T from the matrix form."""
        S = self.sends()
        moves = np.where(S > 0, self._per_producer(self.transfer_time), 0.0) * S
        return float(
            self.warm * np.sum(self._chosen(self.compute_time))
            + np.sum(self._chosen(self.param_time))
            + np.sum(moves)
            + self.warm * self._stages(self.stage_time)
        )

    def energy(self) -> float:
        """Total energy E from the matrix form."""
        S = self.sends()
        compute = self.warm * np.sum(self._chosen(self.compute_time) * self.device_power[None, :])
        params = np.sum(self._chosen(self.param_time) * self.param_power[None, :])
        moves = np.sum(np.where(S > 0, self._per_producer(self.transfer_time), 0.0) * S * self.link_power[None])
        stages = self.warm * self._stages(self.stage_time * self.device_power[None, None, :])
        return float(compute + params + moves + stages)

    def cost(self, wt: float = 1.0, we: float = 0.0) -> float:
        """wt * T + we * E from the matrix form."""
        return wt * self.time() + we * self.energy()

    def _chosen(self, per_choice: np.ndarray) -> np.ndarray:
        # Unchosen entries may be inf (unreachable); 0 * inf would be NaN.
        return np.where(self.A > 0, per_choice, 0.0) * self.A


def matrix_form(graph: Graph, cluster: Cluster, a: np.ndarray, ship_params: bool) -> MatrixForm:
    """Build the document's matrix form for assignment columns ``a``."""
    n, k = graph.n, cluster.k
    tab = cluster.tables
    src, sink = cluster.source_index, cluster.sink_index
    A = np.zeros((n, k))
    A[np.arange(n), a] = 1.0
    ic = graph.input_consumers
    frm = np.concatenate([graph.edge_src, np.full(len(ic), -1, dtype=np.intp), [n - 1]]).astype(np.intp)
    to = np.concatenate([graph.edge_dst, ic, [n]]).astype(np.intp)
    order = np.lexsort((frm, to))  # by consumer, then producer
    frm, to = frm[order], to[order]
    eye = np.eye(k)
    rows = np.where(frm[:, None] >= 0, A[np.maximum(frm, 0)], eye[src][None, :])
    cols = np.where(to[:, None] < n, A[np.minimum(to, n - 1)], eye[sink][None, :])
    L = rows[:, :, None] * cols[:, None, :]
    out_bytes = np.concatenate([[graph.input_bytes], graph.output_bytes])
    T = out_bytes[frm + 1][:, None, None] * tab.inv_bandwidth[None] + tab.latency_for(out_bytes[frm + 1])
    T[:, np.arange(k), np.arange(k)] = 0.0
    T[:, ~tab.usable] = np.inf
    comp = compute_times(graph, cluster)
    ptime = param_times(graph, cluster, np.arange(k)[None, :]) if ship_params else np.zeros((n, k))
    oh = cluster.stage_overhead
    S = np.zeros((len(frm), k, k))
    S[frm < 0] = oh[None, :]  # the input always starts a stage
    layer_edges = (frm >= 0) & (to < n)
    S[layer_edges] = np.where(np.eye(k, dtype=bool), 0.0, oh[None, :])[None]
    warm = 1.0
    only = single_device(a)
    if only is not None:
        warm = warm_scale(graph, cluster, comp[np.arange(n), a], stage_overheads(graph, cluster, a), only)
    return MatrixForm(
        A=A,
        L=L,
        compute_time=comp,
        param_time=ptime,
        param_power=tab.power[src].copy(),
        transfer_time=T,
        device_power=cluster.power.copy(),
        link_power=tab.power.copy(),
        stage_time=S,
        edge_from=frm,
        edge_to=to,
        warm=warm,
    )
