"""Cross-framework agreement: train the same model from the same start on every backend.

``agreement`` runs several identical steps and compares parameters, losses, BatchNorm
running statistics and optimizer state with the NumPy reference; ``step_agreement``
takes one step and compares each part of it: the forward (training-mode logits), the
gradients, the running statistics and the optimizer's update.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from multigpu.checks import check_count
from multigpu.contract.devices import CPUFallbackWarning
from multigpu.contract.protocol import Device
from multigpu.contract.registry import backend as get_backend
from multigpu.models.batchnorm import BatchStatistics
from multigpu.models.graph import Model
from multigpu.optim.base import Optimizer
from multigpu.parallel.data_parallel import DataParallel


@dataclass(frozen=True)
class Agreement:
    """Worst absolute differences of one backend against the NumPy reference."""

    backend: str
    devices: list[str]
    max_param_diff: float
    max_loss_diff: float
    max_state_diff: float = 0.0  # BatchNorm running statistics, every replica
    max_opt_diff: float = 0.0  # optimizer buffers (momentum, Adam's moments)


@dataclass(frozen=True)
class StepAgreement:
    """One step of one backend against the reference, part by part (worst absolute differences)."""

    backend: str
    devices: list[str]
    forward: float  # training-mode logits of the first device's shard
    gradients: float  # the summed gradient (the first step's momentum buffer holds it, scaled)
    running_stats: float  # BatchNorm running statistics after the step, every replica
    update: float  # parameters after the optimizer's step
    loss: float
    seed: int = 0  # the batch's seed
    decisions_differ: int = 0  # ReLU signs and max pool positions that differ from the reference's
    scale: dict[str, float] = field(default_factory=dict)  # the reference's largest magnitude per part


@dataclass
class Run:
    """What ``train_run`` saw: losses, final parameters, every replica's state, optimizer buffers."""

    losses: list[float]
    params: list[np.ndarray]
    states: list[list[np.ndarray]]
    opt_state: list[np.ndarray]
    devices: list[str]


def _trainer(
    model: Model,
    backend: str,
    params: Sequence[np.ndarray],
    devices: Any,  # as the caller gave it: DataParallel checks it
    lr: float,
    allreduce: str,
    optimizer: str | Optimizer,
    sync_bn: bool,
) -> DataParallel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CPUFallbackWarning)
        return DataParallel(
            model,
            backend=backend,
            devices=devices,
            lr=lr,
            params=list(params),
            allreduce=allreduce,
            optimizer=optimizer,
            sync_bn=sync_bn,
        )


def train_run(
    model: Model,
    backend: str,
    params: Sequence[np.ndarray],
    batches: Sequence[tuple[np.ndarray, np.ndarray]],
    devices: object = 2,
    lr: float = 0.2,
    allreduce: str = "fused",
    optimizer: str | Optimizer = "sgd",
    sync_bn: bool = False,
) -> Run:
    """Run ``batches`` through DataParallel; return what it ended with."""
    tr = _trainer(model, backend, params, devices, lr, allreduce, optimizer, sync_bn)
    losses = [tr.train_batch(X, y) for X, y in batches]
    return Run(
        losses,
        tr.get_params(),
        [tr.get_state(r) for r in range(len(tr.devices))],
        tr.get_optimizer_state(),
        [str(d) for d in tr.devices],
    )


def train_steps(
    model: Model,
    backend: str,
    params: Sequence[np.ndarray],
    batches: Sequence[tuple[np.ndarray, np.ndarray]],
    devices: object = 2,
    lr: float = 0.2,
    allreduce: str = "fused",
    optimizer: str | Optimizer = "sgd",
    sync_bn: bool = False,
) -> tuple[list[float], list[np.ndarray], list[str]]:
    """Run ``batches`` through DataParallel; return (losses, final params, device names)."""
    run = train_run(model, backend, params, batches, devices, lr, allreduce, optimizer, sync_bn)
    return run.losses, run.params, run.devices


