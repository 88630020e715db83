"""Plain-text report of a plan: per-layer table, per-device and per-link totals, and
the plan against the baselines."""

from __future__ import annotations

import math
from collections.abc import Sequence

from multigpu.partition.cost.arithmetic import single_device, warm_pass_of
from multigpu.partition.cost.choices import measured_devices
from multigpu.partition.inputs.cluster import Cluster
from multigpu.partition.inputs.graph import Graph
from multigpu.partition.solvers.baselines import BaselineResult
from multigpu.partition.solvers.planner import Plan
from multigpu.partition.stages import stages_summary
from multigpu.partition.units import fmt_bytes, fmt_energy, fmt_time

__all__ = ["baseline_gap", "format_report", "fmt_bytes", "fmt_energy", "fmt_time", "stage_graph"]


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()

    return [line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows]


def format_report(plan: Plan, graph: Graph, cluster: Cluster, baselines: Sequence[BaselineResult] | None = None) -> str:
    """The human-readable report the ``partition`` command prints."""
    bd = plan.breakdown
    out: list[str] = []
    weights = f"wt={plan.wt:g}, we={plan.we:g}" + (", parameters shipped from the source" if plan.ship_params else "")
    out.append(
        f"AutoPartition: {graph.name} ({graph.n} layers) on {cluster.name} ({cluster.k} devices; "
        f"source {cluster.source}, sink {cluster.sink})"
    )
    out.append(f"objective: {plan.objective}; cost = wt*T + we*E with {weights}")
    measured = measured_devices(graph, cluster)
    if measured:
        rest = [n for n in cluster.names if n not in measured]
        out.append(
            f"compute times: measured on {', '.join(measured)} (layer_times of {graph.name})"
            + (f"; from FLOP/s on {', '.join(rest)}" if rest else "")
        )
    only = single_device([cluster.index(d) for d in plan.assignment])
    warm = None if only is None else warm_pass_of(graph, cluster, only)
    if warm is not None and only is not None:  # every layer on one device: its items follow each other there
        out.append(
            f"every layer runs on {cluster.names[only]}: its items follow each other there, priced at its "
            f"warm_pass of {graph.name} ({fmt_time(warm)}; the layer times, measured with the devices "
            f"taking turns, are scaled to it where it is less)"
        )
    if bd.stage_time:
        out.append(
            f"stage overheads (once per stage, in T and in the bottleneck; busy time counts compute only): "
            f"{fmt_time(bd.stage_time)} in all"
        )
    how = {
        "dp": "chain DP",
        "fork-join dp": "fork-join DP",
        "milp": "MILP (HiGHS)",
        "ideal dp": "contiguous DP over the graph's ideals",
        "fill": "the memory fill, the first plan (the time limit struck before a better one)",
        "bound": "a feasible plan within the gap of the LP/Lagrangian lower bound",
        "search": "a local search on the bottleneck beside the MILP (the time limit struck first)",
    }.get(plan.solver, plan.solver)
    out.append(
        f"plan: cost {plan.cost:.6g}  time {fmt_time(plan.time)}  energy {fmt_energy(plan.energy)}  "
        f"makespan {fmt_time(plan.makespan)}  bottleneck {fmt_time(plan.bottleneck)} at {bd.bottleneck_at}  "
        f"({how}, {plan.solve_time * 1e3:.3g} ms)"
    )
    out.append(f"proof: {proof_line(plan)}")
    out.append("stages: " + "; ".join(f"{s.span} on {s.device}" for s in plan.stages))
    out.append("")
    out += stage_graph(plan, graph)
    out.append("")

    out.append("Per layer")
    rows = []
    for i, lc in enumerate(bd.layers):
        moved = f"{fmt_time(lc.transfer_time)} from {'+'.join(lc.transfers_from)}" if lc.transfer_from else "-"
        compute = fmt_time(lc.compute_time)
        if lc.stage_overhead:
            compute += f" + {fmt_time(lc.stage_overhead)} stage"
        rows.append(
            [
                str(i + 1),
                lc.name,
                lc.device,
                compute,
                moved,
                fmt_time(lc.param_time) if lc.param_time else "-",
                fmt_time(lc.time),
                fmt_energy(lc.energy),
            ]
        )
    if bd.output_time:
        rows.append(
            [
                "",
                "(output)",
                cluster.sink or "",
                "-",
                f"{fmt_time(bd.output_time)} from {bd.assignment[-1]}",
                "-",
                fmt_time(bd.output_time),
                fmt_energy(bd.output_energy),
            ]
        )
    out += _table(
        ["#", "layer", "device", "compute", "input transfer", "params", "time", "energy"],
        rows,
        [True, False, False, True, True, True, True, True],
    )
    out.append("")

    out.append(
        "Per device (transfer = time of the transfers it sends or receives; load = per item when "
        "pipelined: compute, stage overheads, transfer CPU)"
    )
    rows = []
    for d in bd.devices:
        limit = "unlimited" if d.memory_limit is None else fmt_bytes(d.memory_limit)
        rows.append(
            [
                d.name,
                str(d.layers),
                fmt_time(d.compute_time),
                fmt_time(d.transfer_time),
                fmt_time(d.transfer_cpu) if d.transfer_cpu else "-",
                fmt_time(d.load),
                fmt_energy(d.compute_energy),
                f"{fmt_bytes(d.memory)} / {limit}",
            ]
        )
    out += _table(
        ["device", "layers", "compute", "transfer", "transfer CPU", "load", "energy", "memory / limit"],
        rows,
        [False, True, True, True, True, True, True, True],
    )
    if bd.hosts:
        out.append("")
        out.append("Per host (share = load of its devices / cores: the bottleneck counts it)")
        rows = [[h.name, f"{h.cores:g}", ", ".join(h.devices), fmt_time(h.load), fmt_time(h.share)] for h in bd.hosts]
        out += _table(["host", "cores", "devices", "load", "share"], rows, [False, True, False, True, True])
    if bd.links:
        out.append("")
        out.append(
            "Per link (load = activation transfer time per inference; * = one host's CPU work, not "
            "counted in the bottleneck)"
        )
        rows = [
            [
                f"{ln.between[0]} <-> {ln.between[1]}",
                fmt_bytes(ln.bytes),
                fmt_time(ln.load) + (" *" if ln.cpu_work else ""),
                fmt_time(ln.param_time) if ln.param_time else "-",
                fmt_energy(ln.energy),
            ]
            for ln in bd.links
        ]
        out += _table(["link", "bytes", "load", "params", "energy"], rows, [False, True, True, True, True])

    if baselines:
        out.append("")
        metric = {"throughput": "bottleneck", "makespan": "makespan"}.get(plan.objective, "cost")
        out.append(f"Plan against the baselines (gap = {metric} / plan {metric} - 1)")
        rows = [
            [
                "AutoPartition",
                f"{plan.cost:.6g}",
                fmt_time(plan.time),
                fmt_energy(plan.energy),
                fmt_time(plan.makespan),
                fmt_time(plan.bottleneck),
                "-",
                stages_summary(plan.assignment),
            ]
        ]
        for b in baselines:
            if b.breakdown is None:
                rows.append([b.description, "n/a", "-", "-", "-", "-", "-", f"cannot run: {_short(b.reason)}"])
                continue
            gap = baseline_gap(plan, b)
            note = stages_summary(b.assignment or [])
            if b.violations:
                note += "  [breaks " + "; ".join(b.violations) + "]"
            rows.append(
                [
                    b.description,
                    f"{b.cost:.6g}",
                    fmt_time(b.breakdown.time),
                    fmt_energy(b.breakdown.energy),
                    fmt_time(b.breakdown.makespan),
                    fmt_time(b.breakdown.bottleneck),
                    f"{gap * 100:+.1f}%",
                    note,
                ]
            )
        out += _table(
            ["placement", "cost", "time", "energy", "makespan", "bottleneck", "gap", "devices"],
            rows,
            [False, True, True, True, True, True, True, False],
        )
    return "\n".join(out)


