"""``planner``: AutoPartition's solve times against n (layers) and k (devices), and each
baseline's gap to the optimum.

* DP: latency without coupling constraints, random chains, n up to 10,000 and k up
  to 64 (target: n = 10,000, k = 64 in <= 1 s).
* MILP: memory-constrained random chains where each device holds 40% of the
  parameters (the unconstrained optimum does not fit), n up to 200 and k up to 16
  (target: n = 200, k = 16 in <= 10 s); in a full run also three seeds at
  n = 200, k = 16, a 200-layer transformer on a 16-device GPU/CPU cluster, and a
  generalised-assignment-like stress case (15% memory) under a time limit.
* Gaps: AlexNet (batch 1) on every shipped cluster, for time (wt=1, we=0), energy
  (wt=0, we=1) and the throughput objective (gap in bottleneck).
* Graphs (#16): ResNet-18, ResNet-50 and GoogLeNet (Inception v1) at batch 1 on the
  shipped ``lab`` cluster (5 devices) and the 16-device GPU/CPU cluster: the fork-join
  DP (latency, no coupling constraint; target <= 1 s) and AutoPartition with memory
  limits that bind (each device holds 40% of the parameters; target <= 10 s, proven
  optimal), under a time limit for the whole solve.
* Stress: the chain of n = 200 layers on k = 16 devices that each hold 15% of the
  parameters, through AutoPartition under a time limit (target <= 60 s).
* Published instances (with ``--instances DIR``, a clone of msr-fiddle/dnn-partitioning):
  BERT-24, BERT-L3 and GNMT of Tarnawski et al. (NeurIPS 2020) through
  AutoPartition (throughput, proven), beside their IP rebuilt on the same HiGHS and their
  contiguous DP (``planner_published``); the size and LP bound of the compact and the
  pairwise form of our throughput MILP. Targets: our time to proof / their IP's <= 1.0 on
  BERT-24 and BERT-L3; our plan never worse than their DP's.

Pure numpy/scipy: it runs in the harness's own process. Grid cells are timed
alternately; reported are the wall time of ``autopartition`` (median, quartiles)
and the solver's own time (``plan.solve_time``).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from multigpu.benchmarks.harness import Options, Result, Table, interleaved, progress_bar, summary
from multigpu.benchmarks.planner_published import INSTANCES, REPO_URL, bench_published

TITLE = "Planner: DP and MILP solve times against n and k; baselines' gap to the optimum"
IN_QUICK = True

DP_TARGET_S, MILP_TARGET_S, STRESS_TARGET_S = 1.0, 10.0, 60.0
STRESS_LIMIT_S = 120.0
GRAPH_LIMIT_S = 60.0  # each MILP solve of the graph cases
# Short time limits each graph case is also solved under, for every objective: the limit is met
# when the solve returns a plan within LIMIT_SLACK of it or 1 s, whichever is larger.
SHORT_LIMITS_S = (1.0, 3.0, 10.0)
LIMIT_SLACK = 0.1
OBJECTIVES = ("latency", "throughput", "makespan")
GRAPHS = ("resnet18", "resnet50", "inception")
# The parts of the benchmark, for ``--cases`` (with the graph names and the graph cases' clusters).
PARTS = ("dp", "milp", "gaps", "graphs", "stress", "published")
GRAPH_CLUSTERS = ("lab", "gpu16")
PUBLISHED_LIMIT_S = 300.0  # each solve of a published instance (ours, their IP, their DP)
PAIRWISE_LIMIT_S = (60.0, 30.0)  # the pairwise form's solve on each (full, --quick)
RATIO_TARGET = 1.0


def random_graph(n: int, rng: np.random.Generator) -> Any:
    """A chain with log-uniform FLOPs and activations, and parameters on about half the layers."""
    from multigpu.partition import Graph, LayerSpec

    layers = tuple(
        LayerSpec(
            name=f"l{i}",
            flops=float(10 ** rng.uniform(6, 10)),
            param_bytes=float(rng.uniform(0, 2e6) * (rng.random() < 0.5)),
            output_bytes=float(10 ** rng.uniform(3, 7)),
        )
        for i in range(n)
    )
    return Graph(layers, input_bytes=float(10 ** rng.uniform(4, 7)), name=f"random-{n}")


def random_cluster(k: int, rng: np.random.Generator, memory: Any = None) -> Any:
    """k devices (10 GFLOP/s .. 10 TFLOP/s), a 100 MB/s default link, faster links on a random tenth of pairs."""
    from multigpu.partition import Cluster, DeviceSpec, Link, LinkSpec

    devices = tuple(
        DeviceSpec(f"d{i}", float(10 ** rng.uniform(10, 13)), float(rng.uniform(5, 300)), memory) for i in range(k)
    )
    links = []
    for u in range(k):
        for v in range(u + 1, k):
            if rng.random() < 0.1:
                links.append(
                    Link(
                        (f"d{u}", f"d{v}"),
                        float(10 ** rng.uniform(8, 10.5)),
                        float(rng.uniform(0, 1e-4)),
                        float(rng.uniform(0, 10)),
                    )
                )
    return Cluster(devices, source="d0", links=tuple(links), default_link=LinkSpec(1e8, 1e-4, 2.0), name=f"random-{k}")


def memory_bound(n: int, k: int, seed: int, share: float = 0.4) -> tuple[Any, Any]:
    """A random chain and cluster where each device holds ``share`` of the parameters."""
    rng = np.random.default_rng(seed)
    graph = random_graph(n, rng)
    mem = share * float(graph.param_bytes.sum()) + float(graph.activation_bytes.max())
    return graph, random_cluster(k, rng, memory=mem)


def transformer_chain(d_model: int = 5120, tokens: int = 512, blocks: int = 50) -> Any:
    """A decoder-only transformer as a chain of 4 matmul layers per block (fp32): 50 blocks =
    200 layers and 63 GB of parameters at d_model = 5120, more than any single device below holds."""
    from multigpu.partition import Graph, LayerSpec

    layers = []
    for b in range(blocks):
        for name, params, width in (
            ("qkv", 3 * d_model * d_model, 3 * d_model),
            ("proj", d_model * d_model, d_model),
            ("up", 4 * d_model * d_model, 4 * d_model),
            ("down", 4 * d_model * d_model, d_model),
        ):
            layers.append(LayerSpec(f"b{b}.{name}", 2.0 * params * tokens, 4.0 * params, 4.0 * tokens * width))
    return Graph(tuple(layers), input_bytes=4.0 * tokens * d_model, name=f"transformer-{d_model}")


def gpu_cluster() -> Any:
    """16 devices: a host (source and sink), an A6000-class GPU (48 GB), four V100-class and
    four T4-class GPUs (16 GB) on PCIe to the host, six CPU nodes on 10 GbE."""
    from multigpu.partition import Cluster, DeviceSpec, Link, LinkSpec

    devices = [DeviceSpec("host", 1.4e12, 135.0, 256e9), DeviceSpec("a6000", 38.7e12, 300.0, 48e9)]
    devices += [DeviceSpec(f"v100-{i}", 15.7e12, 300.0, 16e9) for i in range(4)]
    devices += [DeviceSpec(f"t4-{i}", 8.1e12, 70.0, 16e9) for i in range(4)]
    devices += [DeviceSpec(f"cpu-{i}", 1.0e12, 150.0, 64e9) for i in range(6)]
    links = tuple(Link(("host", d.name), 1.25e9 if d.name.startswith("cpu") else 15.75e9, 1e-5) for d in devices[1:])
    return Cluster(
        tuple(devices), source="host", links=links, default_link=LinkSpec(1.25e9, 5e-5, 0.0), name="gpu-cluster-16"
    )


def _timed_grid(problems: dict[str, tuple[Any, Any, dict[str, Any]]], repeat: int, tick: Any) -> dict[str, Any]:
    """Solve each problem ``repeat`` times, alternating; return wall and solver times and the plan."""
    from multigpu.partition import autopartition

    plans: dict[str, list[Any]] = {k: [] for k in problems}

    def solver(key: str) -> Any:
        graph, cluster, kw = problems[key]
        return lambda: plans[key].append(autopartition(graph, cluster, **kw))

    walls = interleaved({k: solver(k) for k in problems}, repeat=repeat, warmup=0, progress=tick)
    return {k: {"wall": walls[k], "solver_s": [p.solve_time for p in plans[k]], "plan": plans[k][-1]} for k in problems}


def bench_dp(ns: tuple[int, ...], ks: tuple[int, ...], repeat: int, tick: Any) -> list[dict[str, Any]]:
    """DP (latency, no coupling constraint) over the n x k grid."""
    problems = {}
    for n in ns:
        for k in ks:
            rng = np.random.default_rng(n * 1000 + k)
            problems[f"{n},{k}"] = (
                random_graph(n, rng),
                random_cluster(k, rng),
                {"wt": 1.0, "we": 0.01, "constraints": {"memory": False}},
            )
    got = _timed_grid(problems, repeat, tick)
    rows = []
    for key, g in got.items():
        n, k = map(int, key.split(","))
        assert g["plan"].solver == "dp", g["plan"].solver
        rows.append(
            {
                "n": n,
                "k": k,
                "wall": summary(g["wall"]),
                "solver": summary(g["solver_s"]),
                "samples": g["wall"],
                "stages": len(g["plan"].stages),
            }
        )
    return rows


def bench_milp(cases: dict[str, tuple[Any, Any]], repeat: int, tick: Any) -> list[dict[str, Any]]:
    """Memory-constrained AutoPartition (the exact LP -> bound -> MILP path) on each case."""
    from multigpu.partition import autopartition
    from multigpu.partition.cost.arithmetic import memory_use

    rows = []
    got = _timed_grid({k: (g, c, {}) for k, (g, c) in cases.items()}, repeat, tick)
    for label, (graph, cluster) in cases.items():
        free = autopartition(graph, cluster, constraints={"memory": False})
        cols = np.array([cluster.index(d) for d in free.assignment])
        binds = bool(np.any(memory_use(graph, cluster, cols) > cluster.memory))
        plan = got[label]["plan"]
        rows.append(
            {
                "case": label,
                "n": graph.n,
                "k": cluster.k,
                "wall": summary(got[label]["wall"]),
                "solver": summary(got[label]["solver_s"]),
                "samples": got[label]["wall"],
                "memory_binds": binds,
                "method": plan.solver,
                "devices_used": sum(d.layers > 0 for d in plan.breakdown.devices),
                "cost_over_unconstrained": plan.cost / free.cost,
            }
        )
    return rows


def bench_stress(n: int, k: int, seed: int, limit: float) -> dict[str, Any]:
    """AutoPartition proving the optimum (gap 0) under a time limit, on a chain where each
    device holds 15% of the parameters; ``proven`` says whether it proved the optimum."""
    from multigpu.errors import SolverError
    from multigpu.partition import autopartition

    graph, cluster = memory_bound(n, k, seed, share=0.15)
    t0 = time.perf_counter()
    try:
        plan = autopartition(graph, cluster, time_limit=limit, gap=0)
        proven = plan.proof == "optimal"
        out = {
            "proven": proven,
            "method": plan.solver,
            "cost": plan.cost,
            "gap": plan.gap,
            "message": "optimal" if proven else f"best plan {plan.cost:.6g}, bound {plan.bound:.6g}",
        }
    except SolverError as e:
        out = {"proven": False, "method": "milp", "cost": None, "message": str(e)}
    return {"n": n, "k": k, "seconds": time.perf_counter() - t0, "time_limit": limit, **out}


def with_memory(cluster: Any, graph: Any, share: float) -> Any:
    """The cluster with every device's memory at ``share`` of the graph's parameters plus
    its largest activation (so the plan must spread the parameters)."""
    import dataclasses

    mem = share * float(graph.param_bytes.sum()) + float(graph.activation_bytes.max())
    return dataclasses.replace(cluster, devices=tuple(dataclasses.replace(d, memory=mem) for d in cluster.devices))


def bench_graphs(
    graphs: tuple[str, ...],
    clusters: dict[str, Any],
    limit: float,
    tick: Any,
    short_limits: tuple[float, ...] = SHORT_LIMITS_S,
) -> list[dict[str, Any]]:
    """The fork-join DP and the memory-bound MILP path on each (graph, cluster): the time to a
    plan within the default gap (``DEFAULT_GAP``, 0.1%) and, in a second solve, to the exact
    proof (gap 0), each under ``limit`` seconds; then each objective under each of
    ``short_limits`` seconds (at the default gap)."""
    from multigpu.partition import autopartition, load_graph

    rows = []
    for name in graphs:
        graph = load_graph(name)
        for cname, cluster in clusters.items():
            t0 = time.perf_counter()
            free = autopartition(graph, cluster, constraints={"memory": False})
            dp_s = time.perf_counter() - t0
            bound = with_memory(cluster, graph, 0.4)
            within = _bounded_solve(graph, bound, limit, None)
            exact = _bounded_solve(graph, bound, limit, 0.0)
            best = min((r["cost"] for r in (within, exact) if r["cost"] is not None), default=None)
            short = [
                {**_bounded_solve(graph, bound, limit, None, objective), "limit": limit, "objective": objective}
                for objective in OBJECTIVES
                for limit in short_limits
            ]
            rows.append(
                {
                    "graph": name,
                    "cluster": cname,
                    "n": graph.n,
                    "k": cluster.k,
                    "dp_s": dp_s,
                    "dp_method": free.solver,
                    "within": within,
                    "exact": exact,
                    # Kept under their old names: the exact solve's figures.
                    "milp_s": exact["seconds"],
                    "proven": exact["proven"],
                    "method": exact["method"],
                    "cost_over_free": None if best is None else best / free.cost,
                    "short_limits": short,
                }
            )
            tick()
    return rows


def _bounded_solve(
    graph: Any, cluster: Any, limit: float, gap: float | None, objective: str = "latency"
) -> dict[str, Any]:
    """One AutoPartition solve of ``objective`` under ``limit`` seconds, at the default gap
    (``gap`` None) or at ``gap``: its wall time, the gap it proved, whether it met the gap
    asked, the plan's cost and its value of the objective."""
    from multigpu.errors import SolverError
    from multigpu.partition import autopartition
    from multigpu.partition.solvers.solver import DEFAULT_GAP

    asked = DEFAULT_GAP if gap is None else gap
    kw: dict[str, Any] = {} if gap is None else {"gap": gap}
    t0 = time.perf_counter()
    try:
        plan = autopartition(graph, cluster, objective=objective, time_limit=limit, **kw)
        out = {
            "cost": plan.cost,
            "value": plan.value,
            "gap": plan.gap,
            "method": plan.solver,
            "proven": plan.proof == "optimal" if asked == 0 else plan.gap <= asked,
            "stages": len(plan.stages),
        }
    except SolverError as e:
        out = {
            "cost": None,
            "value": None,
            "gap": None,
            "method": "milp",
            "proven": False,
            "stages": None,
            "message": str(e),
        }
    return {"seconds": time.perf_counter() - t0, "asked": asked, **out}


