"""Synchronized BatchNorm: every replica normalizes with the statistics of the whole batch.

The statistics of one BatchNorm node are the per-channel sum and sum of squares of
every device's shard: each device computes its own (``batch_norm_sums``), the local
ones are added on the first device (``copy_to`` and ``add``, both differentiable),
the process group adds the processes' (``group_sum``, differentiable, so backward
sums the gradient of the statistics the same way), and every device normalizes its
shard with the total (``batch_norm_train(..., sums=, count=)``). The whole exchange is
inside one autograd graph, so backward needs no hand-written rule: it is torch's
SyncBatchNorm, derived by each framework's own autograd.

This needs every device's forward to meet at each BatchNorm node, so the step runs all
local replicas in one ``value_and_grad`` (``Model.apply`` walks them in lockstep).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from multigpu.contract.protocol import Device
from multigpu.models.layers import BatchNorm2d


class SynchronizedStatistics:
    """A BatchNorm mode (``multigpu.models.batchnorm``) with statistics over the global batch.

    ``devices[r]`` is replica r's device, ``group`` the process group (None in one
    process) and ``batch`` the global batch size, which every rank knows, so the count
    of values per channel needs no exchange. ``stats[0]`` collects every node's global
    mean and unbiased variance (on the first device: the same for every replica).
    """

    training = True

    def __init__(self, devices: Sequence[Device], group: Any | None, batch: int):
        self.devices, self.group, self.batch = list(devices), group, int(batch)
        self.stats: list[list[Any]] = [[]]

    def __call__(
        self, backend: Any, index: int, layer: BatchNorm2d, xs: Sequence[Any], params: Sequence[Sequence[Any]]
    ) -> list[Any]:
        """Normalize every replica's input with the sums of all of them (and of every process)."""
        b, first = backend, self.devices[0]
        total = b.batch_norm_sums(xs[0])
        for x in xs[1:]:
            total = b.add(total, b.copy_to(b.batch_norm_sums(x), first))
        shape = b.shape(total)
        if self.group is not None:
            total = b.reshape(b.group_sum(b.reshape(total, (-1,)), self.group), shape)
        _, _, h, w = b.shape(xs[0])
        count = self.batch * h * w
        out = []
        for r, (x, p) in enumerate(zip(xs, params)):
            sums = total if r == 0 else b.copy_to(total, self.devices[r])
            y, mean, var = b.batch_norm_train(x, p[0], p[1], layer.eps, sums=sums, count=count)
            if r == 0:
                self.stats[0] += [mean, var]
            out.append(y)
        return out
