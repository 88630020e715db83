"""``resnet_step``: one ResNet-18 training step (batch 32 at 64x64), ours against each framework's own.

For each framework, in its own process, on one device, these run alternately on the
same batch:

* ``ours``: ``DataParallel(resnet18, backend, devices=1, optimizer=SGD(momentum=0.9,
  weight_decay=5e-4))`` with per-device BatchNorm (one device: plain BatchNorm);
* torch: torchvision's ResNet-18 as an ``nn.Module`` with ``optim.SGD``;
* paddle: ``paddle.vision.models.resnet18`` with ``paddle.optimizer.Momentum``;
* mxnet: the Gluon zoo's ``resnet18_v1`` with a ``gluon.Trainer``, not hybridized and
  hybridized (``static_alloc``, ``static_shape``).

Every loop starts from our parameters and running statistics and takes one step on the
same batch first; its parameters are compared with ours ("max |dparam|"), so the times
compare the same work. Reported: ours / theirs as the median of per-round ratios, with
quartiles. Target: <= 1.10 against each (against hybridized Gluon the ratio and its
cause are reported: a static graph against our imperative calls).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from multigpu.benchmarks import harness
from multigpu.benchmarks.harness import Options, Result, Table, fmt_ms, fmt_ratio, ratio, same_step_cases, summary

TITLE = "One ResNet-18 step (batch 32 at 64x64, momentum SGD): ours against each framework's own training step"
IN_QUICK = False  # a ResNet-18 step takes seconds per framework here; tests run it small (test_bench)

BATCH, SIZE, CLASSES = 32, 64, 1000
LR, MOMENTUM, WD = 0.1, 0.9, 5e-4
TARGET = 1.10
AGREE_TOL = 1e-3  # max |dparam| after one step for "computes the same update" (float32 sums in another order)

# case -> (what it is, target of ours / it; None: reported only)
CASES: dict[str, tuple[str, float | None]] = {
    "nn.Module": ("torch: torchvision's ResNet-18 as an nn.Module, optim.SGD", TARGET),
    "paddle.vision": ("paddle: paddle.vision.models.resnet18, paddle.optimizer.Momentum", TARGET),
    "gluon": ("mxnet: Gluon zoo resnet18_v1, gluon.Trainer (sgd), not hybridized", TARGET),
    "gluon hybridized": ("mxnet: the same, hybridize(static_alloc=True, static_shape=True)", None),
}


def _runners(framework: str, init: list[np.ndarray], state: list[np.ndarray]) -> dict[str, Any]:
    from multigpu.benchmarks import resnet_references as ref

    if framework == "torch":
        return {"nn.Module": ref.torch_resnet18(init, state, LR, MOMENTUM, WD, CLASSES)}
    if framework == "paddle":
        return {"paddle.vision": ref.paddle_resnet18(init, state, LR, MOMENTUM, WD, CLASSES)}
    if framework == "mxnet":
        return {
            "gluon": ref.gluon_resnet18(init, state, LR, MOMENTUM, WD, False, CLASSES),
            "gluon hybridized": ref.gluon_resnet18(init, state, LR, MOMENTUM, WD, True, CLASSES),
        }
    return {}


def measure(
    framework: str,
    repeat: int,
    warmup: int,
    progress: bool,
    profile: bool = False,
    size: int = SIZE,
    batch: int = BATCH,
) -> dict[str, Any]:
    """In a fresh process: time ours and the framework's loops; return raw samples (and a
    cProfile summary of ours with ``profile``); ``size`` and ``batch`` shrink it for tests."""
    import multigpu
    from multigpu import models
    from multigpu.contract.devices import CPUFallbackWarning
    from multigpu.optim import SGD

    model = models.resnet18(CLASSES, (3, size, size))
    init, state = model.init_params(seed=0), model.init_state()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
    y = rng.integers(0, CLASSES, batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CPUFallbackWarning)
        tr = multigpu.DataParallel(
            model,
            backend=framework,
            devices="cpu:1",
            lr=LR,
            params=init,
            optimizer=SGD(momentum=MOMENTUM, weight_decay=WD),
        )
    cases, agreement = same_step_cases(tr, _runners(framework, init, state), X, y)
    bar = harness.progress_bar(repeat, f"resnet_step {framework}", progress)
    wall, cpu = harness.interleaved_wall_cpu(
        cases, repeat=repeat, warmup=warmup, progress=bar.update, reverse_odd_rounds=True
    )
    bar.close()
    out: dict[str, Any] = {"samples": wall, "cpu_samples": cpu, "agreement": agreement}
    if profile:
        out["profile"] = _profile(cases["ours"], 3)
    return out


def _profile(fn: Any, calls: int) -> str:
    """The top of a cProfile of ``calls`` calls of ``fn``, by internal time."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
    return text.getvalue()