def limit_met(seconds: float, limit: float) -> bool:
    """Whether a solve of ``seconds`` met a time limit: within LIMIT_SLACK of it or 1 s."""
    return seconds <= limit + max(LIMIT_SLACK * limit, 1.0)


def bench_gaps(model: str = "alexnet", batch: int = 1) -> list[dict[str, Any]]:
    """Each baseline's gap to the optimum on every shipped cluster (latency: cost; throughput: bottleneck)."""
    from multigpu.partition import Constraints, autopartition, baselines, load_cluster, load_graph, shipped_clusters

    graph = load_graph(model, batch=batch)
    rows = []
    for name in shipped_clusters():
        cluster = load_cluster(name)
        settings: tuple[tuple[str, dict[str, Any]], ...] = (
            ("time (wt=1, we=0)", {"wt": 1.0, "we": 0.0}),
            ("energy (wt=0, we=1)", {"wt": 0.0, "we": 1.0}),
            ("throughput (bottleneck)", {"objective": "throughput"}),
        )
        for label, kw in settings:
            plan = autopartition(graph, cluster, **kw)
            thr = kw.get("objective") == "throughput"
            best = plan.bottleneck if thr else plan.cost
            gaps: dict[str, dict[str, Any] | None] = {}
            for b in baselines(graph, cluster, kw.get("wt", 1.0), kw.get("we", 0.0), constraints=Constraints()):
                if b.breakdown is None:
                    gaps[b.name] = None
                    continue
                value = b.breakdown.bottleneck if thr else b.cost
                gaps[b.name] = {"value": value, "gap": value / best - 1, "breaks": list(b.violations)}
            rows.append(
                {
                    "cluster": name,
                    "model": model,
                    "batch": batch,
                    "objective": label,
                    "optimum": best,
                    "stages": [f"{s.first}..{s.last}@{s.device}" for s in plan.stages],
                    "gaps": gaps,
                }
            )
    return rows


