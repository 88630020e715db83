"""Each framework's engine allreduce across processes against the in-process algorithms.

For messages of 4 KB to 64 MB and for LeNet's gradient set (one flat buffer of every
gradient plus the loss, as the step sends it), per framework:

* **engine** (2 and 4 processes): the adapter's engine group's ``allreduce_``
  (torch.distributed Gloo, paddle.distributed Gloo, kvstore ``dist_sync`` through one
  parameter server), and **checked**: the same through ``CheckedGroup``, whose header
  exchange adds one small allreduce;
* **naive / ring / fused** (2 and 4 CPU replicas in one process): the core's
  in-process algorithms on the same framework (for LeNet's set, naive and ring go
  parameter by parameter, fused sums one flat buffer).

Time is the median on rank 0 (cases alternate, after warm-up; 100 rounds for small
messages, down to 5 for 64 MB). Every process runs the OpenMP threads the launcher
gives a rank (cores // n): with more, torch's host copies stall on a loaded machine. Bus bandwidth follows
nccl-tests: algbw = bytes / time, busbw = algbw * 2(n-1)/n. On CPU replicas an
in-process "transfer" is a host copy, and the engines run over loopback TCP on the
same cores, so these figures compare overheads on this machine, not links.
"""

from __future__ import annotations

import functools
import json
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from multigpu.benchmarks.allreduce import busbw
from multigpu.benchmarks.harness import Options, Result, Table, interleaved, isolated, summary

TITLE = "Allreduce: each engine (2 and 4 processes) vs the in-process naive/ring/fused, 4 KB..64 MB + LeNet"
IN_QUICK = True
FRAMEWORKS = ("torch", "paddle", "mxnet")
ALGORITHMS = ("naive", "ring", "fused")


def _sizes(quick: bool) -> list[int]:
    return [4 << 10, 64 << 10, 1 << 20] if quick else [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]


def _lenet_floats() -> int:
    from multigpu import models

    return sum(int(np.prod(s)) for s in models.lenet().param_shapes) + 1  # + the loss slot


