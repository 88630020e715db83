"""The source report's matrix form of an assignment: a one-hot n x k matrix A and k x k
transition matrices L, with the per-choice costs they select."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from multigpu.partition.cost.choices import compute_times, param_times
from multigpu.partition.inputs.cluster import Cluster
from multigpu.partition.inputs.graph import Graph

__all__ = ["MatrixForm", "matrix_form"]


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
    ptime = param_times(graph, cluster, np.arange(k)[None, :]) if ship_params else np.zeros((n, k))
    S = np.zeros((n + 1, k, k))
    oh = cluster.stage_overhead
    S[0] = oh[None, :]                                   # layer 1 always starts a stage
    S[1:n] = np.where(np.eye(k, dtype=bool), 0.0, oh[None, :])[None]
    return MatrixForm(A=A, L=L, compute_time=comp, param_time=ptime, param_power=tab.power[src].copy(),
                      transfer_time=T, device_power=cluster.power.copy(), link_power=tab.power.copy(),
                      stage_time=S)
