"""``multigpu bench lab --lab``: the report's experiment, multi-host allreduces, faults and who
can reach a job, in the emulated lab (the shipped ``lab`` cluster at its own rates).

1. **The report's experiment.** AlexNet on one Pi-class host (500 MB, a quarter of a
   core, no swap), against AlexNet split over the lab with its parameters shipped from
   the host machine (desk-cpu) at run time, each predicted by the cost model on a profile
   of the lab and measured. Links run at the file's rates (scale 1); compute at the
   hosts' CPU shares, whose effective speed the profile measures.
2. **Multi-host data parallel.** ``multigpu launch --nnodes 2`` over a LAN pair and a WiFi
   pair, for torch, Paddle and MXNet: the allreduce's bus bandwidth against the link.
3. **Faults.** The time from a fault to the named error: a link down during ``run`` and
   during ``launch``, a host's processes killed, a stage too big for a host's memory.
4. **Who can reach a job.** What each command listens on (``ss -ltnp``) and whether another
   host can connect; a Ray node without the lab's token.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import multigpu
from multigpu.benchmarks.harness import Options, Result, Table

TITLE = "The emulated lab: the report's experiment, multi-host allreduces, faults, and who can reach a job"
IN_QUICK = False
NEEDS_LAB = True

HOST = "desk-cpu"  # the report's "host machine": the driver, with the memory for AlexNet
#: The report's split (Dev_1..Dev_4): convolutions on the Pis, the dense layers on the LAN.
SPLIT = ["pi1"] * 6 + ["pi2"] * 8 + ["imac"] * 4 + ["desk-gpu"]
REPORT = {"single_pi": (70.0, 80.0), "distributed": (600.0, 900.0)}
PAIRS = {"LAN": ("desk-cpu", "imac"), "WiFi": ("desk-cpu", "pi2")}
PAYLOAD = {"LAN": 4 << 20, "WiFi": 1 << 20}
ENGINES = ("torch", "paddle", "mxnet")


# -- inside a lab host ----------------------------------------------------------------
def profile_inside(address: str, cluster_file: str, progress: bool) -> Any:
    """Profile the lab's links, stage overheads and hosts from the host machine (LeNet's layers:
    a Pi-class host cannot hold AlexNet, which ``layer_times_here`` times layer by layer)."""
    from multigpu.execution import profile

    return profile(
        ["lenet"],
        cluster=multigpu.partition.load_cluster(cluster_file),
        address=address,
        repeats=5,
        warmup=1,
        link_repeats=4,
        sizes=[65536, 655360],
        cpu_items=10,
        timeout=600.0,
        startup_timeout=600.0,
        progress=progress,
    )


def layer_times_here(repeats: int) -> dict[str, float]:
    """Seconds of each of AlexNet's layers on this host (torch, one thread), each layer alone
    with only its own parameters in memory (zeros: the values do not change the time), the
    median of ``repeats`` after one untimed call."""
    os.environ.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    import numpy as np

    from multigpu.contract.protocol import Device

    be = multigpu.backend("torch")
    dev = Device("cpu", 0)
    model = multigpu.models.alexnet()
    stats = model.layer_stats(1)
    rng = np.random.default_rng(0)
    out = {}
    for i, (name, layer) in enumerate(model.layers):
        shapes = model.layer_params(model.param_shapes, i)
        params = [be.from_numpy(np.zeros(shape, np.float32), dev) for shape in shapes]
        x = be.from_numpy(rng.random((1, *stats[i].input_shape), dtype=np.float32), dev)
        be.synchronize(dev)
        layer.forward(be, params, x)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            layer.forward(be, params, x)
            be.synchronize(dev)
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times)
        del params, x
    return out


def single_pi(images: int) -> dict[str, Any]:
    """AlexNet's forward pass on this host alone, in one process (torch, one thread), its
    parameters made here (nothing shipped): seconds per image."""
    os.environ.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    from multigpu.contract.protocol import Device

    be = multigpu.backend("torch")
    model = multigpu.models.alexnet()
    dev = Device("cpu", 0)
    numpy_params = model.init_params(0)
    params = []
    while numpy_params:  # one layer at a time, so the numpy copy and the tensor never both hold it all
        params.append(be.from_numpy(numpy_params.pop(0), dev))
    import numpy as np

    x = np.random.default_rng(0).random((1, *model.input_shape), dtype=np.float32)
    times = []
    for _ in range(images):
        t0 = time.perf_counter()
        be.to_numpy(model.forward(be, params, be.from_numpy(x, dev)))
        times.append(time.perf_counter() - t0)
    return {"seconds": times}


def split_inside(address: str, cluster_file: str, plan: list[str], images: int) -> dict[str, Any]:
    """Run the split plan from the host machine: parameters shipped at run time, then the images."""
    import numpy as np

    from multigpu.execution import run_partitioned

    model = multigpu.models.alexnet()
    x = np.random.default_rng(0).random((images, *model.input_shape), dtype=np.float32)
    t0 = time.perf_counter()
    r = run_partitioned(
        model, None, plan, x, cluster_file, address=address, warmup=0, timeout=900.0, startup_timeout=600.0
    )
    return {
        "total": time.perf_counter() - t0,
        "param_bytes": r.param_bytes,
        "param_seconds": r.param_seconds,
        "startup": r.startup_seconds,
        "latency": r.latency,
        "per_image": r.end_to_end.tolist(),
        "hops": [r.hop_time(h) for h in range(len(r.hop_routes))],
        "routes": r.hop_routes,
        "stages": [r.stage_time(i) for i in range(len(r.stages))],
    }


# -- helpers in the benchmark's process --------------------------------------------
def _cluster_with_source(lab: Any, source: str, folder: Path, name: str, data: dict | None = None) -> Path:
    data = json.loads(lab.cluster_file.read_text()) if data is None else data
    data = {**data, "source": source, "sink": source}
    path = folder / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


def _launch(
    lab: Any, backend: str, hosts: tuple[str, str], out: Path, args: list[str], port: int, timeout: str = "120"
) -> list[subprocess.Popen]:
    addr = {h: lab.plan.host(h).address for h in hosts}
    return [
        lab.popen(
            h,
            [
                sys.executable,
                "-m",
                "multigpu",
                "launch",
                "--nnodes",
                "2",
                "--node-rank",
                str(i),
                "--nproc-per-node",
                "1",
                "--master-addr",
                addr[hosts[0]],
                "--master-port",
                str(port),
                "--node-addr",
                addr[h],
                "--backend",
                backend,
                "--timeout",
                timeout,
                "--init-timeout",
                "300",
                "--",
                sys.executable,
                "-m",
                "multigpu.benchmarks.lab_rank",
                str(out),
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, h in enumerate(hosts)
    ]


def _finish(procs: list[subprocess.Popen], timeout: float = 600) -> list[tuple[int, str]]:
    out = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        out.append((p.returncode, err.strip().splitlines()[-1] if err.strip() else ""))
    return out


def _job_rows(rows: list[tuple[str, int, str]]) -> list[tuple[str, int, str]]:
    """The sockets of a job, not of the host's Ray node."""
    ray = ("raylet", "gcs_server", "ray::")
    return [r for r in rows if not any(x in r[2] for x in ray)]