def selection(cases: tuple[str, ...] | None) -> tuple[set[str], tuple[str, ...], tuple[str, ...]]:
    """The parts, graphs and graph clusters that ``--cases`` selects: each name is a part
    (``PARTS``), a graph (``GRAPHS``) or a graph case's cluster (``GRAPH_CLUSTERS``); a graph
    or a cluster alone selects the graph cases and narrows them to it. None selects all.
    Raises InputError naming an unknown case."""
    from multigpu.errors import InputError

    if cases is None:
        return set(PARTS), GRAPHS, GRAPH_CLUSTERS
    known = (*PARTS, *GRAPHS, *GRAPH_CLUSTERS)
    bad = [c for c in cases if c not in known]
    if bad:
        raise InputError(f"--cases {','.join(cases)}: {bad} unknown to `planner`; choose from {', '.join(known)}")
    parts = {c for c in cases if c in PARTS}
    graphs = tuple(g for g in GRAPHS if g in cases)
    clusters = tuple(c for c in GRAPH_CLUSTERS if c in cases)
    if graphs or clusters:
        parts.add("graphs")
    return parts, graphs or GRAPHS, clusters or GRAPH_CLUSTERS


def run(opts: Options) -> Result:
    """Time the solvers on the grids, compute the gaps, tabulate (the parts ``opts.cases`` selects)."""
    from multigpu.partition.solvers.solver import DEFAULT_GAP

    parts, graph_names, cluster_names = selection(opts.cases)
    dp_ns, dp_ks = (100, 1000, 10_000), (4, 16, 64)
    milp_ns, milp_ks = opts.repeats(((50, 100, 200), (4, 8, 16)), ((20, 50), (4, 8)))
    dp_repeat, milp_repeat = opts.repeats(5, 2), opts.repeats(3, 1)
    milp_cases = {
        f"random chain, 40% memory, n={n} k={k}": memory_bound(n, k, seed=0) for n in milp_ns for k in milp_ks
    }
    if not opts.quick:
        for seed in (1, 2):
            milp_cases[f"random chain, 40% memory, n=200 k=16, seed {seed}"] = memory_bound(200, 16, seed)
        milp_cases["transformer, 200 layers (63 GB) on 16 GPUs/CPUs"] = (transformer_chain(), gpu_cluster())
    from multigpu.partition import load_cluster

    graphs = graph_names[:1] if opts.quick and opts.cases is None else graph_names
    graph_clusters = {
        label: cluster()
        for key, label, cluster in (
            ("lab", "lab", lambda: load_cluster("lab")),
            ("gpu16", "16 GPUs/CPUs", gpu_cluster),
        )
        if key in cluster_names and (key == "lab" or not opts.quick or opts.cases is not None)
    }
    if "graphs" not in parts:
        graphs = ()
    run_stress = "stress" in parts and not opts.quick
    run_published = "published" in parts and opts.instances is not None
    bar = progress_bar(
        (dp_repeat if "dp" in parts else 0)
        + (milp_repeat if "milp" in parts else 0)
        + 1
        + (1 if run_stress else 0)
        + len(graphs) * len(graph_clusters)
        + (len(INSTANCES) if run_published else 0),
        "planner",
        opts.progress,
    )
    dp = bench_dp(dp_ns, dp_ks, dp_repeat, bar.update) if "dp" in parts else []
    milp = bench_milp(milp_cases, milp_repeat, bar.update) if "milp" in parts else []
    gaps = bench_gaps() if "gaps" in parts else []
    bar.update()
    short_limits = SHORT_LIMITS_S[:1] if opts.quick else SHORT_LIMITS_S
    dags = bench_graphs(graphs, graph_clusters, GRAPH_LIMIT_S, bar.update, short_limits)
    stress = bench_stress(200, 16, 0, STRESS_TARGET_S) if run_stress else None
    bar.update()
    published = (
        bench_published(opts.instances, PUBLISHED_LIMIT_S, opts.repeats(*PAIRWISE_LIMIT_S), bar.update)
        if run_published and opts.instances is not None
        else None
    )
    bar.close()

    def ms(s: dict[str, float]) -> str:
        k, unit = (1.0, " s") if s["median"] >= 1 else (1e3, " ms")
        return f"{k * s['median']:.3g}{unit} ({k * s['q1']:.4g}-{k * s['q3']:.4g})"

    dp_rows = [
        [
            r["n"],
            r["k"],
            ms(r["wall"]),
            ms(r["solver"]),
            r["stages"],
            (
                ("yes" if r["solver"]["median"] <= DP_TARGET_S else "**no**")
                if (r["n"], r["k"]) == (10_000, 64)
                else "-"
            ),
        ]
        for r in dp
    ]
    milp_rows = [
        [
            r["case"],
            r["n"],
            r["k"],
            ms(r["wall"]),
            ms(r["solver"]),
            r["method"],
            "yes" if r["memory_binds"] else "no",
            r["devices_used"],
            f"{r['cost_over_unconstrained']:.3f}",
            ("yes" if r["wall"]["median"] <= MILP_TARGET_S else "**no**") if (r["n"], r["k"]) == (200, 16) else "-",
        ]
        for r in milp
    ]

    def secs(x: float) -> str:
        return f"{x:.3g} s" if x >= 1 else f"{1e3 * x:.3g} ms"

    def solved(r: dict[str, Any]) -> str:
        if r["proven"]:
            return secs(r["seconds"]) + ("" if r["asked"] == 0 else f" (gap {r['gap']:.3%})")
        if r["gap"] is None:
            return f"no plan in {GRAPH_LIMIT_S:g} s"
        return f"not proven in {GRAPH_LIMIT_S:g} s (gap {r['gap']:.2%})"

    dag_rows = [
        [
            r["graph"],
            r["cluster"],
            r["n"],
            r["k"],
            secs(r["dp_s"]),
            r["dp_method"],
            "yes" if r["dp_s"] <= DP_TARGET_S else "**no**",
            solved(r["within"]),
            solved(r["exact"]),
            r["exact"]["method"] if r["exact"]["proven"] else r["within"]["method"],
            "-" if r["cost_over_free"] is None else f"{r['cost_over_free']:.3f}",
            "yes" if r["within"]["proven"] and r["within"]["seconds"] <= MILP_TARGET_S else "**no**",
        ]
        for r in dags
    ]
    limit_rows = []
    for r in dags:
        for objective in OBJECTIVES:
            cells = []
            for x in (x for x in r["short_limits"] if x["objective"] == objective):
                ok = limit_met(x["seconds"], x["limit"]) and x["cost"] is not None
                plan = "no plan" if x["cost"] is None else f"gap {x['gap']:.1%}, {x['method']}"
                cells.append(f"{secs(x['seconds'])} ({plan})" + ("" if ok else " **no**"))
            limit_rows.append([r["graph"], r["cluster"], objective, *cells])
    names = ["single", "uniform", "balanced", "greedy"]
    gap_rows = []
    for r in gaps:
        cells = []
        for nm in names:
            g = r["gaps"].get(nm)
            cells.append("n/a" if g is None else f"{100 * g['gap']:+.1f}%" + ("*" if g["breaks"] else ""))
        gap_rows.append([r["cluster"], r["objective"], f"{r['optimum']:.5g}", *cells, "; ".join(r["stages"])])
    tables = [
        Table(
            "DP (latency, no coupling constraint): solve time against n and k",
            ["n layers", "k devices", "autopartition", "solver", "stages", f"<= {DP_TARGET_S:g} s"],
            dp_rows,
        ),
        Table(
            "Memory-constrained (LP, Lagrangian bound, MILP): solve time against n and k",
            [
                "case",
                "n",
                "k",
                "autopartition",
                "solver",
                "method",
                "memory binds",
                "devices used",
                "cost / unconstrained",
                f"<= {MILP_TARGET_S:g} s",
            ],
            milp_rows,
        ),
        Table(
            "Graphs with branches (batch 1, 224 x 224): the fork-join DP, and AutoPartition with every device "
            "holding 40% of the parameters",
            [
                "graph",
                "cluster",
                "n",
                "k",
                "DP",
                "method",
                f"<= {DP_TARGET_S:g} s",
                f"memory-bound, to a {DEFAULT_GAP:.1%} gap",
                "memory-bound, exact proof",
                "proved by",
                "cost / unconstrained",
                f"<= {MILP_TARGET_S:g} s within {DEFAULT_GAP:.1%}",
            ],
            dag_rows,
        ),
        Table(
            "Graphs with branches, 40% memory: each objective under short time limits (wall time; the plan's "
            f"proven gap and method; **no** where the limit was missed by more than {LIMIT_SLACK:.0%} or 1 s, or no "
            "plan came back)",
            ["graph", "cluster", "objective", *(f"limit {x:g} s" for x in short_limits)],
            limit_rows,
        ),
        Table(
            "Baselines' gap to the optimum, AlexNet batch 1 (throughput rows: gap in bottleneck)",
            ["cluster", "objective", "optimum", *names, "optimal stages"],
            gap_rows,
        ),
    ]
    # Only the parts that ran (``--cases``) get a table.
    tables = [t for t in tables if t.rows]
    notes = []
    if dp or milp:
        notes.append(
            f"DP: {dp_repeat} alternating rounds over the grid; MILP: {milp_repeat}. Times are median "
            "(quartiles); autopartition includes building the cost tables and evaluating the plan."
        )
    if gaps:
        notes.append(
            "single = best single device; uniform = contiguous split in cluster order; balanced = FLOPs "
            "proportional to each device's FLOP/s; greedy = each layer on its fastest device. "
            "* = the baseline breaks a constraint."
        )
    if stress is not None:
        outcome = (
            f"proven optimal by {stress['method']}"
            if stress["proven"]
            else f"not proven (target {STRESS_TARGET_S:g} s): {stress['message']}"
        )
        notes.append(
            f"stress (a chain, n={stress['n']}, k={stress['k']}, each device holds 15% of the parameters; "
            f"AutoPartition proving the optimum, time limit {stress['time_limit']:g} s in all): "
            f"{stress['seconds']:.0f} s, {outcome}"
        )
    if dags:
        notes.append(
            f"graph cases: two solves each, one to the default gap ({DEFAULT_GAP:.1%}: the plan is proven within it "
            "of the optimum; the gap reached in brackets) and one proving the optimum (gap=0), each limited to "
            f"{GRAPH_LIMIT_S:g} s; 'proved by' names the method of the exact solve's plan."
        )
    if published is None and opts.instances is None and "published" in parts:
        notes.append(
            f"published instances (Tarnawski et al.): not run; `git clone {REPO_URL} DIR` and pass `--instances DIR`"
        )
    elif published is not None:
        tables += _published_tables(published)
        notes.append(
            "published instances: their files from throughput-inputs/ of "
            f"{REPO_URL} (not shipped), read by multigpu.partition.inputs.graph_pipeline; values in ms. "
            "'theirs' prices a plan in their model, where a sender pays once in all (we charge it once per "
            "device its output goes to). Their IP is throughput-ip/ip.py (non-contiguous) rebuilt on HiGHS; both "
            "MILPs run at a relative gap of 1e-9. Their DP is their throughput-dp/dp.cpp, compiled here with "
            f"g++ -O2. Each solve is limited to {PUBLISHED_LIMIT_S:g} s; the pairwise form to "
            f"{opts.repeats(*PAIRWISE_LIMIT_S):g} s."
        )
    data = {"dp": dp, "milp": milp, "gaps": gaps, "graphs": dags, "stress": stress, "published": published}
    return Result(
        "planner",
        TITLE,
        tables,
        data,
        settings={
            "dp_n": dp_ns,
            "dp_k": dp_ks,
            "milp_n": milp_ns,
            "milp_k": milp_ks,
            "dp_repeat": dp_repeat,
            "milp_repeat": milp_repeat,
        },
        notes=notes,
        plot=(lambda fig: _plot(fig, dp, milp, gaps, dags, published or []))
        if dp or milp or gaps or dags or published
        else None,
    )


