"""``Trainer`` and ``train()``: the textbook's experiments (LeNet, then ResNet-18, on Fashion-MNIST)
on any backend, with callbacks.

``Trainer(model, ...)`` checks every setting and output path; ``fit(data)`` builds the
``DataParallel``, loads the data, restores a checkpoint, runs the epochs and returns a
``TrainResult``. Its collaborators each do one thing: ``DivergenceCheck`` stops a run
whose loss or parameters turn NaN, and the callbacks ``Checkpointer``, ``ProgressBar``,
``PlotCurves`` and ``EpochFunction`` save, show, plot and report. ``train()`` is
``Trainer(...).fit(...)``, or the same in N processes with ``processes=N``.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from multigpu import models
from multigpu.checks import check_count, check_number, check_positive
from multigpu.contract.devices import CPUFallbackWarning
from multigpu.contract.registry import default_backend, registered_backends
from multigpu.data.files import check_writable
from multigpu.distributed.rank import launched, launched_backend, launched_rank
from multigpu.errors import InputError, ModelError
from multigpu.models.graph import Model
from multigpu.optim.base import Optimizer
from multigpu.optim.choice import make_optimizer
from multigpu.optim.schedules import make_schedule
from multigpu.optim.sgd import SGD
from multigpu.parallel.buckets import DEFAULT_BUCKET_MB
from multigpu.parallel.data_parallel import DEFAULT_LR, DataParallel
from multigpu.parallel.process_group import ProcessGroup
from multigpu.parallel.token_batches import is_token_model
from multigpu.training.callbacks import Callback, CallbackList, EpochFunction, PlotCurves, ProgressBar
from multigpu.training.checkpoint import Checkpointer
from multigpu.training.divergence import DivergenceCheck
from multigpu.training.plotting import require_matplotlib
from multigpu.training.processes import join_job, train_processes
from multigpu.training.result import TrainResult

__all__ = ["DEFAULT_BATCH_SIZE", "DEFAULT_LR", "TrainResult", "Trainer", "learning_rate", "resolve_model", "train"]

LR_SCALINGS = (None, "linear")
FASHION_SHAPE, FASHION_CLASSES = (1, 28, 28), 10  # what the default data set holds
#: The global batch ``train()``, ``Trainer`` and ``multigpu train`` share (the textbook's).
DEFAULT_BATCH_SIZE = 256


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
        if model in registered_backends():  # train("torch", ...) from before model came first
            raise ModelError(
                f"model={model!r} is a backend, not a model: train()'s first argument is the model; "
                f"pass the backend by keyword, e.g. train('lenet', backend={model!r})"
            )
        if _is_text(data):  # a token model: the corpus's vocabulary and window length
            return models.get(model, num_classes=data.vocab_size, input_shape=(data.seq_len,))
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


def _is_text(data: Any) -> bool:
    """True for a text corpus (``multigpu.data.TextCorpus``: token windows and next-token labels)."""
    return data is not None and hasattr(data, "val_ids") and hasattr(data, "vocab_size")


def _check_fits(net: Model, data: Any) -> None:
    """Raise ModelError unless ``net`` takes the data's images and has a class per label (for a
    token model: the corpus's windows and a class per token id)."""
    if is_token_model(net) or _is_text(data):
        if not (is_token_model(net) and _is_text(data)):
            what = "token ids" if is_token_model(net) else "images"
            raise ModelError(
                f"model {net.name!r} takes {what} but the data are "
                + ("images" if is_token_model(net) else "text")
                + "; train a token model (e.g. multigpu.models.gpt(...)) on a text corpus "
                "(multigpu.data.load_fortunes()) and an image model on images"
            )
        vocab = int(net.shapes[net.output][-1])
        if vocab < data.vocab_size or net.input_shape[0] < data.seq_len:
            raise ModelError(
                f"model {net.name!r} predicts {vocab} tokens over {net.input_shape[0]} positions but the corpus "
                f"has {data.vocab_size} token ids in windows of {data.seq_len}; build it with "
                f"vocab_size={data.vocab_size}, seq_len={data.seq_len}"
            )
        return
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