# -- 1. the report's experiment ------------------------------------------------------
def report_experiment(lab: Any, folder: Path, say: Any, progress: bool) -> dict[str, Any]:
    """Profile, then AlexNet on pi1 alone (500 MB, then unlimited), then the split."""
    from multigpu.errors import LabError
    from multigpu.partition import evaluate, graph_from_model

    spec = _cluster_with_source(lab, HOST, folder, "host-machine")
    say("lab: profiling the links from the host machine")
    prof = lab.call(HOST, "multigpu.benchmarks.lab:profile_inside", lab.address, str(spec), progress, timeout=3 * 3600)
    g = graph_from_model(multigpu.models.alexnet(), 1)
    measured: dict[str, dict[str, float]] = {}
    for h in lab.plan.hosts:  # one host at a time, so that they do not compete for the machine
        say(f"lab: timing AlexNet's layers on {h.name}, one layer at a time")
        small = h.memory is not None
        if small:  # room for the layer's parameters: the host's Ray node waits meanwhile
            lab.kill(h.name)
            time.sleep(1)
        try:
            measured[h.name] = lab.call(h.name, "multigpu.benchmarks.lab:layer_times_here", 3, timeout=3600)
        finally:
            if small:
                lab.restart(h.name)
    data = prof.cluster.to_dict()
    for d in data["devices"]:
        d.setdefault("layer_times", {})[g.name] = measured[d["name"]]
    prof_file = folder / "profile.json"
    prof_file.write_text(json.dumps(data))
    cluster = multigpu.partition.load_cluster(prof_file)
    on_pi = _cluster_with_source(lab, "pi1", folder, "pi-alone", data=data)
    pi_alone = multigpu.partition.load_cluster(on_pi)
    predicted_single = evaluate(g, pi_alone, ["pi1"] * g.n).time
    split = evaluate(g, cluster, SPLIT, ship_params=True)
    ship_each: dict[str, float] = {}
    for layer in split.layers:
        ship_each[layer.device] = ship_each.get(layer.device, 0.0) + layer.param_time
    out: dict[str, Any] = {
        "profile": {**prof.to_dict(), "cluster": data},
        "alexnet_layers": measured,
        "predicted_single": predicted_single,
        "predicted_split": split.time,
        "predicted_param_time": split.param_time,
        "predicted_param_max": max(ship_each.values()),
        "predicted_ship_each": ship_each,
    }
    say("lab: AlexNet on pi1 alone, 500 MB and no swap (its Ray node stopped)")
    lab.kill("pi1")
    time.sleep(1)
    for label, limit in (("500 MB", lab.plan.host("pi1").memory), ("unlimited", None)):
        lab.set_memory("pi1", limit)
        peak0 = lab.hosts["pi1"].cgroups.memory()
        t0 = time.perf_counter()
        try:
            got = lab.call("pi1", "multigpu.benchmarks.lab:single_pi", 2, timeout=1800)
            out[f"single_{label}"] = {"ok": True, **got}
        except LabError as e:
            out[f"single_{label}"] = {
                "ok": False,
                "error": str(e).splitlines()[0][:300],
                "after": time.perf_counter() - t0,
            }
        mem = lab.hosts["pi1"].cgroups.memory()
        out[f"single_{label}"].update(peak=mem["peak"], oom_kills=(mem["oom_kills"] or 0) - (peak0["oom_kills"] or 0))
        Path(lab.hosts["pi1"].cgroups.dirs["memory"], "memory.max_usage_in_bytes").write_text("0")
    lab.set_memory("pi1", lab.plan.host("pi1").memory)
    lab.restart("pi1")
    say("lab: AlexNet split over the lab, parameters shipped from the host machine")
    out["split"] = lab.call(
        HOST, "multigpu.benchmarks.lab:split_inside", lab.address, str(prof_file), SPLIT, 2, timeout=3 * 3600
    )
    return out


