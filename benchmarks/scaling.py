"""``scaling``: LeNet training throughput against device count, per framework.

Each framework runs in its own process. ``DataParallel`` trains LeNet on 1, 2, 4
(and 8) devices, GPUs when the framework sees that many, else CPU replicas, and the
device counts are timed alternately, one step each per round:

* weak scaling: 128 examples per device (a global batch of 128 N), the textbook's
  exercise of growing the batch with the device count;
* strong scaling: a global batch of 256 whatever N.

Throughput is examples per second; scaling efficiency is thr_N / (N x thr_1), the
median of per-round ratios. CPU replicas share this machine's cores, so on CPU the
efficiency shows what the replicas cost, not what more devices would give.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from multigpu.benchmarks.harness import (
    Options,
    Result,
    Table,
    device_spec,
    fmt_ms,
    interleaved,
    isolated,
    progress_bar,
    ratio,
    summary,
)

TITLE = "Scaling: LeNet examples per second against device count, efficiency thr_N / (N x thr_1)"
IN_QUICK = True

PER_DEVICE, GLOBAL, LR = 128, 256, 0.2
MODES = {"weak": "128 per device", "strong": "256 in all"}


def _batch(mode: str, n: int) -> int:
    return PER_DEVICE * n if mode == "weak" else GLOBAL


def _step(tr: Any, X: np.ndarray, y: np.ndarray) -> Callable[[], None]:
    """One timed case: a training step on (X, y), then a synchronize so the timer sees its end."""

    def run() -> None:
        tr.train_batch(X, y)
        tr.synchronize()

    return run


def measure(framework: str, counts: tuple[int, ...], repeat: int, warmup: int, progress: bool) -> dict[str, Any]:
    """In a fresh process: time one step per device count, alternately, for both modes."""
    import multigpu
    from multigpu import models
    from multigpu.contract.devices import CPUFallbackWarning

    be = multigpu.backend(framework)
    model = models.lenet()
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    bar = progress_bar(len(MODES) * repeat, f"scaling {framework}", progress)
    for mode in MODES:
        cases, kinds = {}, {}
        for n in counts:
            spec, kinds[n] = device_spec(be, n)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CPUFallbackWarning)
                tr = multigpu.DataParallel(model, backend=framework, devices=spec, lr=LR, seed=0)
            B = _batch(mode, n)
            X = rng.random((B, 1, 28, 28), dtype=np.float32)
            y = rng.integers(0, 10, B)
            cases[str(n)] = _step(tr, X, y)
        samples = interleaved(cases, repeat=repeat, warmup=warmup, progress=bar.update, reverse_odd_rounds=True)
        out[mode] = {n: {"kind": kinds[n], "batch": _batch(mode, n), "samples": samples[str(n)]} for n in counts}
    bar.close()
    return out


def run(opts: Options) -> Result:
    """Measure each framework in its own process; tabulate throughput and efficiency."""
    counts = opts.repeats((1, 2, 4, 8), (1, 2, 4))
    repeat, warmup = opts.repeats(20, 4), opts.repeats(2, 1)
    data: dict[str, Any] = {}
    rows = []
    for fw in opts.frameworks():
        data[fw] = got = isolated(f"{__package__}.scaling:measure", fw, counts, repeat, warmup, opts.progress)
        for mode, per_n in got.items():
            one = per_n[counts[0]]
            for n, rec in per_n.items():
                t = summary(rec["samples"])
                # thr_N / (N thr_1) = (B_N / t_N) / (N B_1 / t_1), per round
                eff = ratio(one["samples"], rec["samples"])
                scale = rec["batch"] / (n * one["batch"])
                rec["efficiency"] = {k: v * scale if k != "n" else v for k, v in eff.items()}
                rec["samples_per_s"] = rec["batch"] / t["median"]
                e = rec["efficiency"]
                # Same global batch: is a step on N devices quicker than on one? (On GPUs the
                # no-host-sync step should make 2 GPUs beat 1.)
                vs_one = ratio(rec["samples"], one["samples"]) if mode == "strong" else None
                rec["time_vs_one_device"] = vs_one
                rows.append(
                    [
                        fw,
                        mode,
                        f"{n} {rec['kind'].upper()}",
                        rec["batch"],
                        fmt_ms(t),
                        f"{rec['samples_per_s']:.0f}",
                        f"{e['median']:.2f} ({e['q1']:.2f}-{e['q3']:.2f})",
                        "-"
                        if vs_one is None or n == counts[0]
                        else f"{vs_one['median']:.2f} ({vs_one['q1']:.2f}-{vs_one['q3']:.2f})",
                    ]
                )
    notes = [
        f"{repeat} alternating rounds (one step per device count each) after {warmup} warm-up; "
        "step time median (quartiles) in ms; efficiency = thr_N / (N x thr_1), median (quartiles) of "
        "per-round ratios.",
        "weak: 128 examples per device; strong: 256 in all. CPU rows are CPU replicas sharing this "
        "machine's cores: the arithmetic does not grow with N, so efficiency near 1/N is what CPU "
        "replicas can give; above 1/N, smaller per-replica batches run faster per example (cache) and "
        "MXNet runs each CPU context on its own engine thread.",
        "step time / 1 device: the same global batch on N devices against one device (median, "
        "quartiles of per-round ratios); below 1, N devices finish the step sooner.",
    ]
    table = Table(
        "Throughput and scaling efficiency (DataParallel, fused allreduce)",
        [
            "backend",
            "scaling",
            "devices",
            "global batch",
            "step ms",
            "examples/s",
            "efficiency",
            "step time / 1 device (strong)",
        ],
        rows,
    )
    return Result(
        "scaling",
        TITLE,
        [table],
        data,
        settings={"devices": counts, "per_device": PER_DEVICE, "global": GLOBAL, "repeat": repeat, "warmup": warmup},
        notes=notes,
        plot=lambda fig: _plot(fig, data),
    )


def _plot(fig: Any, data: dict[str, Any]) -> None:
    ax_thr, ax_eff = fig.subplots(1, 2)
    for i, (fw, got) in enumerate(data.items()):
        color = f"C{i}"  # one colour per framework; the line style tells the mode
        for mode, style in (("weak", "-"), ("strong", "--")):
            ns = list(got[mode])
            ax_thr.plot(
                ns, [got[mode][n]["samples_per_s"] for n in ns], style, marker="o", color=color, label=f"{fw} {mode}"
            )
            ax_eff.plot(
                ns,
                [got[mode][n]["efficiency"]["median"] for n in ns],
                style,
                marker="o",
                color=color,
                label=f"{fw} {mode}",
            )
    ax_thr.set(xlabel="devices", ylabel="examples / s", title="throughput (weak: solid, strong: dashed)")
    ax_eff.set(xlabel="devices", ylabel="thr_N / (N x thr_1)", title="scaling efficiency", ylim=(0, None))
    for ax in (ax_thr, ax_eff):
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
