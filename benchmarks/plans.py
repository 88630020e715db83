"""Plans that run, as a user choosing among them sees them: profile this machine, then for
each setting (a model and the objective its plan is chosen for: LeNet, AlexNet and ResNet-18
for latency, LeNet and AlexNet for throughput, streamed; --quick: LeNet only) run every
candidate plan: the planner's choice, its runners-up (``partition.solvers.runners_up``), each
single worker, the baselines (uniform, FLOPs-balanced, greedy) and hand-made plans (ResNet-18's
put a residual block's main path and shortcut on different workers). Reported per setting:
the **regret** of the planner's choice (its measured time over the best candidate's), the
**Kendall tau** between predicted and measured times over the candidates, per-part errors
(stage compute, hops) beside end-to-end ones, and the spread of each candidate's measured time
over the cycles, so that no figure is read closer than the noise allows.

The devices are worker processes (Ray actors) with their own framework and thread
count, plus the driver (this process, the source and sink, which runs no layer). ``profile``
measures every layer on every device and every link through the engine; the cost model on
that profile predicts each plan's end-to-end time (for ResNet-18 the makespan: branches on
different workers at once; streamed, 1 / bottleneck). Every cycle profiles again and runs
every plan (in a shuffled order), each priced on that cycle's profile. A streamed plan is
also priced without the terms of what it shares (hosts' cores, transfer CPU, the driver's
relay), to show what they change. Also reported: a hop against a bare actor call with the
same payload, each cycle's load average, and what a Ray Compiled Graph gives on one plan.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

import multigpu
from multigpu.benchmarks.harness import Options, Result, Table, busy_seconds
from multigpu.contract.registry import PREFERRED
from multigpu.errors import InputError
from multigpu.execution import Session, profile
from multigpu.lab.accounting import ACCOUNT_ENV
from multigpu.partition import (
    Cluster,
    Constraints,
    DeviceSpec,
    EngineProfile,
    autopartition,
    evaluate,
    graph_from_model,
)
from multigpu.partition.stages import split_stages, stages_summary

TITLE = (
    "Plans that run: every candidate of a setting (the planner's choice, its runners-up, single workers, "
    "baselines) predicted and measured; regret, rank correlation, per-part errors, spread"
)
IN_QUICK = True

TARGET_LATENCY = 0.10  # median |error| of end-to-end time
TARGET_STREAM = 0.15  # |error| of streaming throughput
# ResNet-18 (torchvision's layout, 10 classes) on 3x64x64 inputs: ~0.3 GFLOP a pass, a few
# tens of ms on one thread, so profiling its 69 layers' prefixes fits a benchmark. --quick
# (what CI runs, within a time limit) leaves it out: on two shared cores its profile and
# plans more than doubled the quick run.
RESNET_INPUT = (3, 64, 64)


def _model(name: str) -> Any:
    """The benchmark's model called ``name`` (ResNet-18 at RESNET_INPUT)."""
    if name == "resnet18":
        return multigpu.models.resnet18(num_classes=10, input_shape=RESNET_INPUT)
    return multigpu.models.get(name)


