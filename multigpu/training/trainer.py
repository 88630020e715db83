"""``multigpu.train``: the textbook's experiments (LeNet, then ResNet-18, on Fashion-MNIST) on any backend."""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from multigpu import models
from multigpu.checks import check_count, check_number, check_positive
from multigpu.contract.devices import CPUFallbackWarning
from multigpu.data.files import atomic_write, check_writable, check_writable_dir
from multigpu.distributed.rank import launched, launched_rank
from multigpu.errors import CheckpointError, InputError, ModelError, ParamsError, TrainingDivergedError
from multigpu.models.graph import Model
from multigpu.optim.base import Optimizer
from multigpu.optim.choice import make_optimizer
from multigpu.optim.sgd import SGD
from multigpu.parallel.buckets import DEFAULT_BUCKET_MB
from multigpu.parallel.data_parallel import DataParallel
from multigpu.parallel.process_group import ProcessGroup
from multigpu.training.checkpoint import load_checkpoint, save_checkpoint
from multigpu.training.plotting import plot_curves, require_matplotlib
from multigpu.training.processes import join_job, share_checkpoint, train_processes

LR_SCALINGS = (None, "linear")
FASHION_SHAPE, FASHION_CLASSES = (1, 28, 28), 10  # what the default data set holds


@dataclass
class TrainResult:
    """What a training run measured; ``params`` are numpy arrays in model order."""

    backend: str
    devices: list[str]
    model: str
    batch_size: int
    lr: float
    allreduce: str
    seed: int
    test_acc: list[float] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    sec_per_epoch: list[float] = field(default_factory=list)
    samples_per_sec: float = 0.0
    params: list[np.ndarray] = field(default_factory=list, repr=False)
    processes: int = 1  # ranks that trained together; ``devices`` are one rank's
    rank: int = 0  # the rank that returned this result (every rank holds the same numbers)
    optimizer: dict[str, Any] = field(default_factory=dict)  # the optimizer's settings
    sync_bn: bool = False
    #: replica 0's BatchNorm running statistics (model.state_shapes), for DataParallel(state=...)
    state: list[np.ndarray] = field(default_factory=list, repr=False)

    def to_dict(self, include_params: bool = False) -> dict[str, Any]:
        """Return a JSON-able dict; parameters only when ``include_params``."""
        d = asdict(self)
        d["params"] = [p.tolist() for p in self.params] if include_params else None
        d["state"] = [p.tolist() for p in self.state] if include_params else None
        return d

    def save_json(self, path: str | os.PathLike[str], include_params: bool = False) -> None:
        """Write the result as JSON to ``path`` (atomically: the old file or the whole new one)."""
        with atomic_write(path) as f:
            f.write(json.dumps(self.to_dict(include_params), indent=2).encode())


def learning_rate(
    lr: float, scale: int, step: int, steps_per_epoch: int, lr_scaling: str | None, warmup_epochs: float
) -> float:
    """Return the learning rate for global step ``step``.

    ``lr_scaling="linear"`` multiplies ``lr`` by ``scale``, the global-batch
    multiplier (global batch / ``batch_size``: the device count with
    ``scale_batch``, else 1), reached by a linear ramp from ``lr`` over
    ``warmup_epochs`` (Goyal et al., 2017). The rate follows the batch, not the
    device count, so k devices at one global batch train exactly like one device.
    """
    if lr_scaling is None:
        return lr
    target = lr * scale
    ramp = warmup_epochs * steps_per_epoch
    if ramp <= 0 or step >= ramp:
        return target
    return lr + (target - lr) * step / ramp


def _batches(n: int, batch_size: int, fewest: int, rng: np.random.Generator) -> list[np.ndarray]:
    order = rng.permutation(n)
    chunks = [order[i : i + batch_size] for i in range(0, n, batch_size)]
    # A last batch with fewer than ``fewest`` rows (too few to give every device what it needs)
    # joins the one before it, so no example is dropped.
    if len(chunks) > 1 and len(chunks[-1]) < fewest:
        last = chunks.pop()  # popped first: chunks[-2] = f(chunks.pop()) would overwrite the wrong batch
        chunks[-1] = np.concatenate([chunks[-1], last])
    return chunks