def random_batches(model: Model, steps: int, batch: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Return ``steps`` seeded random (X, y) batches shaped for ``model``."""
    rng = np.random.default_rng(seed)
    return [
        (rng.random((batch, *model.input_shape), dtype=np.float32), rng.integers(0, model.num_classes, batch))
        for _ in range(steps)
    ]


def _worst(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    return max((float(np.abs(x - y).max()) for x, y in zip(a, b) if np.size(x)), default=0.0)


def agreement(
    model: Model,
    backends: Sequence[str],
    steps: int = 10,
    batch: int = 32,
    devices: object = 2,
    lr: float = 0.2,
    seed: int = 0,
    allreduce: str = "fused",
    reference: str = "numpy",
    params: Sequence[np.ndarray] | None = None,
    optimizer: str | Optimizer = "sgd",
    sync_bn: bool = False,
) -> list[Agreement]:
    """Compare each backend with ``reference`` after ``steps`` identical steps.

    Raises InputError for fewer than one step or an empty batch.
    """
    check_count(steps, "steps", example=10)
    check_count(batch, "batch", example=32)
    start = model.init_params(seed) if params is None else list(params)
    batches = random_batches(model, steps, batch, seed)
    # The reference always uses the textbook's naive allreduce: it may offer no native one,
    # and the sum it defines does not depend on the algorithm.
    ref = train_run(model, reference, start, batches, devices, lr, "naive", optimizer, sync_bn)
    return [
        _compare(name, train_run(model, name, start, batches, devices, lr, allreduce, optimizer, sync_bn), ref)
        for name in backends
    ]


def _compare(name: str, got: Run, ref: Run) -> Agreement:
    """Worst differences of ``got`` against ``ref``; every replica of ``got`` against ``ref``'s
    replica of the same index, or its only one."""
    states = [(s, ref.states[min(r, len(ref.states) - 1)]) for r, s in enumerate(got.states)]
    return Agreement(
        backend=name,
        devices=got.devices,
        max_param_diff=_worst(got.params, ref.params),
        max_loss_diff=max(abs(a - b) for a, b in zip(got.losses, ref.losses)),
        max_state_diff=max((_worst(s, r) for s, r in states), default=0.0),
        max_opt_diff=_worst(got.opt_state, ref.opt_state),
    )


def sync_bn_agreement(
    model: Model,
    backends: Sequence[str],
    devices: object = 2,
    steps: int = 5,
    batch: int = 13,
    lr: float = 0.1,
    seed: int = 0,
    optimizer: str | Optimizer = "sgd",
) -> list[Agreement]:
    """Synchronized BatchNorm on ``devices`` against 1 device on the full batch, on each backend
    (its own 1-device run, not the reference's), after ``steps`` steps from the same start;
    every replica's running statistics against the one device's. ``batch`` rows split unevenly
    where the device count does not divide them. Raises InputError for fewer than one step or row.
    """
    check_count(steps, "steps", example=5)
    check_count(batch, "batch", example=13)
    start = model.init_params(seed)
    batches = random_batches(model, steps, batch, seed)
    out = []
    for name in backends:
        many = train_run(model, name, start, batches, devices, lr, optimizer=optimizer, sync_bn=True)
        first = many.devices[0]  # the one device: the first of the k ("cpu:0" or "gpu:0")
        one = train_run(
            model, name, start, batches, "cpu" if first.startswith("cpu") else first, lr, optimizer=optimizer
        )
        out.append(_compare(name, many, one))
    return out


def _one_step(
    model: Model,
    backend: str,
    start: Sequence[np.ndarray],
    X: np.ndarray,
    y: np.ndarray,
    devices: object,
    lr: float,
    optimizer: str | Optimizer,
    sync_bn: bool,
) -> dict[str, Any]:
    tr = _trainer(model, backend, start, devices, lr, "fused", optimizer, sync_bn)
    b = tr.backend
    shard = tr.local_shards(X, y)[0][0]
    params = [b.from_numpy(p, tr.devices[0]) for p in start]
    mode = BatchStatistics() if model.batch_norms else None
    logits = b.to_numpy(model.apply(b, [params], [b.from_numpy(shard, tr.devices[0])], mode)[0])
    loss = tr.train_batch(X, y)
    return {
        "forward": logits,
        "loss": loss,
        "params": tr.get_params(),
        "devices": [str(d) for d in tr.devices],
        "states": [a for r in range(len(tr.devices)) for a in tr.get_state(r)],
        "opt": tr.get_optimizer_state(),
    }


def decisions(model: Model, backend: str, params: Sequence[np.ndarray], shards: Sequence[np.ndarray]) -> np.ndarray:
    """The discrete choices of a training-mode forward of each shard: the sign of every ReLU input
    and the position of every max pool window's maximum, as one integer array.

    Float32 rounding differs between frameworks, and an input within it of a ReLU's 0 (or of
    a window's runner-up) lands on different sides: that element's gradient then differs by
    its whole size. Comparing these arrays tells such a batch apart.
    """
    from numpy.lib.stride_tricks import sliding_window_view

    from multigpu.models.layers import MaxPool2d, ReLU
    from multigpu.models.node import INPUT

    b = get_backend(backend)
    dev = Device("cpu", 0)
    watched = [n for n in model.nodes if isinstance(n.layer, (ReLU, MaxPool2d))]
    names = sorted({n.inputs[0] for n in watched})
    tensors = [b.from_numpy(p, dev) for p in params]
    out = []
    for x in shards:
        mode = BatchStatistics() if model.batch_norms else None
        acts = model.run(b, tensors, {INPUT: b.from_numpy(x, dev)}, bn=mode, outputs=names)
        for node in watched:
            a = b.to_numpy(acts[node.inputs[0]])
            layer = node.layer
            if isinstance(layer, ReLU):
                out.append((a > 0).reshape(-1).astype(np.int64))
                continue
            assert isinstance(layer, MaxPool2d)  # watched holds ReLUs and MaxPool2ds only
            k, pad, step = layer.kernel, layer.padding, layer.step
            oh, ow = layer.output_shape(a.shape[1:])[1:]
            # A ceil-mode pool's last window may hang over the right padding: pad as far as it reaches.
            right = [max(pad, (o - 1) * step + k - n - pad) for n, o in zip(a.shape[2:], (oh, ow))]
            padded = np.pad(a, ((0, 0), (0, 0), (pad, right[0]), (pad, right[1])), constant_values=-np.inf)
            # NOTE: numpy 1.23's stub types axis as one int (numpy 2's takes the tuple the function accepts):
            # ignored where wrong, and not reported as unused under numpy 2.
            win = sliding_window_view(padded, (k, k), axis=(2, 3))  # type: ignore[call-overload, unused-ignore]
            win = win[:, :, ::step, ::step][:, :, :oh, :ow]
            out.append(win.reshape(*win.shape[:4], -1).argmax(axis=-1).reshape(-1))
    return np.concatenate(out)


def step_agreement(
    model: Model,
    backends: Sequence[str],
    batch: int = 8,
    devices: object = 2,
    lr: float = 0.1,
    seed: int = 0,
    optimizer: str | Optimizer = "sgd",
    sync_bn: bool = False,
    reference: str = "numpy",
    tries: int = 1,
) -> list[StepAgreement]:
    """One step of ``optimizer`` from the same start on the same batch: each backend against ``reference``.

    The gradient is compared as the one optimizer buffer that holds it after a first
    step (SGD's momentum buffer is the mean loss's gradient then); without momentum it
    is read off the update (``(start - after) / lr``). With ``tries > 1`` the batch is
    the first of seeds ``seed, seed+1, ...`` on which every backend makes the reference's
    discrete choices (``decisions``), so the figures measure how the frameworks agree
    where the step is continuous; each row says how many choices differed on its batch.
    """
    check_count(batch, "batch", example=8)
    check_count(tries, "tries", example=20)
    start = model.init_params(seed)
    probe = _trainer(model, reference, start, devices, lr, "fused", optimizer, sync_bn)
    for s in range(seed, seed + tries):
        X, y = random_batches(model, 1, batch, s)[0]
        shards = [xs for xs, _ in probe.local_shards(X, y)]
        want = decisions(model, reference, start, shards)
        differ = {name: int((decisions(model, name, start, shards) != want).sum()) for name in backends}
        if not any(differ.values()):
            break
    runs = {
        name: _one_step(model, name, start, X, y, devices, lr, optimizer, sync_bn)
        for name in dict.fromkeys([reference, *backends])
    }

    def gradient(r: dict[str, Any]) -> list[np.ndarray]:
        if r["opt"]:
            return r["opt"][:1]
        return [(a - p) / lr for a, p in zip(start, r["params"])]

    ref = runs[reference]
    rows = []
    for name in backends:
        got = runs[name]
        rows.append(
            StepAgreement(
                backend=name,
                devices=got["devices"],
                forward=_worst([got["forward"]], [ref["forward"]]),
                gradients=_worst(gradient(got), gradient(ref)),
                running_stats=_worst(got["states"], ref["states"]),
                update=_worst(got["params"], ref["params"]),
                loss=abs(got["loss"] - ref["loss"]),
                seed=s,
                decisions_differ=differ[name],
                scale={
                    "forward": float(np.abs(ref["forward"]).max()),
                    "gradients": max(float(np.abs(g).max()) for g in gradient(ref)),
                    "running_stats": max((float(np.abs(s).max()) for s in ref["states"]), default=0.0),
                },
            )
        )
    return rows