def _published_tables(rows: list[dict[str, Any]]) -> list[Table]:
    """The published instances: ours beside their IP and DP; each form of our MILP."""

    def secs(x: float) -> str:
        return f"{x:.3g} s"

    def val(x: float) -> str:
        return f"{x:.4f}" if math.isfinite(x) else "none"

    head = []
    forms = []
    for r in rows:
        o, ip, dp = r["ours"], r["ip"], r["dp"]
        ip_cell = f"{val(ip['value'])}, " + (f"proven in {secs(ip['seconds'])}" if ip["proven"] else "not proven")
        dp_value = math.inf if dp is None else dp["value"]
        dp_cell = "no C++ compiler" if dp is None else f"{val(dp['value'])}, {secs(dp['seconds'])}"
        proven = o["gap"] <= 1e-9
        ratio = o["proof_s"] / ip["seconds"] if proven and ip["proven"] else math.nan
        target = r["instance"] in ("BERT-24", "BERT-L3")
        head.append(
            [
                r["instance"],
                r["n"],
                r["k"],
                dp_cell,
                ip_cell,
                f"{val(o['value_ms'])} (theirs {val(o['their_value_ms'])}), "
                + (f"proven in {secs(o['proof_s'])}" if proven else f"gap {o['gap']:.2%}"),
                secs(o["seconds"]),
                (f"{ratio:.2f}" if math.isfinite(ratio) else "-")
                + ((" yes" if ratio <= RATIO_TARGET else " **no**") if target else ""),
                "yes" if o["their_value_ms"] <= dp_value * (1 + 1e-9) else "**no**",
            ]
        )
        c, p = r["forms"]["compact"], r["forms"]["pairwise"]
        pw = (
            f"{val(p['value_ms'])}, proven in {secs(p['seconds'])}"
            if p.get("proven")
            else f"{val(p.get('value_ms', math.inf))}, bound {val(p.get('bound_ms', math.nan))} at {secs(p['seconds'])}"
        )
        forms.append(
            [
                r["instance"],
                f"{ip['rows']:,} x {ip['columns']:,}",
                val(ip["lp_bound"]),
                f"{c['rows']:,} x {c['columns']:,}",
                val(c["lp_bound_ms"]),
                f"{p['rows']:,} x {p['columns']:,}",
                val(p["lp_bound_ms"]),
                pw,
            ]
        )
    return [
        Table(
            "Published instances (Tarnawski et al., NeurIPS 2020): AutoPartition (throughput, proven) beside their "
            "IP on the same HiGHS and their contiguous DP (max-load, ms)",
            [
                "instance",
                "nodes",
                "accelerators",
                "their DP",
                "their IP on HiGHS",
                "ours: bottleneck",
                "ours: in all",
                f"ours / IP, time to proof (<= {RATIO_TARGET:g})",
                "ours <= their DP",
            ],
            head,
        ),
        Table(
            "The throughput MILP's forms on the published instances: rows x columns and LP bound (ms) of the "
            "bottleneck model",
            [
                "instance",
                "their IP",
                "LP bound",
                "compact (per producer and device)",
                "LP bound",
                "pairwise (per device pair)",
                "LP bound",
                "pairwise, solved",
            ],
            forms,
        ),
    ]


