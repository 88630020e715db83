"""Data-parallel training, written once against the backend protocol.

One step: split the minibatch across devices, compute the summed per-example loss
and its gradients on each device, allreduce (sum) the gradients, and let the
optimizer update every replica with the gradient of the mean loss (``1 / global
batch`` times the sum), as the textbook does for SGD. With a process group the sum
also crosses processes, after the local devices have reduced in-process.

Each replica holds its parameters, its optimizer state and its BatchNorm running
statistics as flat buffers with per-parameter views: the forward reads the views,
the optimizer and the running-statistics update are a few whole-buffer calls.

BatchNorm has two modes. Per-device statistics (the default; the chapter's separate
statistics per device, DDP's default): each device normalizes with its own shard's
statistics and folds them into its own running statistics. Synchronized statistics
(``sync_bn=True``, torch's SyncBatchNorm): the statistics are summed over every
device and process, so k devices train exactly as one device on the whole batch;
the step then runs every local replica in one ``value_and_grad``, in lockstep, from
the first replica's parameters copied to each device (copies are differentiable, so
backward sums the devices' gradients on the first one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from multigpu.checks import check_count, check_positive
from multigpu.contract.bucket_signals import KeptBuffers
from multigpu.contract.devices import DeviceSpec, resolve_devices
from multigpu.contract.protocol import Device
from multigpu.contract.registry import backend as get_backend
from multigpu.contract.registry import default_backend
from multigpu.errors import DeviceError, InputError, ModelError, ParamsError
from multigpu.models.batchnorm import BatchStatistics, RunningStatistics
from multigpu.models.context import RunContext
from multigpu.models.graph import Model
from multigpu.models.inputs import check_batch, check_images
from multigpu.models.layers import BatchNorm2d
from multigpu.optim.base import Optimizer
from multigpu.optim.choice import make_optimizer
from multigpu.parallel.allreduce import (
    allreduce_flat,
    allreduce_grads,
    check_algorithm,
    reduce_to_first,
    views_per_buffer,
)
from multigpu.parallel.buckets import DEFAULT_BUCKET_MB, BucketedSum, plan_buckets
from multigpu.parallel.process_group import ProcessGroup, allreduce_numpy
from multigpu.parallel.split import shard_sizes, split_batch
from multigpu.parallel.sync_batchnorm import SynchronizedStatistics
from multigpu.parallel.token_batches import IGNORE_INDEX, check_token_batch, counted, is_token_model


def _flat(arrays: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate([a.reshape(-1) for a in arrays]).astype(np.float32) if arrays else np.zeros(0, np.float32)


def _split(flat: np.ndarray, shapes: Sequence[Sequence[int]]) -> list[np.ndarray]:
    bounds = np.cumsum([0, *(int(np.prod(s)) for s in shapes)])
    return [flat[a:b].reshape(s).copy() for a, b, s in zip(bounds[:-1], bounds[1:], shapes)]


#: The learning rate ``DataParallel``, ``train()`` and ``multigpu train`` share: the textbook's for
#: LeNet at batch 256.
DEFAULT_LR = 0.2


def _queued(k: int) -> None:
    """Bucket k of a device before the last is in its buffer: the last device's signal starts the sum."""


