"""``accuracy``: the textbook's experiment on real Fashion-MNIST, every framework, 3 seeds.

``multigpu.train("lenet", backend=B, devices=2, batch_size=256, lr=0.2, num_epochs=10, seed=s)``
for seeds 0, 1, 2, each run in its own process (the same run as
``multigpu train --backend B --devices 2 --seed S``). Reported: the final and the best
test accuracy per seed, their mean and spread (min-max, standard deviation) per
framework, and the seconds per epoch. Long (tens of minutes on 2 CPU cores), so
not in ``--quick``; ``multigpu bench accuracy --quick`` runs a 1-epoch, 6,000-example
version with one seed, to try the benchmark out.
"""

from __future__ import annotations

import statistics
from typing import Any

from multigpu.benchmarks.harness import Options, Result, Table, isolated

TITLE = "Accuracy: LeNet on real Fashion-MNIST, 2 devices, 10 epochs, 3 seeds per framework"
IN_QUICK = False

SEEDS = (0, 1, 2)
DEVICES, BATCH, LR, EPOCHS = 2, 256, 0.2, 10


def train_one(
    framework: str, seed: int, epochs: int, train_limit: Any, test_limit: Any, progress: bool
) -> dict[str, Any]:
    """In a fresh process: one ``multigpu.train`` run; return its result as a dict."""
    import warnings

    import multigpu
    from multigpu.contract.devices import CPUFallbackWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CPUFallbackWarning)
        r = multigpu.train(
            backend=framework,
            devices=DEVICES,
            batch_size=BATCH,
            lr=LR,
            num_epochs=epochs,
            seed=seed,
            progress=progress,
            train_limit=train_limit,
            test_limit=test_limit,
        )
    return r.to_dict()


def _spread(xs: list[float]) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.4f} (min {min(xs):.4f}, max {max(xs):.4f}, sd {sd:.4f})"


def run(opts: Options) -> Result:
    """Train every framework with every seed, each run in its own process; tabulate."""
    seeds = (0,) if opts.quick else SEEDS
    epochs, train_limit, test_limit = (1, 6000, 2000) if opts.quick else (EPOCHS, None, None)
    data: dict[str, Any] = {}
    rows, per_seed = [], []
    for fw in opts.frameworks():
        runs = data[fw] = [
            isolated(f"{__package__}.accuracy:train_one", fw, s, epochs, train_limit, test_limit, opts.progress)
            for s in seeds
        ]
        finals = [r["test_acc"][-1] for r in runs]
        bests = [max(r["test_acc"]) for r in runs]
        secs = [statistics.median(r["sec_per_epoch"]) for r in runs]
        rows.append(
            [
                fw,
                len(runs),
                _spread(finals),
                _spread(bests),
                f"{statistics.median(secs):.1f}",
                ", ".join(runs[0]["devices"]),
            ]
        )
        per_seed += [
            [
                fw,
                r["seed"],
                f"{r['test_acc'][-1]:.4f}",
                f"{max(r['test_acc']):.4f}",
                f"{statistics.median(r['sec_per_epoch']):.1f}",
            ]
            for r in runs
        ]
    notes = [
        f"{epochs} epoch(s), batch {BATCH}, lr {LR}, {DEVICES} devices (CPU replicas without GPUs), "
        f"{'the first ' + str(train_limit) + ' training images' if train_limit else 'all 60,000 training images'}"
        ", test accuracy on "
        f"{'the first ' + str(test_limit) if test_limit else 'all 10,000'} test images after every epoch.",
        "sec/epoch: median over epochs of the training time (evaluation excluded); the machine was shared, "
        "see the load line above.",
    ]
    if len(data) > 1:
        means = {fw: statistics.mean(r["test_acc"][-1] for r in runs) for fw, runs in data.items()}
        notes.append(f"spread of the frameworks' mean final accuracy: {max(means.values()) - min(means.values()):.4f}")
    tables = [
        Table(
            "Final and best test accuracy per framework (mean over seeds, spread)",
            ["backend", "seeds", "final test accuracy", "best test accuracy", "sec/epoch", "devices"],
            rows,
        ),
        Table("Per seed", ["backend", "seed", "final", "best", "sec/epoch"], per_seed),
    ]
    return Result(
        "accuracy",
        TITLE,
        tables,
        data,
        settings={
            "seeds": seeds,
            "epochs": epochs,
            "batch": BATCH,
            "lr": LR,
            "devices": DEVICES,
            "train_limit": train_limit,
            "test_limit": test_limit,
        },
        notes=notes,
        plot=lambda fig: _plot(fig, data),
    )


def _plot(fig: Any, data: dict[str, Any]) -> None:
    import numpy as np

    ax_acc, ax_loss = fig.subplots(1, 2)
    for fw, runs in data.items():
        acc = np.array([r["test_acc"] for r in runs])
        loss = np.array([r["train_loss"] for r in runs])
        epochs = np.arange(1, acc.shape[1] + 1)
        line = ax_acc.plot(epochs, acc.mean(0), marker="o", label=f"{fw} (mean of {len(runs)})")[0]
        ax_acc.fill_between(epochs, acc.min(0), acc.max(0), color=line.get_color(), alpha=0.2)
        ax_loss.plot(epochs, loss.mean(0), marker="o", color=line.get_color(), label=fw)
        ax_loss.fill_between(epochs, loss.min(0), loss.max(0), color=line.get_color(), alpha=0.2)
    ax_acc.set(xlabel="epoch", ylabel="test accuracy", title="test accuracy (band: min-max over seeds)")
    ax_loss.set(xlabel="epoch", ylabel="train loss (mean per example)", title="train loss")
    for ax in (ax_acc, ax_loss):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
