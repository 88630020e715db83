"""Allreduce algorithms and frameworks side by side: time per LeNet gradient allreduce and
per data-parallel step, as ratios against the textbook's naive algorithm in the same run.

On CPU replicas every "transfer" is a host copy, so this measures the algorithms' copy and
launch overhead, not link bandwidth; on GPUs the same script measures real transfers.
Writes allreduce.json and allreduce.md into --out.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

import multigpu
from multigpu import models
from multigpu.allreduce import ALGORITHMS
from multigpu.devices import CPUFallbackWarning


def _time(fn, repeat: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a markdown table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default=",".join(multigpu.available_backends()))
    p.add_argument("--devices", default="2,4", help="comma-separated replica counts")
    p.add_argument("--gpus", action="store_true", help="use GPUs instead of CPU replicas")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--out", default="benchmarks/out/allreduce")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    m = models.lenet()
    rng = np.random.default_rng(0)
    X = rng.random((args.batch, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, args.batch)
    rows = []
    for name in [b for b in args.backends.split(",") if b]:
        be = multigpu.backend(name)
        for n in [int(k) for k in args.devices.split(",")]:
            spec = n if args.gpus else f"cpu:{n}"
            base_ar = base_step = None
            for algo in ALGORITHMS:
                if algo == "native" and not hasattr(be, "native_allreduce"):
                    continue
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", CPUFallbackWarning)
                    tr = multigpu.DataParallel(m, backend=name, devices=spec, lr=0.1, allreduce=algo)
                grads = [[be.copy_to(p, d) for p in params] for params, d in zip(tr.replicas, tr.devices)]

                def allreduce() -> None:
                    multigpu.allreduce_grads(be, grads, tr.devices, algo)
                    tr.synchronize()

                def step() -> None:
                    tr.train_batch(X, y)
                    tr.synchronize()

                t_ar, t_step = _time(allreduce, args.repeat), _time(step, args.repeat)
                base_ar = base_ar or t_ar
                base_step = base_step or t_step
                rows.append(dict(backend=name, devices=n, algorithm=algo, allreduce_ms=1e3 * t_ar,
                                 allreduce_vs_naive=t_ar / base_ar, step_ms=1e3 * t_step,
                                 step_vs_naive=t_step / base_step))
                print(f"{name:7} n={n} {algo:6} allreduce {1e3 * t_ar:8.2f} ms ({t_ar / base_ar:4.2f}x naive)  "
                      f"step {1e3 * t_step:8.1f} ms ({t_step / base_step:4.2f}x)", flush=True)
    (out / "allreduce.json").write_text(json.dumps(rows, indent=2))
    lines = ["| backend | devices | algorithm | allreduce ms | vs naive | step ms | vs naive |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['backend']} | {r['devices']} | {r['algorithm']} | {r['allreduce_ms']:.2f} | "
              f"{r['allreduce_vs_naive']:.2f} | {r['step_ms']:.1f} | {r['step_vs_naive']:.2f} |" for r in rows]
    (out / "allreduce.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
