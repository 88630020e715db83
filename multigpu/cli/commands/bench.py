"""``multigpu bench``: run the comparative benchmarks through one harness."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from multigpu.cli.parsers import add_command
from multigpu.errors import InputError

DESCRIPTION = """\
Run benchmarks through one harness. Each writes NAME.md (a table), NAME.json
(machine, settings, raw samples) and NAME.png (a plot) into --out. Without names,
runs every benchmark (--quick: the quick ones, with fewer repeats).
"""


def register(sub: Any) -> None:
    """Add the ``bench`` sub-command."""
    p = add_command(
        sub, "bench", run, help="run the comparative benchmarks (tables, JSON, plots)", description=DESCRIPTION
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run (default: all; see --list)")
    p.add_argument("--quick", action="store_true", help="fewer repeats and sizes; skips the long benchmarks")
    p.add_argument("--out", default="benchmarks/out", metavar="DIR", help="output folder (default benchmarks/out)")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.add_argument(
        "--backends",
        metavar="LIST",
        help="comma-separated frameworks to measure, e.g. torch,mxnet (default: every installed one)",
    )
    p.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="CPU threads per framework process (sets OMP_NUM_THREADS and friends; default: the "
        "frameworks' own choice). On a machine shared with other jobs, 1 keeps a busy core "
        "from stalling every parallel op",
    )
    p.add_argument(
        "--lab",
        action="store_true",
        help="run across the hosts of the emulated lab (needs root): `plans --lab` predicts and measures "
        "plans over shaped links; `lab` runs the report's experiment, multi-host allreduces, faults "
        "and who can reach each job",
    )
    p.add_argument(
        "--instances",
        metavar="DIR",
        help="`planner`: also solve the published instances of Tarnawski et al. (NeurIPS 2020) from DIR, a clone "
        "of https://github.com/msr-fiddle/dnn-partitioning, beside their IP (on HiGHS) and their DP",
    )
    p.add_argument(
        "--cases",
        metavar="LIST",
        help="`planner`: comma-separated parts to run (dp, milp, gaps, graphs, stress, published), graphs "
        "(resnet18, resnet50, inception) or graph clusters (lab, gpu16); a graph or cluster runs only those "
        "graph cases, e.g. --cases resnet50,inception,gpu16 (default: every part)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")


def _instances(folder: str | None) -> Path | None:
    """The folder of the published planner instances (``--instances``), checked: InputError
    naming it and how to get the repository when it does not hold them."""
    if folder is None:
        return None
    from multigpu.benchmarks.planner_published import INSTANCES, REPO_URL

    path = Path(folder)
    missing = [rel for rel in INSTANCES.values() if not (path / rel).is_file()]
    if missing:
        raise InputError(
            f"--instances {folder}: {missing[0]} is not there ({len(missing)} instance file(s) missing); get the "
            f"instances with `git clone {REPO_URL} {folder}`"
        )
    return path


def run(args: argparse.Namespace) -> int:
    """Run the chosen benchmarks; return 0, or raise InputError for an unknown name."""
    import importlib

    from multigpu.benchmarks.harness import BENCHMARKS, Options, run_benchmarks

    if args.list:
        for name, module in BENCHMARKS.items():
            mod = importlib.import_module(f"multigpu.benchmarks.{module}")
            print(f"{name:<12} {'quick ' if mod.IN_QUICK else 'full  '} {mod.TITLE}")
        return 0
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        raise InputError(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)} (see --list)")

    def wanted(module: str) -> bool:
        mod = importlib.import_module(f"multigpu.benchmarks.{module}")
        return (not args.quick or mod.IN_QUICK) and (args.lab or not getattr(mod, "NEEDS_LAB", False))

    names = args.names or [n for n, m in BENCHMARKS.items() if wanted(m)]
    needs = [
        n
        for n in names
        if getattr(importlib.import_module(f"multigpu.benchmarks.{BENCHMARKS[n]}"), "NEEDS_LAB", False) and not args.lab
    ]
    if needs:
        raise InputError(f"benchmark(s) {needs} run in the emulated lab; add --lab (as root)")
    backends = None
    if args.backends is not None:
        from multigpu.contract.registry import available_backends, registered_backends

        backends = tuple(b.strip() for b in args.backends.split(",") if b.strip())
        bad = [b for b in backends if b not in registered_backends() or b == "numpy"]
        if bad or not backends:
            raise InputError(
                f"--backends {args.backends!r}: {bad or 'empty'} is not a framework backend; "
                f"choose from {[b for b in registered_backends() if b != 'numpy']}"
            )
        missing = [b for b in backends if b not in available_backends()]
        if missing:
            raise InputError(
                f"--backends {args.backends!r}: {missing} not installed here; "
                f"installed: {[b for b in available_backends() if b != 'numpy']}"
            )
    cases = None
    if args.cases is not None:
        cases = tuple(c.strip() for c in args.cases.split(",") if c.strip())
        if not cases or names != ["planner"]:
            raise InputError(
                f"--cases {args.cases!r} selects parts of `planner` only: name it alone (`bench planner --cases ...`) "
                "and give at least one case"
            )
        from multigpu.benchmarks.planner import selection

        selection(cases)  # an unknown case fails here, before anything runs
    if args.threads is not None and args.threads < 1:
        raise InputError(f"--threads {args.threads} must be at least 1")
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {out} cannot be created ({exc.strerror}); pass a writable folder") from exc
    run_benchmarks(
        names,
        Options(
            quick=args.quick,
            out=out,
            progress=not args.quiet,
            backends=backends,
            threads=args.threads,
            lab=args.lab,
            instances=_instances(args.instances),
            cases=cases,
        ),
        echo=(lambda s: None) if args.quiet else print,
    )
    return 0
