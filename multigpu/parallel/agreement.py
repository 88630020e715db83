"""Cross-framework agreement: train the same model from the same start on every backend."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from multigpu.checks import check_count
from multigpu.contract.devices import CPUFallbackWarning
from multigpu.models.sequential import Sequential
from multigpu.parallel.data_parallel import DataParallel


@dataclass(frozen=True)
class Agreement:
    """Worst absolute differences of one backend against the NumPy reference."""

    backend: str
    devices: list[str]
    max_param_diff: float
    max_loss_diff: float


def train_steps(model: Sequential, backend: str, params: Sequence[np.ndarray],
                batches: Sequence[tuple[np.ndarray, np.ndarray]], devices: object = 2,
                lr: float = 0.2, allreduce: str = "fused") -> tuple[list[float], list[np.ndarray], list[str]]:
    """Run ``batches`` through DataParallel; return (losses, final params, device names)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CPUFallbackWarning)
        tr = DataParallel(model, backend=backend, devices=devices, lr=lr, params=list(params),
                          allreduce=allreduce)
    losses = [tr.train_batch(X, y) for X, y in batches]
    return losses, tr.get_params(), [str(d) for d in tr.devices]


def random_batches(model: Sequential, steps: int, batch: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Return ``steps`` seeded random (X, y) batches shaped for ``model``."""
    rng = np.random.default_rng(seed)
    return [(rng.random((batch, *model.input_shape), dtype=np.float32),
             rng.integers(0, model.num_classes, batch)) for _ in range(steps)]


def agreement(model: Sequential, backends: Sequence[str], steps: int = 10, batch: int = 32,
              devices: object = 2, lr: float = 0.2, seed: int = 0,
              allreduce: str = "fused", reference: str = "numpy",
              params: Optional[Sequence[np.ndarray]] = None) -> list[Agreement]:
    """Compare each backend with ``reference`` after ``steps`` identical SGD steps.

    Raises InputError for fewer than one step or an empty batch.
    """
    check_count(steps, "steps", example=10)
    check_count(batch, "batch", example=32)
    start = model.init_params(seed) if params is None else list(params)
    batches = random_batches(model, steps, batch, seed)
    # The reference always uses the textbook's naive allreduce: it may offer no native one,
    # and the sum it defines does not depend on the algorithm.
    ref_losses, ref_params, _ = train_steps(model, reference, start, batches, devices, lr, "naive")
    out = []
    for name in backends:
        losses, final, devs = train_steps(model, name, start, batches, devices, lr, allreduce)
        out.append(Agreement(
            backend=name, devices=devs,
            max_param_diff=max(float(np.abs(a - b).max()) for a, b in zip(final, ref_params)),
            max_loss_diff=max(abs(a - b) for a, b in zip(losses, ref_losses))))
    return out