def default_backend_name(backend: str | None) -> str:
    """``backend``, or where None: the backend ``multigpu launch`` was given, else the first
    installed of torch, paddle and mxnet, else numpy (one rule for ``train``, ``Trainer``,
    ``DataParallel`` and the command line)."""
    return backend if backend is not None else launched_backend() or default_backend()


def _check_settings(s: dict[str, Any]) -> None:
    """Raise InputError for a setting out of range, before anything is built or loaded."""
    check_count(s["batch_size"], "batch_size", example=DEFAULT_BATCH_SIZE)
    check_count(s["num_epochs"], "num_epochs", example=10)
    check_positive(s["lr"], "lr", example=DEFAULT_LR)
    if s["lr_scaling"] not in LR_SCALINGS:
        raise InputError(f"lr_scaling={s['lr_scaling']!r} is unknown; use None or 'linear'")
    check_number(s["warmup_epochs"], "warmup_epochs", minimum=0.0, example=1.0)
    if s["warmup_epochs"] and s["lr_scaling"] is None:
        raise InputError("warmup_epochs only applies with lr_scaling='linear'; set both or neither")
    make_schedule(s["lr_schedule"], 1, s["warmup_steps"], s["lr_floor"])  # raises for a bad name or warmup
    if s["lr_schedule"] is not None and s["lr_scaling"] is not None:
        raise InputError("lr_schedule and lr_scaling both set the learning rate per step; give one of them")
    if s["bucket_mb"] is not None:
        check_positive(s["bucket_mb"], "bucket_mb", unit="MiB", example=25)
    if not isinstance(s["model"], (str, Model)):
        resolve_model(s["model"])  # raises the ModelError that names the fix
    if isinstance(s["model"], str) and s["model"] not in models.MODELS:
        resolve_model(s["model"])


