"""Training: ``train()`` over the data-parallel step, checkpoints, plots, and runs
across several processes.
"""

from __future__ import annotations

from multigpu.training.trainer import TrainResult, train

__all__ = ["TrainResult", "train"]
