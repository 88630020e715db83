"""``resnet_accuracy``: the chapter's next experiment, ResNet-18 on Fashion-MNIST, 1 device against 2.

The textbook trains its small ResNet-18 (``multigpu.models.resnet18_textbook``: a 3x3
stem, no max pool, d2l's residual blocks) on Fashion-MNIST with plain SGD on one GPU at
batch 256 and lr 0.1, then on two GPUs at batch 512 and lr 0.2, and compares accuracy
and time per epoch. Here each run is ``multigpu.train(model="resnet18_textbook", ...)``
with per-device BatchNorm statistics (the chapter's), in its own process, on the first
``TRAIN`` training and ``TEST`` test images (a full epoch of 60,000 takes hours on two
CPU cores). On CPU replicas two devices share the same cores, so the second run is not
faster here: the comparison is of accuracy per epoch at the doubled batch and rate.

Test accuracy uses the running statistics, which need some 50 steps to forget their start
(momentum 0.1: 0.9^50 is 0.5%): with fewer, inference accuracy stays near chance while the
training loss falls. Hence 60 steps of batch 256 (30 of 512), not a handful.
"""

from __future__ import annotations

import statistics
from typing import Any

from multigpu.benchmarks.harness import Options, Result, Table, isolated

TITLE = "ResNet-18 (the textbook's) on Fashion-MNIST: 1 device at batch 256, lr 0.1 against 2 at 512, lr 0.2"
IN_QUICK = False

CONFIGS = (("1 device", 1, 256, 0.1), ("2 devices", 2, 512, 0.2))
TRAIN, TEST, EPOCHS = 3072, 500, 5  # 60 steps at batch 256: minutes per run (a full epoch takes an hour)
#: Without --backends only torch runs: each framework takes about half an hour here, Paddle five times that.
DEFAULT_FRAMEWORKS = ("torch",)


def train_one(
    framework: str, devices: int, batch: int, lr: float, epochs: int, train_limit: int, test_limit: int, progress: bool
) -> dict[str, Any]:
    """In a fresh process: one ``multigpu.train`` run; return its result as a dict."""
    import warnings

    import multigpu
    from multigpu.contract.devices import CPUFallbackWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CPUFallbackWarning)
        r = multigpu.train(
            backend=framework,
            model="resnet18_textbook",
            devices=devices,
            batch_size=batch,
            lr=lr,
            num_epochs=epochs,
            seed=0,
            progress=progress,
            train_limit=train_limit,
            test_limit=test_limit,
        )
    return r.to_dict()


def run(opts: Options) -> Result:
    """Train every framework in both configurations, each run in its own process; tabulate."""
    epochs, train, test = (1, 512, 256) if opts.quick else (EPOCHS, TRAIN, TEST)
    data: dict[str, Any] = {}
    rows = []
    frameworks = (
        opts.frameworks() if opts.backends is not None else [f for f in opts.frameworks() if f in DEFAULT_FRAMEWORKS]
    )
    for fw in frameworks:
        data[fw] = {}
        for label, devices, batch, lr in CONFIGS:
            r = data[fw][label] = isolated(
                f"{__package__}.resnet_accuracy:train_one", fw, devices, batch, lr, epochs, train, test, opts.progress
            )
            rows.append(
                [
                    fw,
                    label,
                    batch,
                    lr,
                    " ".join(f"{a:.3f}" for a in r["test_acc"]),
                    " ".join(f"{x:.3f}" for x in r["train_loss"]),
                    f"{statistics.median(r['sec_per_epoch']):.0f}",
                    f"{r['samples_per_sec']:.1f}",
                    ", ".join(r["devices"]),
                ]
            )
    notes = [
        f"{epochs} epoch(s) on the first {train} training images, test accuracy on the first {test} test "
        "images after every epoch; plain SGD (the chapter's), He init, per-device BatchNorm statistics.",
        "2 devices are CPU replicas without GPUs: they share the machine's cores, so time per epoch does not "
        "drop; with GPUs each would take half the batch.",
        "sec/epoch: median over epochs of the training time (evaluation excluded); the machine was shared, "
        "see the load line above.",
    ]
    table = Table(
        "Test accuracy and train loss per epoch",
        ["backend", "run", "batch", "lr", "test accuracy", "train loss", "sec/epoch", "examples/s", "devices"],
        rows,
    )
    return Result(
        "resnet_accuracy",
        TITLE,
        [table],
        data,
        settings={"configs": CONFIGS, "epochs": epochs, "train_limit": train, "test_limit": test},
        notes=notes,
        plot=lambda fig: _plot(fig, data),
    )


def _plot(fig: Any, data: dict[str, Any]) -> None:
    ax_acc, ax_loss = fig.subplots(1, 2)
    for fw, runs in data.items():
        for label, r in runs.items():
            epochs = range(1, len(r["test_acc"]) + 1)
            ax_acc.plot(epochs, r["test_acc"], marker="o", label=f"{fw}, {label}")
            ax_loss.plot(epochs, r["train_loss"], marker="o", label=f"{fw}, {label}")
    ax_acc.set(xlabel="epoch", ylabel="test accuracy", title="test accuracy")
    ax_loss.set(xlabel="epoch", ylabel="train loss (mean per example)", title="train loss")
    for ax in (ax_acc, ax_loss):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
