"""How a model's BatchNorm layers get their statistics while it runs: the BatchNorm modes.

A model (``multigpu.models.graph.Model``) runs its nodes on one or more replicas in
lockstep; at each BatchNorm node it hands the inputs of every replica to its mode,
which returns the outputs. The modes:

* :class:`RunningStatistics`: inference; each replica normalizes with its own running
  statistics (the state it keeps);
* :class:`BatchStatistics`: training with each replica's own batch statistics (the
  chapter's separate statistics per device, DDP's default); it collects every node's
  batch mean and unbiased variance per replica, in state order, for the core to update
  the running statistics with;
* ``multigpu.parallel.sync_batchnorm.SynchronizedStatistics``: training with the
  statistics of the whole batch across devices and processes (torch's SyncBatchNorm).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from multigpu.models.layers import BatchNorm2d


@runtime_checkable
class BatchNormMode(Protocol):
    """What a model calls at each BatchNorm node."""

    #: True when the mode uses batch statistics (a training step).
    training: bool

    def __call__(
        self, backend: Any, index: int, layer: BatchNorm2d, xs: Sequence[Any], params: Sequence[Sequence[Any]]
    ) -> list[Any]:
        """Return the outputs of BatchNorm node number ``index`` (in state order) for every replica.

        ``xs[r]`` is replica r's input, ``params[r]`` its (gamma, beta).
        """


class RunningStatistics:
    """Inference: normalize with each replica's running statistics.

    ``states[r]`` is replica r's state list (running mean, running variance per
    BatchNorm node, in the model's state order).
    """

    training = False

    def __init__(self, states: Sequence[Sequence[Any]]):
        self.states = states

    def __call__(
        self, backend: Any, index: int, layer: BatchNorm2d, xs: Sequence[Any], params: Sequence[Sequence[Any]]
    ) -> list[Any]:
        """Normalize each replica's input with its own running mean and variance."""
        return [
            backend.batch_norm(x, p[0], p[1], state[2 * index], state[2 * index + 1], layer.eps)
            for x, p, state in zip(xs, params, self.states)
        ]


class BatchStatistics:
    """Training with each replica's own batch statistics.

    ``stats[r]`` collects replica r's (mean, unbiased variance) per node, in state
    order: the same layout as the state, so one whole-buffer update folds them in.
    """

    training = True

    def __init__(self, replicas: int = 1):
        self.stats: list[list[Any]] = [[] for _ in range(replicas)]

    def __call__(
        self, backend: Any, index: int, layer: BatchNorm2d, xs: Sequence[Any], params: Sequence[Sequence[Any]]
    ) -> list[Any]:
        """Normalize each replica's input with its own batch statistics; keep them."""
        out = []
        for x, p, stats in zip(xs, params, self.stats):
            y, mean, var = backend.batch_norm_train(x, p[0], p[1], layer.eps)
            stats += [mean, var]
            out.append(y)
        return out
