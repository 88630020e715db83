"""What the backend contract costs: one LeNet DataParallel step with and without the checks.

The same model, batch and devices run through ``multigpu.backend("torch")`` (every
call checked by ``multigpu.contract.checked``) and through the bare adapter
(``multigpu.contract.checked.unchecked``), alternating step by step in one process, so
outside load hits both alike. Batch 256 is the textbook's step; batch 2 makes the
arithmetic negligible, so the same checks show up as an absolute time (they read
shapes and dtypes only, so their cost does not grow with the batch). The checks'
own time is also taken in CPU time of the calling thread, which a busy machine does
not inflate the way it inflates wall-clock time.
"""

from __future__ import annotations

import statistics
import time
import warnings
from typing import Any

from multigpu.benchmarks.harness import Options, Result, Table, interleaved, isolated, summary

TITLE = "Contract overhead: a LeNet DataParallel step with and without the checks (torch, CPU replicas)"
IN_QUICK = True
BATCHES = (256, 2)
DEVICES = (1, 2)


def measure(backend: str, repeat: int, warmup: int) -> dict[str, Any]:
    """Time the checked and the bare step alternately; runs in its own process.

    Each (devices, batch) pair is its own interleaved run, half of it in the order
    checked, bare and half in the order bare, checked, so neither case always
    follows the other.
    """
    import multigpu
    from multigpu import models
    from multigpu.contract.checked import unchecked
    from multigpu.parallel.agreement import random_batches

    warnings.simplefilter("ignore")
    if backend == "torch":  # one thread: no spinning pool inflates this thread's CPU time
        import torch

        torch.set_num_threads(1)
    model = models.lenet()
    checked = multigpu.backend(backend)
    samples: dict[str, dict[str, list[float]]] = {}
    calls: dict[str, int] = {}
    cpu: dict[str, float] = {}
    for n in DEVICES:
        trainers = {
            label: multigpu.DataParallel(model, backend=be, devices=f"cpu:{n}", lr=0.01, seed=0)
            for label, be in (("checked", checked), ("bare", unchecked(checked)))
        }
        for batch in BATCHES:
            X, y = random_batches(model, 1, batch, seed=0)[0]
            key = f"{n} dev, batch {batch}"
            samples[key] = {"checked": [], "bare": []}
            for order in (("checked", "bare"), ("bare", "checked")):
                got = interleaved(
                    {label: (lambda tr=trainers[label]: tr.train_batch(X, y)) for label in order},  # noqa: B023 (bound by an argument or called at once)
                    repeat=(repeat + 1) // 2,
                    warmup=warmup,
                )
                for label, values in got.items():
                    samples[key][label].extend(values)
            calls[key] = _protocol_calls(trainers["checked"], X, y)
            cpu[key] = _own_cpu_time(trainers, X, y, repeat)
    return {"samples": samples, "calls": calls, "cpu": cpu}


def _own_cpu_time(trainers: dict[str, Any], X: Any, y: Any, rounds: int) -> float:
    """Median over alternating rounds of (checked - bare) CPU seconds of this thread per step."""
    diffs = []
    for i in range(rounds):
        spent = {}
        for label in ("checked", "bare") if i % 2 else ("bare", "checked"):
            t0 = time.thread_time()
            trainers[label].train_batch(X, y)
            spent[label] = time.thread_time() - t0
        diffs.append(spent["checked"] - spent["bare"])
    return statistics.median(diffs)


def _protocol_calls(tr: Any, X: Any, y: Any) -> int:
    """How many protocol calls one step makes (each passes the contract once)."""
    be, count = tr.backend, [0]
    names = [n for n in dir(type(be)) if not n.startswith("_") and callable(getattr(type(be), n))]

    def counting(method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            return method(*args, **kwargs)

        return call

    for name in names:
        setattr(be, name, counting(getattr(be, name)))
    try:
        tr.train_batch(X, y)
    finally:
        for name in names:
            delattr(be, name)
    return count[0]


def run(opts: Options) -> Result:
    """Measure torch on 1 and 2 CPU replicas (numpy when torch is missing)."""
    import multigpu

    backend = "torch" if "torch" in multigpu.available_backends() else "numpy"
    repeat = opts.repeats(60, 16)
    raw = isolated("multigpu.benchmarks.contract_overhead:measure", backend, repeat, opts.repeats(5, 3))
    rows: list[list[Any]] = []
    data: dict[str, Any] = {
        "backend": backend,
        "samples": raw["samples"],
        "protocol_calls": raw["calls"],
        "checks_cpu_seconds": raw["cpu"],
    }
    for key, s in raw["samples"].items():
        ratios = [a / b for a, b in zip(s["checked"], s["bare"])]
        diffs = [a - b for a, b in zip(s["checked"], s["bare"])]
        on, off, r, d = summary(s["checked"]), summary(s["bare"]), summary(ratios), summary(diffs)
        data[key] = {"checked": on, "bare": off, "ratio": r, "difference": d}
        rows.append(
            [
                key,
                f"{1e3 * on['median']:.2f}",
                f"{1e3 * off['median']:.2f}",
                f"{r['median']:.4f}",
                f"{r['q1']:.4f}-{r['q3']:.4f}",
                f"{1e6 * d['median']:+.0f}",
                f"{1e6 * raw['cpu'][key]:+.0f}",
                raw["calls"][key],
            ]
        )
    table = Table(
        f"LeNet step on {backend} CPU replicas: through the contract vs the bare adapter",
        [
            "case",
            "checked ms",
            "bare ms",
            "ratio (median of rounds)",
            "ratio IQR",
            "difference us (median of rounds)",
            "checks' CPU time us (this thread)",
            "protocol calls per step",
        ],
        rows,
        note="Target: ratio <= 1.02 at batch 256 (the step's budget against hand-written loops is "
        "1.05). Rounds alternate the two cases; batch 2 isolates the checks' own time.",
    )

    def plot(fig: Any) -> None:
        ax = fig.add_subplot(1, 1, 1)
        keys = list(raw["samples"])
        ratios = [[a / b for a, b in zip(raw["samples"][k]["checked"], raw["samples"][k]["bare"])] for k in keys]
        ax.boxplot(ratios, labels=keys)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(ylabel="checked / bare step time (per round)", title=f"What the contract costs per step ({backend})")
        ax.grid(alpha=0.3)

    return Result(
        name="contract",
        title=TITLE,
        tables=[table],
        data=data,
        settings={"repeat": repeat, "devices": list(DEVICES), "batches": list(BATCHES)},
        notes=[
            "the bare adapter is multigpu.contract.checked.unchecked(multigpu.backend(name)); "
            "DataParallel uses a backend object as given",
            "torch runs with one intra-op thread here (torch.set_num_threads(1))",
        ],
        plot=plot,
    )
