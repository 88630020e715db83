"""The published pipeline-partitioning instances of Tarnawski et al. (NeurIPS 2020) as a
planner benchmark: our planner beside their integer program (rebuilt on the same HiGHS)
and their contiguous DP (their own C++, compiled here when a C++ compiler is present).

The instances are not shipped: clone https://github.com/msr-fiddle/dnn-partitioning and
pass its folder (``multigpu bench planner --instances DIR``). ``read_pipeline_instance``
(``multigpu.partition.inputs.graph_pipeline``) reads each onto our throughput objective.

Their IP (``throughput-ip/ip.py``, the non-contiguous variant, Gurobi there): binary
x[node, machine], continuous comm_in/comm_out per node and accelerator (comm_in[u, m] >=
x[v, m] - x[u, m] and comm_out[u, m] >= x[u, m] - x[v, m] for each edge (u, v)), an
accelerator's load = its compute + the node costs on comm_in and comm_out, the CPU's its
compute, knapsack rows on the accelerators, colour classes on one machine, minimise the
max-load. Rebuilt row for row; both solvers run HiGHS at the same relative gap.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

PROGRESS: Any = None  # a callable hearing the solve's steps (for a trace), or None
REPO_URL = "https://github.com/msr-fiddle/dnn-partitioning"
INSTANCES = {
    "BERT-24": "throughput-inputs/LayerGraphs/bert24_inference.json",
    "BERT-L3": "throughput-inputs/OperatorGraphs/bert_l-3_inference.json",
    "GNMT": "throughput-inputs/LayerGraphs/gnmt_inference.json",
}


def check_instances(folder: Path) -> dict[str, Path]:
    """The instance files under ``folder``; BenchmarkError naming the folder and how to get
    the repository when any is missing."""
    from multigpu.errors import BenchmarkError

    paths = {name: folder / rel for name, rel in INSTANCES.items()}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise BenchmarkError(
            f"the published instances are not in {str(folder)!r} (missing {', '.join(missing)}); get them "
            f"with `git clone {REPO_URL} DIR` and pass `--instances DIR`"
        )
    return paths


def their_ip(data: dict[str, Any], gap: float, time_limit: float) -> dict[str, Any]:
    """Tarnawski et al.'s throughput IP (non-contiguous) on HiGHS: value (ms), bound, seconds,
    rows and columns. Machines 0..c-1 are CPUs, c..c+k-1 accelerators, as in ip.py."""
    from scipy.sparse import coo_matrix

    from multigpu.partition.solvers.highs import OPTIMAL, Highs

    k, c = int(data["maxFPGAs"]), int(data["maxCPUs"])
    m = c + k
    nodes = data["nodes"]
    ids = [nd["id"] for nd in nodes]
    at = {nid: i for i, nid in enumerate(ids)}
    nn = len(nodes)
    cost = np.zeros(nn)
    for e in data["edges"]:
        cost[at[e["sourceId"]]] = float(e["cost"])
    x = np.arange(nn * m).reshape(nn, m)
    cin = nn * m + np.arange(nn * k).reshape(nn, k)
    cout = nn * m + nn * k + np.arange(nn * k).reshape(nn, k)
    big = nn * m + 2 * nn * k
    ncol = big + 1
    r: list[int] = []
    cc: list[int] = []
    v: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(cols: list[int], vals: list[float], low: float, high: float) -> None:
        n_row = len(lo)
        r.extend([n_row] * len(cols))
        cc.extend(cols)
        v.extend(vals)
        lo.append(low)
        hi.append(high)

    ub = np.ones(ncol)
    ub[nn * m : big] = np.inf
    ub[big] = np.inf
    for i, nd in enumerate(nodes):
        row(list(x[i]), [1.0] * m, 1.0, 1.0)
        if not nd.get("supportedOnFpga", True):
            ub[x[i, c:]] = 0.0
    size = np.array([float(nd.get("size", 0.0)) for nd in nodes])
    for j in range(k):
        row(list(x[:, c + j]), list(size), -math.inf, float(data["maxSizePerFPGA"]))
    for j in range(k):
        for e in data["edges"]:
            u, w = at[e["sourceId"]], at[e["destId"]]
            row([cin[u, j], x[w, c + j], x[u, c + j]], [1.0, -1.0, 1.0], 0.0, math.inf)
            row([cout[u, j], x[u, c + j], x[w, c + j]], [1.0, -1.0, 1.0], 0.0, math.inf)
    lat = np.array([[float(nd["cpuLatency"]), float(nd["fpgaLatency"])] for nd in nodes])
    for mach in range(m):
        if mach < c:
            row([*x[:, mach], big], [*lat[:, 0], -1.0], -math.inf, 0.0)
        else:
            j = mach - c
            row([*x[:, mach], *cin[:, j], *cout[:, j], big], [*lat[:, 1], *cost, *cost, -1.0], -math.inf, 0.0)
    classes: dict[Any, list[int]] = {}
    for i, nd in enumerate(nodes):
        if nd.get("colorClass") is not None:  # a null class is the node's own (as our reader)
            classes.setdefault(nd["colorClass"], []).append(i)
    for members in classes.values():
        for a, b in zip(members, members[1:]):
            for mach in range(m):
                row([x[a, mach], x[b, mach]], [1.0, -1.0], 0.0, 0.0)
    A = coo_matrix((v, (r, cc)), shape=(len(lo), ncol)).tocsr()
    cvec = np.zeros(ncol)
    cvec[big] = 1.0
    integrality = np.zeros(ncol, dtype=np.uint8)
    integrality[: nn * m] = 1
    h = Highs(cvec, A, np.array(lo), np.array(hi), np.zeros(ncol), ub, integrality)
    relax = Highs(cvec, A, np.array(lo), np.array(hi), np.zeros(ncol), ub, integrality).solve(relax=True)
    t0 = time.perf_counter()
    out = h.solve({"mip_rel_gap": gap, "mip_abs_gap": 0.0, "time_limit": time_limit, "presolve": True})
    seconds = time.perf_counter() - t0
    return {
        "value": out.fun if out.x is not None else math.inf,
        "bound": out.bound,
        "proven": out.status == OPTIMAL,
        "seconds": seconds,
        "rows": len(lo),
        "columns": ncol,
        "lp_bound": relax.fun,
    }


def their_dp(folder: Path, rel: str, build_dir: Path, time_limit: float) -> dict[str, Any] | None:
    """Their contiguous DP (``throughput-dp/dp.cpp``), compiled with the C++ compiler found
    here (None without one): its max-load (ms) and wall seconds. Null colour classes are
    dropped from the JSON it reads (its reader wants an integer or no key)."""
    import json

    cxx = shutil.which("g++") or shutil.which("c++")
    src = folder / "throughput-dp" / "dp.cpp"
    if cxx is None or not src.is_file():
        return None
    exe = build_dir / "tarnawski-dp"
    if not exe.exists():
        build_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run([cxx, "-O2", "-std=c++17", "-o", str(exe), str(src)], check=True, capture_output=True)
    data = json.loads((folder / rel).read_text())
    for nd in data["nodes"]:
        if nd.get("colorClass", 0) is None:
            del nd["colorClass"]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            [str(exe)], input=json.dumps(data), capture_output=True, text=True, timeout=time_limit, check=False
        )
    except subprocess.TimeoutExpired:
        return {"value": math.inf, "seconds": time_limit, "message": f"over {time_limit:g} s"}
    seconds = time.perf_counter() - t0
    found = re.search(r"objective = ([0-9.eE+-]+)", done.stderr)
    if found is None:
        return {"value": math.inf, "seconds": seconds, "message": (done.stdout + done.stderr).strip()[-200:]}
    return {"value": float(found.group(1)), "seconds": seconds, "message": "ok"}


def form_stats(inst: Any, form: str, time_limit: float | None) -> dict[str, Any]:
    """One form of our throughput MILP on an instance: rows, columns and LP bound (ms) of
    its phase-1 model, and with ``time_limit`` the proven solve (gap 0) through
    ``solve_throughput``: its value and bound (ms), our value priced their way, seconds."""
    from multigpu.partition.cost.tables import CostTables
    from multigpu.partition.exceptions import InfeasibleError
    from multigpu.partition.inputs.graph_pipeline import pipeline_max_load
    from multigpu.partition.solvers.bottleneck_bound import bottleneck_lower_bound
    from multigpu.partition.solvers.constraints import Constraints
    from multigpu.partition.solvers.highs import Highs
    from multigpu.partition.solvers.milp_compact import build_compact
    from multigpu.partition.solvers.milp_model import build_model
    from multigpu.partition.solvers.solver import Budget
    from multigpu.partition.solvers.throughput import solve_throughput

    tables = CostTables.build(inst.graph, inst.cluster, False)
    cons = Constraints.coerce(inst.constraints).resolve(inst.graph, inst.cluster)
    lb = bottleneck_lower_bound(tables, cons)
    if form == "compact":
        model = build_compact(tables, cons, 1.0, 0.0, objective="bottleneck", scale=1 / lb, b_scale=1 / lb)
    else:
        model = build_model(tables, cons, 1.0, 0.0, objective="bottleneck", scale=1e3 / lb)
    lp = Highs(model.c, model.A, model.lo, model.hi, model.lb, model.ub, model.integrality).solve(relax=True)
    out: dict[str, Any] = {
        "rows": int(model.A.shape[0]),
        "columns": int(model.A.shape[1]),
        "lp_bound_ms": 1e3 * lp.fun / model.scale,
    }
    if time_limit is None:
        return out
    t0 = time.perf_counter()
    budget = Budget(time_limit=time_limit, gap=0.0, progress=PROGRESS)
    sol = solve_throughput(
        tables, cons, 1.0, 0.0, 1.0, None, lambda: InfeasibleError("no plan fits"), budget, form=form
    )
    names = [inst.cluster.names[d] for d in sol.a]
    out.update(
        value_ms=1e3 * sol.value,
        bound_ms=1e3 * sol.bound,
        their_value_ms=pipeline_max_load(inst.data, inst.original_assignment(names)),
        seconds=time.perf_counter() - t0,
        proven=sol.bound >= sol.value * (1 - 1e-9),
    )
    return out


def ours(inst: Any, time_limit: float) -> dict[str, Any]:
    """``autopartition`` (throughput, gap 0) on an instance: the bottleneck and bound (ms),
    the plan priced their way, seconds in all, and the seconds to the proof of the
    bottleneck (before the tie-break by latency)."""
    from multigpu.partition import autopartition
    from multigpu.partition.inputs.graph_pipeline import pipeline_max_load

    t0 = time.perf_counter()
    proof: list[float] = []

    def hear(line: str) -> None:
        if "breaking ties by cost" in line or line.split("] ", 1)[-1].startswith("done"):
            proof.append(time.perf_counter() - t0)

    plan = autopartition(
        inst.graph,
        inst.cluster,
        objective="throughput",
        constraints=inst.constraints,
        gap=0.0,
        time_limit=time_limit,
        progress=hear,
    )
    seconds = time.perf_counter() - t0
    return {
        "value_ms": 1e3 * plan.bottleneck,
        "bound_ms": 1e3 * plan.bound,
        "gap": plan.gap,
        "their_value_ms": pipeline_max_load(inst.data, inst.original_assignment(plan.assignment)),
        "seconds": seconds,
        "proof_s": proof[0] if proof else seconds,
        "method": plan.solver,
    }


def bench_published(folder: Path, time_limit: float, pairwise_limit: float, tick: Any) -> list[dict[str, Any]]:
    """Each instance: ours (autopartition, gap 0), the size and LP bound of each form of our
    MILP (the pairwise one also solved, up to ``pairwise_limit``), their IP and their DP."""
    from multigpu.partition.inputs.graph_pipeline import read_pipeline_instance

    paths = check_instances(folder)
    build = Path(tempfile.gettempdir()) / f"multigpu-bench-{os.getuid()}"
    rows = []
    for name, path in paths.items():
        inst = read_pipeline_instance(path)
        row = {
            "instance": name,
            "file": INSTANCES[name],
            "n": inst.graph.n,
            "k": inst.accelerators,
            "ours": ours(inst, time_limit),
            "forms": {
                "compact": form_stats(inst, "compact", None),
                "pairwise": form_stats(inst, "pairwise", pairwise_limit),
            },
            "ip": their_ip(inst.data, 1e-9, time_limit),
            "dp": their_dp(folder, INSTANCES[name], build, time_limit),
        }
        rows.append(row)
        tick()
    return rows
