"""What the backend contract costs: one LeNet DataParallel step with and without the checks.

The same model, batch and devices run through ``multigpu.backend("torch")`` (every
call checked by ``multigpu.contract``) and through the bare adapter
(``multigpu.contract.unchecked``), alternating step by step in one process, so
outside load hits both alike. Reported per device count: the median step, the
median of the per-round ratios checked/unchecked, and how many protocol calls one
step makes (each is checked once).
"""
from __future__ import annotations

import warnings
from typing import Any

from .harness import Options, Result, Table, interleaved, isolated, summary

TITLE = "Contract overhead: a LeNet DataParallel step with and without the checks (torch, CPU replicas)"
IN_QUICK = True
BATCH = 256


def measure(backend: str, devices: list[int], repeat: int, warmup: int) -> dict[str, Any]:
    """Time the checked and the bare step alternately; runs in its own process.

    Each device count is its own interleaved run, half of it in the order checked,
    bare and half in the order bare, checked, so neither case always follows a
    switch of trainer (which costs the first step after it a few cache misses).
    """
    import multigpu
    from multigpu import models
    from multigpu.agreement import random_batches
    from multigpu.contract import unchecked

    warnings.simplefilter("ignore")
    model = models.lenet()
    X, y = random_batches(model, 1, BATCH, seed=0)[0]
    checked = multigpu.backend(backend)
    samples: dict[str, list[float]] = {}
    calls, own = {}, {}
    for n in devices:
        trainers = {label: multigpu.DataParallel(model, backend=be, devices=f"cpu:{n}", lr=0.01, seed=0)
                    for label, be in (("checked", checked), ("unchecked", unchecked(checked)))}
        for order in (("checked", "unchecked"), ("unchecked", "checked")):
            got = interleaved({label: (lambda tr=trainers[label]: tr.train_batch(X, y)) for label in order},
                              repeat=(repeat + 1) // 2, warmup=warmup)
            for label, values in got.items():
                samples.setdefault(f"{n} dev {label}", []).extend(values)
        calls[n] = _calls_per_step(trainers["checked"], X, y)
        own[n] = _checks_own_time(trainers["checked"], X, y)
    return {"samples": samples, "calls": calls, "own": own}


def _checks_own_time(tr: Any, X: Any, y: Any, steps: int = 10) -> float:
    """Seconds per step spent inside multigpu/contract.py itself (cProfile's exclusive time).

    Free of the step-to-step noise that the ratio carries; cProfile slows every
    Python call, so this is an upper bound.
    """
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(steps):
        tr.train_batch(X, y)
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    return sum(v[2] for k, v in stats.items() if k[0].endswith("contract.py")) / steps


def _calls_per_step(tr: Any, X: Any, y: Any) -> int:
    """Count the adapter calls of one step: the protocol calls plus the checks' own shape()/dtype()."""
    be = tr.backend
    real = be.adapter
    count = [0]

    class Counting:
        def __getattr__(self, name: str) -> Any:
            attr = getattr(real, name)
            if not callable(attr) or name.startswith("_"):
                return attr

            def call(*args: Any, **kwargs: Any) -> Any:
                count[0] += 1
                return attr(*args, **kwargs)
            return call

    be.adapter = Counting()
    try:
        tr.train_batch(X, y)
    finally:
        be.adapter = real
    return count[0]


def run(opts: Options) -> Result:
    """Measure torch on 1 and 2 CPU replicas (numpy when torch is missing)."""
    import multigpu

    backend = "torch" if "torch" in multigpu.available_backends() else "numpy"
    devices = [1, 2]
    raw = isolated("multigpu.benchmarks.contract_overhead:measure", backend, devices,
                   opts.repeats(40, 12), opts.repeats(5, 3))
    samples = raw["samples"]
    rows: list[list[Any]] = []
    data: dict[str, Any] = {"backend": backend, "batch": BATCH, "samples": samples, "calls_per_step": raw["calls"],
                            "checks_seconds_per_step": raw["own"]}
    for n in devices:
        on, off = samples[f"{n} dev checked"], samples[f"{n} dev unchecked"]
        ratios = [a / b for a, b in zip(on, off)]
        s_on, s_off, s_r = summary(on), summary(off), summary(ratios)
        data[f"{n}"] = {"checked": s_on, "unchecked": s_off, "ratio": s_r}
        rows.append([n, f"{1e3 * s_on['median']:.2f}", f"{1e3 * s_off['median']:.2f}",
                     f"{s_r['median']:.4f}", f"{s_r['q1']:.4f}-{s_r['q3']:.4f}",
                     f"{1e6 * (s_on['median'] - s_off['median']):+.0f}", f"{1e6 * raw['own'][n]:.0f}",
                     raw["calls"][n]])
    table = Table(f"LeNet step, batch {BATCH}, {backend}, CPU replicas: checked vs bare adapter",
                  ["devices", "checked ms", "bare ms", "ratio (median of rounds)", "ratio IQR",
                   "difference us",
                   "checks' own time us (cProfile)", "adapter calls per step"], rows,
                  note="Ratio < 1.02 is the target (the step budget against hand-written loops is 1.05). "
                       "Each round times every case once, alternating.")

    def plot(fig: Any) -> None:
        ax = fig.add_subplot(1, 1, 1)
        names = list(samples)
        ax.boxplot([[1e3 * s for s in samples[n]] for n in names], labels=names)
        ax.set(ylabel="ms per step", title=f"LeNet step, batch {BATCH}, {backend}: with and without the contract")
        ax.grid(alpha=0.3)

    return Result(name="contract", title=TITLE, tables=[table], data=data,
                  settings={"repeat": opts.repeats(40, 12), "devices": devices, "batch": BATCH},
                  notes=[f"median per-round ratio {data[str(n)]['ratio']['median']:.4f} on {n} device(s)"
                         for n in devices] + ["the bare adapter is multigpu.contract.unchecked(backend)"],
                  plot=plot)
