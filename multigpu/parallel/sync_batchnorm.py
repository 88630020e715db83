"""Synchronized BatchNorm: every replica normalizes with the statistics of the whole batch.

The statistics of one BatchNorm node are gathered as torch's SyncBatchNorm gathers them:
each device computes its shard's per-channel count, mean and centred sum of squares
(``batch_norm_stats``, computed stably on its own shard) into its own row of a table with a
row per device of the job; the tables of the local devices are added on the first device
(``copy_to`` and ``add``, both differentiable) and those of the processes by the group
(``group_sum``, differentiable, so backward sums the gradient of the statistics the same
way). Every row but a device's own is zero, so the sums gather the rows. Every device
then normalizes its shard with the table (``batch_norm_train(..., stats=, count=)``),
which combines the rows with the parallel formula. No step subtracts two large sums (the
sum of squares minus the squared sum), which in float32 loses a channel whose mean is far
above its spread. The whole exchange is inside one autograd graph, so backward needs no
hand-written rule: each framework's own autograd derives it.

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
    process) and ``batch`` the global batch size, which every rank knows (it gives the
    count of values per channel in all; the table carries each device's own). Every rank
    drives the same number of devices. ``stats[0]`` collects every node's global mean and
    unbiased variance (on the first device: the same for every replica).
    """

    training = True

    def __init__(self, devices: Sequence[Device], group: Any | None, batch: int):
        self.devices, self.group, self.batch = list(devices), group, int(batch)
        self.stats: list[list[Any]] = [[]]

    def __call__(
        self, backend: Any, index: int, layer: BatchNorm2d, xs: Sequence[Any], params: Sequence[Sequence[Any]]
    ) -> list[Any]:
        """Normalize every replica's input with the statistics of all of them (and of every process)."""
        b, first = backend, self.devices[0]
        local = len(xs)
        rank, world = (0, 1) if self.group is None else (self.group.rank, self.group.world_size)
        parts = world * local  # one row per device of the job: rank r's devices are rows r*local ...
        table = b.batch_norm_stats(xs[0], rank * local, parts)
        for r, x in enumerate(xs[1:], start=1):
            table = b.add(table, b.copy_to(b.batch_norm_stats(x, rank * local + r, parts), first))
        if self.group is not None:
            table = b.reshape(b.group_sum(b.reshape(table, (-1,)), self.group), b.shape(table))
        _, _, h, w = b.shape(xs[0])
        count = self.batch * h * w
        out = []
        for r, (x, p) in enumerate(zip(xs, params)):
            stats = table if r == 0 else b.copy_to(table, self.devices[r])
            y, mean, var = b.batch_norm_train(x, p[0], p[1], layer.eps, stats=stats, count=count)
            if r == 0:
                self.stats[0] += [mean, var]
            out.append(y)
        return out