def resolve_model(model: str | Model, data: Any = None) -> Model:
    """Return the model to train: a built-in one by name, or the model object itself.

    A built-in model is built for the data (``data``, or Fashion-MNIST when None): its
    input shape and class count are the data's where its factory takes them (LeNet's
    are fixed). Raises ModelError for an unknown name or an object that is not a
    multigpu model.
    """
    if isinstance(model, str):
        if data is None:
            shape, classes = FASHION_SHAPE, FASHION_CLASSES
        else:
            shape = tuple(data.train_images.shape[1:])
            classes = int(max(data.train_labels.max(), data.test_labels.max())) + 1
        return models.get(model, num_classes=classes, input_shape=shape)
    if isinstance(model, Model):
        return model
    raise ModelError(
        f"model={model!r} is neither a built-in model name ({', '.join(sorted(models.MODELS))}) "
        "nor a multigpu model; pass a name or e.g. multigpu.Sequential([...], input_shape=(1, 28, 28))"
    )


def _check_fits(net: Model, data: Any) -> None:
    """Raise ModelError unless ``net`` takes the data's images and has a class per label."""
    image = tuple(data.train_images.shape[1:])
    if net.input_shape != image:
        raise ModelError(
            f"model {net.name!r} takes inputs of shape {net.input_shape} but the images are {image}; "
            f"build it with input_shape={image}"
        )
    classes = int(max(data.train_labels.max(), data.test_labels.max())) + 1
    if net.num_classes < classes:
        raise ModelError(
            f"model {net.name!r} has {net.num_classes} outputs but the labels run to {classes - 1}; "
            f"end it with Dense(out_features={classes})"
        )


