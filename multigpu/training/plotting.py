"""Plots of training curves (matplotlib is the optional ``plot`` extra)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from typing import Any

from multigpu.errors import MissingDependencyError


def require_matplotlib() -> None:
    """Raise MissingDependencyError naming the extra when matplotlib is absent."""
    if importlib.util.find_spec("matplotlib") is None:
        raise MissingDependencyError(
            "plotting needs matplotlib, which is not installed; install it with: pip install 'multigpu[plot]'"
        )


def plot_curves(results: Sequence[Any], path: str | os.PathLike[str], title: str = "") -> None:
    """Write a PNG of test accuracy and train loss per epoch for one or more TrainResults."""
    fig, (acc_ax, loss_ax) = _two_panels()
    for r in results:
        epochs = range(1, len(r.test_acc) + 1)
        label = f"{r.backend} ({len(r.devices)} dev)"
        acc_ax.plot(epochs, r.test_acc, marker="o", label=label)
        loss_ax.plot(epochs, r.train_loss, marker="o", label=label)
    acc_ax.set(xlabel="epoch", ylabel="test accuracy", title="test accuracy")
    loss_ax.set(xlabel="epoch", ylabel="train loss", title="train loss (mean per example)")
    _save(fig, (acc_ax, loss_ax), title, path)


def plot_loss_curves(results: Sequence[Any], path: str | os.PathLike[str], title: str = "") -> None:
    """Write a PNG of a token model's training loss per step and validation loss per epoch."""
    fig, (step_ax, val_ax) = _two_panels()
    for r in results:
        label = f"{r.backend} ({len(r.devices)} dev)"
        step_ax.plot(range(1, len(r.step_loss) + 1), r.step_loss, label=label, linewidth=0.8)
        val_ax.plot(range(1, len(r.val_loss) + 1), r.val_loss, marker="o", label=label)
    step_ax.set(xlabel="step", ylabel="train loss (nats per token)", title="training loss")
    val_ax.set(xlabel="epoch", ylabel="validation loss (nats per token)", title="validation loss")
    _save(fig, (step_ax, val_ax), title, path)


def _two_panels() -> tuple[Any, Any]:
    """A figure with two side-by-side axes (matplotlib loaded for files only)."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only: no display is needed or wanted
    import matplotlib.pyplot as plt

    return plt.subplots(1, 2, figsize=(10, 4))


def _save(fig: Any, axes: Sequence[Any], title: str, path: str | os.PathLike[str]) -> None:
    """Grid and legend on each axis, the title, then the PNG written and the figure closed."""
    import matplotlib.pyplot as plt

    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
