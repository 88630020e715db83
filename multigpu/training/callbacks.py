"""Callbacks: code that runs at fixed points of ``Trainer.fit()``, as in Keras and Lightning.

Subclass ``Callback`` and override the hooks you need; pass instances as
``Trainer(callbacks=[...])`` or ``train(callbacks=[...])``. Each hook gets the trainer
first (``trainer.result`` holds the history so far, ``trainer.parallel`` the
``DataParallel``, ``trainer.rank`` this process's rank); setting
``trainer.stop_training = True`` ends the run after the current epoch, as in Keras.

Hooks run on every rank of a multi-process run; a callback that writes files should do
so where ``trainer.rank == 0``. The progress bar, the checkpoint, the curves and the
``on_epoch`` function of ``train()`` are callbacks too (``ProgressBar``,
``multigpu.training.checkpoint.Checkpointer``, ``PlotCurves``, ``EpochFunction``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from multigpu.errors import InputError
from multigpu.training.plotting import plot_curves, plot_loss_curves
from multigpu.training.result import TrainResult

#: What the hooks get first: the ``multigpu.training.Trainer`` (typed loosely: the trainer imports this module).
TrainerLike = Any


class Callback:
    """Base class of training callbacks; every hook does nothing unless overridden.

    ``epoch`` counts from 0, as in Keras. ``logs`` at the end of an epoch holds
    ``test_acc`` (a token model's: ``val_loss``), ``train_loss``, ``seconds`` and ``lr``.
    """

    def on_fit_start(self, trainer: TrainerLike) -> None:
        """Before the first epoch (after a checkpoint, if any, was restored)."""

    def on_epoch_start(self, trainer: TrainerLike, epoch: int, steps: int) -> None:
        """Before the first step of ``epoch``, which has ``steps`` steps."""

    def on_batch_end(self, trainer: TrainerLike, epoch: int, step: int, loss: float) -> None:
        """After step ``step`` (from 0) of ``epoch``; ``loss`` is the batch's mean loss."""

    def on_epoch_end(self, trainer: TrainerLike, epoch: int, logs: dict[str, float]) -> None:
        """After ``epoch`` was trained and evaluated; ``trainer.result`` already holds it."""

    def on_checkpoint(self, trainer: TrainerLike, epoch: int, path: Path) -> None:
        """After the checkpoint of ``epoch`` was written to ``path`` (rank 0 only)."""

    def on_fit_end(self, trainer: TrainerLike, result: TrainResult) -> None:
        """After the last epoch; ``result`` is what ``fit()`` returns."""


class CallbackList(Callback):
    """Several callbacks called in order, each hook in turn."""

    def __init__(self, callbacks: Iterable[Callback] = ()) -> None:
        self.callbacks = list(callbacks)
        for cb in self.callbacks:
            if not isinstance(cb, Callback):
                raise InputError(
                    f"callbacks must be multigpu.training.Callback instances, got {cb!r}; "
                    "subclass Callback and override e.g. on_epoch_end"
                )

    def on_fit_start(self, trainer: TrainerLike) -> None:
        for cb in self.callbacks:
            cb.on_fit_start(trainer)

    def on_epoch_start(self, trainer: TrainerLike, epoch: int, steps: int) -> None:
        for cb in self.callbacks:
            cb.on_epoch_start(trainer, epoch, steps)

    def on_batch_end(self, trainer: TrainerLike, epoch: int, step: int, loss: float) -> None:
        for cb in self.callbacks:
            cb.on_batch_end(trainer, epoch, step, loss)

    def on_epoch_end(self, trainer: TrainerLike, epoch: int, logs: dict[str, float]) -> None:
        for cb in self.callbacks:
            cb.on_epoch_end(trainer, epoch, logs)

    def on_checkpoint(self, trainer: TrainerLike, epoch: int, path: Path) -> None:
        for cb in self.callbacks:
            cb.on_checkpoint(trainer, epoch, path)

    def on_fit_end(self, trainer: TrainerLike, result: TrainResult) -> None:
        for cb in self.callbacks:
            cb.on_fit_end(trainer, result)


class ProgressBar(Callback):
    """A bar of the epoch's steps on stderr, drawn on a terminal only (tqdm's ``disable=None``),
    and one line per epoch on stdout: test accuracy, train loss, seconds, devices."""

    def __init__(self) -> None:
        self._bar: Any = None

    def on_epoch_start(self, trainer: TrainerLike, epoch: int, steps: int) -> None:
        from tqdm.auto import tqdm

        desc = f"epoch {epoch + 1}/{trainer.num_epochs}"
        # disable=None: no carriage-return updates where stderr is a file or a pipe
        self._bar = tqdm(total=steps, desc=desc, unit="batch", leave=False, disable=None, file=sys.stderr)

    def on_batch_end(self, trainer: TrainerLike, epoch: int, step: int, loss: float) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def on_epoch_end(self, trainer: TrainerLike, epoch: int, logs: dict[str, float]) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        r = trainer.result
        score = f"val loss {logs['val_loss']:.3f}" if "val_loss" in logs else f"test acc {logs['test_acc']:.3f}"
        print(
            f"epoch {epoch + 1}/{trainer.num_epochs}: {score}, "
            f"train loss {logs['train_loss']:.3f}, {logs['seconds']:.1f} sec/epoch on {r.devices} ({r.backend})",
            flush=True,
        )


class PlotCurves(Callback):
    """Write the accuracy and loss curves to ``path`` (a PNG) at the end of the run, on rank 0."""

    def __init__(self, path: Any) -> None:
        self.path = path

    def on_fit_end(self, trainer: TrainerLike, result: TrainResult) -> None:
        if trainer.rank == 0 and result.val_loss:
            plot_loss_curves([result], self.path, title=f"{result.model} on a text corpus, {result.backend}")
        elif trainer.rank == 0:
            plot_curves([result], self.path, title=f"{result.model} on Fashion-MNIST, {result.backend}")


class EpochFunction(Callback):
    """Call ``fn(epoch, result)`` after every epoch on rank 0 (``train(on_epoch=fn)``)."""

    def __init__(self, fn: Callable[[int, TrainResult], None]) -> None:
        if not callable(fn):
            raise InputError(f"on_epoch={fn!r} is not callable; pass a function of (epoch, result)")
        self.fn = fn

    def on_epoch_end(self, trainer: TrainerLike, epoch: int, logs: dict[str, float]) -> None:
        if trainer.rank == 0:
            self.fn(epoch, trainer.result)