def train(
    backend: str = "numpy",
    num_gpus: int | str = 1,
    batch_size: int = 256,
    lr: float = 0.2,
    num_epochs: int = 10,
    model: str | Model = "lenet",
    allreduce: str = "fused",
    data_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    progress: bool = True,
    plot: str | os.PathLike[str] | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    *,
    scale_batch: bool = False,
    lr_scaling: str | None = None,
    warmup_epochs: float = 0.0,
    train_limit: int | None = None,
    test_limit: int | None = None,
    data: Any = None,
    on_epoch: Callable[[int, TrainResult], None] | None = None,
    processes: int = 1,
    process_group: ProcessGroup | None = None,
    verify_data: bool = True,
    optimizer: str | Optimizer = "sgd",
    sync_bn: bool = False,
    bucket_mb: float | None = DEFAULT_BUCKET_MB,
) -> TrainResult:
    """Train ``model`` on Fashion-MNIST with data-parallel SGD; return a TrainResult.

    ``optimizer`` is ``"sgd"`` (plain SGD, the textbook's), ``"adamw"`` or an optimizer
    object such as ``multigpu.optim.SGD(momentum=0.9, weight_decay=5e-4)``; ``lr`` is its
    learning rate. ``sync_bn`` synchronizes BatchNorm statistics across every device and
    process (else each device normalizes with its own shard's). Checkpoints hold the
    optimizer state and every replica's BatchNorm running statistics too. With several
    processes the gradients cross them in buckets of up to ``bucket_mb`` MiB started
    during backward (None: one buffer after backward).

    ``num_gpus`` is a device count (CPU replicas with a warning when the framework
    sees fewer GPUs) or a device string such as ``"cpu:2"``. ``scale_batch``
    multiplies the batch by the device count; ``lr_scaling="linear"`` scales the
    rate by the same global-batch multiplier (1 without ``scale_batch``), with an
    optional warmup. ``checkpoint=DIR`` saves after every epoch and resumes from
    DIR. ``train_limit``/``test_limit`` use the first N examples; ``data`` replaces
    the loader with any object shaped like ``FashionMNIST``; ``verify_data=False``
    loads IDX files whose MD5 is not Fashion-MNIST's (your own subset).

    Every argument, the backend, devices and output paths are checked before any
    data is loaded. A NaN or infinite training loss stops the run with
    TrainingDivergedError naming the epoch and step; the checkpoint of the last
    finished epoch stays as it was. Raises InputError, DataError/DataNotFoundError,
    MissingDependencyError (plot without matplotlib), CheckpointError or
    TrainingDivergedError.

    ``processes=N`` trains as N processes on this host, each driving ``num_gpus``
    devices, with the backend's own distributed engine, and returns rank 0's result
    (``data`` and ``on_epoch`` must then be picklable; ``on_epoch`` runs in rank 0).
    Inside a rank started by ``multigpu launch`` train() joins that job by itself;
    ``process_group`` joins one made elsewhere. Every rank draws the same global
    batches from ``seed`` and trains on its shard; loss and accuracy are reduced
    across ranks; only rank 0 writes checkpoints and plots. A rank that fails raises
    RankFailedError (or CollectiveError) on the others.
    """
    if processes != 1:
        args = {k: v for k, v in locals().items() if k != "processes"}  # the arguments, nothing else yet
        return train_processes(processes, args)
    check_count(batch_size, "batch_size", example=256)
    check_count(num_epochs, "num_epochs", example=10)
    check_positive(lr, "lr", example=0.2)
    if lr_scaling not in LR_SCALINGS:
        raise InputError(f"lr_scaling={lr_scaling!r} is unknown; use None or 'linear'")
    check_number(warmup_epochs, "warmup_epochs", minimum=0.0, example=1.0)
    if warmup_epochs and lr_scaling is None:
        raise InputError("warmup_epochs only applies with lr_scaling='linear'; set both or neither")
    for name, limit in (("train_limit", train_limit), ("test_limit", test_limit)):
        if limit is not None:
            check_count(limit, name, example=1000)
    if bucket_mb is not None:
        check_positive(bucket_mb, "bucket_mb", unit="MiB", example=25)
    opt = make_optimizer(optimizer)
    net = resolve_model(model, data)
    writer = (process_group.rank if process_group is not None else launched_rank()) == 0  # writes files
    if plot is not None:  # fail before training, not after ten epochs
        require_matplotlib()
        if writer:
            check_writable(plot, "plot")
    saved = None
    if checkpoint is not None and writer:  # only rank 0 reads and writes the folder
        saved = load_checkpoint(check_writable_dir(checkpoint, "checkpoint"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CPUFallbackWarning)
        devices: int | str | list[Any]
        group, devices, joined = process_group, num_gpus, False
        if group is None and launched():
            group, devices = join_job(backend, num_gpus)
            joined = True
        tr = DataParallel(
            net,
            backend=backend,
            devices=devices,
            lr=lr,
            allreduce=allreduce,
            seed=seed,
            process_group=group,
            optimizer=opt,
            sync_bn=sync_bn,
            bucket_mb=bucket_mb,
        )
    rank, world = tr.rank, tr.world_size
    progress = progress and rank == 0
    for w in caught:
        if progress:
            print(f"note: {w.message}", file=sys.stderr)
        if rank == 0:
            warnings.warn(w.message, stacklevel=2)  # keep it visible to callers that filter warnings
    n_dev = len(tr.devices) * world  # every device of the job
    global_batch = batch_size * n_dev if scale_batch else batch_size
    check_count(global_batch, "batch_size", minimum=n_dev, example=f"{n_dev} (one row per device)")
    # the fewest rows a batch may have: one per device, two per device where a BatchNorm sees 1x1
    # planes (one value has no variance), or two in all with synchronized statistics
    two = max(net.min_training_examples().values(), default=1) > 1
    fewest = max(n_dev, 2) if two and sync_bn else 2 * n_dev if two else n_dev
    if data is None:
        from multigpu.data import load_fashion_mnist

        data = load_fashion_mnist(data_dir, progress=progress, verify=verify_data)
    _check_fits(net, data)
    Xtr, ytr, Xte, yte = data.train_images, data.train_labels, data.test_images, data.test_labels
    Xtr, ytr = Xtr[:train_limit], ytr[:train_limit]
    Xte, yte = Xte[:test_limit], yte[:test_limit]

    result = TrainResult(
        backend=tr.backend.name,
        devices=[str(d) for d in tr.devices],
        model=net.name,
        batch_size=global_batch,
        lr=lr,
        allreduce=allreduce,
        seed=seed,
        processes=world,
        rank=rank,
        optimizer=opt.config(),
        sync_bn=sync_bn,
    )
    config = {
        "backend": result.backend,
        "devices": result.devices,
        "model": net.name,
        "param_shapes": [list(shape) for shape in net.param_shapes],
        "batch_size": global_batch,
        "lr": lr,
        "allreduce": allreduce,
        "seed": seed,
        "lr_scaling": lr_scaling,
        "warmup_epochs": warmup_epochs,
        "train_size": len(Xtr),
        "test_size": len(Xte),
    }
    if opt.config() != SGD().config() or sync_bn or net.batch_norms:  # older checkpoints stay valid
        config.update(optimizer=opt.config(), sync_bn=sync_bn, state_shapes=[list(shape) for shape in net.state_shapes])
    if world > 1:
        config["processes"] = world
    rng = np.random.default_rng(seed)
    start_epoch = 0
    arrays = saved[1].pop("arrays") if saved is not None else None  # numpy: stays on rank 0
    if checkpoint is not None and world > 1:
        saved = share_checkpoint(tr, saved)  # only rank 0 needs the folder
    if saved is not None:
        params, state = saved
        diff = {k: (state["config"].get(k), v) for k, v in config.items() if state["config"].get(k) != v}
        if diff:
            raise CheckpointError(
                f"checkpoint in {checkpoint} belongs to a different run (saved vs now: {diff}); "
                "use another folder or the same settings"
            )
        try:
            if params is not None and arrays is not None:  # None on ranks other than 0: broadcast below
                tr.set_params(params)
                tr.set_optimizer_state([arrays[f"opt{j}"] for j in range(opt.buffers)], state.get("steps", 0))
            tr.steps = int(state.get("steps", 0))
            rng.bit_generator.state = state["rng"]
        except (ParamsError, TypeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"checkpoint in {checkpoint} is damaged ({exc}); delete it to start afresh") from exc
        tr.broadcast_params()  # rank 0's restored parameters to every rank (no-op in one process)
        if net.batch_norms:
            try:  # every replica's own running statistics, rank 0's file to every rank
                tr.scatter_states(arrays.get("bn") if arrays is not None else None)
            except (ParamsError, AttributeError) as exc:
                raise CheckpointError(
                    f"checkpoint in {checkpoint} is damaged ({exc}); delete it to start afresh"
                ) from exc
        start_epoch = state["epoch"]
        for key in ("test_acc", "train_loss", "sec_per_epoch"):
            getattr(result, key).extend(state[key])

    steps_per_epoch = math.ceil(len(Xtr) / global_batch)
    multiplier = global_batch // batch_size  # linear scaling follows the batch, not the device count
    bar = _progress_bar(progress)
    for epoch in range(start_epoch, num_epochs):
        chunks = _batches(len(Xtr), global_batch, fewest, rng)
        total = 0.0
        with bar(total=len(chunks), desc=f"epoch {epoch + 1}/{num_epochs}", unit="batch", leave=False) as pbar:
            t0 = time.perf_counter()
            for i, idx in enumerate(chunks):
                tr.lr = learning_rate(
                    lr, multiplier, epoch * steps_per_epoch + i, steps_per_epoch, lr_scaling, warmup_epochs
                )
                loss = tr.train_batch(Xtr[idx], ytr[idx])  # read after the update: no extra device wait
                if not math.isfinite(loss):  # Keras's TerminateOnNaN: stop, keep the last checkpoint
                    raise _diverged(
                        f"the loss is {loss} at epoch {epoch + 1}, step {i + 1}",
                        epoch,
                        i + 1,
                        loss,
                        tr.lr,
                        checkpoint,
                        len(result.test_acc),
                    )
                total += loss * len(idx)
                pbar.update(1)
            tr.synchronize()  # queued device work belongs to this epoch's time
            seconds = time.perf_counter() - t0
        params = tr.get_params()  # one read per epoch, after the device work is done
        stats = tr.gather_states() if net.batch_norms else np.zeros((0,), np.float32)  # every rank takes part
        bad = (
            "parameters"
            if not all(np.isfinite(p).all() for p in params)
            else "BatchNorm running statistics"
            if not np.isfinite(stats).all()
            else None
        )
        if bad is not None:  # a ReLU may have hidden NaN from the loss
            raise _diverged(
                f"the {bad} hold NaN or infinity after epoch {epoch + 1} although every loss was finite",
                epoch,
                len(chunks),
                math.nan,
                tr.lr,
                checkpoint,
                len(result.test_acc),
            )
        result.sec_per_epoch.append(seconds)
        result.train_loss.append(total / len(Xtr))
        result.test_acc.append(tr.evaluate(Xte, yte))
        if checkpoint is not None and rank == 0:
            extra = {f"opt{j}": a for j, a in enumerate(tr.get_optimizer_state())}
            if net.batch_norms:
                extra["bn"] = stats
            save_checkpoint(
                checkpoint,
                params,
                {
                    "config": config,
                    "epoch": epoch + 1,
                    "rng": rng.bit_generator.state,
                    "test_acc": result.test_acc,
                    "train_loss": result.train_loss,
                    "sec_per_epoch": result.sec_per_epoch,
                    "steps": tr.steps,
                },
                extra,
            )
        if progress:
            print(
                f"epoch {epoch + 1}/{num_epochs}: test acc {result.test_acc[-1]:.3f}, "
                f"train loss {result.train_loss[-1]:.3f}, {seconds:.1f} sec/epoch "
                f"on {result.devices} ({result.backend})",
                flush=True,
            )
        if on_epoch is not None and rank == 0:
            on_epoch(epoch, result)
    result.params = tr.get_params()  # after a resume that had nothing left to do, too
    result.state = tr.get_state()
    result.samples_per_sec = len(Xtr) * len(result.sec_per_epoch) / max(sum(result.sec_per_epoch), 1e-12)
    if joined and tr.process_group is not None:
        tr.process_group.close()
    if plot is not None and rank == 0:
        plot_curves([result], plot, title=f"{net.name} on Fashion-MNIST, {result.backend}")
    return result


def _diverged(
    what: str, epoch: int, step: int, loss: float, lr: float, checkpoint: Any, done: int
) -> TrainingDivergedError:
    if checkpoint is None:
        kept = "no checkpoint was asked for (--checkpoint DIR keeps one per epoch)"
    elif done:
        kept = f"the checkpoint in {checkpoint} still holds epoch {done}"
    else:
        kept = f"no epoch finished, so {checkpoint} holds no checkpoint"
    return TrainingDivergedError(
        f"training diverged: {what} (lr {lr:g}); lower the learning rate, e.g. to {lr / 10:g}; {kept}",
        epoch=epoch + 1,
        step=step,
        loss=loss,
    )


def _progress_bar(enabled: bool) -> Callable[..., Any]:
    from functools import partial

    from tqdm.auto import tqdm

    return partial(tqdm, disable=not enabled, file=sys.stderr)
