"""``step``: one LeNet training step (batch 256), DataParallel against the loops it replaces.

For each framework, in its own process, on 1, 2 and 4 devices (GPUs when the
framework sees that many, else CPU replicas), these run alternately on the same
batch:

* ``ours``: ``DataParallel(lenet, backend, devices, allreduce="fused").train_batch``;
* ``textbook``: the chapter's own multi-device code (``textbook.py``) with its naive
  per-parameter allreduce; for Paddle the variant whose allreduce writes in place,
  and ``textbook as printed`` beside it (the chapter's allreduce never sums);
* on one device, the framework's hand-written loop (``handwritten.py``): torch
  autograd + SGD, MXNet autograd + SGD and a Gluon ``Trainer``, the Paddle dygraph
  loop; MXNet's Gluon ``Trainer`` also on 2 and 4 devices;
* on GPUs, torch's ``nn.DataParallel``.

Every case is first stepped once from the same parameters on the same batch, and
its parameters are compared with ours ("max |dparam|"): the loops compute the same
update, so the times compare the same work. Reported: ours / theirs as the median
of per-round ratios (each round times every case back to back), with quartiles.
Targets: <= 1.05 against a hand-written single-device loop, <= 1.0 against the
textbook's code and ``nn.DataParallel``.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from multigpu.benchmarks.harness import (
    Options,
    Result,
    Table,
    device_spec,
    fmt_ms,
    fmt_ratio,
    interleaved_wall_cpu,
    isolated,
    progress_bar,
    ratio,
    same_step_cases,
    summary,
)

TITLE = "One LeNet step (batch 256): DataParallel against hand-written loops, the textbook's code, nn.DataParallel"
IN_QUICK = True

BATCH, LR = 256, 0.2
DEVICES = (1, 2, 4)
TARGET_HAND, TARGET_TEXTBOOK = 1.05, 1.0
AGREE_TOL = 1e-4  # max |dparam| after one step for "computes the same update"

# case -> (what it is, target of ours / it on 1 device, target on more devices; None: reported only)
CASES: dict[str, tuple[str, float | None, float | None]] = {
    "autograd": ("hand-written loop, 1 device (autograd + SGD)", TARGET_HAND, None),
    "dygraph": (
        "hand-written loop, 1 device (Paddle dygraph: backward, optimizer.step, clear_grad)",
        TARGET_HAND,
        None,
    ),
    "gluon": (
        "MXNet Gluon Trainer on the same devices (on 1 device: a hand-written single-device loop)",
        TARGET_HAND,
        None,
    ),
    "textbook": ("the textbook's multi-device code (naive allreduce)", TARGET_TEXTBOOK, TARGET_TEXTBOOK),
    "textbook as printed": ("the textbook's Paddle code as printed (allreduce never sums)", None, None),
    "nn.DataParallel": ("torch nn.DataParallel on the same GPUs", TARGET_TEXTBOOK, TARGET_TEXTBOOK),
}


def target(case: str, n: int) -> float | None:
    """The target of ours / ``case`` on ``n`` devices, or None when the ratio is reported only."""
    return CASES[case][1] if n == 1 else CASES[case][2]


def _runners(framework: str, init: list[np.ndarray], n: int, gpu: bool) -> dict[str, Any]:
    from multigpu.benchmarks import handwritten as hw
    from multigpu.benchmarks.textbook import TEXTBOOK, paddle_textbook

    out: dict[str, Any] = {}
    if n == 1:
        if framework == "torch":
            out["autograd"] = hw.torch_autograd(init, LR, BATCH, gpu)
        elif framework == "mxnet":
            out["autograd"] = hw.mxnet_autograd(init, LR, BATCH, gpu)
        elif framework == "paddle":
            out["dygraph"] = hw.paddle_dygraph(init, LR, BATCH, gpu)
    if framework == "mxnet":
        out["gluon"] = hw.mxnet_gluon(init, LR, BATCH, n, gpu)
    if framework in TEXTBOOK:
        out["textbook"] = TEXTBOOK[framework](init, n, LR, gpu)
    if framework == "paddle" and n > 1:
        out["textbook as printed"] = paddle_textbook(init, n, LR, gpu, fixed=False)
    if framework == "torch" and gpu:
        out["nn.DataParallel"] = hw.torch_nn_data_parallel(init, LR, BATCH, n)  # not run here: no GPU
    return out


def measure(framework: str, counts: tuple[int, ...], repeat: int, warmup: int, progress: bool) -> dict[str, Any]:
    """In a fresh process: time every case for each device count; return raw samples."""
    import multigpu
    from multigpu import models
    from multigpu.contract.devices import CPUFallbackWarning

    be = multigpu.backend(framework)
    model = models.lenet()
    init = model.init_params(seed=0)
    rng = np.random.default_rng(0)
    X = rng.random((BATCH, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, BATCH)
    out: dict[str, Any] = {"threads": _threads(framework), "counts": {}}
    bar = progress_bar(len(counts) * repeat, f"step {framework}", progress)
    for n in counts:
        spec, kind = device_spec(be, n)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CPUFallbackWarning)
            tr = multigpu.DataParallel(model, backend=framework, devices=spec, lr=LR, params=init, allreduce="fused")
        runners = _runners(framework, init, n, kind == "gpu")
        # One step from the same start on the same batch: every loop must land where ours does.
        cases, agreement = same_step_cases(tr, runners, X, y)
        samples, cpu = interleaved_wall_cpu(
            cases, repeat=repeat, warmup=warmup, progress=bar.update, reverse_odd_rounds=True
        )
        out["counts"][n] = {"spec": spec, "kind": kind, "samples": samples, "cpu_samples": cpu, "agreement": agreement}
    bar.close()
    return out


def _threads(framework: str) -> dict[str, Any]:
    if framework == "torch":
        import torch

        return {"torch.get_num_threads": torch.get_num_threads()}
    return {}


def run(opts: Options) -> Result:
    """Run every framework's cases in its own process and tabulate ours / theirs."""
    repeat, warmup = opts.repeats(40, 5), opts.repeats(3, 1)
    data: dict[str, Any] = {}
    rows, notes = [], []
    for fw in opts.frameworks():
        data[fw] = got = isolated(f"{__package__}.step:measure", fw, DEVICES, repeat, warmup, opts.progress)
        for n, rec in got["counts"].items():
            s = rec["samples"]
            ours = summary(s["ours"])
            for case in CASES:
                if case not in s:
                    continue
                goal = target(case, n)
                r = ratio(s["ours"], s[case])
                rc = ratio(rec["cpu_samples"]["ours"], rec["cpu_samples"][case])
                rec.setdefault("ratios", {})[case] = r
                rec.setdefault("cpu_ratios", {})[case] = rc
                agrees = rec["agreement"][case] <= AGREE_TOL
                rows.append(
                    [
                        fw,
                        f"{n} {rec['kind'].upper()}",
                        fmt_ms(ours),
                        case,
                        fmt_ms(summary(s[case])),
                        fmt_ratio(r),
                        "-" if goal is None else f"<= {goal:g}",
                        "-"
                        if goal is None
                        else ("yes" if r["median"] <= goal else f"**no** (+{100 * (r['median'] / goal - 1):.1f}%)"),
                        fmt_ratio(rc),
                        f"{rec['agreement'][case]:.1e}" + ("" if agrees else " (differs)"),
                    ]
                )
    if not data:
        notes.append("no framework backend is installed; nothing to measure")
    from multigpu.benchmarks.textbook import SUBSTITUTIONS

    notes += [
        f"{repeat} alternating rounds after {warmup} warm-up rounds; times are median (quartiles) in ms; "
        "ours / theirs is the median of per-round ratios (quartiles) of wall time; the target applies to it.",
        "CPU time ours / theirs: the same for this process's CPU time (every thread). It leaves out time spent "
        "waiting for a core, so under outside load it shows whether the work differs; it counts thread pools' "
        "spin-waits, so read it with one thread per framework (--threads 1).",
        "max |dparam|: largest parameter difference from ours after one step from the same start on the "
        f"same batch; above {AGREE_TOL:g} the loop computes something else (the printed Paddle textbook code "
        "never sums the gradients).",
        "CPU rows are CPU replicas on one host: they share its cores, so more devices cannot be faster here.",
        "nn.DataParallel and the GPU paths run only where a GPU is present.",
    ] + [f"textbook transcription, {k}: {v}" for k, v in SUBSTITUTIONS.items() if k in data]
    table = Table(
        "ours / theirs, one LeNet step, batch 256",
        [
            "backend",
            "devices",
            "ours ms",
            "compared with",
            "theirs ms",
            "ours / theirs",
            "target",
            "met",
            "CPU time ours / theirs",
            "max |dparam|",
        ],
        rows,
    )
    legend = Table(
        "what each case is",
        ["case", "what", "target on 1 device", "on 2 and 4"],
        [
            [c, w, "-" if t1 is None else f"<= {t1:g}", "-" if tn is None else f"<= {tn:g}"]
            for c, (w, t1, tn) in CASES.items()
        ],
    )
    return Result(
        "step",
        TITLE,
        [table, legend],
        data,
        settings={"batch": BATCH, "lr": LR, "devices": DEVICES, "repeat": repeat, "warmup": warmup},
        notes=notes,
        plot=lambda fig: _plot(fig, data),
    )