def _devices(frameworks: list[str], threads: int | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The driver and the workers: one single-threaded worker per framework of
    ``frameworks`` (they differ by up to 2.2x in speed; in torch, paddle, mxnet order),
    and with ``threads`` a torch worker with that many threads.

    No multi-threaded worker by default: on a two-core machine shared with other
    jobs, an OpenMP team of two waits at every barrier for a descheduled thread, and
    one such worker profiled LeNet at 32 ms a pass against 0.44 ms single-threaded.
    Set MULTIGPU_BENCH_THREADS=2 on a quiet machine with spare cores."""
    have = [b for b in PREFERRED if b in frameworks]
    first = have[0] if have else "numpy"
    workers = [{"name": f"{b}-1t", "backend": b, "threads": 1} for b in have]
    if "torch" in have and threads:
        workers.append({"name": f"torch-{threads}t", "backend": "torch", "threads": threads})
    if len(workers) < 3:
        workers.append({"name": "numpy", "backend": "numpy"})
    return {"name": "driver", "backend": first, "threads": 1}, workers


def _cut(n: int, names: list[str], fractions: list[float]) -> list[str]:
    """A contiguous plan: device names[i] gets a share fractions[i] of the n layers."""
    out: list[str] = []
    for i, (name, f) in enumerate(zip(names, fractions)):
        count = n - len(out) if i == len(names) - 1 else max(1, round(f * n))
        out += [name] * count
    return out


#: What a setting's candidates must number at least (the issue's figure), and how many of the
#: planner's runners-up every setting runs whatever the others number.
MIN_CANDIDATES = 8
RUNNERS_UP = 3
#: The settings: a model and the objective its plans are chosen for (throughput plans are
#: streamed). ResNet-18 is latency only: its throughput plans come from the MILP, about 0.15 s
#: a solve, and its runners-up take ~140 solves each.
SETTINGS = [
    ("lenet", "latency"),
    ("alexnet", "latency"),
    ("resnet18", "latency"),
    ("lenet", "throughput"),
    ("alexnet", "throughput"),
]
QUICK_SETTINGS = [("lenet", "latency"), ("lenet", "throughput")]
#: Targets for a user choosing among the candidates (issue 39): the planner's choice within 5%
#: of the best measured candidate, and the predicted order agreeing with the measured one.
TARGET_REGRET = 1.05
TARGET_TAU = 0.8


def candidates(
    model: str,
    objective: str,
    graph: Any,
    cluster: Any,
    workers: list[str],
    extra: Sequence[dict[str, Any]] = (),
) -> tuple[list[dict[str, Any]], list[str]]:
    """A setting's candidate plans, the planner's choice first, each plan once: the planner's
    choice for ``objective`` on ``workers`` (the driver runs no layer), its runners-up (at least
    RUNNERS_UP, more until there are MIN_CANDIDATES), every single-worker plan, the
    baselines (uniform, FLOPs-balanced, greedy) and ``extra`` (hand-made plans). A plan two
    ways reached is one candidate with both roles. Also returns what was left out and why."""
    from multigpu.partition.solvers.baselines import baselines
    from multigpu.partition.solvers.runners_up import runners_up

    excluded = [d for d in cluster.names if d not in workers]
    cons = Constraints(excluded=excluded)
    stream = objective == "throughput"
    setting = f"{model}, {objective}"
    out: list[dict[str, Any]] = []
    left_out: list[str] = []

    def add(plan: list[str], role: str, label: str) -> None:
        for c in out:
            if c["plan"] == plan:
                c["roles"].append(role)
                return
        out.append(
            {
                "model": model,
                "setting": setting,
                "objective": objective,
                "label": label,
                "roles": [role],
                "plan": list(plan),
                "stream": stream,
            }
        )

    first = autopartition(graph, cluster, objective=objective, constraints=cons)
    add(first.assignment, "planner", f"AutoPartition ({objective})")
    ranked = runners_up(graph, cluster, MIN_CANDIDATES - 1, objective, cons, first=first)
    singles = [[w] * graph.n for w in workers]
    base = [b for b in baselines(graph, cluster, constraints=cons) if b.name != "single"]
    # Runners-up first (RUNNERS_UP of them), then the others, then runners-up to the minimum.
    for k, r in enumerate(ranked[:RUNNERS_UP]):
        add(r.assignment, f"runner-up {k + 2}", f"runner-up {k + 2}")
    for w, plan in zip(workers, singles):
        add(plan, "single device", f"1 device: {w}")
    for b in base:
        if b.assignment is None or b.reason:
            left_out.append(f"{setting}: baseline {b.name} ({b.reason})")
            continue
        add(b.assignment, f"baseline {b.name}", f"baseline: {b.description}")
    for p in extra:
        add(p["plan"], "hand-made", p["label"])
    for k, r in enumerate(ranked[RUNNERS_UP:], start=RUNNERS_UP):
        if len(out) >= MIN_CANDIDATES:
            break
        add(r.assignment, f"runner-up {k + 2}", f"runner-up {k + 2}")
    if len(out) < MIN_CANDIDATES:
        left_out.append(f"{setting}: only {len(out)} distinct plans (fewer than {MIN_CANDIDATES})")
    return out, left_out


def _plans(settings: list[tuple[str, str]], workers: list[str], cluster: Any) -> list[dict[str, Any]]:
    """Every setting's candidates (see ``candidates``), in setting order; a setting's
    left-out plans are on its first candidate (``left_out``)."""
    plans: list[dict[str, Any]] = []
    for model, objective in settings:
        m = _model(model)
        g = graph_from_model(m, 1)
        extra = _resnet_plans(workers) if model == "resnet18" else []
        if model != "resnet18" and objective == "latency":
            n = len(m)
            extra.append({"label": f"2 stages: {workers[0]} | {workers[1]}", "plan": _cut(n, workers[:2], [0.5, 0.5])})
        cands, left_out = candidates(model, objective, g, cluster, workers, extra)
        cands[0]["left_out"] = left_out
        plans += cands
    return plans


def _resnet_plans(workers: list[str]) -> list[dict[str, Any]]:
    """Hand-made ResNet-18 plans of 2 and 3 workers that put residual blocks' main paths and
    shortcuts on different workers (and frameworks): their hops are join hops."""
    w1, w2, w3 = workers[0], workers[1], workers[2]
    names = [name for name, _ in _model("resnet18").layers]

    def place(rule: Any) -> list[str]:
        return [rule(name) or w1 for name in names]

    def main_path(name: str) -> bool:  # conv1..bn2 of a block
        return name.startswith("layer") and name.split(".")[2].startswith(("conv", "bn", "relu1"))

    def stage(name: str) -> int:
        return int(name[5]) if name.startswith("layer") else 0

    return [
        {
            "label": f"2 workers: projection shortcuts on {w2}",
            "plan": place(lambda n: w2 if ".downsample." in n else None),
        },
        {
            "label": f"2 workers: layer3-4 main paths on {w2}, shortcuts on {w1}",
            "plan": place(lambda n: w2 if stage(n) >= 3 and main_path(n) else None),
        },
        {
            "label": f"3 workers: first blocks of layer2-4, main path on {w2}, shortcut on {w3}",
            "plan": place(
                lambda n: (
                    (w2 if main_path(n) else w3 if ".downsample." in n else None)
                    if stage(n) >= 2 and n.split(".")[1] == "0"
                    else None
                )
            ),
        },
    ]


def _summary(p: dict[str, Any]) -> str:
    """A plan's stages: runs of a chain (``torch-1t x5 | paddle-1t x5``), or for a graph
    model its stage DAG's size and how many stages and layers each device holds."""
    m = _model(p["model"])
    g = graph_from_model(m, 1)
    if g.is_chain:
        return stages_summary(p["plan"], " | ")
    stages = split_stages(p["plan"], g.names, g.producers)
    per: dict[str, tuple[int, int]] = {}
    for s in stages:
        n, k = per.get(s.device, (0, 0))
        per[s.device] = (n + 1, k + s.layers)
    return f"{len(stages)} stages (a DAG): " + ", ".join(f"{d} {n} ({k} layers)" for d, (n, k) in per.items())


def _unshared(cluster: Cluster) -> Cluster:
    """The cluster without what a pipelined run shares: no hosts, transfer CPU or relay
    (the cost model before those terms: each device and link its own resource)."""
    devices = tuple(dataclasses.replace(d, host=None) for d in cluster.devices)
    engine = cluster.engine
    if engine is not None:
        engine = dataclasses.replace(engine, transfer_cpu={}, relay=None)
    return dataclasses.replace(cluster, devices=devices, hosts=(), engine=engine)


def _load() -> float:
    return os.getloadavg()[0]


def _our_seconds(session: Session) -> float:
    """CPU seconds used so far by this benchmark: every process it started (Ray's daemons and
    workers, a lab's hosts) when the harness accounts for them, else the driver and the
    session's workers."""
    from multigpu.benchmarks.harness import own_cpu_seconds
    from multigpu.lab.accounting import read_account

    here = os.environ.get(ACCOUNT_ENV)
    if here:  # inside a lab host: the harness's account lives in the process that brought the lab up
        seconds = read_account(here)
        if seconds is not None:
            return seconds
    seconds = own_cpu_seconds()
    if seconds is not None:
        return seconds
    ws = session.workers
    return time.process_time() + sum(
        ws._get(a.cpu_time.remote(), lambda: "a worker", what="reading its CPU time")[0] for a in ws.actors.values()
    )


def _with_cores_left(cluster: Cluster, others: float) -> Cluster:
    """The cluster with the driver's host given the cores other processes left on the
    machine (at most its own: a run pinned to fewer cores keeps its count)."""
    host = cluster.devices[cluster.source_index].host
    left = max((os.cpu_count() or 1) - others, 0.05)
    hosts = tuple(dataclasses.replace(h, cores=min(h.cores, left)) if h.name == host else h for h in cluster.hosts)
    return dataclasses.replace(cluster, hosts=hosts)


def run(opts: Options) -> Result:
    """Profile, plan, run, compare: ``cycles`` times, each profile next to its runs
    (with ``--lab`` the harness runs ``plans_lab`` instead: across the emulated lab's hosts)."""
    quick = opts.quick
    driver, workers = _devices(opts.frameworks(), int(os.environ.get("MULTIGPU_BENCH_THREADS", "0")) or None)
    say = (lambda s: print(s, file=sys.stderr, flush=True)) if opts.progress else (lambda s: None)
    spec = Cluster(
        devices=tuple(
            DeviceSpec(d["name"], 1.0, 0.0, backend=d["backend"], threads=d.get("threads")) for d in [driver, *workers]
        ),
        source=driver["name"],
    )
    names = [w["name"] for w in workers]
    chosen = QUICK_SETTINGS if quick else SETTINGS
    models = list(dict.fromkeys(model for model, _ in chosen))
    settings = Cycles(
        cycles=opts.repeats(3, 1),
        items={"lenet": opts.repeats(60, 25), "alexnet": opts.repeats(6, 3), "resnet18": 12},
        stream_items={"lenet": opts.repeats(200, 80), "alexnet": opts.repeats(24, 12), "resnet18": 40},
        profile={"repeats": opts.repeats(15, 6), "warmup": opts.repeats(3, 1), "link_repeats": opts.repeats(12, 5)},
    )
    with Session(spec) as session:
        measured = measure(session, models, lambda c: _plans(chosen, names, c), settings, say, opts.progress)
        compiled = (
            None
            if quick
            else _compiled_comparison(
                session, measured.plans, measured.params, np.random.default_rng(1), say, measured.profiles[-1]
            )
        )
    return _report(
        measured.profiles,
        measured.plans,
        measured.runs,
        compiled,
        quick,
        measured.loads,
        measured.others,
        measured.run_profiles,
    )


@dataclasses.dataclass
class Cycles:
    """How much ``measure`` runs: cycles of a profile and every plan, items per plan (by
    model), the profile's settings, and the batch (inputs per item) of the profile and the runs."""

    cycles: int
    items: dict[str, int]
    stream_items: dict[str, int]
    profile: dict[str, Any]
    batch: int = 1
    #: Items a streamed run passes before its timed ones (a run's first items after its
    #: parameters arrive can be slowed by the hosts still settling: see ``plans_lab``).
    stream_warmup: int = 2


@dataclasses.dataclass
class Measured:
    """What ``measure`` returns (picklable, so a lab host can send it back)."""

    profiles: list[Any]
    plans: list[dict[str, Any]]
    runs: dict[int, list[Any]]
    loads: list[tuple[float, float]]
    others: dict[int, list[float]]
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Each plan's runs' profiles, in order: what every run was priced on (the diagnostics
    #: price the plan on the same one, also when ``merged`` holds several models' profiles).
    run_profiles: dict[int, list[Any]] = dataclasses.field(default_factory=dict)


def measure(
    session: Session, models: list[str], make_plans: Any, settings: Cycles, say: Any, progress: bool
) -> Measured:
    """``settings.cycles`` times: profile the session's devices, then run every plan
    ``make_plans(profiled_cluster)`` gives (made once, from the first profile), priced on
    that cycle's profile; record each run's other load (cores other processes used)."""
    rng = np.random.default_rng(0)
    out = Measured([], [], {}, [], {})
    for c in range(settings.cycles):
        load_before = _load()
        say(f"plans: cycle {c + 1}/{settings.cycles}: profiling {', '.join(models)}")
        t0 = time.perf_counter()
        prof = profile(
            [_model(m) for m in models], session=session, progress=progress, batch=settings.batch, **settings.profile
        )
        prof.seconds = time.perf_counter() - t0
        out.profiles.append(prof)
        if not out.plans:
            out.plans = make_plans(prof.cluster)
            out.runs = {i: [] for i in range(len(out.plans))}
            out.run_profiles = {i: [] for i in range(len(out.plans))}
            out.params = {m: _model(m).init_params(0) for m in set(p["model"] for p in out.plans)}
        # A shuffled order each cycle: a plan run first after the profile (or last) is not always the same one.
        for i in np.random.default_rng(c).permutation(len(out.plans)):
            i = int(i)
            p = out.plans[i]
            m = _model(p["model"])
            n_items = (settings.stream_items if p.get("stream") else settings.items)[p["model"]]
            x = rng.random((n_items * settings.batch, *m.input_shape), dtype=np.float32)
            say(f"plans: cycle {c + 1}/{settings.cycles}: {p['model']} {p['label']}")
            busy0, ours0, wall0 = busy_seconds(), _our_seconds(session), time.perf_counter()
            out.runs[i].append(
                session.run(
                    m,
                    out.params[p["model"]],
                    p["plan"],
                    x,
                    stream=bool(p.get("stream")),
                    warmup=settings.stream_warmup if p.get("stream") else 2,
                    cluster=prof.cluster,
                    batch=settings.batch,
                )
            )
            out.run_profiles[i].append(prof)
            busy1, ours1, wall1 = busy_seconds(), _our_seconds(session), time.perf_counter()
            if busy0 is not None and busy1 is not None:
                out.others.setdefault(i, []).append(max(0.0, (busy1 - busy0) - (ours1 - ours0)) / (wall1 - wall0))
        out.loads.append((load_before, _load()))
    return out


def merged(parts: Sequence[Measured]) -> Measured:
    """One ``Measured`` of several ``measure`` calls (say, each model at its own batch): their
    profiles, plans and loads in order, each plan's runs and other load under its new index."""
    out = Measured([], [], {}, [], {})
    for part in parts:
        base = len(out.plans)
        out.profiles += part.profiles
        out.plans += part.plans
        out.loads += part.loads
        out.runs.update({base + i: rs for i, rs in part.runs.items()})
        out.others.update({base + i: o for i, o in part.others.items()})
        out.run_profiles.update({base + i: ps for i, ps in part.run_profiles.items()})
        out.params.update(part.params)
    return out


def _compiled_comparison(
    session: Session, plans: list[dict[str, Any]], params: dict[str, Any], rng: np.random.Generator, say: Any, prof: Any
) -> dict[str, Any]:
    """The LeNet 2-stage plan on actor calls and on a Compiled Graph, one after the other."""
    p = next(q for q in plans if q["model"] == "lenet" and "hand-made" in q.get("roles", ()) and not q["stream"])
    m = multigpu.models.lenet()
    x = rng.random((60, *m.input_shape), dtype=np.float32)
    out: dict[str, Any] = {"plan": stages_summary(p["plan"], " | ")}
    for engine in ("tasks", "compiled"):
        say(f"plans: LeNet 2 stages on the {engine} engine")
        lat = session.run(m, params["lenet"], p["plan"], x, engine=engine, warmup=2, cluster=prof.cluster)
        st = session.run(m, params["lenet"], p["plan"], x, engine=engine, stream=True, warmup=2, cluster=prof.cluster)
        out[engine] = {
            "end_to_end": lat.latency,
            "hops": [lat.hop_time(h) for h in range(len(lat.hop_routes))],
            "stages": [lat.stage_time(i) for i in range(len(lat.stages))],
            "items_per_second": st.items_per_second,
            "stream_stages": [st.stage_time(i) for i in range(len(st.stages))],
        }
    return out


def fidelity(cands: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How well the model serves a user choosing among one setting's candidates.

    Each candidate holds ``roles`` (one of them "planner"), ``cycle_predicted`` and
    ``cycle_measured`` (seconds per item, one per cycle, each cycle's prediction on its own
    profile) and ``parts`` (``kind`` and ``error``, the median over cycles). Returns the
    planner's **regret** (its measured time over the best candidate's, on the medians over
    cycles, and cycle by cycle), **Kendall tau** between predicted and measured (tau-b, ties
    counted; on the medians and by cycle), the median |error| of each kind of part and end
    to end, and each candidate's **spread**: (largest - least) / median of its measured times.
    """
    from scipy.stats import kendalltau

    if not any("planner" in c["roles"] for c in cands):
        raise InputError(
            f"no candidate is the planner's choice among {[c['label'] for c in cands]}; give one the role 'planner'"
        )
    cycles = min(len(c["cycle_measured"]) for c in cands)
    pred = np.array([c["cycle_predicted"][:cycles] for c in cands], dtype=float)
    meas = np.array([c["cycle_measured"][:cycles] for c in cands], dtype=float)
    pred_med, meas_med = np.median(pred, axis=1), np.median(meas, axis=1)
    chosen = next(i for i, c in enumerate(cands) if "planner" in c["roles"])
    best = int(np.argmin(meas_med))

    def tau(x: np.ndarray, y: np.ndarray) -> float:
        t = kendalltau(x, y).statistic
        return float(t) if np.isfinite(t) else math.nan  # nan: one of them ranks every candidate equal

    errors: dict[str, list[float]] = {}
    for c in cands:
        for part in c["parts"]:
            kind = "end to end" if part["kind"] in ("end_to_end", "stream") else part["kind"]
            errors.setdefault(kind, []).append(abs(part["error"]))
    # One cycle has no spread to show (nan, printed '-'), not a spread of 0.
    spread = (meas.max(axis=1) - meas.min(axis=1)) / meas_med if cycles > 1 else np.full(len(cands), math.nan)
    return {
        "candidates": len(cands),
        "planner": cands[chosen]["label"],
        "best": cands[best]["label"],
        "regret": float(meas_med[chosen] / meas_med[best]),
        "regret_by_cycle": [float(meas[chosen, k] / meas[:, k].min()) for k in range(cycles)],
        "tau": tau(pred_med, meas_med),
        "tau_by_cycle": [tau(pred[:, k], meas[:, k]) for k in range(cycles)],
        "part_errors": {k: float(statistics.median(v)) for k, v in errors.items()},
        "part_counts": {k: len(v) for k, v in errors.items()},
        "spread": [float(s) for s in spread],
        "predicted_rank": [int(r) for r in np.argsort(np.argsort(pred_med, kind="stable"), kind="stable") + 1],
        "measured_rank": [int(r) for r in np.argsort(np.argsort(meas_med, kind="stable"), kind="stable") + 1],
    }


def _choosing(data_plans: list[dict[str, Any]], left_out: list[str]) -> tuple[list[Table], list[str], dict[str, Any]]:
    """The tables, notes and data of ``fidelity`` for every setting among ``data_plans``
    (none when no plan has a setting: ``plans_lab``'s hand-made plans)."""
    settings: dict[str, list[dict[str, Any]]] = {}
    for d in data_plans:
        if d.get("setting"):
            settings.setdefault(d["setting"], []).append(d)
    if not settings:
        return [], [], {}
    figures = {name: fidelity(cands) for name, cands in settings.items()}
    kinds = ["end to end", "stage", "hop", "join hop"]

    def part(f: dict[str, Any], kind: str) -> str:
        e = f["part_errors"].get(kind)
        return "-" if e is None else f"{100 * e:.1f}% ({f['part_counts'][kind]})"

    summary = Table(
        "Choosing a plan: in each setting every candidate (the planner's choice, its runners-up, each single "
        "worker, the baselines, hand-made plans) is priced and run every cycle. Regret: the planner's choice's "
        "measured time over the best candidate's (medians over cycles, then by cycle); Kendall tau between "
        "predicted and measured times over the candidates; median |error| per part (count); the spread of a "
        "candidate's measured time over the cycles ((largest - least) / median: median and largest over the "
        "candidates)",
        [
            "setting",
            "candidates",
            "planner's choice",
            "best measured",
            "regret",
            "regret by cycle",
            "Kendall tau",
            "tau by cycle",
            *(f"|error| {k}" for k in kinds),
            "spread",
        ],
        [
            [
                name,
                str(f["candidates"]),
                f["planner"],
                f["best"],
                f"{f['regret']:.3f}",
                " ".join(f"{r:.3f}" for r in f["regret_by_cycle"]),
                f"{f['tau']:.2f}",
                " ".join(f"{t:.2f}" for t in f["tau_by_cycle"]),
                *(part(f, k) for k in kinds),
                f"{_share(statistics.median(f['spread']))} / {_share(max(f['spread']))}",
            ]
            for name, f in figures.items()
        ],
        note=f"Targets: regret <= {TARGET_REGRET:.2f}, tau >= {TARGET_TAU}. "
        + (" ".join(left_out) if left_out else "No candidate was left out."),
    )
    rows = []
    for name, cands in settings.items():
        f = figures[name]
        for c, rp, rm, sp in zip(cands, f["predicted_rank"], f["measured_rank"], f["spread"]):
            rows.append(
                [
                    name,
                    c["label"],
                    ", ".join(c["roles"]),
                    _summary(c),
                    str(rp),
                    str(rm),
                    _ms(statistics.median(c["cycle_predicted"])),
                    _ms(statistics.median(c["cycle_measured"])),
                    " ".join(_ms(x) for x in c["cycle_measured"]),
                    _share(sp),
                ]
            )
    ranks = Table(
        "The candidates: predicted and measured rank (1: fastest), time per item (ms; streamed: 1 / rate); "
        "runner-up k is the planner's k-th best plan on the first cycle's profile",
        [
            "setting",
            "candidate",
            "roles",
            "stages",
            "predicted rank",
            "measured rank",
            "predicted",
            "measured",
            "measured by cycle",
            "spread",
        ],
        rows,
    )
    regrets = [f["regret"] for f in figures.values()]
    taus = [f["tau"] for f in figures.values()]
    notes = [
        "Choosing a plan: regret "
        + ", ".join(f"{n} {f['regret']:.3f}" for n, f in figures.items())
        + f" (target <= {TARGET_REGRET:.2f}): {'met' if all(r <= TARGET_REGRET for r in regrets) else 'missed'}; "
        "Kendall tau "
        + ", ".join(f"{n} {f['tau']:.2f}" for n, f in figures.items())
        + f" (target >= {TARGET_TAU}): {'met' if all(t >= TARGET_TAU for t in taus) else 'missed'}; "
        + (
            "a candidate's measured time moved by a median "
            + ", ".join(_share(statistics.median(f["spread"])) for f in figures.values())
            + " over the cycles (per setting)."
            if any(math.isfinite(x) for f in figures.values() for x in f["spread"])
            else "one cycle: no spread measured."
        )
    ]
    return [summary, ranks], notes, figures


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%" if math.isfinite(x) else "-"


def _share(x: float) -> str:
    return f"{100 * x:.1f}%" if math.isfinite(x) else "-"


def _ms(x: float) -> str:
    return f"{1e3 * x:.3f}" if math.isfinite(x) else "-"


def _plot_settings(data_plans: list[dict[str, Any]]) -> Any:
    """One panel per setting: each candidate's predicted against measured time per item (log
    scales), the bar its measured range over the cycles, the planner's choice a star, and the
    setting's regret and Kendall tau in the title."""

    def plot(fig: Any) -> None:
        settings: dict[str, list[dict[str, Any]]] = {}
        for d in data_plans:
            if d.get("setting"):
                settings.setdefault(d["setting"], []).append(d)
        cols = min(3, len(settings))
        rows = math.ceil(len(settings) / cols)
        for k, (name, cands) in enumerate(settings.items()):
            ax = fig.add_subplot(rows, cols, k + 1)
            f = fidelity(cands)
            vals = []
            for c in cands:
                x = 1e3 * statistics.median(c["cycle_predicted"])
                ys = [1e3 * y for y in c["cycle_measured"]]
                y = statistics.median(ys)
                vals += [x, *ys]
                star = "planner" in c["roles"]
                ax.plot([x, x], [min(ys), max(ys)], color="0.5", lw=1, zorder=2)
                ax.scatter(
                    x, y, marker="*" if star else "o", s=120 if star else 30, color="tab:red" if star else "tab:blue"
                )
            lo, hi = min(vals) / 1.3, max(vals) * 1.3
            ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
            ax.set_title(f"{name}: regret {f['regret']:.3f}, tau {f['tau']:.2f}", fontsize=9)
            ax.tick_params(which="both", labelsize=7)
            if k % cols == 0:
                ax.set_ylabel("measured, ms per item", fontsize=8)
            if k >= (rows - 1) * cols:
                ax.set_xlabel("predicted, ms per item", fontsize=8)
        fig.suptitle(
            "Every candidate of each setting (star: the planner's choice; bar: measured range over the cycles; "
            "line: measured = predicted)",
            fontsize=9,
        )
        fig.tight_layout(rect=(0, 0, 1, 0.95))

    return plot


def plot_plans(data_plans: list[dict[str, Any]], mape: float) -> Any:
    """The predicted-against-measured plot of ``data_plans`` (the JSON's ``plans``):
    dots end to end, squares streamed per item; a streamed plan's hollow square is its
    prediction without hosts and transfer CPU."""

    def plot(fig: Any) -> None:
        ax = fig.add_axes([0.07, 0.1, 0.55, 0.8])
        colors = {"lenet": "tab:blue", "alexnet": "tab:red", "resnet18": "tab:green"}
        keys = []
        vals = []
        for k, d in enumerate(data_plans, start=1):
            if d["stream"]:
                x, y, marker = 1e3 / d["predicted"], 1e3 / d["measured"], "s"
                what = "ms per item, streamed"
            else:
                x, y, marker = 1e3 * d["predicted"], 1e3 * d["measured"], "o"
                what = "end to end"
            vals += [x, y]
            ax.scatter(x, y, marker=marker, color=colors.get(d["model"], "k"), s=45, zorder=3)
            if d["stream"] and d.get("predicted_unshared"):
                # Where the model without hosts and transfer CPU put it (1 / bottleneck, median).
                x0 = 1e3 / statistics.median(d["predicted_unshared"])
                ax.scatter(x0, y, marker="s", facecolors="none", edgecolors=colors.get(d["model"], "k"), s=45, zorder=3)
                ax.plot([x0, x], [y, y], color=colors.get(d["model"], "k"), lw=0.8, ls=":", zorder=2)
                vals.append(x0)
            ax.annotate(str(k), (x, y), fontsize=8, xytext=(5, -3), textcoords="offset points")
            keys.append(f"{k:>2}  {d['model']}: {d['label']} ({what}): {100 * d['error']:+.1f}%")
        lo, hi = min(vals) / 1.5, max(vals) * 1.5
        xs = np.geomspace(lo, hi, 50)
        ax.plot(xs, xs, "k-", lw=1, label="measured = predicted")
        ax.fill_between(xs, xs / 1.1, xs * 1.1, color="0.85", label="within 10%")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("predicted by the cost model on the profile (ms)")
        ax.set_ylabel("measured (ms, median)")
        ax.set_title(
            f"Plans on Ray workers (dots: end to end; squares: streamed, per item;\n"
            f"hollow: streamed, predicted without hosts and transfer CPU); "
            f"median |error| end to end {100 * mape:.1f}%",
            fontsize=10,
        )
        ax.legend(loc="upper left", fontsize=8)
        fig.text(0.64, 0.9, "\n".join(keys), fontsize=7.5, va="top", family="monospace")

    return plot


def _report(
    profiles: list[Any],
    plans: list[dict[str, Any]],
    runs: dict[int, list[Any]],
    compiled: dict[str, Any] | None,
    quick: bool,
    loads: list[tuple[float, float]],
    others: dict[int, list[float]],
    run_profiles: dict[int, list[Any]],
) -> Result:
    """Each plan's error is the median over cycles of (predicted - measured) / measured,
    each cycle's prediction from the profile taken just before its runs (``run_profiles``:
    each plan's, run by run)."""
    prof, cluster = profiles[-1], profiles[-1].cluster
    profile_seconds = statistics.median(p.seconds for p in profiles)
    rows, data_plans, stream_rows = [], [], []
    latency_errors: list[float] = []
    stream_errors: list[float] = []
    part_errors: dict[str, list[float]] = {"stage": [], "hop": [], "join hop": []}
    graph_errors: dict[str, list[float]] = {"end_to_end": [], "stream": []}  # ResNet-18: branches on workers
    for i, p in enumerate(plans):
        rs = runs[i]
        old = []
        if p.get("stream"):
            preds = [r.prediction.throughput for r in rs]
            meas = [r.items_per_second for r in rs]
            g = graph_from_model(_model(p["model"]), rs[0].batch)
            old = [1.0 / evaluate(g, _unshared(q.cluster), p["plan"]).bottleneck for q in run_profiles[i]]
            left = [
                1.0 / evaluate(g, _with_cores_left(q.cluster, o), p["plan"]).bottleneck
                for q, o in zip(run_profiles[i], others.get(i, []))
            ]
        else:
            preds = [r.prediction.end_to_end for r in rs]
            meas = [r.latency for r in rs]
        errs = [(a - b) / b for a, b in zip(preds, meas)]
        err = statistics.median(errs)
        predicted, measured = statistics.median(preds), statistics.median(meas)
        if p.get("stream"):
            stream_errors.append(err)
            if p["model"] == "resnet18":
                graph_errors["stream"].append(err)
            old_errs = [(a - b) / b for a, b in zip(old, meas)]
            rows.append(
                [
                    p["model"],
                    p["label"],
                    _summary(p),
                    "items/s",
                    f"{predicted:.1f}",
                    f"{measured:.1f}",
                    _pct(err),
                    " ".join(_pct(e) for e in errs),
                    f"{statistics.median(old):.1f} ({_pct(statistics.median(old_errs))})",
                    rs[-1].prediction.bottleneck_at,
                ]
            )
            stream_rows.append(
                [
                    p["model"],
                    p["label"],
                    " ".join(f"{o:.2f}" for o in others.get(i, [])),
                    " ".join(_pct(e) for e in errs),
                    " ".join(_pct((a - b) / b) for a, b in zip(left, meas)) if left else "-",
                ]
            )
        else:
            latency_errors.append(err)
            if p["model"] == "resnet18":
                graph_errors["end_to_end"].append(err)
            rows.append(
                [
                    p["model"],
                    p["label"],
                    _summary(p),
                    "end to end, ms",
                    _ms(predicted),
                    _ms(measured),
                    _pct(err),
                    " ".join(_pct(e) for e in errs),
                    "",
                    "",
                ]
            )
        parts = []
        for row_i, first in enumerate(rs[0].compare_rows()):
            cells = [r.compare_rows()[row_i] for r in rs]
            e = statistics.median(c["error"] for c in cells)
            if first["kind"] in part_errors:
                part_errors[first["kind"]].append(e)
            parts.append(
                {
                    "what": first["what"],
                    "kind": first["kind"],
                    "predicted": statistics.median(c["predicted"] for c in cells),
                    "measured": statistics.median(c["measured"] for c in cells),
                    "error": e,
                }
            )
        data_plans.append(
            {
                "model": p["model"],
                "label": p["label"],
                "setting": p.get("setting"),
                "roles": p.get("roles", []),
                # Seconds per item, cycle by cycle: what the candidates are ranked by.
                "cycle_predicted": [1.0 / x for x in preds] if p.get("stream") else preds,
                "cycle_measured": [1.0 / x for x in meas] if p.get("stream") else meas,
                "plan": p["plan"],
                "batch": rs[0].batch,
                "stream": bool(p.get("stream")),
                "predicted": predicted,
                "measured": measured,
                "error": err,
                "cycle_errors": errs,
                "predicted_unshared": old,
                "others_cores": others.get(i, []),
                "rounds": [r.to_dict() for r in rs],
                "parts": parts,
            }
        )
    mape = statistics.median(abs(e) for e in latency_errors)
    table = Table(
        f"Predicted against measured, per plan: {len(profiles)} profile(s), one per cycle (and per "
        f"batch), then every plan priced on its own and run; medians over cycles (error: the median of "
        f"the cycles' errors)",
        [
            "model",
            "plan",
            "stages",
            "figure",
            "predicted",
            "measured",
            "error",
            "error by cycle",
            "without hosts and transfer CPU",
            "bottleneck at",
        ],
        rows,
        note=f"Median |error| of end-to-end time over {len(latency_errors)} plans: {100 * mape:.1f}% "
        f"(target <= {100 * TARGET_LATENCY:.0f}%). Streaming: "
        + ", ".join(f"{100 * abs(e):.1f}%" for e in stream_errors)
        + f" (target <= {100 * TARGET_STREAM:.0f}%). Load average (1 min) before and after each "
        f"cycle: " + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in loads) + ".",
    )
    part_rows = [
        [
            kind,
            str(len(errs)),
            f"{100 * statistics.median(abs(e) for e in errs):.1f}%",
            f"{100 * max(abs(e) for e in errs):.1f}%",
        ]
        for kind, errs in part_errors.items()
        if errs
    ]
    parts_table = Table(
        "Per part: |error| of each stage's compute and each hop, over all plans",
        ["part", "count", "median |error|", "largest |error|"],
        part_rows,
    )
    detail_rows = []
    for d in data_plans:
        for part in d["parts"]:
            detail_rows.append(
                [
                    d["model"],
                    d["label"],
                    part["what"],
                    _ms(part["predicted"]),
                    _ms(part["measured"]),
                    _pct(part["error"]),
                ]
            )
    detail = Table(
        "Every part of every plan (ms)", ["model", "plan", "part", "predicted", "measured", "error"], detail_rows
    )
    hop_rows = [
        [f"{h.between[0]} -> {h.between[1]}", str(h.nbytes), _ms(h.hop), _ms(h.bare), f"{h.ratio:.2f}x"]
        for h in prof.hop_vs_bare
    ]
    worst = max((h.ratio for h in prof.hop_vs_bare), default=math.nan)
    hops = Table(
        "A hop between two workers against a bare actor call with the same payload (timed alternately)",
        ["hop", "bytes", "hop, ms", "bare call, ms", "ratio"],
        hop_rows,
        note=f"Largest ratio {worst:.2f}x (target <= 1.5x).",
    )
    dev_rows = []
    for d in cluster.devices:
        for g in prof.graphs:
            t = d.measured(g)
            if t:
                dev_rows.append(
                    [
                        d.name,
                        d.backend or "-",
                        str(d.threads or "-"),
                        g,
                        _ms(sum(t.values())),
                        f"{1e6 * d.stage_overhead:.1f}",
                        f"{d.flops / 1e9:.2f}",
                    ]
                )
    devices = Table(
        "The profile: per device, sum of its layer times, stage overhead and effective GFLOP/s",
        ["device", "backend", "threads", "graph", "sum of layers, ms", "stage overhead, us", "GFLOP/s"],
        dev_rows,
        note=f"Profiled in {profile_seconds:.0f} s.",
    )
    link_rows = [
        [
            f"{f.between[0]} <-> {f.between[1]}",
            f"{1e6 * f.latency:.1f}",
            f"{f.bandwidth / 1e6:.0f}",
            f"{100 * f.worst_error:.1f}%",
        ]
        for f in prof.links
    ]
    links = Table(
        "The profile: links fitted to hops through the engine",
        ["link", "latency, us", "bandwidth, MB/s", "worst fit error"],
        link_rows,
    )

    def cpu_cells(f: Any) -> list[str]:
        inline = "-" if f.inline_fixed is None else f"{1e6 * f.inline_fixed:.1f}"
        return [
            f"{1e6 * f.fixed:.1f}",
            inline,
            f"{1e9 * f.per_byte:.3f}",
            f"{1e6 * f.serial_cost(0.0):.1f}",
            f"{1e9 * (f.serial_cost(1.0) - f.serial_cost(0.0)):.3f}",
        ]

    engine = cluster.engine if cluster.engine is not None else EngineProfile()
    cpu_rows = [
        [d.name, d.host or "-", *cpu_cells(engine.transfer_cpu[d.name])]
        for d in cluster.devices
        if d.name in engine.transfer_cpu
    ]
    if engine.relay is not None:
        cpu_rows.append([f"{engine.relay.device} (relay: each hop between two workers)", "-", *cpu_cells(engine.relay)])
    cpu_table = Table(
        "The profile: CPU per transfer (each one a device sends or receives), measured as process CPU "
        "time through the engine; serial: the part on the thread that runs the calls",
        ["device", "host", "fixed, us", "inline fixed, us", "per byte, ns", "serial fixed, us", "serial per byte, ns"],
        cpu_rows,
        note="Hosts: "
        + ", ".join(f"{h.name} ({h.cores:g} cores)" for h in cluster.hosts)
        + (
            f". Inline fixed: a transfer of at most {engine.inline_bytes} bytes (inside Ray's message; '-': fixed)."
            if engine.inline_bytes
            else "."
        ),
    )
    outside = Table(
        "Streamed runs and the machine's other load: cores other processes used during each cycle's run "
        "(/proc/stat busy time less this benchmark's processes), the error, and the error had the host "
        "been given only the cores they left on the machine, at most its own (a diagnostic, not the "
        "model: the profile's host keeps its cores)",
        ["model", "plan", "others' cores by cycle", "error by cycle", "error with the cores left"],
        stream_rows,
    )
    choice_tables, choice_notes, choice_data = _choosing(data_plans, [x for p in plans for x in p.get("left_out", [])])
    tables = [*choice_tables, table, outside, parts_table, devices, links, cpu_table, hops]
    graph_mape = (
        statistics.median(abs(e) for e in graph_errors["end_to_end"]) if graph_errors["end_to_end"] else math.nan
    )
    notes = (
        []
        if not graph_errors["end_to_end"]
        else [
            f"ResNet-18 (a DAG; hand-made candidates put branches on different workers): median |error| of end-to-end "
            f"time against the makespan "
            f"{100 * graph_mape:.1f}% over {len(graph_errors['end_to_end'])} plans (target 10%): "
            f"{'met' if graph_mape <= TARGET_LATENCY else 'missed'}."
        ]
    )
    e2e_met = "met" if mape <= TARGET_LATENCY else "missed"
    stream_met = "met" if all(abs(e) <= TARGET_STREAM for e in stream_errors) else "missed"
    notes = [
        *choice_notes,
        *notes,
        f"Median |error| end to end: {100 * mape:.1f}% (target 10%): {e2e_met}.",
        "Streaming |error|: "
        + ", ".join(f"{100 * abs(e):.1f}%" for e in stream_errors)
        + f" (target 15%): {stream_met}.",
    ]
    if compiled is not None:
        t, c = compiled["tasks"], compiled["compiled"]
        tables.append(
            Table(
                f"Actor calls against a Ray Compiled Graph, LeNet {compiled['plan']}",
                ["engine", "end to end, ms", "hops, ms", "stages, ms", "streamed items/s"],
                [
                    [
                        e,
                        _ms(v["end_to_end"]),
                        " / ".join(_ms(h) for h in v["hops"]),
                        " / ".join(_ms(s) for s in v["stages"]),
                        f"{v['items_per_second']:.0f}",
                    ]
                    for e, v in (("tasks (actor calls)", t), ("compiled graph", c))
                ],
            )
        )
        notes.append(
            f"Compiled Graph: end to end {t['end_to_end'] / c['end_to_end']:.2f}x faster, streaming "
            f"{c['items_per_second'] / t['items_per_second']:.2f}x the items/s of actor calls, on this "
            f"plan; its waiting actors poll their channels (CPU busy while idle)."
        )
    tables.append(detail)

    # A setting's candidates side by side; the lab's hand-made plans (no settings) on one plot.
    plot = _plot_settings(data_plans) if choice_data else plot_plans(data_plans, mape)

    return Result(
        name="plans",
        title=TITLE,
        tables=tables,
        notes=notes,
        plot=plot,
        settings={
            "quick": quick,
            "cycles": len(profiles),
            "engine": "tasks",
            "devices": [d.name for d in cluster.devices],
        },
        data={
            "median_abs_error": mape,
            "stream_errors": stream_errors,
            "resnet18": {"median_abs_error": graph_mape, "stream_errors": graph_errors["stream"]},
            "choosing": choice_data,
            "plans": data_plans,
            "loads": loads,
            "profiles": [q.to_dict() for q in profiles],
            "compiled": compiled,
        },
    )
