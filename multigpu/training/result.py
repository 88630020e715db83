"""``TrainResult``: what a training run measured."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from multigpu.data.files import atomic_write


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
    #: a token model's validation loss per epoch (mean per counted position; its runs have no test_acc)
    val_loss: list[float] = field(default_factory=list)
    #: a token model's training loss after every step
    step_loss: list[float] = field(default_factory=list)

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