def _plot(fig: Any, data: dict[str, Any]) -> None:
    fws = list(data)
    axes = fig.subplots(1, max(1, len(fws)), sharey=True, squeeze=False)[0]
    for ax, fw in zip(axes, fws):
        counts = list(data[fw]["counts"])
        cases = [c for c in CASES if any(c in data[fw]["counts"][n].get("ratios", {}) for n in counts)]
        width = 0.8 / max(1, len(cases))
        for j, case in enumerate(cases):
            xs, ys, lo, hi = [], [], [], []
            for i, n in enumerate(counts):
                r = data[fw]["counts"][n].get("ratios", {}).get(case)
                if r is not None:
                    xs.append(i + (j - (len(cases) - 1) / 2) * width)
                    ys.append(r["median"])
                    lo.append(r["median"] - r["q1"])
                    hi.append(r["q3"] - r["median"])
            ax.bar(xs, ys, width, yerr=[lo, hi], label=case, capsize=2)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(TARGET_HAND, color="r", lw=0.8, ls="--")
        ax.set_xticks(range(len(counts)), [f"{n} {data[fw]['counts'][n]['kind']}" for n in counts])
        ax.set_title(fw)
        ax.set_xlabel("devices")
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("ours / theirs (time per step; < 1: ours faster)")
    fig.suptitle("One LeNet step, batch 256: DataParallel time / other loop's time (dashed: 1.05)")