def _repeat(nbytes: int, repeat: int) -> int:
    # Many rounds for small messages (cheap, and their times are noisy), few for 64 MB.
    return max(5, min(repeat, int(2.5e8 // nbytes)))


def worker(out: str, sizes: list[int], repeat: int) -> None:
    """One rank: time the engine and the checked allreduce per size; rank 0 writes ``out``."""
    from multigpu.distributed.rank import init_process_group

    group = init_process_group()
    be = group.backend
    results = {}
    messages = [("lenet", _lenet_floats() * 4), *((str(s), s) for s in sizes)]
    for label, nbytes in messages:
        buf = be.from_numpy(np.ones(nbytes // 4, np.float32), group.device)
        cases = {"engine": lambda b=buf: group.engine.allreduce_(b), "checked": lambda b=buf: group.allreduce_(b)}
        results[label] = {"bytes": nbytes, **interleaved(cases, repeat=_repeat(nbytes, repeat), warmup=1)}
        del buf
    group.barrier()
    if group.rank == 0:
        Path(out).write_text(json.dumps({"framework": be.name, "processes": group.world_size, "results": results}))
    group.close()


def in_process(framework: str, n: int, sizes: list[int], repeat: int) -> dict[str, Any]:
    """Time naive, ring and fused on ``n`` CPU replicas of ``framework`` (run in its own process).

    Unless ``--threads`` set it, the process gets the OpenMP threads the launcher gives
    one rank of an n-process job on this host, so both sides use the cores alike.
    """
    import os

    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))  # as launch.run does
    import multigpu
    from multigpu import models
    from multigpu.contract.devices import CPUFallbackWarning
    from multigpu.parallel.allreduce import allreduce_flat, allreduce_grads, naive_allreduce, ring_allreduce

    be = multigpu.backend(framework)
    shapes = models.lenet().param_shapes
    out: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CPUFallbackWarning)
        devices = multigpu.resolve_devices(be, f"cpu:{n}")

    def sync() -> None:
        for d in devices:
            be.synchronize(d)

    rng = np.random.default_rng(0)
    grads = [[be.from_numpy(rng.random(s, dtype=np.float32), d) for s in shapes] for d in devices]
    one = {
        "naive": lambda: allreduce_grads(be, grads, devices, "naive"),
        "ring": lambda: allreduce_grads(be, grads, devices, "ring"),
        "fused": lambda: allreduce_grads(be, grads, devices, "fused"),
    }
    out[f"{n}/lenet"] = {"bytes": _lenet_floats() * 4, **interleaved(one, repeat=repeat, warmup=1, sync=sync)}
    for nbytes in sizes:
        bufs = [be.from_numpy(np.ones(nbytes // 4, np.float32), d) for d in devices]
        cases: dict[str, Callable[[], Any]] = {
            "naive": functools.partial(naive_allreduce, be, bufs, devices),
            "ring": functools.partial(ring_allreduce, be, bufs, devices),
            "fused": functools.partial(allreduce_flat, be, bufs, devices),
        }
        out[f"{n}/{nbytes}"] = {
            "bytes": nbytes,
            **interleaved(cases, repeat=_repeat(nbytes, repeat), warmup=1, sync=sync),
        }
    return out


def _engine_job(framework: str, processes: int, sizes: list[int], repeat: int) -> dict[str, Any]:
    from multigpu.distributed.job import Job
    from multigpu.distributed.supervisor import run as run_job

    with tempfile.TemporaryDirectory(prefix="dist-allreduce-") as tmp:
        out = Path(tmp) / "out.json"
        run_job(
            Job(framework, processes, timeout=300),
            [
                sys.executable,
                "-m",
                f"{__package__}.dist_allreduce",
                "--worker",
                str(out),
                json.dumps(sizes),
                str(repeat),
            ],
        )
        return json.loads(out.read_text())


def _label(nbytes: int) -> str:
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale:
            v = nbytes / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{nbytes} B"


def run(opts: Options) -> Result:
    """Every installed framework; 2 processes/replicas (and 4 unless --quick)."""
    frameworks = [f for f in opts.frameworks() if f in FRAMEWORKS]
    counts = [2] if opts.quick else [2, 4]
    sizes, repeat = _sizes(opts.quick), opts.repeats(100, 30)
    tables: list[Any] = []
    data: dict[str, Any] = {}
    for fw in frameworks:
        t0 = time.perf_counter()
        local: dict[str, Any] = {}
        for n in counts:  # a fresh process per n: the thread count is fixed at import
            local.update(isolated(f"{__package__}.dist_allreduce:in_process", fw, n, sizes, repeat))
        engine = {n: _engine_job(fw, n, sizes, repeat)["results"] for n in counts}
        if opts.progress:
            print(f"  {fw}: done in {time.perf_counter() - t0:.0f} s", flush=True)
        rows, series = [], []
        for n in counts:
            for label in ["lenet", *map(str, sizes)]:
                eng, loc = engine[n][label], local[f"{n}/{label}"]
                nbytes = eng["bytes"]
                med = {
                    "engine": summary(eng["engine"])["median"],
                    "checked": summary(eng["checked"])["median"],
                    **{a: summary(loc[a])["median"] for a in ALGORITHMS},
                }
                best = min(ALGORITHMS, key=lambda a: med[a])
                rows.append(
                    [
                        f"LeNet grads ({_label(nbytes)})" if label == "lenet" else _label(nbytes),
                        n,
                        f"{1e3 * med['engine']:.3f}",
                        f"{busbw(nbytes, med['engine'], n):.3f}",
                        f"{1e3 * med['checked']:.3f}",
                        *(f"{1e3 * med[a]:.3f}" for a in ALGORITHMS),
                        f"{best} {busbw(nbytes, med[best], n):.3f}",
                    ]
                )
                series.append({"n": n, "label": label, "bytes": nbytes, "median": med})
        data[fw] = {"series": series, "engine_samples": engine, "in_process_samples": local}
        tables.append(
            Table(
                f"{fw}: ms per allreduce (median, rank 0) and bus bandwidth (GB/s)",
                [
                    "message",
                    "n",
                    "engine ms",
                    "engine busbw",
                    "checked ms",
                    "naive ms",
                    "ring ms",
                    "fused ms",
                    "best in-process busbw",
                ],
                rows,
                note=f"engine: {_engine_name(fw)} across n processes; naive/ring/fused: n CPU replicas in one "
                "process (fused on CPU replicas is the 'shared' schedule: one reduce into the first buffer, "
                "which every replica then reads, so nothing is copied back); checked: the engine plus the "
                "header exchange. busbw = bytes / time * 2(n-1)/n.",
            )
        )

    def plot(fig: Any) -> None:
        for i, fw in enumerate(frameworks):
            ax = fig.add_subplot(1, len(frameworks), i + 1)
            for n, style in zip(counts, ("-", "--")):
                pts = [s for s in data[fw]["series"] if s["n"] == n and s["label"] != "lenet"]
                xs = [s["bytes"] for s in pts]
                for case in ("engine", *ALGORITHMS):
                    ax.plot(
                        xs,
                        [busbw(s["bytes"], s["median"][case], n) for s in pts],
                        style,
                        marker="o",
                        label=f"{case} n={n}",
                    )
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("message bytes")
            ax.set_ylabel("bus bandwidth GB/s")
            ax.set_title(fw)
            ax.legend(fontsize=7)

    return Result(
        name="dist_allreduce",
        title=TITLE,
        tables=tables,
        data=data,
        settings={"sizes": sizes, "counts": counts, "repeat": repeat, "frameworks": frameworks},
        plot=plot,
    )


def _engine_name(fw: str) -> str:
    return {
        "torch": "torch.distributed (Gloo)",
        "paddle": "paddle.distributed (Gloo)",
        "mxnet": "kvstore dist_sync (1 server)",
    }[fw]


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker(sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit("run through the harness: multigpu bench dist_allreduce")