class DataParallel:
    """Train ``model`` with synchronous data parallelism on several devices of one backend.

    ``devices`` is N (GPUs when the framework sees them, else N CPU replicas with a
    warning), ``"cpu:N"``, ``"gpu:0,1"`` or a list of Device. ``params`` is a list of
    numpy arrays in model order; None draws the model's init from ``seed``. ``state``
    is the BatchNorm running statistics (``model.state_shapes``) for every replica;
    None starts them at mean 0, variance 1. ``optimizer`` is an ``multigpu.optim``
    optimizer or its name (default plain SGD, the textbook's); ``lr`` is its learning
    rate, which a schedule may change between steps. ``sync_bn`` synchronizes
    BatchNorm statistics across devices and processes. ``backend`` is a backend name or
    object; None picks the process group's backend, else the first installed of torch,
    paddle and mxnet, else numpy (the rule ``train()`` and ``multigpu train`` follow).
    ``process_group`` (a ``multigpu.parallel.process_group.ProcessGroup``) extends the sum
    across processes: every rank then passes the same global batch to
    ``train_batch`` and trains on its own shard of it, and rank 0's parameters,
    optimizer state and running statistics are broadcast to every rank at start.
    With a group whose engine sums asynchronously the gradients cross processes in
    buckets of up to ``bucket_mb`` MiB (the first 1 MiB), each started while backward
    still runs (``multigpu.parallel.buckets``); ``bucket_mb=None`` sums one buffer after
    backward instead.

    A token model (integer inputs: ``multigpu.models.gpt(...)``) trains on ids and next-token
    labels (``multigpu.parallel.token_batches``): the loss is the per-position cross-entropy
    averaged over the counted positions of the global batch, with dropout drawn in the core
    from ``seed``, the step count and each replica's rows; ``token_loss`` evaluates it.
    """

    def __init__(
        self,
        model: Model,
        backend: str | Any | None = None,
        devices: DeviceSpec = 1,
        lr: float = DEFAULT_LR,
        params: Sequence[np.ndarray] | None = None,
        allreduce: str = "fused",
        seed: int = 0,
        process_group: ProcessGroup | None = None,
        *,
        optimizer: str | Optimizer = "sgd",
        sync_bn: bool = False,
        state: Sequence[np.ndarray] | None = None,
        bucket_mb: float | None = DEFAULT_BUCKET_MB,
    ):
        if not isinstance(model, Model):
            raise ModelError(
                f"model must be a multigpu model (Model or Sequential), got {type(model).__name__}; "
                "e.g. multigpu.models.lenet()"
            )
        if not isinstance(sync_bn, bool):
            raise InputError(f"sync_bn={sync_bn!r} must be True or False")
        self.model = model
        self.tokens = is_token_model(model)  # trains on (ids, next-token labels): see token_batches
        if self.tokens and model.batch_norms:
            raise ModelError(f"model {model.name!r} takes token ids and has BatchNorm; a token model trains without it")
        self.seed = seed  # also the dropout seed: masks depend on (seed, node, step) alone
        if backend is None:  # the group's engine decides; else the first installed framework
            backend = getattr(process_group, "backend", None) or default_backend()
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        self.allreduce = check_algorithm(self.backend, allreduce)
        self.optimizer = make_optimizer(optimizer)
        self.lr = lr
        self.sync_bn = sync_bn
        self.devices: list[Device] = resolve_devices(self.backend, devices)
        self.process_group = process_group
        self.steps = 0  # optimizer steps taken (torch's step counter)
        self._grad_buffers: dict[int, Any] = {}  # per replica: [gradients..., loss], kept between steps
        self._bucket_bufs: dict[int, KeptBuffers] = {}  # per replica, with buckets: one such buffer per bucket
        self._update_views: dict[int, tuple[list[Any], list[list[Any]]]] = {}  # per replica: _bucket_updates' views
        self._param_size = model.num_params()
        self.bucket_mb = bucket_mb
        self._layout = None if bucket_mb is None else plan_buckets(model.param_shapes, bucket_mb)
        host = model.init_params(seed) if params is None else model.check_params(params)
        self._place_params(host)
        self.opt_state = [
            [self.backend.from_numpy(np.zeros(self._param_size, np.float32), d) for _ in range(self.optimizer.buffers)]
            for d in self.devices
        ]
        self.has_bn = bool(model.batch_norms)
        momenta = {cast(BatchNorm2d, model.nodes[i].layer).momentum for i in model.batch_norms}
        self._bn_momentum = momenta.pop() if len(momenta) == 1 else None  # one whole-buffer update when equal
        self._place_state([model.init_state() if state is None else model.check_state(state)] * len(self.devices))
        if process_group is not None:
            self._check_device_counts()
            self.broadcast_params()

    # -- settings ------------------------------------------------------------------
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

    @property
    def synchronized(self) -> bool:
        """True when the step synchronizes BatchNorm statistics (there is more than one device to sync)."""
        return self.sync_bn and self.has_bn and len(self.devices) * self.world_size > 1

    def _check_device_counts(self) -> None:
        # local_shards splits every batch into world_size * n shards: every rank must
        # drive the same number of devices for the shards to cover the batch exactly.
        assert self.process_group is not None
        n = len(self.devices)
        total = allreduce_numpy(self.process_group, self.backend, np.array([n], np.float32))[0]
        if total != n * self.world_size:
            raise DeviceError(
                f"rank {self.rank} drives {n} device(s) but the {self.world_size} ranks drive {int(total)} in "
                "all; give every rank the same device count (e.g. the same --devices)"
            )

    # -- parameters and state -------------------------------------------------------
    def _place_params(self, host: Sequence[np.ndarray]) -> None:
        b, flat = self.backend, _flat(host)
        self.flat_params = [b.from_numpy(flat, d) for d in self.devices]
        self.replicas = [b.unflatten(f, self.model.param_shapes) for f in self.flat_params]

    def _place_state(self, per_replica: Sequence[Sequence[np.ndarray]]) -> None:
        b = self.backend
        self.flat_state = [b.from_numpy(_flat(s), d) for s, d in zip(per_replica, self.devices)]
        self.states = [b.unflatten(f, self.model.state_shapes) for f in self.flat_state]

    def broadcast_params(self) -> None:
        """Overwrite every rank's parameters, optimizer state and running statistics with rank 0's
        (a no-op without a group)."""
        b, group = self.backend, self.process_group
        if group is None:
            return
        for flat in [self.flat_params[0], *self.opt_state[0]]:
            group.broadcast_(flat, 0)
        for flat in self.flat_params[1:]:
            b.assign_(flat, self.flat_params[0])
        for per in self.opt_state[1:]:
            for dst, src in zip(per, self.opt_state[0]):
                b.assign_(dst, src)
        if self.has_bn:
            # every local replica's statistics, rank 0's device i to every rank's device i
            stacked = b.flatten(self.flat_state)
            group.broadcast_(stacked, 0)
            views = b.unflatten(stacked, [b.shape(self.flat_state[0])] * len(self.devices))
            for dst, view in zip(self.flat_state, views):
                b.assign_(dst, view)

    def get_params(self, replica: int = 0) -> list[np.ndarray]:
        """Return the parameters of one replica as numpy arrays, in model order."""
        return _split(self.backend.to_numpy(self.flat_params[replica]), self.model.param_shapes)

    def set_params(self, params: Sequence[np.ndarray]) -> None:
        """Overwrite every replica with ``params`` (numpy arrays in model order)."""
        flat = _flat(self.model.check_params(params))
        for dst, d in zip(self.flat_params, self.devices):
            self.backend.assign_(dst, self.backend.from_numpy(flat, d))

    def get_state(self, replica: int = 0) -> list[np.ndarray]:
        """Return one replica's BatchNorm running statistics (``model.state_shapes``) as numpy arrays."""
        return _split(self.backend.to_numpy(self.flat_state[replica]), self.model.state_shapes)

    def set_state(self, state: Sequence[np.ndarray], replica: int | None = None) -> None:
        """Overwrite the running statistics of ``replica`` (default: every replica) with ``state``."""
        flat = _flat(self.model.check_state(state))
        targets = range(len(self.devices)) if replica is None else [replica]
        for r in targets:
            self.backend.assign_(self.flat_state[r], self.backend.from_numpy(flat, self.devices[r]))

    def gather_states(self) -> np.ndarray:
        """Return every replica's running statistics as a (world_size * devices, size) array,
        rank r's device i in row r * devices + i; every rank gets all (a collective)."""
        b, n = self.backend, len(self.devices)
        size = sum(int(np.prod(s)) for s in self.model.state_shapes)
        rows: np.ndarray = np.zeros((self.world_size * n, size), np.float32)
        for i in range(n):
            rows[self.rank * n + i] = b.to_numpy(self.flat_state[i])
        if self.process_group is not None and size:
            rows = allreduce_numpy(self.process_group, b, rows).reshape(rows.shape)  # zeros elsewhere: a gather
        return rows

    def scatter_states(self, rows: np.ndarray | None) -> None:
        """Set each local replica's running statistics from ``gather_states``' layout.

        With a process group ``rows`` is read on rank 0 only (the others pass None) and
        broadcast, so every rank takes its own rows. Raises ParamsError for the wrong
        number of replicas or values.
        """
        b, n = self.backend, len(self.devices)
        size = sum(int(np.prod(s)) for s in self.model.state_shapes)
        total = self.world_size * n
        if self.rank == 0:
            rows = np.asarray(rows, np.float32)
            if rows.shape != (total, size):
                raise ParamsError(
                    f"running statistics of shape {rows.shape}, but this job has {total} replicas of "
                    f"{size} values; resume with the same model, devices and processes"
                )
        if self.process_group is not None:
            flat = b.from_numpy(
                rows.reshape(-1) if self.rank == 0 and rows is not None else np.zeros(total * size, np.float32),
                self.process_group.device,
            )
            self.process_group.broadcast_(flat, 0)
            rows = b.to_numpy(flat).reshape(total, size)
        assert rows is not None
        for i in range(n):
            self.set_state(_split(rows[self.rank * n + i], self.model.state_shapes), replica=i)

    def get_optimizer_state(self) -> list[np.ndarray]:
        """Return replica 0's optimizer buffers (every replica holds the same) as flat numpy arrays."""
        return [self.backend.to_numpy(t) for t in self.opt_state[0]]

    def set_optimizer_state(self, buffers: Sequence[np.ndarray], steps: int) -> None:
        """Overwrite every replica's optimizer buffers and the step count (e.g. from a checkpoint)."""
        if len(buffers) != self.optimizer.buffers or any(np.shape(a) != (self._param_size,) for a in buffers):
            raise ParamsError(
                f"{self.optimizer.name} keeps {self.optimizer.buffers} buffer(s) of "
                f"{self._param_size} values, got shapes {[np.shape(a) for a in buffers]}"
            )
        self.steps = check_count(steps, "steps", minimum=0)
        for per, d in zip(self.opt_state, self.devices):
            for dst, src in zip(per, buffers):
                self.backend.assign_(dst, self.backend.from_numpy(np.asarray(src, np.float32), d))

    # -- the step ---------------------------------------------------------------------
    def _loss(self, params: Sequence[Any], x: Any, y: Any) -> Any:
        b = self.backend
        if not self.has_bn:
            return b.sum(b.softmax_cross_entropy(self.model.apply(b, [params], [x])[0], y))
        mode = BatchStatistics()
        out = self.model.apply(b, [params], [x], mode)[0]
        return b.sum(b.softmax_cross_entropy(out, y)), mode.stats[0]

    def _sync_loss(self, params: Sequence[Any], *shards: Any) -> Any:
        """Every local replica in lockstep, from the first replica's parameters (copied to each device)."""
        b, n, first = self.backend, len(self.devices), self.devices[0]
        xs, ys = shards[:n], shards[n:]
        per_device = [list(params)] + [[b.copy_to(p, d) for p in params] for d in self.devices[1:]]
        mode = SynchronizedStatistics(self.devices, self.process_group, self._global_batch)
        outs = self.model.apply(b, per_device, xs, mode)
        total = None
        for r, (out, y) in enumerate(zip(outs, ys)):
            loss = b.sum(b.softmax_cross_entropy(out, y))
            loss = loss if r == 0 else b.copy_to(loss, first)
            total = loss if total is None else b.add(total, loss)
        return total, mode.stats[0]

    def local_shards(self, X: np.ndarray, y: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Return this process's shards of the global batch, one per local device.

        The global batch is split into ``world_size * len(devices)`` consecutive
        shards; rank r takes shards ``r*n .. r*n+n-1``. One process with k devices
        and k processes with one device each therefore see the same shards.
        """
        n = len(self.devices)
        shards = split_batch(X, y, self.world_size * n)
        return shards[self.rank * n : (self.rank + 1) * n]

    def _check_shards(self, batch: int, shards: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        """BatchNorm in training needs two values per channel: refuse a shard too small, naming the node."""
        need = self.model.min_training_examples()
        if not need or max(need.values()) < 2:
            return
        node = next(k for k, v in need.items() if v >= 2)
        if self.synchronized:
            if batch < 2:
                raise InputError(
                    f"BatchNorm node {node!r} of {self.model.name} normalizes 1x1 planes, so in training "
                    f"the batch needs at least 2 examples, got {batch}"
                )
            return
        for d, (xs, _) in zip(self.devices, shards):
            if len(xs) < 2:
                raise InputError(
                    f"BatchNorm node {node!r} of {self.model.name} normalizes 1x1 planes, so in training each "
                    f"device's shard needs at least 2 examples, but device {d} gets {len(xs)} of the batch of "
                    f"{batch} (its batch variance would be undefined); use a batch of at least "
                    f"{2 * len(self.devices) * self.world_size}, or sync_bn=True"
                )

    def train_batch(self, X: np.ndarray, y: np.ndarray) -> float:
        """Run one optimizer step on the (global) minibatch; return its mean per-example loss.

        Forward and backward are queued on every device before anything crosses
        devices or returns to the host; the loss is read once, after the update.
        Raises InputError for a bad batch (shape, dtype, labels, empty, fewer rows
        than devices, or too few for BatchNorm in training).

        A token model (``self.tokens``) takes the ids ``(B, T)`` or ``{input name: (B, T)}`` and
        the labels ``(B, T)`` (``IGNORE_INDEX`` where not counted); its loss is the mean over the
        counted positions of the global batch, with dropout on (``RunContext(training=True)``,
        this trainer's seed and step).
        """
        if self.tokens:
            return self._train_tokens(X, y)
        X, y = check_batch(self.model, X, y)
        b = self.backend
        shards = self.local_shards(X, y)
        if self.has_bn:
            self._check_shards(len(X), shards)
        n = len(self.devices)
        if self.synchronized:
            self._global_batch = len(X)
            inputs = [b.from_numpy(xs, d) for d, (xs, _) in zip(self.devices, shards)]
            inputs += [b.from_numpy(ys, d) for d, (_, ys) in zip(self.devices, shards)]
            flat, aux = b.value_and_grad(
                self._sync_loss, self.replicas[0], *inputs, aux=True, out=self._gradient_buffer(0)
            )
            if self.process_group is not None:
                self.process_group.allreduce_(flat)  # the local sum, loss included, crosses processes once
            grad, loss = b.unflatten(flat, [(self._param_size,), (1,)])
            updates = [(p, grad, st) for p, st in zip(self.flat_params, self.opt_state)]  # read from the first device
            auxes = [aux] * n
        else:
            bucketed = self._announce_step()
            outs = []
            for r, (d, params, (xs, ys)) in enumerate(zip(self.devices, self.replicas, shards)):
                where = self._gradient_target(r, bucketed)
                outs.append(
                    b.value_and_grad(
                        self._loss, params, b.from_numpy(xs, d), b.from_numpy(ys, d), aux=self.has_bn, **where
                    )
                )
            flats = [o[0] for o in outs] if self.has_bn else outs
            auxes = [o[1] for o in outs] if self.has_bn else []
            updates, loss = self._summed_updates(bucketed, flats)
        self.steps += 1
        scale = 1.0 / len(X)
        for p, g, state in updates:
            self.optimizer.update(b, p, g, state, self.lr, scale, self.steps)
        for r, aux in enumerate(auxes):
            self._fold_statistics(r, aux)
        return float(b.to_numpy(loss).reshape(())) / len(X)

    def _token_loss(self, replica: int, context: RunContext) -> Any:
        """Replica ``replica``'s loss function over its (ids, [mask,] labels): the per-position
        cross-entropy summed over the shard, dropout drawn from ``context``."""
        b, model, names = self.backend, self.model, self.model.input_names

        def loss(params: Sequence[Any], *tensors: Any) -> Any:
            feeds = dict(zip(names, tensors[:-1]))
            logits = model.apply(b, [params], [feeds], context=context.for_replica(replica))[0]
            return b.sum(b.cross_entropy(logits, tensors[-1], IGNORE_INDEX))

        return loss

    def _train_tokens(self, X: Any, y: Any) -> float:
        """``train_batch`` for a token model (see there)."""
        feeds, y = check_token_batch(self.model, X, y)
        b, n = self.backend, len(self.devices)
        names = self.model.input_names
        bounds = np.cumsum([0, *shard_sizes(len(y), self.world_size * n)])
        rows = [(int(a), int(c)) for a, c in zip(bounds[:-1], bounds[1:])][self.rank * n : (self.rank + 1) * n]
        # every replica's rows of the global batch: the dropout masks do not depend on the device count
        context = RunContext(
            training=True, seed=self.seed, step=self.steps, devices=self.devices, shards=rows, batch=len(y)
        )
        bucketed = self._announce_step()
        flats = []
        for r, (d, params, (start, stop)) in enumerate(zip(self.devices, self.replicas, rows)):
            where = self._gradient_target(r, bucketed)
            tensors = [b.from_numpy(feeds[k][start:stop], d) for k in names if k in feeds]
            tensors.append(b.from_numpy(y[start:stop], d))
            flats.append(b.value_and_grad(self._token_loss(r, context), params, *tensors, **where))
        updates, loss = self._summed_updates(bucketed, flats)
        self.steps += 1
        total = counted(y)
        for p, g, state in updates:
            self.optimizer.update(b, p, g, state, self.lr, 1.0 / total, self.steps)
        return float(b.to_numpy(loss).reshape(())) / total

    def token_loss(self, X: Any, y: Any, batch_size: int = 64) -> float:
        """Return a token model's mean loss per counted position on ``(X, y)`` (inference: no dropout).

        Each device takes a share of every chunk of ``batch_size * devices`` rows; with a
        process group every rank passes the same data, takes its share and the sums cross
        ranks, so every rank returns the same loss.
        """
        if not self.tokens:
            raise ModelError(f"model {self.model.name!r} takes images; token_loss is for token models (use evaluate)")
        feeds, y = check_token_batch(self.model, X, y)
        check_count(batch_size, "batch_size", example=64)
        b, n, names = self.backend, len(self.devices), self.model.input_names
        if self.process_group is not None:
            a, c = (int(v) for v in np.cumsum([0, *shard_sizes(len(y), self.world_size)])[self.rank : self.rank + 2])
            feeds, y = {k: v[a:c] for k, v in feeds.items()}, y[a:c]
        pending = []
        step = batch_size * n
        for start in range(0, len(y), step):
            stop = min(start + step, len(y))
            parts = min(n, stop - start)
            bounds = start + np.cumsum([0, *shard_sizes(stop - start, parts)])
            for r, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
                d = self.devices[r]
                inputs = {k: b.from_numpy(feeds[k][lo:hi], d) for k in names if k in feeds}
                logits = self.model.apply(b, [self.replicas[r]], [inputs], context=RunContext(devices=[d]))[0]
                pending.append(b.sum(b.cross_entropy(logits, b.from_numpy(y[lo:hi], d), IGNORE_INDEX)))
        total = np.array([sum(float(b.to_numpy(t).reshape(())) for t in pending), counted(y)], np.float32)
        if self.process_group is not None:
            total = allreduce_numpy(self.process_group, b, total)
        return float(total[0] / total[1])

    def _announce_step(self) -> BucketedSum | None:
        """The step's gradient sums: buckets (or None for one buffer after backward), announced
        to a checked process group so its check overlaps the computation."""
        bucketed = self._bucketed()
        if bucketed is None:
            announce = getattr(self.process_group, "announce", None)
            if announce is not None:
                announce("allreduce_", self._param_size + 1)
        else:
            announce = getattr(self.process_group, "announce_buckets", None)
            if announce is not None:  # the step's buckets checked together (a flag in bucket 0, or one header)
                announce(bucketed.sizes)
        return bucketed

    def _gradient_target(self, replica: int, bucketed: BucketedSum | None) -> dict[str, Any]:
        """Where replica ``replica``'s ``value_and_grad`` writes: its gradient buffer, or its bucket
        buffers, the last device's signals starting the sums (the others' backward is queued by then)."""
        if bucketed is None:
            return {"out": self._gradient_buffer(replica)}
        last = replica == len(self.devices) - 1
        return {
            "out": bucketed.outputs[replica],
            "buckets": bucketed.layout.params,
            "on_bucket": bucketed.ready if last else _queued,
        }

    def _summed_updates(self, bucketed: BucketedSum | None, flats: list[Any]) -> tuple[list[Any], Any]:
        """The (param, summed grad, state) triples of every replica and the summed loss."""
        if bucketed is None:
            grads, loss = self._sum(flats)
            return list(zip(self.flat_params, grads, self.opt_state)), loss
        return self._bucket_updates(bucketed, bucketed.finish())

    def _bucketed(self) -> BucketedSum | None:
        """This step's bucketed sum across processes, or None where one buffer is summed after backward
        (no group, a group without ``allreduce_async_``, bucket_mb=None, or another allreduce)."""
        group = self.process_group
        if (
            group is None
            or self._layout is None
            or self.allreduce != "fused"
            or not callable(getattr(group, "allreduce_async_", None))
        ):
            return None
        reserved = int(getattr(group, "reserved_floats", 0))  # the checked group's flag, after the loss
        buffers = [self._bucket_buffers(r, reserved) for r in range(len(self.devices))]
        return BucketedSum(self.backend, group, buffers, self.devices, self._layout, reserved)

    def _bucket_updates(self, bucketed: BucketedSum, sums: Sequence[Sequence[Any]]) -> tuple[list[Any], Any]:
        """The optimizer's (params, gradient, state) per device and bucket, and the loss, from each device's
        summed bucket buffers (the optimizers are element-wise: bucket by bucket is the whole-buffer update)."""
        assert self._layout is not None
        updates: list[Any] = []
        losses = []
        for r, bufs in enumerate(sums):
            grads, loss = bucketed.gradients(bufs)
            losses.append(loss)
            params, states = self._bucket_views(r)
            for k, (p, g) in enumerate(zip(params, grads)):
                updates.append((p, g, [st[k] for st in states]))
        return updates, losses[0]  # the summed loss, read from the first device

    def _bucket_views(self, replica: int) -> tuple[list[Any], list[list[Any]]]:
        """Replica ``replica``'s parameters and optimizer buffers cut into buckets (views, cut once: both
        buffers live as long as the trainer, and every later write to them is in place)."""
        assert self._layout is not None
        kept = self._update_views.get(replica)
        if kept is None:
            views = self._layout.param_views
            kept = self._update_views[replica] = (
                views(self.backend, self.flat_params[replica]),
                [views(self.backend, t) for t in self.opt_state[replica]],
            )
        return kept

    def _bucket_buffers(self, replica: int, reserved: int) -> KeptBuffers:
        """Replica ``replica``'s gradient buffer of each bucket (bucket 0 ends with the loss, then the group's
        ``reserved`` floats), kept from step to step like ``_gradient_buffer``: one buffer per bucket, so an
        engine that tracks buffers (MXNet's) starts a bucket's sum after that bucket's gradients only."""
        assert self._layout is not None
        sizes = [self._layout.sizes[0] + reserved, *self._layout.sizes[1:]]
        kept = self._bucket_bufs.get(replica)
        if kept is None or int(np.prod(self.backend.shape(kept[0]))) != sizes[0]:
            self._bucket_bufs[replica] = KeptBuffers(
                self.backend.from_numpy(np.zeros(n, np.float32), self.devices[replica]) for n in sizes
            )
        return self._bucket_bufs[replica]

    def _gradient_buffer(self, replica: int) -> Any:
        """Replica ``replica``'s buffer for [gradients..., loss], kept from step to step (as a framework
        keeps ``.grad``): a new one of a ResNet-18's size each step cost about 5% of the step."""
        if replica not in self._grad_buffers:
            self._grad_buffers[replica] = self.backend.from_numpy(
                np.zeros(self._param_size + 1, np.float32), self.devices[replica]
            )
        return self._grad_buffers[replica]

    def _fold_statistics(self, replica: int, batch_stats: Any) -> None:
        """running <- (1 - m) running + m * batch, for every BatchNorm node of one replica."""
        b = self.backend
        if self._bn_momentum is not None:
            b.axpby_(self.flat_state[replica], 1.0 - self._bn_momentum, batch_stats, self._bn_momentum)
            return
        views = b.unflatten(batch_stats, self.model.state_shapes)
        for k, i in enumerate(self.model.batch_norms):
            m = cast(BatchNorm2d, self.model.nodes[i].layer).momentum
            for j in (2 * k, 2 * k + 1):
                b.axpby_(self.states[replica][j], 1.0 - m, views[j], m)

    def _sum(self, flats: list[Any]) -> tuple[list[Any], Any]:
        """Sum [grads..., loss] buffers over devices (and processes); return (flat grad per device, loss)."""
        b, group, n = self.backend, self.process_group, len(self.devices)
        halves = [(self._param_size,), (1,)]
        if self.allreduce == "fused":
            sums = allreduce_flat(b, flats, self.devices, group)
            views = views_per_buffer(b, sums, halves)  # CPU replicas share one sum
            return [views[id(f)][0] for f in sums], views[id(sums[0])][1]
        parts = [b.unflatten(f, [*self.model.param_shapes, (1,)]) for f in flats]
        allreduce_grads(b, [v[:-1] for v in parts], self.devices, self.allreduce)
        reduce_to_first(b, [v[-1] for v in parts])
        if group is not None:
            group.allreduce_(flats[0])  # the local sum, loss included, crosses processes once
            flats = [flats[0]] * n  # the update moves grads to each device
        firsts = [b.unflatten(f, halves) for f in flats]
        return [f[0] for f in firsts], firsts[0][1]

    def synchronize(self) -> None:
        """Wait until every device has finished its queued work."""
        for d in self.devices:
            self.backend.synchronize(d)

    # -- inference -----------------------------------------------------------------------
    def predict(self, X: np.ndarray, batch_size: int = 1024) -> np.ndarray:
        """Return predicted classes; each device classifies its own share of ``X`` with its
        replica's parameters and running statistics.

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
            for r, (d, params, size) in enumerate(zip(self.devices, self.replicas, shard_sizes(len(chunk), parts))):
                x = b.from_numpy(X[offset : offset + size], d)
                mode = RunningStatistics([self.states[r]]) if self.has_bn else None
                logits = self.model.apply(b, [params], [x], mode)[0]
                pending.append((offset, size, b.argmax(logits, 1)))
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
