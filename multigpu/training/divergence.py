"""Stopping a run whose loss or parameters turned NaN or infinite (Keras's ``TerminateOnNaN``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from multigpu.errors import TrainingDivergedError


class DivergenceCheck:
    """Raises ``TrainingDivergedError`` naming the epoch, the step, the learning rate, a lower
    one to try, and what the checkpoint folder (``checkpoint``, or None) still holds."""

    def __init__(self, checkpoint: Any) -> None:
        self.checkpoint = checkpoint

    def check_loss(self, loss: float, epoch: int, step: int, lr: float, done: int) -> None:
        """Raise unless ``loss`` (of step ``step`` from 1, epoch ``epoch`` from 0) is finite."""
        if not math.isfinite(loss):
            raise self.error(f"the loss is {loss} at epoch {epoch + 1}, step {step}", epoch, step, loss, lr, done)

    def check_params(
        self, params: Sequence[np.ndarray], stats: np.ndarray, epoch: int, steps: int, lr: float, done: int
    ) -> None:
        """Raise when the parameters or the BatchNorm statistics hold NaN or infinity after ``epoch``:
        a ReLU may hide a NaN from the loss."""
        if not all(np.isfinite(p).all() for p in params):
            bad = "parameters"
        elif not np.isfinite(stats).all():
            bad = "BatchNorm running statistics"
        else:
            return
        what = f"the {bad} hold NaN or infinity after epoch {epoch + 1} although every loss was finite"
        raise self.error(what, epoch, steps, math.nan, lr, done)

    def error(self, what: str, epoch: int, step: int, loss: float, lr: float, done: int) -> TrainingDivergedError:
        """The error for ``what``; ``done`` is the count of epochs the checkpoint holds."""
        if self.checkpoint is None:
            kept = "no checkpoint was asked for (--checkpoint DIR keeps one per epoch)"
        elif done:
            kept = f"the checkpoint in {self.checkpoint} still holds epoch {done}"
        else:
            kept = f"no epoch finished, so {self.checkpoint} holds no checkpoint"
        return TrainingDivergedError(
            f"training diverged: {what} (lr {lr:g}); lower the learning rate, e.g. to {lr / 10:g}; {kept}",
            epoch=epoch + 1,
            step=step,
            loss=loss,
        )