# -- 2. bus bandwidth ------------------------------------------------------------------
def bus_bandwidth(lab: Any, folder: Path, say: Any) -> list[dict[str, Any]]:
    """``launch --nnodes 2`` per engine and pair; the allreduce's bus bandwidth against the link."""
    from multigpu.contract.registry import available_backends

    rows = []
    port = 29600
    for engine in [e for e in ENGINES if e in available_backends()]:
        for kind, hosts in PAIRS.items():
            port += 1
            out = folder / f"bus-{engine}-{kind}"
            out.mkdir()
            say(f"lab: allreduce of {PAYLOAD[kind] >> 20} MiB across the {kind} pair {hosts}, {engine}")
            t0 = time.perf_counter()
            ended = _finish(_launch(lab, engine, hosts, out, [str(PAYLOAD[kind]), "3"], port))
            row: dict[str, Any] = {
                "engine": engine,
                "pair": kind,
                "hosts": hosts,
                "bytes": PAYLOAD[kind],
                "link": lab.plan.link(*hosts).bandwidth,
                "wall": time.perf_counter() - t0,
                "status": [rc for rc, _ in ended],
            }
            if all(rc == 0 for rc, _ in ended):
                got = json.loads((out / "rank0.json").read_text())
                t = statistics.median(got["seconds"])
                n = got["world"]
                row.update(seconds=got["seconds"], busbw=PAYLOAD[kind] * 2 * (n - 1) / n / t)
            else:
                row["error"] = " / ".join(e for _, e in ended)
            rows.append(row)
    return rows


