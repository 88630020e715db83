"""The benchmark harness: one runner, one result format.

A benchmark is a module in this package with ``TITLE`` (one line), ``IN_QUICK``
(whether ``--quick`` runs it) and ``run(opts: Options) -> Result``. The runner
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
  from slowing another.
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
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from importlib import metadata
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

__all__ = ["BENCHMARKS", "Options", "Result", "Table", "interleaved", "isolated", "machine",
           "run_benchmarks", "summary"]

# Benchmark name -> module in this package, in the order ``--all`` runs them.
BENCHMARKS: dict[str, str] = {
    "dist_allreduce": "dist_allreduce",
    "dist_step": "dist_step",
    "contract": "contract_overhead",
    "plans": "plans",
}

FRAMEWORK_PACKAGES = ("numpy", "scipy", "torch", "mxnet", "paddlepaddle", "ray", "matplotlib")


@dataclass(frozen=True)
class Options:
    """What the runner passes to every benchmark."""

    quick: bool = False
    out: Path = Path("benchmarks/out")
    progress: bool = True

    def repeats(self, full: int, quick: int) -> int:
        """Return ``quick`` under ``--quick``, else ``full``."""
        return quick if self.quick else full


@dataclass
class Table:
    """One markdown table: ``rows`` hold already formatted cells."""

    title: str
    columns: list[str]
    rows: list[list[Any]]
    note: str = ""

    def markdown(self) -> str:
        """Return the table as GitHub markdown, title and note included."""
        lines = [f"### {self.title}", "", "| " + " | ".join(self.columns) + " |",
                 "|" + "|".join("---" for _ in self.columns) + "|"]
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
    plot: Optional[Callable[[Any], None]] = None  # draws on a matplotlib Figure


def summary(samples: Sequence[float]) -> dict[str, float]:
    """Return median, min, max, quartiles and count of ``samples``."""
    xs = sorted(float(s) for s in samples)
    if not xs:
        raise ValueError("summary of no samples")
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"median": statistics.median(xs), "min": xs[0], "max": xs[-1], "q1": q[0], "q3": q[2],
            "n": len(xs)}


def interleaved(cases: Mapping[str, Callable[[], Any]], repeat: int, warmup: int = 2,
                sync: Optional[Callable[[], None]] = None,
                progress: Optional[Callable[[], None]] = None) -> dict[str, list[float]]:
    """Time each case ``repeat`` times, alternating between cases; return seconds per call.

    ``warmup`` untimed rounds run first. ``sync`` (a device synchronize) runs inside
    the timed region after every call, so queued device work is counted.
    """
    if repeat < 1:
        raise ValueError(f"repeat={repeat} must be >= 1")
    for _ in range(warmup):
        for fn in cases.values():
            fn()
            if sync is not None:
                sync()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            if sync is not None:
                sync()
            samples[name].append(time.perf_counter() - t0)
        if progress is not None:
            progress()
    return samples


def isolated(target: str, *args: Any, timeout: Optional[float] = None, **kwargs: Any) -> Any:
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


def machine() -> dict[str, Any]:
    """Describe this machine: CPU, cores, GPUs, Python, package versions, load average."""
    versions = {}
    for pkg in FRAMEWORK_PACKAGES:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "gpus": _gpus(),
            "python": platform.python_version(), "platform": platform.platform(),
            "versions": versions, "loadavg": list(os.getloadavg())}


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


def _write(result: Result, out: Path, before: dict[str, Any], load_after: list[float],
           seconds: float) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    md = out / f"{result.name}.md"
    loaded = max(before["loadavg"][0], load_after[0]) > 0.5 * (before["cores"] or 1)
    header = [f"## {result.title}", "",
              f"Machine: {before['cpu']}, {before['cores']} cores, "
              f"GPUs: {', '.join(before['gpus']) or 'none'}; load average (1 min) "
              f"{before['loadavg'][0]:.2f} before, {load_after[0]:.2f} after"
              f"{' (other load was present)' if loaded else ''}; {seconds:.0f} s.", ""]
    body = [t.markdown() for t in result.tables] + [f"- {n}" for n in result.notes]
    md.write_text("\n".join(header + body) + "\n")
    js = out / f"{result.name}.json"
    js.write_text(json.dumps(_jsonable({
        "name": result.name, "title": result.title, "machine": before,
        "loadavg_after": load_after, "other_load": loaded, "seconds": seconds,
        "settings": result.settings, "tables": [asdict(t) for t in result.tables],
        "notes": result.notes, "data": result.data}), indent=1))
    paths = [md, js]
    if result.plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=(10, 6))
        result.plot(fig)
        png = out / f"{result.name}.png"
        fig.savefig(png, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(png)
    return paths


def run_benchmarks(names: Iterable[str], opts: Options,
                   echo: Callable[[str], None] = print) -> list[Path]:
    """Run the named benchmarks in order; return every file written."""
    written: list[Path] = []
    for name in names:
        module = importlib.import_module(f"{__package__}.{BENCHMARKS[name]}")
        before = machine()
        echo(f"bench {name}: {module.TITLE}")
        t0 = time.perf_counter()
        result = module.run(opts)
        seconds = time.perf_counter() - t0
        written += _write(result, opts.out, before, list(os.getloadavg()), seconds)
        echo(f"bench {name}: done in {seconds:.0f} s -> {opts.out / name}.{{md,json,png}}")
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m benchmarks``: the same as ``multigpu bench``."""
    from multigpu.cli import main as cli_main

    return cli_main(["bench", *(sys.argv[1:] if argv is None else argv)])
