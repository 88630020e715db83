"""``multigpu partition``: the cheapest placement of a network's layers on a cluster."""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

from multigpu.cli.parsers import add_alias, add_command, add_json_output, check_output, emit_json

DESCRIPTION = """\
Place each layer of a network (a chain or any graph with branches) on a device of a
heterogeneous cluster at the least cost = wt*T + we*E, where T is compute plus transfer
time (each activation sent once to each device that consumes it) and E is compute
energy plus link energy (docs/design/cost-model.md gives the exact model); or at the
least makespan (branches on different devices running at once), or the best pipelined
throughput. The optimum is exact: a DP without coupling constraints on chains and
fork-join graphs, a HiGHS MILP with memory, busy-time or energy constraints, for other
graphs, and for --objective makespan/throughput. Prints a per-layer table, the stages as
a graph, the transfers, each device's compute/transfer/energy/memory, and the plan
against four baselines; --plot draws the graph coloured by device.
The solve stops at a proven gap of 0.1% (--gap; --prove for the exact optimum) or at
--time-limit with the best plan found; the report says which, with the gap.
Exit status: 0 ok, 1 infeasible constraints or a solver failure (or a time limit
reached before any plan was found), 2 bad input, 130 interrupted."""


def register(subparsers: Any) -> None:
    """Add the ``partition`` sub-command to an argparse subparsers object."""
    p = add_command(
        subparsers,
        "partition",
        run,
        help="place a network's layers on heterogeneous devices at minimal time/energy cost",
        description=DESCRIPTION,
        raw=True,
    )
    model = p.add_argument(
        "--model",
        default=None,
        metavar="FILE|NAME",
        help="the network (required): a built-in model (lenet, alexnet, ...), a shipped layer graph "
        "(resnet50, inception, ...) or a JSON/TOML graph file",
    )
    add_alias(p, "--graph", model)
    p.add_argument(
        "--cluster",
        required=True,
        metavar="FILE|NAME",
        help="cluster: a JSON/TOML file, or a shipped one (lab, gpu-box)",
    )
    batch = p.add_argument(
        "--batch-size", type=int, default=1, metavar="N", help="inputs per forward pass of a built-in model (default 1)"
    )
    add_alias(p, "--batch", batch)
    p.add_argument("--wt", type=float, default=1.0, help="weight of time T in seconds (default 1)")
    p.add_argument("--we", type=float, default=0.0, help="weight of energy E in joules (default 0)")
    p.add_argument(
        "--objective",
        choices=("latency", "makespan", "throughput"),
        default="latency",
        help="latency: minimise wt*T + we*E (default); makespan: minimise when the output reaches "
        "the sink, branches running at once; throughput: minimise the pipelined bottleneck "
        "(busiest device, link or host)",
    )
    p.add_argument(
        "--energy-budget",
        type=float,
        default=None,
        metavar="J",
        help="the most energy E one inference may use, in joules",
    )
    p.add_argument(
        "--busy-limit",
        action="append",
        default=[],
        metavar="DEVICE=SECONDS",
        help="the most compute seconds on DEVICE (repeatable)",
    )
    p.add_argument(
        "--pin", action="append", default=[], metavar="LAYER=DEVICE", help="run LAYER on DEVICE (repeatable)"
    )
    p.add_argument(
        "--exclude", action="append", default=[], metavar="DEVICE", help="run no layer on DEVICE (repeatable)"
    )
    p.add_argument(
        "--ignore-memory", action="store_true", help="ignore the devices' declared memory (respected by default)"
    )
    p.add_argument(
        "--ship-params",
        action="store_true",
        help="each layer's parameters travel from the source first (as in the source report)",
    )
    p.add_argument(
        "--solver", choices=("auto", "dp", "milp"), default="auto", help="force the DP or the MILP (default auto)"
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the most seconds the solve may take (default: no limit); on reaching it the best plan "
        "found is printed with its proven gap (exit 1 only if no plan was found)",
    )
    exact = p.add_mutually_exclusive_group()
    exact.add_argument(
        "--gap",
        type=float,
        default=None,
        metavar="FRACTION",
        help="stop once the plan is proven within this relative gap of the optimum (default 0.001, i.e. 0.1%%)",
    )
    exact.add_argument("--prove", action="store_true", help="prove the optimum exactly (--gap 0)")
    p.add_argument(
        "--plot",
        default=None,
        metavar="PNG",
        help="draw the graph, each layer coloured by its device and the cut edges marked (needs matplotlib)",
    )
    p.add_argument("--no-baselines", action="store_true", help="skip the baseline comparison")
    p.add_argument(
        "--export-stages",
        default=None,
        metavar="DIR",
        help="write each stage of the plan as an ONNX file in DIR (new or empty), with manifest.json saying "
        "which stage feeds which; --model names a built-in model (exported with its initial parameters, "
        "seed 0, and a symbolic batch) or an ONNX file (exported with its own weights at --batch-size); needs onnx",
    )
    add_json_output(p, "the plan (assignment, time, energy, cost, baselines, ...)")
    p.add_argument("--verbose", action="store_true", help="print the MILP solver's log")