# -- 3. faults ---------------------------------------------------------------------------
def _timed_run_fault(lab: Any, folder: Path, fault: Any, label: str) -> dict[str, Any]:
    spec = _cluster_with_source(lab, HOST, folder, "faults")
    p = lab.popen(
        HOST,
        [
            sys.executable,
            "-m",
            "multigpu",
            "run",
            "--cluster",
            str(spec),
            "--address",
            lab.address,
            "--plan",
            f"{HOST}*3,imac*4,{HOST}*3",
            "--random",
            "100000",
            "--timeout",
            "10",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(25)  # the workers are up and items flow
    running = p.poll() is None
    t0 = time.perf_counter()
    fault()
    try:
        _, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    return {
        "fault": label,
        "seconds": time.perf_counter() - t0,
        "status": p.returncode,
        "was_running": running,
        "error": err.strip().splitlines()[-1] if err.strip() else "",
        "timeout": 10,
    }


def faults(lab: Any, folder: Path, say: Any) -> list[dict[str, Any]]:
    """Each fault, the time to its error, and what the error names."""
    from multigpu.errors import InfeasibleError
    from multigpu.partition import Constraints, autopartition, graph_from_model

    out = []
    say("lab: faults: a link down during multigpu run")
    out.append(_timed_run_fault(lab, folder, lambda: lab.link("imac", False), "run: imac's link down"))
    lab.link("imac", True)
    lab.restart("imac")
    say("lab: faults: a host killed during multigpu run")
    out.append(_timed_run_fault(lab, folder, lambda: lab.kill("imac"), "run: imac's processes killed"))
    lab.restart("imac")
    say("lab: faults: a link down during multigpu launch")
    job = folder / "launch-fault"
    job.mkdir()
    procs = _launch(lab, "torch", PAIRS["LAN"], job, [str(1 << 20), "100000"], 29700, timeout="10")
    time.sleep(30)
    t0 = time.perf_counter()
    lab.link("imac", False)
    ended = _finish(procs, timeout=120)
    lab.link("imac", True)
    for (rc, err), host in zip(ended, PAIRS["LAN"]):
        out.append(
            {
                "fault": f"launch (torch): imac's link down, seen on {host}",
                "seconds": time.perf_counter() - t0,
                "status": rc,
                "error": err,
                "timeout": 10,
            }
        )
    say("lab: faults: a stage that does not fit pi2's memory")
    alex = multigpu.models.alexnet()
    fc = ["fc6", "relu6", "fc7", "relu7"]  # 218 MB of parameters
    small = json.loads(lab.cluster_file.read_text())
    for d in small["devices"]:
        if d["name"] == "pi2":  # NumPy: a worker light enough to start in 200 MB, so its stage is what fails
            d["memory"], d["backend"] = 200e6, "numpy"
    small_file = _cluster_with_source(lab, HOST, folder, "small-pi2", data=small)
    try:
        autopartition(
            graph_from_model(alex, 1),
            multigpu.partition.load_cluster(small_file),
            constraints=Constraints(pinned={n: "pi2" for n in fc}),
        )
        refused = "not refused"
    except InfeasibleError as e:
        refused = str(e).splitlines()[0][:300]
    lab.set_memory("pi2", 200_000_000)
    plan = [HOST] * 14 + ["pi2"] * 4 + [HOST]
    t0 = time.perf_counter()
    got = lab.run(
        HOST,
        [
            sys.executable,
            "-m",
            "multigpu",
            "run",
            "--model",
            "alexnet",
            "--cluster",
            str(small_file),
            "--address",
            lab.address,
            "--plan",
            ",".join(plan),
            "--random",
            "1",
            "--timeout",
            "300",
        ],
        timeout=900,
    )
    seconds = time.perf_counter() - t0
    kills = lab.hosts["pi2"].cgroups.memory()["oom_kills"]
    lab.set_memory("pi2", lab.plan.host("pi2").memory)
    lab.restart("pi2")
    out.append(
        {
            "fault": "run: fc6..relu7 (218 MB) forced onto pi2 (200 MB)",
            "seconds": seconds,
            "status": got.returncode,
            "error": got.stderr.strip().splitlines()[-1] if got.stderr.strip() else "",
            "planner": refused,
            "oom_kills": kills,
            "timeout": 300,
        }
    )
    return out


# -- 4. who can reach a job ------------------------------------------------------------
def who_can_reach(lab: Any, folder: Path, say: Any) -> dict[str, Any]:
    """Listening sockets of each command and whether another host reaches them."""
    from multigpu.contract.registry import available_backends

    engines = [b for b in ("numpy", "torch", "paddle", "mxnet") if b in available_backends()]
    single: list[Any] = []
    multi: list[Any] = []
    host, other = "desk-gpu", "pi1"
    addr = lab.plan.host(host).address
    base = {(a, p) for a, p, _ in lab.listening(host)}
    for b in engines:
        say(f"lab: who can reach `multigpu launch --nproc-per-node 2 --backend {b}` on one host")
        out = folder / f"single-{b}"
        out.mkdir()
        p = lab.popen(
            host,
            [
                sys.executable,
                "-m",
                "multigpu",
                "launch",
                "--nproc-per-node",
                "2",
                "--backend",
                b,
                "--",
                sys.executable,
                "-m",
                "multigpu.benchmarks.lab_rank",
                str(out),
                "4096",
                "1",
                "6",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        rows = _poll_listeners(
            lab, host, base, lambda out=out, p=p: (out / "listening.rank0").exists() or p.poll() is not None
        )
        tried = lab.reach(other, addr, sorted({port for _, port, _ in rows}))
        single.append(
            {
                "command": f"multigpu launch --nproc-per-node 2 --backend {b}",
                "status": _finish([p])[0][0],
                "listening": rows,
                "reach": tried,
            }
        )
    say("lab: who can reach `multigpu run` with a local Ray instance")
    local = folder / "local.json"
    local.write_text(
        json.dumps(
            {
                "devices": [
                    {"name": "d", "flops": 1e9, "power": 0, "backend": "numpy"},
                    {"name": "w", "flops": 1e9, "power": 0, "backend": "numpy"},
                ],
                "default_link": {"bandwidth": 1e8, "latency": 0},
                "source": "d",
            }
        )
    )
    p = lab.popen(
        host,
        [sys.executable, "-m", "multigpu", "run", "--cluster", str(local), "--plan", "d*3,w*7", "--random", "20000"],
        lab_env=False,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    t_end = time.monotonic() + 25
    rows = _poll_listeners(lab, host, base, lambda: time.monotonic() > t_end or p.poll() is not None)
    tried = lab.reach(other, addr, sorted({port for _, port, _ in rows}))
    env = {k: v for k, v in _ray_env_of(lab, host).items()}
    p.kill()
    p.wait()
    single.append(
        {"command": "multigpu run (a local Ray instance)", "status": 0, "listening": rows, "reach": tried, "auth": env}
    )
    for b in [e for e in ENGINES if e in engines]:
        say(f"lab: who can reach `multigpu launch --nnodes 2 --backend {b}` on desk-cpu and imac")
        out = folder / f"multi-{b}"
        out.mkdir()
        hosts = PAIRS["LAN"]
        before = {h: {(a, q) for a, q, _ in lab.listening(h)} for h in hosts}
        procs = _launch(lab, b, hosts, out, ["4096", "1", "6"], 29800 + len(multi))
        deadline = time.monotonic() + 300
        while (
            not (out / "listening.rank0").exists()
            and all(q.poll() is None for q in procs)
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        seen = {h: [r for r in _job_rows(lab.listening(h)) if (r[0], r[1]) not in before[h]] for h in hosts}
        tried = {
            h: lab.reach(other, lab.plan.host(h).address, sorted({q for _, q, _ in rows_})) for h, rows_ in seen.items()
        }
        multi.append(
            {
                "command": f"multigpu launch --nnodes 2 --backend {b}",
                "status": [rc for rc, _ in _finish(procs)],
                "listening": seen,
                "reach": tried,
                "given": {h: lab.plan.host(h).address for h in hosts},
            }
        )
    say("lab: a Ray node without the lab's token tries to join")
    head = lab.plan.head
    cluster_rows = [r for r in lab.listening(head)]
    bad = folder / "wrong-token"
    bad.write_text("0" * 64)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    t0 = time.perf_counter()
    got = lab.run(
        "pi2",
        [
            str(Path(sys.executable).with_name("ray")),
            "start",
            f"--address={lab.address}",
            f"--temp-dir={folder / 'intruder'}",
            "--node-ip-address",
            lab.plan.host("pi2").address,
            "--num-cpus",
            "1",
        ],
        env={**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(bad)},
        lab_env=False,
        timeout=180,
    )
    refused = {
        "status": got.returncode,
        "seconds": time.perf_counter() - t0,
        "error": next(
            (x for x in got.stderr.splitlines() if "Authentication" in x or "AuthToken" in x),
            got.stderr.strip().splitlines()[-1] if got.stderr.strip() else "",
        ),
    }
    return {
        "single": single,
        "multi": multi,
        "cluster": {
            "head": head,
            "listening": cluster_rows,
            "reach": lab.reach(other, lab.plan.host(head).address, sorted({q for _, q, _ in cluster_rows})),
        },
        "intruder": refused,
        "host": host,
        "from": other,
    }


def _ray_env_of(lab: Any, host: str) -> dict[str, str]:
    """RAY_AUTH_MODE of the raylet a local instance started in ``host`` (its environment)."""
    for pid in lab.pids(host):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"raylet" not in cmd or b"mgl-" in cmd:
                continue
            env = dict(
                x.split("=", 1)
                for x in Path(f"/proc/{pid}/environ").read_text(errors="replace").split("\0")
                if "=" in x
            )
            return {
                k: ("(a private file)" if k == "RAY_AUTH_TOKEN_PATH" else v)
                for k, v in env.items()
                if k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")
            }
        except OSError:
            continue
    return {}


def _poll_listeners(lab: Any, host: str, base: set, done: Any) -> list[tuple[str, int, str]]:
    """Every socket that listened in ``host`` while the command ran, beyond ``base`` (the
    host's own Ray node): a local Ray instance's raylet and gcs_server count."""
    seen: dict[tuple[str, int], tuple[str, int, str]] = {}
    deadline = time.monotonic() + 300
    while not done() and time.monotonic() < deadline:
        for r in lab.listening(host):
            if (r[0], r[1]) not in base:
                seen[(r[0], r[1])] = r
        time.sleep(0.2)
    for r in lab.listening(host):
        if (r[0], r[1]) not in base:
            seen[(r[0], r[1])] = r
    return sorted(seen.values())


# -- the benchmark -----------------------------------------------------------------------
def run(opts: Options) -> Result:
    """Bring the lab up (torch on every device), run the four parts, take it down."""
    from multigpu.lab import Lab

    say = (lambda s: print(s, file=sys.stderr, flush=True)) if opts.progress else (lambda s: None)
    folder = Path(tempfile.mkdtemp(prefix="multigpu-bench-lab-"))
    data: dict[str, Any] = {}
    try:
        with Lab("lab", backend="torch", echo=say) as lab:
            data["plan"] = lab.plan.to_dict()
            parts = (
                ("reach", lambda: who_can_reach(lab, folder, say)),
                ("allreduce", lambda: bus_bandwidth(lab, folder, say)),
                ("report", lambda: report_experiment(lab, folder, say, opts.progress)),
                ("faults", lambda: faults(lab, folder, say)),
            )
            for key, part in parts:
                try:
                    data[key] = part()
                except Exception as exc:  # noqa: BLE001 - one failed part must not hide the others' results
                    data.setdefault("failed", {})[key] = f"{type(exc).__name__}: {exc}"[:3000]
                    say(f"lab: the {key} part failed: {data['failed'][key][:300]}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return _result(data)


def _fmt_s(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.2f}"


def _report_table(data: dict[str, Any]) -> tuple[Table, list[str]]:
    rep = data["report"]
    flops = sum(st.flops for st in multigpu.models.alexnet().layer_stats(1))
    pi_gflops = flops / sum(rep["alexnet_layers"]["pi1"].values()) / 1e9
    single_ok = rep.get("single_unlimited", {})
    single = statistics.median(single_ok["seconds"]) if single_ok.get("ok") else math.nan
    sp = rep["split"]
    split_total = sp["param_seconds"] + sp["per_image"][0]
    ratio = split_total / single if math.isfinite(single) else math.nan
    small = rep.get("single_500 MB", {})
    largest = rep["predicted_split"] - rep["predicted_param_time"] + rep["predicted_param_max"]
    rows = [
        [
            "AlexNet on pi1 alone, 500 MB, no swap",
            "-",
            "OOM-killed" if not small.get("ok") else _fmt_s(statistics.median(small["seconds"])),
            f"{(small.get('peak') or 0) / 1e6:.0f} MB peak, {small.get('oom_kills', 0)} OOM kill(s)"
            + ("" if small.get("ok") else f": {small.get('error', '')}"),
        ],
        [
            "AlexNet on pi1 alone, memory unlimited (as if swap cost nothing)",
            _fmt_s(rep["predicted_single"]),
            _fmt_s(single),
            f"{(single_ok.get('peak') or 0) / 1e6:.0f} MB peak",
        ],
        [
            "split: parameters shipped (s)",
            (f"{_fmt_s(rep['predicted_param_time'])} (sum) / {_fmt_s(rep['predicted_param_max'])} (largest device)"),
            _fmt_s(sp["param_seconds"]),
            f"{sp['param_bytes'] / 1e6:.0f} MB to 4 workers at once",
        ],
        [
            "split: first image end to end (s)",
            _fmt_s(rep["predicted_split"] - rep["predicted_param_time"]),
            _fmt_s(sp["per_image"][0]),
            "hops: " + ", ".join(f"{a}->{b} {t:.2f}" for (a, b), t in zip(sp["routes"], sp["hops"])),
        ],
        [
            "split: shipping + one image (s)",
            f"{_fmt_s(rep['predicted_split'])} (sum) / {_fmt_s(largest)} (largest)",
            _fmt_s(split_total),
            "",
        ],
        [
            "split ÷ one Pi",
            f"{largest / rep['predicted_single']:.1f}x",
            f"{ratio:.1f}x",
            (
                f"the report: {REPORT['distributed'][0] / REPORT['single_pi'][1]:.1f}x to "
                f"{REPORT['distributed'][1] / REPORT['single_pi'][0]:.1f}x (600-900 s against 70-80 s)"
            ),
        ],
    ]
    report_table = Table(
        "The report's experiment: AlexNet on one Pi-class host against AlexNet split over the lab, "
        "parameters shipped at run time",
        ["case", "predicted", "measured", "notes"],
        rows,
        note=f"Scale: links at the file's rates (1x: WiFi 1 MB/s, LAN 10 MB/s); the Pi-class host has "
        f"a quarter of a core of this machine and computes AlexNet at {pi_gflops:.2f} GFLOP/s "
        f"(the profile), against the Pi 3's nominal 38.4 GFLOP/s: compute runs "
        f"{38.4 / pi_gflops:.1f}x slower than the nominal Pi, transfers at the report's speed. "
        f"Split: {' | '.join(_spans(SPLIT))}, the driver (host machine) desk-cpu.",
    )
    notes = [
        (
            f"Predicted split = the cost model with ship_params, which adds each layer's parameter transfer "
            f"from the source one after another ({_fmt_s(rep['predicted_param_time'])} s); the executor ships "
            f"every worker's parameters at once over distinct links, so the largest device's shipping "
            f"({_fmt_s(rep['predicted_param_max'])} s) is the term the run shows."
        ),
        (
            "The report's Pi swapped AlexNet (over 1 GB with its framework) to an SD card, and its 70-80 s are "
            "mostly that swapping; the lab has no swap, so the 500 MB Pi-class host is killed by the kernel's OOM "
            "killer instead, and the unlimited case shows the compute alone. Its distributed run (600-900 s) also "
            "shipped the parameters at WiFi and LAN speed, as here."
        ),
    ]
    return report_table, notes


def _bus_table(data: dict[str, Any]) -> Table:
    bus_rows = [
        [
            r["engine"],
            f"{r['pair']} {r['hosts'][0]}-{r['hosts'][1]}",
            f"{r['bytes'] >> 20} MiB",
            f"{r['link'] / 1e6:.3g}",
            "-" if "busbw" not in r else f"{r['busbw'] / 1e6:.3g}",
            "-" if "busbw" not in r else f"{r['busbw'] / r['link']:.2f}",
            " ".join(f"{t:.3f}" for t in r.get("seconds", [])) or r.get("error", ""),
        ]
        for r in data["allreduce"]
    ]
    bus = Table(
        "Multi-host data parallel: an allreduce across two lab hosts (`multigpu launch --nnodes 2`), "
        "bus bandwidth against the link",
        ["engine", "pair", "payload", "link, MB/s", "bus bandwidth, MB/s", "bus / link", "seconds each"],
        bus_rows,
        note="Bus bandwidth = bytes x 2(n-1)/n / time (n = 2): what each rank must send and receive over "
        "the link. Gloo (torch, Paddle) exchanges halves both ways; MXNet's dist_sync pushes to the "
        "parameter servers (one per host) and pulls the sum back.",
    )
    return bus


def _fault_table(data: dict[str, Any]) -> Table:
    fault_rows = [
        [
            f["fault"],
            _fmt_s(f["seconds"]),
            str(f["status"]),
            f.get("error", "")[:220]
            + (f" | planner: {f['planner']}" if "planner" in f else "")
            + (f" | OOM kills on pi2: {f['oom_kills']}" if "oom_kills" in f else ""),
        ]
        for f in data["faults"]
    ]
    fault_table = Table(
        "Faults: the time from each fault to a named error",
        ["fault", "seconds to the error", "exit status", "error"],
        fault_rows,
        note="Timeouts: --timeout 10 s for run and launch, 300 s for the memory case (its parameters "
        "travel at 1 MB/s).",
    )
    return fault_table


def _reach_table(data: dict[str, Any]) -> Table:
    reach = data["reach"]
    reach_rows = []
    for r in reach["single"]:
        auth = "; " + ", ".join(f"{k}={v}" for k, v in r["auth"].items()) if r.get("auth") else ""
        reach_rows.append(
            [r["command"], "one host (" + reach["host"] + ")", _addrs(r["listening"]) + auth, _reached(r["reach"])]
        )
    for r in reach["multi"]:
        for h, rows_ in r["listening"].items():
            reach_rows.append([r["command"], f"{h} (given {r['given'][h]})", _addrs(rows_), _reached(r["reach"][h])])
    c = reach["cluster"]
    reach_rows.append(
        ["the lab's Ray head (token authentication)", c["head"], _addrs(c["listening"]), _reached(c["reach"])]
    )
    intr = reach["intruder"]
    reach_table = Table(
        f"Who can reach a job: listening sockets (ss -ltnp) and a TCP connect from another lab host ({reach['from']})",
        ["command", "where", "listening on", "from another host"],
        reach_rows,
        note=f"A Ray node without the lab's token (`ray start --address` with another token): exit "
        f"status {intr['status']} after {intr['seconds']:.0f} s: {intr['error'][:200]}",
    )
    return reach_table


def _result(data: dict[str, Any]) -> Result:
    tables, notes = [], []
    for key, build in (
        ("report", _report_table),
        ("allreduce", _bus_table),
        ("faults", _fault_table),
        ("reach", _reach_table),
    ):
        if key not in data:
            notes.append(f"The {key} part failed: {data.get('failed', {}).get(key, 'it did not run')}")
            continue
        built = build(data)
        if isinstance(built, tuple):
            tables.append(built[0])
            notes += built[1]
        else:
            tables.append(built)
    return Result(
        name="lab",
        title=TITLE,
        tables=tables,
        notes=notes,
        plot=_plot(data),
        data=data,
        settings={"cluster": "lab", "backend": "torch", "split": SPLIT, "payload": PAYLOAD},
    )


def _plot(data: dict[str, Any]) -> Any:
    """Three panels: the report's experiment, bus bandwidth against the link, each fault's time."""

    def plot(fig: Any) -> None:
        axes = fig.subplots(1, 3)
        rep = data.get("report")
        if rep and rep.get("single_unlimited", {}).get("ok"):
            single = statistics.median(rep["single_unlimited"]["seconds"])
            sp = rep["split"]
            largest = rep["predicted_split"] - rep["predicted_param_time"] + rep["predicted_param_max"]
            names = ["one Pi\n(no memory limit)", "split: parameters\nshipped", "split: one image"]
            pred = [rep["predicted_single"], rep["predicted_param_max"], largest - rep["predicted_param_max"]]
            meas = [single, sp["param_seconds"], sp["per_image"][0]]
            xs = range(len(names))
            axes[0].bar([x - 0.2 for x in xs], pred, 0.4, label="predicted")
            axes[0].bar([x + 0.2 for x in xs], meas, 0.4, label="measured")
            axes[0].set_xticks(list(xs), names, fontsize=7)
            axes[0].set_yscale("log")
            axes[0].set_ylabel("seconds")
            axes[0].set_title("AlexNet: one Pi-class host against the split", fontsize=9)
            axes[0].legend(fontsize=7)
        bus = [r for r in data.get("allreduce", []) if "busbw" in r]
        if bus:
            labels = [f"{r['engine']}\n{r['pair']}" for r in bus]
            axes[1].bar(range(len(bus)), [r["busbw"] / r["link"] for r in bus])
            axes[1].axhline(1.0, color="k", lw=0.8)
            axes[1].set_xticks(range(len(bus)), labels, fontsize=7)
            axes[1].set_ylabel("bus bandwidth / link rate")
            axes[1].set_title("Allreduce across two hosts", fontsize=9)
        faults = data.get("faults", [])
        if faults:
            axes[2].barh(range(len(faults)), [f["seconds"] for f in faults])
            axes[2].set_yticks(range(len(faults)), [f["fault"][:38] for f in faults], fontsize=6)
            axes[2].set_xlabel("seconds to a named error")
            axes[2].set_title("Faults", fontsize=9)
        fig.tight_layout()

    return plot


def _spans(plan: list[str]) -> list[str]:
    out, start = [], 0
    for i in range(1, len(plan) + 1):
        if i == len(plan) or plan[i] != plan[start]:
            out.append(f"{plan[start]} x{i - start}")
            start = i
    return out


def _addrs(rows: Any) -> str:
    got: dict[str, set[str]] = {}
    for a, _, who in rows:
        got.setdefault(a, set()).update(x for x in who.split(",") if x)
    return "; ".join(f"{a} ({', '.join(sorted(w)) or '?'})" for a, w in sorted(got.items())) or "nothing"


def _reached(tried: dict) -> str:
    counts: dict[str, int] = {}
    for what in tried.values():
        counts[what] = counts.get(what, 0) + 1
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) or "-"