def run(opts: Options, size: int = SIZE, batch: int = BATCH) -> Result:
    """Run every framework's cases in its own process and tabulate ours / theirs."""
    repeat, warmup = opts.repeats(20, 4), opts.repeats(2, 1)
    data: dict[str, Any] = {}
    rows, notes = [], []
    for fw in opts.frameworks():
        data[fw] = got = harness.isolated(
            f"{__package__}.resnet_step:measure", fw, repeat, warmup, opts.progress, True, size, batch
        )
        s = got["samples"]
        for case, (_, goal) in CASES.items():
            if case not in s:
                continue
            r = ratio(s["ours"], s[case])
            rc = ratio(got["cpu_samples"]["ours"], got["cpu_samples"][case])
            got.setdefault("ratios", {})[case] = r
            agrees = got["agreement"][case] <= AGREE_TOL
            met = (
                "-"
                if goal is None
                else ("yes" if r["median"] <= goal else f"**no** (+{100 * (r['median'] / goal - 1):.1f}%)")
            )
            rows.append(
                [
                    fw,
                    fmt_ms(summary(s["ours"])),
                    case,
                    fmt_ms(summary(s[case])),
                    fmt_ratio(r),
                    "-" if goal is None else f"<= {goal:g}",
                    met,
                    fmt_ratio(rc),
                    f"{got['agreement'][case]:.1e}" + ("" if agrees else " (differs)"),
                ]
            )
    if not data:
        notes.append("no framework backend is installed; nothing to measure")
    notes += [
        f"{repeat} alternating rounds after {warmup} warm-up rounds; times are median (quartiles) in ms; "
        "ours / theirs is the median of per-round ratios (quartiles) of wall time; the target applies to it.",
        "CPU time ours / theirs: the same for this process's CPU time (every thread).",
        f"max |dparam|: largest parameter difference from ours after one step from the same start on the same "
        f"batch (momentum {MOMENTUM}, weight decay {WD}, lr {LR}); above {AGREE_TOL:g} the loop computes "
        "something else.",
        "Against hybridized Gluon the ratio is reported, not targeted: hybridize() runs one static MXNet graph "
        "(memory planned once, no per-op Python dispatch), where ours calls mx.nd ops one by one, as "
        "non-hybridized Gluon does.",
    ]
    table = Table(
        f"ours / theirs, one ResNet-18 step, batch {batch} at {size}x{size}, 1 CPU device",
        [
            "backend",
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
        ["case", "what", "target"],
        [[c, w, "-" if t is None else f"<= {t:g}"] for c, (w, t) in CASES.items()],
    )
    profiles = [
        f"cProfile of ours on {fw} (3 steps, by internal time):\n\n```\n{d['profile']}\n```"
        for fw, d in data.items()
        if d.get("profile")
    ]
    return Result(
        "resnet_step",
        TITLE,
        [table, legend],
        data,
        settings={
            "batch": batch,
            "size": size,
            "classes": CLASSES,
            "lr": LR,
            "momentum": MOMENTUM,
            "weight_decay": WD,
            "repeat": repeat,
            "warmup": warmup,
        },
        notes=notes + profiles,
        plot=lambda fig: _plot(fig, data, batch, size),
    )


def _plot(fig: Any, data: dict[str, Any], batch: int, size: int) -> None:
    ax = fig.subplots()
    labels, ys, lo, hi = [], [], [], []
    for fw, d in data.items():
        for case, r in d.get("ratios", {}).items():
            labels.append(f"{fw}\n{case}")
            ys.append(r["median"])
            lo.append(r["median"] - r["q1"])
            hi.append(r["q3"] - r["median"])
    ax.bar(range(len(ys)), ys, yerr=[lo, hi], capsize=3)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(TARGET, color="r", lw=0.8, ls="--")
    ax.set_xticks(range(len(ys)), labels, fontsize=8)
    ax.set_ylabel("ours / theirs (time per step; < 1: ours faster)")
    ax.set_title(f"One ResNet-18 step, batch {batch} at {size}x{size}: ours / the framework's own (dashed: {TARGET})")
    ax.grid(axis="y", alpha=0.3)