class Trainer:
    """Data-parallel training of ``model`` (a built-in name or a ``Model``) with callbacks.

    The settings are ``train()``'s (see there); ``callbacks`` are ``Callback`` instances
    called in order after the built-in ones. ``fit(data=None, ...)`` trains and returns a
    ``TrainResult``; a Trainer fits once. Every setting, the checkpoint folder and the
    plot path are checked here; the backend and devices when ``fit`` starts, before any
    data is loaded.
    """

    def __init__(
        self,
        model: str | Model = "lenet",
        *,
        backend: str | None = None,
        devices: int | str | Sequence[Any] = 1,
        batch_size: int = DEFAULT_BATCH_SIZE,
        lr: float = DEFAULT_LR,
        num_epochs: int = 10,
        optimizer: str | Optimizer = "sgd",
        allreduce: str = "fused",
        seed: int = 0,
        sync_bn: bool = False,
        bucket_mb: float | None = DEFAULT_BUCKET_MB,
        scale_batch: bool = False,
        lr_scaling: str | None = None,
        warmup_epochs: float = 0.0,
        lr_schedule: str | Callable[[int], float] | None = None,
        warmup_steps: int = 0,
        lr_floor: float = 0.0,
        progress: bool = True,
        checkpoint: str | os.PathLike[str] | None = None,
        plot: str | os.PathLike[str] | None = None,
        callbacks: Iterable[Callback] = (),
        process_group: ProcessGroup | None = None,
    ) -> None:
        _check_settings(locals())
        self.model_arg, self.backend_name, self.devices = model, default_backend_name(backend), devices
        self.batch_size, self.lr, self.num_epochs, self.seed = batch_size, lr, num_epochs, seed
        self.allreduce, self.sync_bn, self.bucket_mb = allreduce, sync_bn, bucket_mb
        self.scale_batch, self.lr_scaling, self.warmup_epochs = scale_batch, lr_scaling, warmup_epochs
        self.lr_schedule, self.warmup_steps, self.lr_floor = lr_schedule, warmup_steps, lr_floor
        self.optimizer = make_optimizer(optimizer)
        self.progress, self.plot, self.checkpoint = progress, plot, checkpoint
        self.user_callbacks = CallbackList(callbacks)
        self.process_group = process_group
        writer = (process_group.rank if process_group is not None else launched_rank()) == 0  # writes files
        if plot is not None:  # fail before training, not after ten epochs
            require_matplotlib()
            if writer:
                check_writable(plot, "plot")
        self.checkpointer = None if checkpoint is None else Checkpointer(checkpoint, writer)
        self.divergence = DivergenceCheck(checkpoint)
        self.stop_training = False  # a callback may set it: the run ends after the current epoch
        self._fitted = False

    # -- what fit() builds ---------------------------------------------------------------
    def _build_parallel(self, data: Any) -> None:
        """The model, the DataParallel (joining a launched job), and the batch arithmetic."""
        self.model = resolve_model(self.model_arg, data)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CPUFallbackWarning)
            group, devices, self._joined = self.process_group, self.devices, False
            if group is None and launched():
                group, devices = join_job(self.backend_name, self.devices)
                self._joined = True
            self.parallel = DataParallel(
                self.model,
                backend=self.backend_name,
                devices=devices,
                lr=self.lr,
                allreduce=self.allreduce,
                seed=self.seed,
                process_group=group,
                optimizer=self.optimizer,
                sync_bn=self.sync_bn,
                bucket_mb=self.bucket_mb,
            )
        self.rank, self.world_size = self.parallel.rank, self.parallel.world_size
        for w in caught:
            if self.progress and self.rank == 0:
                print(f"note: {w.message}", file=sys.stderr)
            if self.rank == 0:
                warnings.warn(w.message, stacklevel=4)  # keep it visible to callers that filter warnings
        n_dev = len(self.parallel.devices) * self.world_size  # every device of the job
        self.global_batch = self.batch_size * n_dev if self.scale_batch else self.batch_size
        check_count(self.global_batch, "batch_size", minimum=n_dev, example=f"{n_dev} (one row per device)")
        # the fewest rows a batch may have: one per device, two per device where a BatchNorm sees 1x1
        # planes (one value has no variance), or two in all with synchronized statistics
        two = max(self.model.min_training_examples().values(), default=1) > 1
        self.fewest = max(n_dev, 2) if two and self.sync_bn else 2 * n_dev if two else n_dev

    def _build_callbacks(self) -> None:
        """The built-in callbacks (checkpoint, progress, plot) before the user's."""
        built: list[Callback] = [] if self.checkpointer is None else [self.checkpointer]
        if self.progress and self.rank == 0:
            built.append(ProgressBar())
        if self.plot is not None:
            built.append(PlotCurves(self.plot))
        self.callbacks = CallbackList([*built, *self.user_callbacks.callbacks])

    def _new_result(self, train_size: int, test_size: int) -> None:
        """The empty TrainResult, and the run's settings a checkpoint must match (``config``)."""
        tr, net, opt = self.parallel, self.model, self.optimizer
        self.result = TrainResult(
            backend=tr.backend.name,
            devices=[str(d) for d in tr.devices],
            model=net.name,
            batch_size=self.global_batch,
            lr=self.lr,
            allreduce=self.allreduce,
            seed=self.seed,
            processes=self.world_size,
            rank=self.rank,
            optimizer=opt.config(),
            sync_bn=self.sync_bn,
        )
        self.config: dict[str, Any] = {
            "backend": self.result.backend,
            "devices": self.result.devices,
            "model": net.name,
            "param_shapes": [list(shape) for shape in net.param_shapes],
            "batch_size": self.global_batch,
            "lr": self.lr,
            "allreduce": self.allreduce,
            "seed": self.seed,
            "lr_scaling": self.lr_scaling,
            "warmup_epochs": self.warmup_epochs,
            "train_size": train_size,
            "test_size": test_size,
        }
        if self.lr_schedule is not None or self.warmup_steps:
            name = self.lr_schedule if isinstance(self.lr_schedule, str) or self.lr_schedule is None else "callable"
            self.config.update(lr_schedule=name, warmup_steps=self.warmup_steps, lr_floor=self.lr_floor)
        if opt.config() != SGD().config() or self.sync_bn or net.batch_norms:  # older checkpoints stay valid
            shapes = [list(shape) for shape in net.state_shapes]
            self.config.update(optimizer=opt.config(), sync_bn=self.sync_bn, state_shapes=shapes)
        if self.world_size > 1:
            self.config["processes"] = self.world_size

    # -- the run ----------------------------------------------------------------------------
    def fit(
        self,
        data: Any = None,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        verify_data: bool = True,
        train_limit: int | None = None,
        test_limit: int | None = None,
    ) -> TrainResult:
        """Train for ``num_epochs`` (from the checkpoint's epoch, if one is restored); return the result.

        ``data`` is any object shaped like ``FashionMNIST`` (None: Fashion-MNIST from
        ``data_dir``, checked unless ``verify_data=False``); ``train_limit``/``test_limit``
        use the first N examples.
        """
        if self._fitted:
            raise InputError("this Trainer has already fitted; build a new Trainer (checkpoint= resumes a run)")
        self._fitted = True
        for name, limit in (("train_limit", train_limit), ("test_limit", test_limit)):
            if limit is not None:
                check_count(limit, name, example=1000)
        probe = self.model_arg if isinstance(self.model_arg, Model) else models.get(self.model_arg)
        if data is None and is_token_model(probe):  # a text model's default data: the fortunes corpus
            from multigpu.data import load_fortunes

            data = load_fortunes(probe.input_shape[0], data_dir)
        self._build_parallel(data)
        if data is None:
            from multigpu.data import load_fashion_mnist

            data = load_fashion_mnist(data_dir, progress=self.progress and self.rank == 0, verify=verify_data)
        _check_fits(self.model, data)
        self.tokens = is_token_model(self.model)
        if self.tokens:  # windows of token ids, labelled with the next tokens; validation loss per epoch
            train_set = (data.train_ids[:train_limit], data.train_labels[:train_limit])
            test_set = (data.val_ids[:test_limit], data.val_labels[:test_limit])
        else:
            train_set = (data.train_images[:train_limit], data.train_labels[:train_limit])
            test_set = (data.test_images[:test_limit], data.test_labels[:test_limit])
        self._new_result(len(train_set[0]), len(test_set[0]))
        self.steps_per_epoch = math.ceil(len(train_set[0]) / self.global_batch)
        total = self.num_epochs * self.steps_per_epoch
        self.schedule = (
            None
            if self.lr_schedule is None and not self.warmup_steps
            else make_schedule(self.lr_schedule, total, self.warmup_steps, self.lr_floor)
        )
        self._build_callbacks()
        self.rng = np.random.default_rng(self.seed)
        start = 0 if self.checkpointer is None else self.checkpointer.restore(self)
        self.callbacks.on_fit_start(self)
        for epoch in range(start, self.num_epochs):
            if self.stop_training:
                break
            self._epoch(epoch, train_set, test_set)
        return self._finish(len(train_set[0]))

    def _epoch(self, epoch: int, train_set: tuple[Any, Any], test_set: tuple[Any, Any]) -> None:
        """Train one epoch, check it, evaluate it, record it and call the callbacks."""
        (X, y), tr = train_set, self.parallel
        chunks = _batches(len(X), self.global_batch, self.fewest, self.rng)
        steps_per_epoch = math.ceil(len(X) / self.global_batch)
        multiplier = self.global_batch // self.batch_size  # linear scaling follows the batch, not the devices
        done = len(self.result.train_loss)
        self.callbacks.on_epoch_start(self, epoch, len(chunks))
        total, t0 = 0.0, time.perf_counter()
        for i, idx in enumerate(chunks):
            step = epoch * steps_per_epoch + i
            if self.schedule is not None:
                tr.lr = self.lr * max(self.schedule(step), 1e-12)  # the rate must stay positive
            else:
                tr.lr = learning_rate(self.lr, multiplier, step, steps_per_epoch, self.lr_scaling, self.warmup_epochs)
            loss = tr.train_batch(X[idx], y[idx])  # read after the update: no extra device wait
            self.divergence.check_loss(loss, epoch, i + 1, tr.lr, done)
            total += loss * len(idx)
            if self.tokens:
                self.result.step_loss.append(loss)
            self.callbacks.on_batch_end(self, epoch, i, loss)
        tr.synchronize()  # queued device work belongs to this epoch's time
        seconds = time.perf_counter() - t0
        self.epoch_params = tr.get_params()  # one read per epoch, after the device work is done
        # every rank takes part in the gather
        self.epoch_stats = tr.gather_states() if self.model.batch_norms else np.zeros((0,), np.float32)
        self.divergence.check_params(self.epoch_params, self.epoch_stats, epoch, len(chunks), tr.lr, done)
        self.result.sec_per_epoch.append(seconds)
        self.result.train_loss.append(total / len(X))
        if self.tokens:
            self.result.val_loss.append(tr.token_loss(*test_set))
            score = {"val_loss": self.result.val_loss[-1]}
        else:
            self.result.test_acc.append(tr.evaluate(*test_set))
            score = {"test_acc": self.result.test_acc[-1]}
        logs = {**score, "train_loss": self.result.train_loss[-1], "seconds": seconds, "lr": tr.lr}
        self.callbacks.on_epoch_end(self, epoch, logs)

    def _finish(self, train_size: int) -> TrainResult:
        """Fill in the final parameters and throughput; leave a joined job; call on_fit_end."""
        result, tr = self.result, self.parallel
        result.params = tr.get_params()  # after a resume that had nothing left to do, too
        result.state = tr.get_state()
        result.samples_per_sec = train_size * len(result.sec_per_epoch) / max(sum(result.sec_per_epoch), 1e-12)
        if self._joined:
            assert tr.process_group is not None  # _build_parallel passed the joined job's group
            tr.process_group.close()
        self.callbacks.on_fit_end(self, result)
        return result