def stage_graph(plan: Plan, graph: Graph) -> list[str]:
    """The stages as a graph: each stage, its device and layers, and what it waits for
    (``<-``: a stage, and the layers it consumes from there), then every transfer."""
    out = [
        "Stages (a DAG: a stage runs once the stages after <- are done; stages on different devices "
        "whose inputs are ready run at once)"
    ]
    names = graph.names
    rows = []
    for s in plan.stages:
        feeds: dict[int, list[str]] = {}
        for p, t in s.inputs:
            feeds.setdefault(t, []).append("input" if p < 0 else names[p])
        waits = ", ".join("input" if t < 0 else f"{t + 1} ({', '.join(ps)})" for t, ps in sorted(feeds.items()))
        rows.append([str(s.index + 1), s.device, str(s.layers), s.span, waits])
    out += _table(
        ["stage", "device", "layers", "span", "<- waits for (the layers it consumes there)"],
        rows,
        [True, False, True, False, False],
    )
    transfers = plan.breakdown.transfers
    if transfers:
        out.append("")
        out.append("Transfers (each activation once to each other device that consumes it)")
        rows = [
            [t.producer, f"{t.between[0]} -> {t.between[1]}", t.to, fmt_bytes(t.bytes), fmt_time(t.time)]
            for t in transfers
        ]
        out += _table(
            ["output of", "from -> to", "first consumer there", "bytes", "time"],
            rows,
            [False, False, False, True, True],
        )
    return out


def baseline_gap(plan: Plan, baseline: BaselineResult) -> float:
    """Relative gap of a baseline to the plan in the plan's objective (cost for
    latency, bottleneck for throughput); +inf if the baseline cannot run."""
    if baseline.breakdown is None:
        return math.inf
    if plan.objective == "throughput":
        mine, theirs = plan.bottleneck, baseline.breakdown.bottleneck
    elif plan.objective == "makespan":
        mine, theirs = plan.makespan, baseline.breakdown.makespan
    else:
        mine, theirs = plan.cost, baseline.cost
    if mine > 0:
        return theirs / mine - 1
    return 0.0 if theirs <= 0 else math.inf


def _short(reason: str | None) -> str:
    if not reason:
        return ""
    return reason.split(";")[0]


def proof_line(plan: Plan) -> str:
    """How close the plan is proven to be to the optimum of its objective, in words."""
    what = {"throughput": "bottleneck", "makespan": "makespan"}.get(plan.objective, "cost")
    if plan.proof == "optimal":
        return f"optimal (the {what} meets the proven lower bound)"
    if plan.proof == "heuristic":
        return f"no lower bound on the {what} was proven (a heuristic plan)"
    bound = fmt_time(plan.bound) if what != "cost" else f"{plan.bound:.6g}"
    return f"within {plan.gap:.3%} of the optimum (the {what} is at least {bound})"
