"""Training: ``Trainer`` (with ``fit()`` and callbacks) over the data-parallel step, ``train()``
as its one-call form, checkpoints, plots, and runs across several processes.
"""

from __future__ import annotations

from multigpu.training.callbacks import Callback, EpochFunction, PlotCurves, ProgressBar
from multigpu.training.checkpoint import Checkpointer
from multigpu.training.result import TrainResult
from multigpu.training.trainer import DEFAULT_BATCH_SIZE, Trainer, train

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "Callback",
    "Checkpointer",
    "EpochFunction",
    "PlotCurves",
    "ProgressBar",
    "TrainResult",
    "Trainer",
    "train",
]