def _plot(
    fig: Any,
    dp: list[dict[str, Any]],
    milp: list[dict[str, Any]],
    gaps: list[dict[str, Any]],
    graphs: list[dict[str, Any]],
    published: list[dict[str, Any]],
) -> None:
    """One panel per part that ran (``--cases`` may select a few): DP and MILP times against n,
    the baselines' gaps, the graphs' time to the default gap and to the exact proof, and on the
    published instances our time to proof beside their IP's."""
    grid = [r for r in milp if r["case"].startswith("random chain") and "seed" not in r["case"]]
    parts = (("dp", dp), ("milp", grid), ("gaps", gaps), ("graphs", graphs), ("published", published))
    panels = [p for p, rows in parts if rows]
    axes = dict(zip(panels, np.atleast_1d(fig.subplots(1, len(panels)))))
    for part, rows, key, target, ylabel, title in (
        ("dp", dp, "solver", DP_TARGET_S, "solver s", "DP"),
        ("milp", grid, "wall", MILP_TARGET_S, "autopartition s", "memory-constrained (MILP path)"),
    ):
        if part not in axes:
            continue
        ax = axes[part]
        for k in sorted({r["k"] for r in rows}):
            pts = sorted((r["n"], r[key]["median"]) for r in rows if r["k"] == k)
            ax.plot(*zip(*pts), marker="o", label=f"k={k}")
        ax.axhline(target, color="r", ls="--", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel="layers n", ylabel=ylabel, title=title)
    if "gaps" in axes:
        ax = axes["gaps"]
        names = ["single", "uniform", "balanced", "greedy"]
        labels = [f"{r['cluster']}\n{r['objective'].split(' ')[0]}" for r in gaps]
        width = 0.8 / len(names)
        for j, nm in enumerate(names):
            ys = [100 * (r["gaps"][nm]["gap"] if r["gaps"].get(nm) else np.nan) for r in gaps]
            ax.bar(np.arange(len(gaps)) + (j - 1.5) * width, np.maximum(ys, 0.1), width, label=nm)
        ax.set_xticks(range(len(gaps)), labels, fontsize=6)
        ax.set(yscale="log", ylabel="gap to optimum, % (log)", title="baselines, AlexNet")
    if "graphs" in axes:
        ax = axes["graphs"]
        x = np.arange(len(graphs))
        for off, key, label in ((-0.2, "within", "to a 0.1% gap"), (0.2, "exact", "exact proof")):
            ax.bar(x + off, [r[key]["seconds"] for r in graphs], 0.4, label=label)
        ax.axhline(MILP_TARGET_S, color="r", ls="--", lw=0.8)
        ax.set_xticks(x, [f"{r['graph']}\n{r['cluster']}" for r in graphs], fontsize=6)
        ax.set(ylabel="autopartition s", title="graphs, 40% memory per device")
    if "published" in axes:
        ax = axes["published"]
        x = np.arange(len(published))
        ax.bar(x - 0.2, [r["ours"]["proof_s"] for r in published], 0.4, label="ours, to the proof")
        ax.bar(x + 0.2, [r["ip"]["seconds"] for r in published], 0.4, label="their IP on HiGHS")
        ax.set_xticks(x, [r["instance"] for r in published], fontsize=7)
        ax.set(yscale="log", ylabel="seconds (log)", title="published instances, throughput")
    for ax in axes.values():
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.set_size_inches(5 * len(panels), 5)
    fig.tight_layout()
