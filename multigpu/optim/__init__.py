"""Optimizers as core algorithms over the backend's whole-buffer math, one definition for
every framework: SGD with momentum, Nesterov and weight decay, and AdamW, each exactly as
``torch.optim`` defines it, and learning-rate schedules (a linear warmup, then a cosine).
Their state (momentum buffers, Adam's moments) lives per
replica as flat buffers, beside the flat parameters and gradients.
"""

from __future__ import annotations

from multigpu.optim.adamw import AdamW
from multigpu.optim.base import Optimizer
from multigpu.optim.choice import OPTIMIZERS, make_optimizer
from multigpu.optim.schedules import SCHEDULES, make_schedule, warmup_cosine
from multigpu.optim.sgd import SGD

__all__ = ["OPTIMIZERS", "SCHEDULES", "SGD", "AdamW", "Optimizer", "make_optimizer", "make_schedule", "warmup_cosine"]
