"""The benchmark harness: one runner, one result format.

A benchmark is a module in this package with ``TITLE`` (one line), ``IN_QUICK``
(whether ``--quick`` runs it) and ``run(opts: Options) -> Result``; ``NEEDS_LAB = True``
marks one that runs only with ``--lab`` (it brings up the emulated lab, as root). The runner
records the machine and the load around each benchmark and writes, per benchmark,
``NAME.md`` (tables), ``NAME.json`` (machine, settings, raw samples) and
``NAME.png`` (a plot).

Rules every benchmark follows, so that its numbers can be trusted:

* time with :func:`interleaved`: warm-up rounds, then the cases alternate
  (A B C A B C ...), so a burst of outside load hits every case alike;
* synchronize the devices inside the timed region (pass ``sync``);
* report the median and the spread (:func:`summary`), and compare cases only as
  ratios of figures measured in the same run;
* run each framework in its own process (:func:`isolated`) when more than one
  framework, or a distributed engine, is involved: MXNet's engine crashes beside
  torch or paddle in some paths, and a fresh process keeps one framework's threads
  from slowing another;
* compare two cases with :func:`ratio` (per-round ratios of alternately timed
  samples, so a burst of load cancels out) and show progress with
  :func:`progress_bar` (quiet under ``--quiet``).

The runner measures outside load itself: the CPU time that processes other than
this run used while it ran (from ``/proc/stat``), besides the load average.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from multiprocessing import get_context
from pathlib import Path
from typing import Any

__all__ = [
    "BENCHMARKS",
    "Options",
    "Result",
    "Table",
    "device_spec",
    "fmt_ms",
    "interleaved",
    "isolated",
    "fmt_ratio",
    "interleaved_wall_cpu",
    "machine",
    "progress_bar",
    "ratio",
    "run_benchmarks",
    "same_step_cases",
    "summary",
]

# Benchmark name -> module in this package, in the order a full run takes them.
BENCHMARKS: dict[str, str] = {
    "step": "step",
    "resnet_step": "resnet_step",
    "allreduce": "allreduce",
    "scaling": "scaling",
    "planner": "planner",
    "accuracy": "accuracy",
    "resnet_accuracy": "resnet_accuracy",
    "dist_allreduce": "dist_allreduce",
    "dist_step": "dist_step",
    "plans": "plans",
    "contract": "contract_overhead",
    "transformer_step": "transformer_step",
    "lab": "lab",
}

#: With ``--lab``, a benchmark whose lab variant is another module runs that module instead.
LAB_VARIANTS: dict[str, str] = {"plans": "plans_lab"}

# Read by the frameworks' thread pools when they start (torch, MXNet and Paddle use OpenMP).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

FRAMEWORK_PACKAGES = ("numpy", "scipy", "highspy", "torch", "mxnet", "paddlepaddle", "ray", "matplotlib")


@dataclass(frozen=True)
class Options:
    """What the runner passes to every benchmark."""

    quick: bool = False
    out: Path = Path("benchmarks/out")
    progress: bool = True
    backends: tuple[str, ...] | None = None  # None: every installed framework
    threads: int | None = None  # CPU threads per framework process; None: the frameworks' defaults
    lab: bool = False  # run across the hosts of the emulated lab (root): `multigpu bench plans --lab`, `lab`
    instances: Path | None = None  # `bench planner --instances DIR`: a clone of msr-fiddle/dnn-partitioning
    cases: tuple[str, ...] | None = None  # `--cases`: the parts of a benchmark to run (None: all); `planner` only

    def repeats(self, full: int, quick: int) -> int:
        """Return ``quick`` under ``--quick``, else ``full``."""
        return quick if self.quick else full

    def frameworks(self) -> list[str]:
        """Return the installed framework backends to measure (never the NumPy reference)."""
        from multigpu.contract.registry import available_backends

        installed = [b for b in available_backends() if b != "numpy"]
        return installed if self.backends is None else [b for b in self.backends if b in installed]


@dataclass
class Table:
    """One markdown table: ``rows`` hold already formatted cells."""

    title: str
    columns: list[str]
    rows: list[list[Any]]
    note: str = ""

    def markdown(self) -> str:
        """Return the table as GitHub markdown, title and note included."""
        lines = [
            f"### {self.title}",
            "",
            "| " + " | ".join(self.columns) + " |",
            "|" + "|".join("---" for _ in self.columns) + "|",
        ]
        # A "|" inside a cell (a plan "a | b") would end the cell: escape it.
        lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in self.rows]
        if self.note:
            lines += ["", self.note]
        return "\n".join(lines) + "\n"


@dataclass
class Result:
    """What one benchmark measured: tables for people, raw samples for machines, a plot."""

    name: str
    title: str
    tables: list[Table]
    data: dict[str, Any]
    settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    plot: Callable[[Any], None] | None = None  # draws on a matplotlib Figure


def summary(samples: Sequence[float]) -> dict[str, float]:
    """Return median, min, max, quartiles and count of ``samples``."""
    xs = sorted(float(s) for s in samples)
    if not xs:
        raise ValueError("summary of no samples")
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"median": statistics.median(xs), "min": xs[0], "max": xs[-1], "q1": q[0], "q3": q[2], "n": len(xs)}


def interleaved(
    cases: Mapping[str, Callable[[], Any]],
    repeat: int,
    warmup: int = 2,
    sync: Callable[[], None] | None = None,
    progress: Callable[[], None] | None = None,
    reverse_odd_rounds: bool = False,
) -> dict[str, list[float]]:
    """Time each case ``repeat`` times, alternating between cases; return seconds per call.

    ``warmup`` untimed rounds run first. ``sync`` (a device synchronize) runs inside
    the timed region after every call, so queued device work is counted.
    ``reverse_odd_rounds`` runs every second round in reverse order (A B C, C B A, ...),
    so no case always follows the same neighbour (caches, allocator state).
    """
    return interleaved_wall_cpu(cases, repeat, warmup, sync, progress, reverse_odd_rounds)[0]


def interleaved_wall_cpu(
    cases: Mapping[str, Callable[[], Any]],
    repeat: int,
    warmup: int = 2,
    sync: Callable[[], None] | None = None,
    progress: Callable[[], None] | None = None,
    reverse_odd_rounds: bool = False,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """:func:`interleaved`, returning ``(wall, cpu)``: wall-clock seconds and this process's
    CPU seconds (all its threads) per call.

    CPU time stops while the process waits for a core, so on a machine shared with
    other jobs it shows the work done where wall time also shows the waiting. It does
    not count device time, and it counts a thread pool's spin-waits, so use it beside
    wall time, with one CPU thread per framework, never instead of it.
    """
    if repeat < 1:
        raise ValueError(f"repeat={repeat} must be >= 1")
    for _ in range(warmup):
        for fn in cases.values():
            fn()
            if sync is not None:
                sync()
    wall: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    order = list(cases.items())
    for i in range(repeat):
        for name, fn in order[::-1] if reverse_odd_rounds and i % 2 else order:
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            if sync is not None:
                sync()
            t1, c1 = time.perf_counter(), time.process_time()
            wall[name].append(t1 - t0)
            cpu[name].append(c1 - c0)
        if progress is not None:
            progress()
    return wall, cpu


def ratio(num: Sequence[float], den: Sequence[float]) -> dict[str, float]:
    """Compare two cases timed by the same :func:`interleaved` run: ``num / den``.

    Round i's samples of both cases ran back to back, so the per-round ratios cancel
    load that changes between rounds. Returns their median, quartiles, min and max,
    and the plain ratio of the two medians (``of_medians``).
    """
    if len(num) != len(den) or not num:
        raise ValueError(f"ratio needs two equally long, non-empty sample lists (got {len(num)}, {len(den)})")
    out = summary([a / b for a, b in zip(num, den)])
    out["of_medians"] = statistics.median(num) / statistics.median(den)
    return out


def same_step_cases(
    trainer: Any, runners: Mapping[str, Any], X: Any, y: Any
) -> tuple[dict[str, Callable[[], Any]], dict[str, float]]:
    """Step ``trainer`` (a DataParallel) and every runner once from the same start on ``(X, y)``;
    return the cases to time (``"ours"`` first; each waits for its devices) and each runner's
    largest parameter difference from ours (a loop that computes another update shows there)."""
    import numpy as np

    trainer.train_batch(X, y)
    ref = trainer.get_params()
    agreement = {}
    for name, r in runners.items():
        r.step(X, y)
        r.sync()
        agreement[name] = max(float(np.abs(a - b).max()) for a, b in zip(r.params(), ref))

    def ours() -> None:
        trainer.train_batch(X, y)  # reads the loss: it waits for every device
        trainer.synchronize()

    cases: dict[str, Callable[[], Any]] = {"ours": ours}
    for name, r in runners.items():
        cases[name] = (lambda r: lambda: (r.step(X, y), r.sync()))(r)  # noqa: B023 (bound by an argument or called at once)
    return cases, agreement


def progress_bar(total: int, desc: str, enabled: bool = True) -> Any:
    """Return a tqdm bar on stderr (a silent one when not ``enabled``); call ``.update()``/``.close()``."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, leave=False, file=sys.stderr, dynamic_ncols=True)


