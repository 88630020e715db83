"""Benchmark the AutoPartition solvers and the baselines.

Reports
  1. the chain DP's solve time at n = 10,000 layers, k = 64 devices (target <= 1 s);
  2. the constrained solve time with binding memory constraints at n = 200, k = 16
     (target <= 10 s): random chains, and a transformer on a 16-device GPU cluster;
  3. the cost gap of each baseline to the optimum on every shipped cluster, with
     AlexNet (batch 1), for time (wt=1, we=0), for energy (wt=0, we=1), and for the
     throughput objective (the gap in bottleneck).

Run:  python benchmarks/bench_partition.py [--json OUT] [--stress SECONDS]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from typing import Any

import numpy as np

from multigpu.partition import (Cluster, Constraints, DeviceSpec, Graph, LayerSpec, Link, LinkSpec,
                                autopartition, baselines, load_cluster, load_graph, shipped_clusters)
from multigpu.partition.costmodel import memory_use

DP_TARGET_S = 1.0
MILP_TARGET_S = 10.0


def random_graph(n: int, rng: np.random.Generator) -> Graph:
    """A chain with log-uniform FLOPs and activations, and parameters on ~half the layers."""
    layers = tuple(LayerSpec(name=f"l{i}", flops=float(10 ** rng.uniform(6, 10)),
                             param_bytes=float(rng.uniform(0, 2e6) * (rng.random() < 0.5)),
                             output_bytes=float(10 ** rng.uniform(3, 7))) for i in range(n))
    return Graph(layers, input_bytes=float(10 ** rng.uniform(4, 7)), name=f"random-{n}")


def random_cluster(k: int, rng: np.random.Generator, memory: float | None = None) -> Cluster:
    """k devices (10 GFLOP/s .. 10 TFLOP/s), a 100 MB/s default link and faster links on a
    random tenth of the pairs."""
    devices = tuple(DeviceSpec(f"d{i}", float(10 ** rng.uniform(10, 13)), float(rng.uniform(5, 300)),
                               memory) for i in range(k))
    links = []
    for u in range(k):
        for v in range(u + 1, k):
            if rng.random() < 0.1:
                links.append(Link((f"d{u}", f"d{v}"), float(10 ** rng.uniform(8, 10.5)),
                                  float(rng.uniform(0, 1e-4)), float(rng.uniform(0, 10))))
    return Cluster(devices, source="d0", links=tuple(links),
                   default_link=LinkSpec(1e8, 1e-4, 2.0), name=f"random-{k}")


def bench_dp(n: int, k: int, repeat: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    graph, cluster = random_graph(n, rng), random_cluster(k, rng)
    times, walls = [], []
    plan = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan = autopartition(graph, cluster, wt=1.0, we=0.01, constraints={"memory": False})
        walls.append(time.perf_counter() - t0)
        times.append(plan.solve_time)
    assert plan is not None and plan.solver == "dp"
    return {"n": n, "k": k, "solve_s_median": statistics.median(times), "solve_s_min": min(times),
            "autopartition_wall_s_median": statistics.median(walls), "repeat": repeat,
            "stages": len(plan.stages), "cost": plan.cost, "target_s": DP_TARGET_S,
            "meets_target": statistics.median(times) <= DP_TARGET_S}


def transformer_chain(d_model: int = 5120, tokens: int = 512, blocks: int = 50) -> Graph:
    """A decoder-only transformer as a chain: per block, the fused QKV projection, the
    output projection and the two MLP matmuls (4 layers, fp32). 50 blocks = 200 layers,
    63 GB of parameters at d_model = 5120: no single device below holds it."""
    layers = []
    for b in range(blocks):
        for name, params, width in (("qkv", 3 * d_model * d_model, 3 * d_model),
                                    ("proj", d_model * d_model, d_model),
                                    ("up", 4 * d_model * d_model, 4 * d_model),
                                    ("down", 4 * d_model * d_model, d_model)):
            layers.append(LayerSpec(f"b{b}.{name}", 2.0 * params * tokens, 4.0 * params,
                                    4.0 * tokens * width))
    return Graph(tuple(layers), input_bytes=4.0 * tokens * d_model, name=f"transformer-{d_model}")


def gpu_cluster() -> Cluster:
    """16 devices: a host (source and sink), an A6000-class GPU (48 GB), four V100-class
    and four T4-class GPUs (16 GB) on PCIe to the host, six CPU nodes on 10 GbE."""
    devices = [DeviceSpec("host", 1.4e12, 135.0, 256e9), DeviceSpec("a6000", 38.7e12, 300.0, 48e9)]
    devices += [DeviceSpec(f"v100-{i}", 15.7e12, 300.0, 16e9) for i in range(4)]
    devices += [DeviceSpec(f"t4-{i}", 8.1e12, 70.0, 16e9) for i in range(4)]
    devices += [DeviceSpec(f"cpu-{i}", 1.0e12, 150.0, 64e9) for i in range(6)]
    links = tuple(Link(("host", d.name), 1.25e9 if d.name.startswith("cpu") else 15.75e9, 1e-5)
                  for d in devices[1:])
    return Cluster(tuple(devices), source="host", links=links, default_link=LinkSpec(1.25e9, 5e-5, 0.0),
                   name="gpu-cluster-16")


def _milp_case(label: str, graph: Graph, cluster: Cluster, repeat: int) -> dict[str, Any]:
    free = autopartition(graph, cluster, constraints={"memory": False})
    cols = np.array([cluster.index(d) for d in free.assignment])
    binds = bool(np.any(memory_use(graph, cluster, cols) > cluster.memory))
    times, plan = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan = autopartition(graph, cluster)
        times.append(time.perf_counter() - t0)
    assert plan is not None
    return {"case": label, "n": graph.n, "k": cluster.k, "seconds_median": statistics.median(times),
            "seconds_min": min(times), "repeat": repeat, "memory_binds": binds, "solver": plan.solver,
            "devices_used": sum(d.layers > 0 for d in plan.breakdown.devices), "cost": plan.cost,
            "unconstrained_cost": free.cost, "meets_target": statistics.median(times) <= MILP_TARGET_S}


def bench_milp(n: int, k: int, repeat: int, seed: int) -> list[dict[str, Any]]:
    """Memory-constrained AutoPartition (the exact LP -> bound -> MILP path) on
    (a) random chains where each device holds 40% of the parameters, three seeds, and
    (b) a 200-layer transformer on a 16-device GPU cluster (63 GB of parameters)."""
    cases = []
    for s in range(seed, seed + 3):
        rng = np.random.default_rng(s)
        graph = random_graph(n, rng)
        mem = 0.4 * float(graph.param_bytes.sum()) + float(graph.activation_bytes.max())
        cases.append(_milp_case(f"random chain, 40% memory, seed {s}", graph,
                                random_cluster(k, rng, memory=mem), repeat))
    if n == 200 and k == 16:
        cases.append(_milp_case("transformer chain, 63 GB on 16 GPUs/CPUs", transformer_chain(), gpu_cluster(),
                                repeat))
    return cases


def bench_stress(n: int, k: int, seed: int, limit: float) -> dict[str, Any]:
    """A generalised-assignment-like instance (every device holds only 15% of the
    parameters, so at least 7 devices share the chain): the MILP with a time limit."""
    from multigpu.partition.costmodel import CostTables
    from multigpu.partition.milp import solve_milp

    rng = np.random.default_rng(seed)
    graph = random_graph(n, rng)
    mem = 0.15 * float(graph.param_bytes.sum()) + float(graph.activation_bytes.max())
    cluster = random_cluster(k, rng, memory=mem)
    free = autopartition(graph, cluster, constraints={"memory": False})
    tables = CostTables.build(graph, cluster, False)
    cons = Constraints().resolve(graph, cluster)
    t0 = time.perf_counter()
    res = solve_milp(tables, cons, 1.0, 0.0, scale=1e3 / free.cost, options={"time_limit": limit})
    return {"case": "random chain, 15% memory (GAP-like)", "seconds": time.perf_counter() - t0,
            "status": res.status, "message": res.message, "time_limit": limit,
            "best_cost": res.value if res.a is not None else None}


def bench_baselines(model: str, batch: int) -> list[dict[str, Any]]:
    graph = load_graph(model, batch=batch)
    rows = []
    for name in shipped_clusters():
        cluster = load_cluster(name)
        for wt, we in ((1.0, 0.0), (0.0, 1.0)):
            plan = autopartition(graph, cluster, wt=wt, we=we)
            row: dict[str, Any] = {"cluster": name, "model": model, "batch": batch, "objective": "latency",
                                   "wt": wt, "we": we,
                                   "optimum_cost": plan.cost, "optimum_stages": [
                                       f"{s.first}..{s.last}@{s.device}" for s in plan.stages],
                                   "baselines": {}}
            for b in baselines(graph, cluster, wt, we, constraints=Constraints()):
                row["baselines"][b.name] = None if b.breakdown is None else {
                    "cost": b.cost, "gap_pct": 100 * (b.cost / plan.cost - 1),
                    "breaks": b.violations}
            rows.append(row)
        # The throughput objective: the gap in bottleneck (seconds per pipelined item).
        plan = autopartition(graph, cluster, objective="throughput")
        row = {"cluster": name, "model": model, "batch": batch, "objective": "throughput",
               "optimum_cost": plan.bottleneck,
               "optimum_stages": [f"{s.first}..{s.last}@{s.device}" for s in plan.stages], "baselines": {}}
        for b in baselines(graph, cluster, constraints=Constraints()):
            row["baselines"][b.name] = None if b.breakdown is None else {
                "cost": b.breakdown.bottleneck, "gap_pct": 100 * (b.breakdown.bottleneck / plan.bottleneck - 1),
                "breaks": b.violations}
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks, print a summary, optionally write JSON; exit 1 if a target is missed."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", metavar="OUT", help="write the figures as JSON to OUT")
    ap.add_argument("--dp-n", type=int, default=10_000, help="DP benchmark layers (default 10000)")
    ap.add_argument("--dp-k", type=int, default=64, help="DP benchmark devices (default 64)")
    ap.add_argument("--milp-n", type=int, default=200, help="MILP benchmark layers (default 200)")
    ap.add_argument("--milp-k", type=int, default=16, help="MILP benchmark devices (default 16)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per timing; the median is reported (default 3)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random instances (default 0)")
    ap.add_argument("--model", default="alexnet", help="model for the baseline gaps (default alexnet)")
    ap.add_argument("--batch", type=int, default=1, help="batch for the baseline gaps (default 1)")
    ap.add_argument("--stress", type=float, default=0.0, metavar="SECONDS",
                    help="also run the GAP-like stress instance with this MILP time limit (default: skip)")
    args = ap.parse_args(argv)

    dp = bench_dp(args.dp_n, args.dp_k, args.repeat, args.seed)
    print(f"DP    n={dp['n']:>6} k={dp['k']:>3}: {dp['solve_s_median']:.3f} s median "
          f"(min {dp['solve_s_min']:.3f} s; autopartition incl. evaluate {dp['autopartition_wall_s_median']:.3f} s) "
          f"target <= {DP_TARGET_S:g} s: {'ok' if dp['meets_target'] else 'MISSED'}")
    milp = bench_milp(args.milp_n, args.milp_k, args.repeat, args.seed)
    for case in milp:
        print(f"MILP  n={case['n']:>6} k={case['k']:>3}: {case['seconds_median']:.2f} s median "
              f"({case['case']}; memory binds: {case['memory_binds']}; solved by {case['solver']}; "
              f"{case['devices_used']} devices; cost x{case['cost'] / case['unconstrained_cost']:.3f} the "
              f"unconstrained optimum) target <= {MILP_TARGET_S:g} s: {'ok' if case['meets_target'] else 'MISSED'}")
    stress = None
    if args.stress:
        stress = bench_stress(args.milp_n, args.milp_k, args.seed, args.stress)
        print(f"stress n={args.milp_n} k={args.milp_k} ({stress['case']}): {stress['seconds']:.1f} s, "
              f"HiGHS: {stress['message']}")
    gaps = bench_baselines(args.model, args.batch)
    print(f"\nbaseline cost gap to the optimum ({args.model}, batch {args.batch})")
    names = ["single", "uniform", "balanced", "greedy"]
    print(f"  {'cluster':<9} {'objective':<12} {'optimum':>11}  " + "  ".join(f"{n:>10}" for n in names))
    for row in gaps:
        cells = []
        for n in names:
            b = row["baselines"][n]
            cells.append("n/a" if b is None else f"{b['gap_pct']:+.1f}%" + ("*" if b["breaks"] else ""))
        label = "bottleneck" if row["objective"] == "throughput" else "wt=%g we=%g" % (row["wt"], row["we"])
        print(f"  {row['cluster']:<9} {label:<12} {row['optimum_cost']:>11.5g}  "
              + "  ".join(f"{c:>10}" for c in cells))
    print("  (* = the baseline breaks a constraint, e.g. memory)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"python": sys.version.split()[0], "machine": platform.machine(),
                       "processor": platform.processor(), "dp": dp, "milp": milp, "stress": stress,
                       "baselines": gaps}, f, indent=2)
    return 0 if dp["meets_target"] and all(c["meets_target"] for c in milp) else 1


if __name__ == "__main__":
    sys.exit(main())