def _devices_from(devices: Any, num_gpus: Any) -> Any:
    """``devices``, or the deprecated ``num_gpus`` with a FutureWarning (shown by default)."""
    if num_gpus is None:
        return devices
    warnings.warn(
        "train(num_gpus=...) is deprecated and goes in the next release; use devices=..., as DataParallel does",
        FutureWarning,
        stacklevel=3,
    )
    if devices != 1:
        raise InputError(f"devices={devices!r} and num_gpus={num_gpus!r} both given; give devices only")
    return num_gpus


def train(
    model: str | Model = "lenet",
    *,
    backend: str | None = None,
    devices: int | str | Sequence[Any] = 1,
    batch_size: int = DEFAULT_BATCH_SIZE,
    lr: float = DEFAULT_LR,
    num_epochs: int = 10,
    optimizer: str | Optimizer = "sgd",
    allreduce: str = "fused",
    seed: int = 0,
    sync_bn: bool = False,
    bucket_mb: float | None = DEFAULT_BUCKET_MB,
    scale_batch: bool = False,
    lr_scaling: str | None = None,
    warmup_epochs: float = 0.0,
    lr_schedule: str | Callable[[int], float] | None = None,
    warmup_steps: int = 0,
    lr_floor: float = 0.0,
    data: Any = None,
    data_dir: str | os.PathLike[str] | None = None,
    verify_data: bool = True,
    train_limit: int | None = None,
    test_limit: int | None = None,
    progress: bool = True,
    checkpoint: str | os.PathLike[str] | None = None,
    plot: str | os.PathLike[str] | None = None,
    callbacks: Iterable[Callback] = (),
    on_epoch: Callable[[int, TrainResult], None] | None = None,
    processes: int = 1,
    process_group: ProcessGroup | None = None,
    num_gpus: int | str | None = None,
) -> TrainResult:
    """Train ``model`` on Fashion-MNIST (or ``data``) with data-parallel SGD; return a TrainResult.

    ``Trainer(model, ...).fit(data, ...)`` in one call. ``model`` is a built-in name
    (``"lenet"``, ``"resnet18"``, ...) or a ``Model``; every other argument is a keyword.
    ``backend`` None is the backend ``multigpu launch`` was given, else the first
    installed of torch, paddle and mxnet, else numpy. ``devices`` is a device count (CPU
    replicas with a warning when the framework sees fewer GPUs), ``"cpu:2"`` or
    ``"gpu:0,1"``, as in ``DataParallel`` (``num_gpus`` is its deprecated old name).

    ``optimizer`` is ``"sgd"`` (plain SGD, the textbook's), ``"adamw"`` or an optimizer
    object such as ``multigpu.optim.SGD(momentum=0.9, weight_decay=5e-4)``; ``lr`` is its
    learning rate. ``sync_bn`` synchronizes BatchNorm statistics across every device and
    process. With several processes the gradients cross them in buckets of up to
    ``bucket_mb`` MiB started during backward (None: one buffer after backward).
    ``scale_batch`` multiplies the batch by the device count; ``lr_scaling="linear"``
    scales the rate by the same global-batch multiplier (1 without ``scale_batch``),
    with an optional warmup. ``lr_schedule`` multiplies ``lr`` per step instead: ``"cosine"``
    (a linear warmup over ``warmup_steps``, then a half cosine down to ``lr_floor * lr`` at the
    last step), ``"constant"`` or a function of the step (torch's LambdaLR). A token model
    (``multigpu.models.gpt(...)``) trains on a text corpus (``data`` a
    ``multigpu.data.TextCorpus``; None: ``load_fortunes()``) and reports the validation loss
    per epoch instead of the test accuracy. ``data`` replaces the loader with any object shaped like
    ``FashionMNIST``; ``train_limit``/``test_limit`` use the first N examples;
    ``verify_data=False`` loads IDX files whose MD5 is not Fashion-MNIST's.

    ``checkpoint=DIR`` saves after every epoch (parameters, optimizer state, every
    replica's BatchNorm statistics) and resumes from DIR; ``plot=PNG`` draws the curves;
    ``callbacks`` run at each epoch's end (and more: see ``Callback``); ``on_epoch(epoch,
    result)`` is called on rank 0 after every epoch. A NaN or infinite loss stops the run
    with TrainingDivergedError naming the epoch and step; the last checkpoint stays.
    Raises InputError, ModelError, DeviceError, DataError/DataNotFoundError,
    MissingDependencyError (plot without matplotlib), CheckpointError or
    TrainingDivergedError, every setting and output path checked before data loads.

    ``processes=N`` trains as N processes on this host, each driving ``devices``, with the
    backend's own distributed engine, and returns rank 0's result (``data``, ``on_epoch``
    and ``callbacks`` must then be picklable). Inside a rank started by ``multigpu
    launch`` train() joins that job by itself; ``process_group`` joins one made
    elsewhere. Every rank draws the same global batches from ``seed`` and trains on its
    shard; only rank 0 writes checkpoints and plots. A failed rank raises
    RankFailedError (or CollectiveError) on the others.
    """
    args = dict(locals())
    args["devices"] = _devices_from(devices, args.pop("num_gpus"))
    if args.pop("processes") != 1:
        args["backend"] = default_backend_name(backend)  # the launcher starts that backend's engine
        return train_processes(processes, args)  # the ranks call train(**args) again
    fit = {k: args.pop(k) for k in ("data", "data_dir", "verify_data", "train_limit", "test_limit")}
    epoch_fn = args.pop("on_epoch")
    args["callbacks"] = [*([] if epoch_fn is None else [EpochFunction(epoch_fn)]), *callbacks]
    return Trainer(args.pop("model"), **args).fit(fit.pop("data"), **fit)