def device_spec(backend: Any, n: int) -> tuple[str, str]:
    """Return ``(spec, kind)`` for ``n`` devices: ``"gpu:0,..,n-1"`` when the backend sees
    that many GPUs, else ``"cpu:n"`` (CPU replicas)."""
    if backend.gpu_count() >= n:
        return "gpu:" + ",".join(str(i) for i in range(n)), "gpu"
    return f"cpu:{n}", "cpu"


def fmt_ms(s: dict[str, float], digits: int = 1) -> str:
    """Format a :func:`summary` of seconds as ``"median ms (q1-q3)"``."""
    return f"{1e3 * s['median']:.{digits}f} ({1e3 * s['q1']:.{digits}f}-{1e3 * s['q3']:.{digits}f})"


def fmt_ratio(r: dict[str, float]) -> str:
    """Format a :func:`ratio` as ``"median (q1-q3)"``."""
    return f"{r['median']:.3f} ({r['q1']:.2f}-{r['q3']:.2f})"


def isolated(target: str, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
    """Run ``"module:function"(*args, **kwargs)`` in a fresh process; return its result.

    The result must be picklable. An exception in the child is re-raised here.
    """
    module, _, func = target.partition(":")
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(_call, module, func, args, kwargs).result(timeout=timeout)


def _call(module: str, func: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return getattr(importlib.import_module(module), func)(*args, **kwargs)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus() -> list[str]:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine() -> dict[str, Any]:
    """Describe this machine and the moment: the date and time (UTC), CPU, cores, memory,
    GPUs, Python, package versions, thread settings, load average."""
    versions: dict[str, str | None] = {}
    for pkg in FRAMEWORK_PACKAGES:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    threads = {k: os.environ[k] for k in (*THREAD_VARIABLES, "MXNET_CPU_WORKER_NTHREADS") if k in os.environ}
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return {
        "date": date,
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "gpus": _gpus(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
        "thread_env": threads,
        "loadavg": list(os.getloadavg()),
    }


def busy_seconds() -> float | None:
    """CPU seconds the whole machine has been busy (every process, steal included), from
    /proc/stat; None where it cannot be read."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    ticks = [int(f) for f in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    guest = sum(ticks[8:10]) if len(ticks) > 9 else 0  # already counted in user/nice
    return (sum(ticks) - idle - guest) / os.sysconf("SC_CLK_TCK")


class LoadMeter:
    """CPU seconds used by processes other than this run, between ``__init__`` and ``stop()``.

    Busy time of the whole machine comes from ``/proc/stat``. This run's share is every
    process it started, wherever it runs: Ray's raylet, gcs_server and workers, and the
    hosts of a lab it brought up (``multigpu.lab.accounting.CpuAccount``: a cpuacct cgroup
    as root, else a poll of this process's descendants). ``own_cpu_s_children_only`` is
    what the older accounting saw (this process and the children it waited for), which
    counted Ray's daemons as other load.
    """

    def __init__(self) -> None:
        from multigpu.lab.accounting import CpuAccount

        self.account = CpuAccount()
        self.t0, self.busy0, self.own0 = time.perf_counter(), self._busy(), self._own()

    @staticmethod
    def _busy() -> float | None:
        return busy_seconds()

    @staticmethod
    def _own() -> float:
        import resource

        return sum(
            r.ru_utime + r.ru_stime
            for r in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
        )

    def own_seconds(self) -> float:
        """CPU seconds of this run so far (every process it started)."""
        return self.account.seconds()

    def stop(self) -> dict[str, Any]:
        """Return wall seconds, this run's CPU seconds, other processes' CPU seconds and
        their average share of the machine's cores (0..1), and how this run was counted."""
        wall, busy = time.perf_counter() - self.t0, self._busy()
        own = self.account.seconds()
        children_only = self._own() - self.own0
        self.account.close()
        other = None if busy is None or self.busy0 is None else max(0.0, busy - self.busy0 - own)
        old_other = None if busy is None or self.busy0 is None else max(0.0, busy - self.busy0 - children_only)
        cores = os.cpu_count() or 1
        return {
            "wall_s": wall,
            "own_cpu_s": own,
            "other_cpu_s": other,
            "other_share": None if other is None else other / (wall * cores),
            "own_method": self.account.method,
            "own_cpu_s_children_only": children_only,
            "other_share_children_only": None if old_other is None else old_other / (wall * cores),
        }


#: The meter of the benchmark that is running (benchmarks read their own CPU from it).
CURRENT: LoadMeter | None = None


def own_cpu_seconds() -> float | None:
    """CPU seconds the running benchmark has used so far, all its processes included (None
    outside ``run_benchmarks``)."""
    return None if CURRENT is None else CURRENT.own_seconds()


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "tolist"):  # numpy scalars and arrays
        return _jsonable(x.tolist())
    if isinstance(x, Path):
        return str(x)
    return x


def _load_line(before: dict[str, Any], load_after: list[float], load: dict[str, Any]) -> str:
    share = load.get("other_share")
    other = (
        "unknown" if share is None else f"{share:.0%} of the {before['cores']} cores ({load['other_cpu_s']:.0f} CPU-s)"
    )
    old = load.get("other_share_children_only")
    counted = (
        ""
        if old is None
        else f" (this run's processes counted by {load.get('own_method')}, its Ray daemons included; "
        f"counting only this process and its reaped children, as before, would say {old:.0%})"
    )
    return (
        f"Load average (1 min) {before['loadavg'][0]:.2f} before, {load_after[0]:.2f} after; "
        f"other processes used {other} during the run{counted}."
    )


def _write(
    result: Result, out: Path, before: dict[str, Any], load_after: list[float], load: dict[str, Any]
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    seconds = load["wall_s"]
    share = load.get("other_share")
    loaded = share is not None and share > 0.1 or before["loadavg"][0] > 0.5 * (before["cores"] or 1)
    versions = ", ".join(f"{k} {v}" for k, v in before["versions"].items() if v)
    header = [
        f"## {result.title}",
        "",
        f"Run on {before['date']}. "
        f"Machine: {before['cpu']}, {before['cores']} cores, {before['memory_gib']} GiB, "
        f"GPUs: {', '.join(before['gpus']) or 'none'}; Python {before['python']}; {versions}; "
        f"threads: {', '.join(f'{k}={v}' for k, v in before['thread_env'].items()) or 'framework defaults'}.",
        "",
        _load_line(before, load_after, load)
        + (" Other load was present." if loaded else "")
        + f" Took {seconds:.0f} s.",
        "",
    ]
    if result.plot is not None:  # drawn below, beside this page: the docs site shows it
        header += [f"![{result.title}]({result.name}.png)", ""]
    body = [t.markdown() for t in result.tables] + [f"- {n}" for n in result.notes]
    md = out / f"{result.name}.md"
    md.write_text("\n".join(header + body) + "\n")
    js = out / f"{result.name}.json"
    js.write_text(
        json.dumps(
            _jsonable(
                {
                    "name": result.name,
                    "title": result.title,
                    "machine": before,
                    "loadavg_after": load_after,
                    "load": load,
                    "other_load": loaded,
                    "seconds": seconds,
                    "settings": result.settings,
                    "tables": [asdict(t) for t in result.tables],
                    "notes": result.notes,
                    "data": result.data,
                }
            ),
            indent=1,
        )
    )
    paths = [md, js]
    if result.plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=(10, 6))
        try:
            result.plot(fig)
            png = out / f"{result.name}.png"
            fig.savefig(png, dpi=110, bbox_inches="tight")
        finally:
            plt.close(fig)
        paths.append(png)
    return paths


def run_benchmarks(names: Iterable[str], opts: Options, echo: Callable[[str], None] = print) -> list[Path]:
    """Run the named benchmarks in order; return every file written.

    A benchmark that raises is reported and the others still run; at the end
    BenchmarkError names every one that failed.
    """
    from multigpu.errors import BenchmarkError

    written: list[Path] = []
    failed: dict[str, str] = {}
    saved = {k: os.environ.get(k) for k in THREAD_VARIABLES}
    if opts.threads is not None:  # isolated() children inherit these when they start
        os.environ.update({k: str(opts.threads) for k in THREAD_VARIABLES})
    try:
        _run_each(names, opts, echo, written, failed)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if failed:
        raise BenchmarkError("benchmark(s) failed: " + "; ".join(f"{k}: {v}" for k, v in failed.items()))
    return written


def _run_each(
    names: Iterable[str], opts: Options, echo: Callable[[str], None], written: list[Path], failed: dict[str, str]
) -> None:
    for name in names:
        module_name = LAB_VARIANTS.get(name, BENCHMARKS[name]) if opts.lab else BENCHMARKS[name]
        module = importlib.import_module(f"{__package__}.{module_name}")
        before = machine()
        echo(f"bench {name}: {module.TITLE}")
        global CURRENT
        meter = CURRENT = LoadMeter()
        try:
            result = module.run(opts)
        except Exception as exc:  # one broken benchmark must not hide the others' results
            failed[name] = f"{type(exc).__name__}: {exc}"
            echo(f"bench {name}: FAILED: {failed[name]}")
            continue
        finally:
            CURRENT = None
            load = meter.stop()  # also on Ctrl-C: the accounting's cgroup goes
        written += _write(result, opts.out, before, list(os.getloadavg()), load)
        echo(f"bench {name}: done in {load['wall_s']:.0f} s -> {opts.out / name}.{{md,json,png}}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks``: the same as ``multigpu bench``."""
    from multigpu.cli import main as cli_main

    return cli_main(["bench", *(sys.argv[1:] if argv is None else argv)])
