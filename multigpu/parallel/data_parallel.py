"""Data-parallel SGD, written once against the backend protocol.

One step: split the minibatch across devices, compute the summed per-example loss
and its gradients on each device, allreduce (sum) the gradients, and apply
``p -= lr / global_batch * g`` on every replica, as the textbook does. With a
process group the sum also crosses processes, after the local devices have
reduced in-process.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np

from multigpu.checks import check_count, check_positive
from multigpu.contract.devices import DeviceSpec, resolve_devices
from multigpu.contract.protocol import Device
from multigpu.contract.registry import backend as get_backend
from multigpu.errors import DeviceError, ModelError
from multigpu.models.inputs import check_batch, check_images
from multigpu.models.sequential import Sequential
from multigpu.parallel.allreduce import (
    allreduce_flat,
    allreduce_grads,
    check_algorithm,
    reduce_to_first,
    views_per_buffer,
)
from multigpu.parallel.process_group import ProcessGroup, allreduce_numpy
from multigpu.parallel.split import shard_sizes, split_batch


class DataParallel:
    """Train ``model`` with synchronous data-parallel SGD on several devices of one backend.

    ``devices`` is N (GPUs when the framework sees them, else N CPU replicas with a
    warning), ``"cpu:N"``, ``"gpu:0,1"`` or a list of Device. ``params`` is a list of
    numpy arrays in model order; None draws the textbook init from ``seed``.
    ``process_group`` (a ``multigpu.parallel.process_group.ProcessGroup``) extends the sum
    across processes: every rank then passes the same global batch to
    ``train_batch`` and trains on its own shard of it, and rank 0's parameters are
    broadcast to every rank at start.
    """

    def __init__(self, model: Sequential, backend: Union[str, Any] = "numpy",
                 devices: DeviceSpec = 1, lr: float = 0.1,
                 params: Optional[Sequence[np.ndarray]] = None, allreduce: str = "fused",
                 seed: int = 0, process_group: Optional[ProcessGroup] = None):
        if not isinstance(model, Sequential):
            raise ModelError(f"model must be a multigpu Sequential, got {type(model).__name__}; "
                             "e.g. multigpu.models.lenet()")
        self.model = model
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        self.allreduce = check_algorithm(self.backend, allreduce)
        self.lr = lr
        self.devices: list[Device] = resolve_devices(self.backend, devices)
        self.process_group = process_group
        host = model.init_params(seed) if params is None else model.check_params(params)
        self.replicas = [[self.backend.from_numpy(p, d) for p in host] for d in self.devices]
        if process_group is not None:
            self._check_device_counts()
            self.broadcast_params()

    @property
    def lr(self) -> float:
        """The learning rate (per global batch, as in the textbook)."""
        return self._lr

    @lr.setter
    def lr(self, value: float) -> None:
        self._lr = check_positive(value, "lr", example=0.2)

    @property
    def rank(self) -> int:
        """This process's rank in the process group (0 without one)."""
        return 0 if self.process_group is None else self.process_group.rank

    @property
    def world_size(self) -> int:
        """How many processes train together (1 without a process group)."""
        return 1 if self.process_group is None else self.process_group.world_size

    def _check_device_counts(self) -> None:
        # local_shards splits every batch into world_size * n shards: every rank must
        # drive the same number of devices for the shards to cover the batch exactly.
        assert self.process_group is not None
        n = len(self.devices)
        total = allreduce_numpy(self.process_group, self.backend, np.array([n], np.float32))[0]
        if total != n * self.world_size:
            raise DeviceError(
                f"rank {self.rank} drives {n} device(s) but the {self.world_size} ranks drive {int(total)} in "
                "all; give every rank the same device count (e.g. the same --gpus)")

    def broadcast_params(self) -> None:
        """Overwrite every rank's replicas with rank 0's parameters (a no-op without a group)."""
        b, group = self.backend, self.process_group
        if group is None:
            return
        flat = b.flatten(self.replicas[0])
        group.broadcast_(flat, 0)
        views = b.unflatten(flat, self.model.param_shapes)
        for params in self.replicas:
            for p, v in zip(params, views):
                b.assign_(p, v)

    def _loss(self, params: Sequence[Any], x: Any, y: Any) -> Any:
        b = self.backend
        return b.sum(b.softmax_cross_entropy(self.model.forward(b, params, x), y))

    def local_shards(self, X: np.ndarray, y: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Return this process's shards of the global batch, one per local device.

        The global batch is split into ``world_size * len(devices)`` consecutive
        shards; rank r takes shards ``r*n .. r*n+n-1``. One process with k devices
        and k processes with one device each therefore see the same shards.
        """
        n = len(self.devices)
        shards = split_batch(X, y, self.world_size * n)
        return shards[self.rank * n : (self.rank + 1) * n]

    def train_batch(self, X: np.ndarray, y: np.ndarray) -> float:
        """Run one SGD step on the (global) minibatch; return its mean per-example loss.

        Forward and backward are queued on every device before anything crosses
        devices or returns to the host; the loss is read once, after the update.
        Raises InputError for a bad batch (shape, dtype, labels, empty, or fewer rows
        than devices).
        """
        X, y = check_batch(self.model, X, y)
        b = self.backend
        shards = self.local_shards(X, y)
        announce = getattr(self.process_group, "announce", None)
        if announce is not None:  # the check of the gradient allreduce overlaps the computation
            announce("allreduce_", sum(int(np.prod(s)) for s in self.model.param_shapes) + 1)
        flats = [b.value_and_grad(self._loss, params, b.from_numpy(xs, d), b.from_numpy(ys, d))
                 for d, params, (xs, ys) in zip(self.devices, self.replicas, shards)]
        grads, loss = self._sum(flats)
        for params, g in zip(self.replicas, grads):
            b.sgd_(params, g, self.lr / len(X))
        return float(b.to_numpy(loss).reshape(())) / len(X)

    def _sum(self, flats: list[Any]) -> tuple[list[Sequence[Any]], Any]:
        """Sum [grads..., loss] buffers over devices (and processes); return (grads per device, loss)."""
        b, group, n = self.backend, self.process_group, len(self.devices)
        shapes = [*self.model.param_shapes, (1,)]
        if self.allreduce == "fused":
            sums = allreduce_flat(b, flats, self.devices, group)
            views = views_per_buffer(b, sums, shapes)  # CPU replicas share one sum
            return [views[id(f)][:-1] for f in sums], views[id(sums[0])][-1]
        views = [b.unflatten(f, shapes) for f in flats]
        allreduce_grads(b, [v[:-1] for v in views], self.devices, self.allreduce)
        reduce_to_first(b, [v[-1] for v in views])
        if group is None:
            return [v[:-1] for v in views], views[0][-1]
        group.allreduce_(flats[0])  # the local sum, loss included, crosses processes once
        return [views[0][:-1]] * n, views[0][-1]  # sgd_ moves grads to each device

    def get_params(self, replica: int = 0) -> list[np.ndarray]:
        """Return the parameters of one replica as numpy arrays, in model order."""
        return [self.backend.to_numpy(p) for p in self.replicas[replica]]

    def set_params(self, params: Sequence[np.ndarray]) -> None:
        """Overwrite every replica with ``params`` (numpy arrays in model order)."""
        host = self.model.check_params(params)
        self.replicas = [[self.backend.from_numpy(p, d) for p in host] for d in self.devices]

    def synchronize(self) -> None:
        """Wait until every device has finished its queued work."""
        for d in self.devices:
            self.backend.synchronize(d)

    def predict(self, X: np.ndarray, batch_size: int = 1024) -> np.ndarray:
        """Return predicted classes; each device classifies its own share of ``X``.

        Raises InputError for bad images (see ``train_batch``) or a batch_size that
        is not a positive integer.
        """
        X = check_images(self.model, X)
        check_count(batch_size, "batch_size", example=1024)
        b, n = self.backend, len(self.devices)
        out = np.empty(len(X), np.int64)
        step = batch_size * n
        for start in range(0, len(X), step):
            chunk = X[start : start + step]
            parts = min(n, len(chunk))  # the last chunk may be smaller than the device count
            offset = start
            pending = []
            for d, params, size in zip(self.devices, self.replicas, shard_sizes(len(chunk), parts)):
                x = b.from_numpy(X[offset : offset + size], d)
                pending.append((offset, size, b.argmax(self.model.forward(b, params, x), 1)))
                offset += size
            for o, size, pred in pending:  # read back after every device has been queued
                out[o : o + size] = b.to_numpy(pred)
        return out

    def evaluate(self, X: np.ndarray, y: np.ndarray, batch_size: int = 1024) -> float:
        """Return accuracy in [0, 1], computed on all devices, each taking a share.

        With a process group every rank passes the same ``X``; rank r classifies its
        consecutive share r of ``world_size`` and the correct counts are summed across
        ranks, so every rank returns the same accuracy.
        """
        X, y = check_batch(self.model, X, y)
        check_count(batch_size, "batch_size", example=1024)
        if self.process_group is None:
            return float((self.predict(X, batch_size) == y).mean())
        xs, ys = split_batch(X, y, self.world_size)[self.rank]
        correct = np.array([(self.predict(xs, batch_size) == ys).sum()], np.float32)
        return float(allreduce_numpy(self.process_group, self.backend, correct)[0]) / len(X)