def _bad_input(message: str) -> Exception:
    from multigpu.partition import PartitionInputError

    return PartitionInputError(message)


def _pairs(items: list[str], flag: str, value_kind: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise _bad_input(f"{flag} {item!r} must look like NAME={value_kind}")
        if key in out:
            raise _bad_input(f"{flag} names {key!r} twice ({key}={out[key]} and {key}={value}); give each once")
        out[key] = value
    return out


def _busy(items: list[str]) -> dict[str, float] | None:
    if not items:
        return None
    out = {}
    for dev, text in _pairs(items, "--busy-limit", "SECONDS").items():
        try:
            out[dev] = float(text)
        except ValueError:
            raise _bad_input(f"--busy-limit {dev}={text!r}: {text!r} is not a number of seconds") from None
    return out


def _json_number(x: float) -> float | None:
    return x if math.isfinite(x) else None


class _Progress:
    """Prints the solver's steps to stderr once a solve has run for ``QUIET_SECONDS``: a short
    solve stays quiet, a long one shows where it is (stdout keeps the report or the JSON)."""

    QUIET_SECONDS = 1.0

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self, line: str) -> None:
        if time.perf_counter() - self.start >= self.QUIET_SECONDS:
            print(f"partition: {line}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """Plan the placement and print the report (or JSON); return 0 or raise (``multigpu.cli`` maps
    InfeasibleError and SolverError to exit 1, bad input to exit 2)."""
    from multigpu.partition import Constraints, autopartition, baselines, format_report, load_cluster, load_graph
    from multigpu.partition.report import baseline_gap
    from multigpu.partition.solvers.solver import DEFAULT_GAP

    if args.model is None:
        raise _bad_input("the network is missing; give --model NAME|FILE, e.g. --model alexnet")
    check_output(args)
    graph = load_graph(args.model, batch=args.batch_size)
    cluster = load_cluster(args.cluster)
    pins: dict[Any, str] = dict(_pairs(args.pin, "--pin", "DEVICE"))
    cons = Constraints(
        memory=not args.ignore_memory,
        busy_time=_busy(args.busy_limit),
        energy_budget=args.energy_budget,
        pinned=pins,
        excluded=list(args.exclude),
    )
    if args.plot is not None:  # before a long solve, not after it
        from pathlib import Path

        from multigpu.training.plotting import require_matplotlib

        require_matplotlib()
        if not Path(args.plot).resolve().parent.is_dir():
            raise _bad_input(f"--plot {args.plot!r}: its folder does not exist; give a path in an existing folder")
    if args.export_stages is not None:  # before a long solve, not after it
        from multigpu.execution.onnx_stages import cli_export_check

        export = cli_export_check(args.model, args.export_stages, batch=args.batch_size)
    plan = autopartition(
        graph,
        cluster,
        wt=args.wt,
        we=args.we,
        objective=args.objective,
        constraints=cons,
        ship_params=args.ship_params,
        solver=args.solver,
        verbose=args.verbose,
        time_limit=args.time_limit,
        gap=0.0 if args.prove else (DEFAULT_GAP if args.gap is None else args.gap),
        progress=_Progress(),
    )
    if args.export_stages is not None:
        from multigpu.execution.onnx_stages import cli_export

        cli_export(*export, plan, args.export_stages)
    base = [] if args.no_baselines else baselines(graph, cluster, args.wt, args.we, args.ship_params, cons)
    if args.json or args.out is not None:
        out = plan.to_dict()
        out["baselines"] = {
            b.name: None
            if b.breakdown is None
            else {
                "assignment": b.assignment,
                "time": b.breakdown.time,
                "energy": b.breakdown.energy,
                "cost": b.breakdown.cost,
                "makespan": b.breakdown.makespan,
                "bottleneck": b.breakdown.bottleneck,
                "gap": _json_number(baseline_gap(plan, b)),
                "violations": b.violations,
            }
            for b in base
        }
        emit_json(args, out)
    if not args.json:
        print(format_report(plan, graph, cluster, base))
    if args.plot is not None:
        from multigpu.partition.plot import plot_plan

        plot_plan(plan, graph, cluster, args.plot)
    return 0
