"""Plans that run on a local Ray instance: outputs equal to the unpartitioned model,
mixed frameworks, streaming order, the profiler, and every fault with a clear error and
nothing left behind. One Ray instance serves the whole module (the fault test that
kills a worker starts its own, in a subprocess, to prove that instance goes away too)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import multigpu
from multigpu.errors import DeviceError, InputError, PlanError, WorkerDiedError, WorkerTimeoutError
from multigpu.execution import Session, profile, run_partitioned
from multigpu.execution.cores import usable_cores
from multigpu.execution.engine import inline_payload_bytes
from multigpu.partition import Cluster, DeviceSpec, LinkSpec, autopartition, evaluate, graph_from_model, load_cluster

ray = pytest.importorskip("ray", reason="the executor needs Ray (pip install 'multigpu[cluster]')")

LENET = multigpu.models.lenet()
PARAMS = LENET.init_params(1, scale=0.1)  # larger than the 0.01 init, so outputs differ by input
FRAMEWORKS = [b for b in ("torch", "paddle", "mxnet") if b in multigpu.available_backends()]


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_gone(pids: set[int], seconds: float = 20.0) -> set[int]:
    """The pids still alive after waiting up to ``seconds``."""
    deadline = time.monotonic() + seconds
    left = {p for p in pids if alive(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = {p for p in left if alive(p)}
    return left


@pytest.fixture(scope="module")
def local_ray():
    """One Ray instance for the module; on teardown, every process it or a run started must be gone."""
    import logging

    if ray.is_initialized():  # pragma: no cover - another module left one running
        ray.shutdown()
    before = descendants(os.getpid())
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    seen = descendants(os.getpid()) - before
    assert seen, "ray.init started no process"
    workers: set[int] = set()
    yield workers
    ray.shutdown()
    left = wait_gone(seen | workers | (descendants(os.getpid()) - before))
    assert not left, f"processes left behind after ray.shutdown: {sorted(left)}"


def record(workers: set[int]):
    """An ``on_workers`` callback that remembers every worker process."""

    def cb(info):
        workers.update(w["pid"] for w in info if not w["local"])

    return cb


def reference(x: np.ndarray, params=PARAMS) -> np.ndarray:
    be = multigpu.backend("numpy")
    dev = multigpu.Device("cpu", 0)
    out = be.to_numpy(LENET.forward(be, [be.from_numpy(p, dev) for p in params], be.from_numpy(x, dev)))
    return out.reshape(len(x), -1)


def cluster(*workers: DeviceSpec, driver_backend: str = "numpy") -> Cluster:
    return Cluster(
        devices=(DeviceSpec("driver", 1e9, 0.0, backend=driver_backend), *workers),
        source="driver",
        default_link=LinkSpec(1e8, 1e-3),
    )


def inputs(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 1, 28, 28), dtype=np.float32)


def test_two_and_three_stage_runs_equal_the_unpartitioned_forward(local_ray):
    be = FRAMEWORKS[0] if FRAMEWORKS else "numpy"
    cl = cluster(DeviceSpec("a", 1e9, 0.0, backend=be, threads=1), DeviceSpec("b", 1e9, 0.0, backend=be, threads=1))
    x = inputs(6)
    ref = reference(x)
    two = run_partitioned(LENET, PARAMS, ["a"] * 5 + ["b"] * 5, x, cl, on_workers=record(local_ray))
    three = run_partitioned(LENET, PARAMS, ["a"] * 3 + ["b"] * 4 + ["driver"] * 3, x, cl, on_workers=record(local_ray))
    for r, stages in ((two, 2), (three, 3)):
        np.testing.assert_allclose(r.outputs, ref, atol=1e-5, rtol=0)
        assert len(r.stages) == stages and r.stage_times.shape == (6, stages) and r.hop_times.shape == (6, stages + 1)
        assert (r.stage_times > 0).all() and (r.hop_times > 0).all()
        # The parts add up to the end-to-end time: nothing between the stamps is lost.
        np.testing.assert_allclose(r.stage_times.sum(1) + r.hop_times.sum(1), r.end_to_end, rtol=1e-9, atol=1e-9)
        hops = sum(a != b for a, b in r.hop_routes)
        assert r.prediction is not None and len(r.compare_rows()) == stages + hops + 1
    shipped = sum(p.nbytes for p in PARAMS)  # every parameter lives on a worker
    assert two.param_bytes == shipped and two.param_seconds > 0
    assert three.param_bytes == sum(PARAMS[i].nbytes for i in (0, 1, 2, 3))  # fc3/fc4 stay in the driver
    assert [w["device"] for w in three.workers if w["local"]] == ["driver"]
    assert three.hop_routes == [("driver", "a"), ("a", "b"), ("b", "driver"), ("driver", "driver")]


@pytest.mark.skipif(len(FRAMEWORKS) < 3, reason="needs torch, paddle and mxnet")
def test_mixed_frameworks_each_in_its_own_process_give_the_same_outputs(local_ray):
    cl = cluster(
        DeviceSpec("t", 1e9, 0.0, backend="torch", threads=1),
        DeviceSpec("p", 1e9, 0.0, backend="paddle", threads=1),
        DeviceSpec("m", 1e9, 0.0, backend="mxnet", threads=1),
    )
    x = inputs(5, seed=2)
    r = run_partitioned(LENET, PARAMS, ["t"] * 3 + ["p"] * 4 + ["m"] * 3, x, cl, on_workers=record(local_ray))
    np.testing.assert_allclose(r.outputs, reference(x), atol=1e-5, rtol=0)
    pids = {w["device"]: w["pid"] for w in r.workers}
    assert {w["device"]: w["backend"] for w in r.workers} == {"t": "torch", "p": "paddle", "m": "mxnet"}
    assert len(set(pids.values())) == 3 and os.getpid() not in pids.values()


@pytest.mark.parametrize("window", [None, 2])
def test_streaming_returns_every_item_once_in_order(local_ray, window):
    cl = cluster(DeviceSpec("a", 1e9, 0.0, backend="numpy"), DeviceSpec("b", 1e9, 0.0, backend="numpy"))
    x = inputs(30, seed=3)
    r = run_partitioned(
        LENET,
        PARAMS,
        ["a"] * 3 + ["driver"] * 3 + ["b"] * 4,
        x,
        cl,
        stream=True,
        window=window,
        warmup=0,
        on_workers=record(local_ray),
    )
    assert r.outputs.shape == (30, 10)
    np.testing.assert_allclose(r.outputs, reference(x), atol=1e-5, rtol=0)  # row j is input j's
    assert r.items_per_second and r.items_per_second > 0 and r.stream
    assert [row["kind"] for row in r.compare_rows()] == ["stage"] * 3 + ["stream"]


def test_batches_split_the_inputs_and_keep_their_order(local_ray):
    cl = cluster(DeviceSpec("a", 1e9, 0.0, backend="numpy"))
    x = inputs(7, seed=4)
    r = run_partitioned(LENET, PARAMS, ["a"] * 10, x, cl, batch=3, on_workers=record(local_ray))
    np.testing.assert_allclose(r.outputs, reference(x), atol=1e-5, rtol=0)  # all 7 rows, the short item's too
    # The figures are per item of 3 rows: the last item (1 row) is run but not timed, and says so.
    assert r.end_to_end.shape == (2,) and r.stage_times.shape == (2, 1) and r.hop_bytes[0] == 3 * 28 * 28 * 4
    assert any("1 of 3 rows" in n for n in r.notes) and "1 of 3 rows" in r.format_timing()


def test_fewer_inputs_than_one_batch_is_an_input_error_naming_both(local_ray):
    cl = cluster(DeviceSpec("a", 1e9, 0.0, backend="numpy"))
    with pytest.raises(InputError, match=r"2 inputs are fewer than one item of batch 64.*--random 64"):
        run_partitioned(LENET, PARAMS, ["a"] * 10, inputs(2, seed=4), cl, batch=64, on_workers=record(local_ray))


def test_a_session_runs_several_plans_on_the_same_workers(local_ray):
    cl = cluster(
        DeviceSpec("a", 1e9, 0.0, backend="numpy"),
        DeviceSpec("b", 1e9, 0.0, backend="numpy"),
        DeviceSpec("c", 1e9, 0.0),
    )  # no backend: not a worker
    x = inputs(4, seed=6)
    with Session(cl, on_workers=record(local_ray)) as s:
        assert sorted(s.workers.actors) == ["a", "b"]
        runs = [
            s.run(LENET, PARAMS, plan, x) for plan in (["a"] * 10, ["b"] * 4 + ["a"] * 6, ["driver"] * 2 + ["b"] * 8)
        ]
        with pytest.raises(PlanError, match="device 'c' cannot run"):
            s.run(LENET, PARAMS, ["c"] * 10, x)
    for r in runs:
        np.testing.assert_allclose(r.outputs, reference(x), atol=1e-5, rtol=0)
    pids = [{w["device"]: w["pid"] for w in r.workers if not w["local"]} for r in runs]
    assert pids[0]["a"] == pids[1]["a"] and pids[1]["b"] == pids[2]["b"]  # the same processes
    assert runs[1].param_bytes == sum(p.nbytes for p in PARAMS)
    with pytest.raises(PlanError, match="not open"):
        s.run(LENET, PARAMS, ["a"] * 10, x)


def test_compiled_graph_engine_gives_the_same_outputs_in_order(local_ray):
    cl = cluster(DeviceSpec("a", 1e9, 0.0, backend="numpy"), DeviceSpec("b", 1e9, 0.0, backend="numpy"))
    x = inputs(12, seed=5)
    ref = reference(x)
    for stream in (False, True):
        r = run_partitioned(
            LENET,
            PARAMS,
            ["driver"] * 2 + ["a"] * 3 + ["b"] * 5,
            x,
            cl,
            engine="compiled",
            stream=stream,
            on_workers=record(local_ray),
        )
        np.testing.assert_allclose(r.outputs, ref, atol=1e-5, rtol=0)
        assert r.engine == "compiled"
    with pytest.raises(PlanError, match="driver's stages at the start or the end"):
        run_partitioned(
            LENET,
            PARAMS,
            ["a"] * 3 + ["driver"] * 2 + ["b"] * 5,
            x[:1],
            cl,
            engine="compiled",
            on_workers=record(local_ray),
        )


def test_the_profile_loads_in_the_cost_model_and_prices_runs(local_ray, tmp_path):
    backend = FRAMEWORKS[0] if FRAMEWORKS else "numpy"
    res = profile(
        "lenet",
        [{"name": "w1", "backend": backend, "threads": 1}, {"name": "w2", "backend": "numpy"}],
        driver={"name": "host", "backend": "numpy"},
        repeats=4,
        warmup=1,
        link_repeats=4,
        progress=False,
    )
    path = res.write(tmp_path / "measured.json")
    cl = load_cluster(path)
    assert cl.names == ["host", "w1", "w2"] and cl.source == "host" == cl.sink
    g = graph_from_model(LENET, 1)
    for d in cl.devices:
        times = d.measured(g.name)
        assert list(times) == g.names and all(t > 0 for t in times.values())
        assert d.stage_overhead >= 0 and d.flops == pytest.approx(g.flops.sum() / sum(times.values()))
    assert {frozenset(ln.between) for ln in cl.links} == {
        frozenset(p) for p in [("host", "w1"), ("host", "w2"), ("w1", "w2")]
    }
    assert all(f.latency > 0 and f.bandwidth > 0 for f in res.links)
    assert res.hop_vs_bare and all(h.ratio > 0 for h in res.hop_vs_bare)
    assert {x.layer for x in res.layers} == set(g.names) and all(x.q1 <= x.median <= x.q3 for x in res.layers)
    # One host, this machine's cores; every process's CPU per transfer; the driver relays.
    assert [h.name for h in cl.hosts] == [socket.gethostname()] and cl.hosts[0].cores == usable_cores()
    assert all(d.host == socket.gethostname() for d in cl.devices)
    # What Ray adds to the hardware is the cluster's engine profile, not the devices'.
    eng = cl.engine
    assert eng is not None and eng.name == "ray" and sorted(eng.transfer_cpu) == cl.names
    # The local instance keeps Ray's own inline threshold, and the profile records it.
    assert eng.inline_bytes == inline_payload_bytes() == 100 * 1024 - 256
    assert all(f.fixed + f.per_byte > 0 for f in eng.transfer_cpu.values())
    assert eng.relay is not None and eng.relay.device == "host"
    routes = {s.route for s in res.transfer_cpu.samples}
    assert ("w1",) in routes and ("w2",) in routes and ("w1", "w2") in routes
    # Each worker alone also one way (the payload in, one float32 out), so the profile
    # prices a byte received apart from a byte sent.
    assert {(s.route, s.sent) for s in res.transfer_cpu.samples if s.sent != s.nbytes} == {(("w1",), 4), (("w2",), 4)}
    assert all(f.receive_per_byte is not None for f in eng.transfer_cpu.values())
    assert all(t > 0 for s in res.transfer_cpu.samples for t in s.cpu.values())
    # The report gives each device's two figures and the relay its one.
    text = res.format()
    assert all(f"transfer CPU of {d.name}:" in text for d in cl.devices) and "ns/byte received" in text
    relay_line = next(line for line in text.splitlines() if line.strip().startswith("relay host:"))
    assert "received" not in relay_line
    # Every device also timed whole passes one after another (the driver back to back, a
    # worker call after call): a plan with every layer on it is priced so.
    assert all(eng.warm_pass[d.name][g.name] > 0 for d in cl.devices)
    for d in cl.devices:
        local = evaluate(g, cl, [d.name] * g.n)
        cold = sum(d.measured(g.name).values()) + d.stage_overhead
        assert local.compute_time + local.stage_time == pytest.approx(min(eng.warm_pass[d.name][g.name], cold)), d.name
    assert any(p.device == "w1" and p.warm is not None for p in res.passes)
    plan = autopartition(g, cl)
    # A split plan prices a layer at its measured time; a plan on one device (which one wins
    # depends on the timings) at its warm pass, checked just above.
    if len(set(plan.assignment)) > 1:
        assert (
            plan.breakdown.layers[0].compute_time == cl.devices[cl.index(plan.assignment[0])].measured(g.name)["conv1"]
        )
    r = run_partitioned(LENET, PARAMS, ["w1"] * 5 + ["w2"] * 5, inputs(3), cl, on_workers=record(local_ray))
    assert r.prediction.measured == ["host", "w1", "w2"]
    bd = evaluate(g, cl, ["w1"] * 5 + ["w2"] * 5)
    assert r.prediction.bottleneck == bd.bottleneck
    assert bd.hosts[0].load == pytest.approx(
        sum(d.compute_time + d.stage_overhead + d.transfer_cpu for d in bd.devices)
    )
    assert all(f.serial_fixed is not None and f.serial_fixed <= f.fixed for f in eng.transfer_cpu.values())
    assert "predicted" in r.format_compare() and "end to end" in r.format_compare()
    # A local instance passes every payload inside Ray's messages: no stream to probe, no message bytes.
    assert res.streams == [] and eng.message_bytes is None


def test_a_stream_probe_loads_the_link_one_way(local_ray):
    """The profiler's stream probe: payloads through the engine to a worker that computes and replies
    with one value; its steady time per item (here a local instance: the CPU sets it)."""
    from multigpu.execution import engine as ray_engine
    from multigpu.execution.stream_fitting import time_streams
    from multigpu.execution.worker import PROBE_SEND

    cl = cluster(DeviceSpec("a", 1e9, 0.0, backend="numpy"))
    with Session(cl, on_workers=record(local_ray)) as s:
        actor = s.workers.actors["a"]
        ray.get(actor.prepare_profile.remote(LENET, None, 1, 0))
        ray.get(actor.set_probe_work.remote(2))
        x = np.arange(16384, dtype=np.float32)
        res = ray_engine.run_chain(s.workers, [("a", PROBE_SEND)], ["probe"], [x] * 3, window=3)
        assert [y.tolist() for y in res.outputs] == [[0.0]] * 3  # one value back, the payload's first
        got = time_streams(s.workers, ray_engine, ["a"], 65536, 8, 1, False)
    assert len(got) == 1 and got[0].worker == "a" and got[0].nbytes == 65536 and got[0].items == 8
    assert 0 < got[0].seconds < 1.0


def test_a_link_probe_waits_then_computes_and_passes_the_payload_on(local_ray):
    """The profiler's link probe: the worker sleeps the wait (a hop's processes wait as long as
    a stage keeps them waiting), computes its layers and passes the payload on unchanged;
    without the wait it only computes."""
    from multigpu.execution import engine as ray_engine
    from multigpu.execution.link_fitting import LINK_PROBE_WAIT
    from multigpu.execution.worker import PROBE

    cl = cluster(DeviceSpec("a", 1e9, 0.0, backend="numpy"))
    with Session(cl, on_workers=record(local_ray)) as s:
        actor = s.workers.actors["a"]
        ray.get(actor.prepare_profile.remote(LENET, None, 1, 0))
        x = np.arange(1024, dtype=np.float32)
        spans = {}
        for wait in (LINK_PROBE_WAIT, 0.0):
            ray.get(actor.set_probe_work.remote(2, wait))
            res = ray_engine.run_chain(s.workers, [("a", PROBE)], ["probe"], [x] * 3, window=1)
            assert all(np.array_equal(y, x) for y in res.outputs)
            spans[wait] = [tr[2] - tr[1] for tr in res.traces]
    assert min(spans[LINK_PROBE_WAIT]) >= LINK_PROBE_WAIT
    assert min(spans[0.0]) < LINK_PROBE_WAIT


def _stop_later(local_ray, device: str, sig: int, delay: float, stopped: list[int]):
    def cb(info):
        record(local_ray)(info)
        pid = next(w["pid"] for w in info if w["device"] == device)

        def fire():
            stopped.append(pid)
            os.kill(pid, sig)

        threading.Timer(delay, fire).start()

    return cb


def test_a_hung_worker_times_out_naming_its_stage_and_device(local_ray):
    cl = cluster(DeviceSpec("a", 1e9, 0.0, backend="numpy"), DeviceSpec("b", 1e9, 0.0, backend="numpy"))
    stopped: list[int] = []
    t0 = time.monotonic()
    try:
        with pytest.raises(
            WorkerTimeoutError,
            match="stage 2 \\(pool2..fc4\\) on device 'b' \\(its worker: pid \\d+ "
            "on host [^)]+\\) did not finish item \\d+ within 3 s",
        ):
            run_partitioned(
                LENET,
                PARAMS,
                ["a"] * 5 + ["b"] * 5,
                inputs(1000),
                cl,
                timeout=3.0,
                on_workers=_stop_later(local_ray, "b", signal.SIGSTOP, 1.0, stopped),
            )
        assert time.monotonic() - t0 < 60
    finally:
        for pid in stopped:  # let the killed-but-stopped process die
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert stopped and not wait_gone(set(stopped))


def test_a_worker_killed_inside_a_compiled_graph_raises_without_hanging(local_ray):
    cl = cluster(DeviceSpec("a", 1e9, 0.0, backend="numpy"), DeviceSpec("b", 1e9, 0.0, backend="numpy"))
    killed: list[int] = []
    t0 = time.monotonic()
    with pytest.raises(
        WorkerDiedError, match="stage 2 \\(pool2..fc4\\) on device 'b'|a worker of the compiled graph.*device 'b'"
    ):
        run_partitioned(
            LENET,
            PARAMS,
            ["a"] * 5 + ["b"] * 5,
            inputs(20000),
            cl,
            engine="compiled",
            stream=True,
            timeout=20.0,
            on_workers=_stop_later(local_ray, "b", signal.SIGKILL, 1.0, killed),
        )
    assert killed and time.monotonic() - t0 < 90
    assert not wait_gone(set(killed))


def test_a_missing_ray_resource_is_named_before_anything_starts(local_ray):
    cl = cluster(DeviceSpec("pi", 1e9, 0.0, backend="numpy", resources={"pi1": 1}))
    with pytest.raises(PlanError, match="device 'pi' asks for Ray resource pi1=1.*--resources='\\{\"pi1\": 1\\}'"):
        run_partitioned(LENET, PARAMS, ["pi"] * 10, inputs(1), cl)


def test_a_worker_side_error_names_the_device(local_ray):
    if not FRAMEWORKS or multigpu.backend(FRAMEWORKS[0]).gpu_count() > 0:
        pytest.skip("needs a framework that sees no GPU")
    cl = cluster(DeviceSpec("g", 1e9, 0.0, backend=FRAMEWORKS[0], device="gpu:0"))
    with pytest.raises(DeviceError, match="device 'g': .*gpu:0"):
        run_partitioned(LENET, PARAMS, ["g"] * 10, inputs(1), cl, on_workers=record(local_ray))


KILL_SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    import numpy as np
    import multigpu
    from multigpu.errors import WorkerDiedError
    from multigpu.partition import Cluster, DeviceSpec, LinkSpec
    sys.path.insert(0, sys.argv[1])
    from test_execution_ray import descendants

    cl = Cluster(devices=(DeviceSpec("driver", 1e9, 0, backend="numpy"), DeviceSpec("a", 1e9, 0, backend="numpy"),
                          DeviceSpec("b", 1e9, 0, backend="numpy")), source="driver", default_link=LinkSpec(1e8, 1e-3))
    seen, killed = set(), {}

    def on_workers(info):
        pid = next(w["pid"] for w in info if w["device"] == "b")
        def kill():
            seen.update(descendants(os.getpid()))
            killed["at"] = time.monotonic()
            os.kill(pid, signal.SIGKILL)
        threading.Timer(1.0, kill).start()

    x = np.random.default_rng(0).random((20000, 1, 28, 28), dtype=np.float32)
    try:
        multigpu.run_partitioned("lenet", None, ["a"] * 5 + ["b"] * 5, x, cl, stream=True, timeout=20.0,
                                 on_workers=on_workers)
        print(json.dumps({"error": None}))
    except WorkerDiedError as e:
        print(json.dumps({"error": str(e), "after_kill": time.monotonic() - killed["at"], "pids": sorted(seen)}))
""")


def test_a_killed_worker_raises_naming_its_stage_and_leaves_nothing_behind(tmp_path):
    script = tmp_path / "kill.py"
    script.write_text(KILL_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=170,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["error"] is not None, "the run finished before the kill"
    assert "stage 2 (pool2..fc4) on device 'b'" in out["error"] and "died" in out["error"]
    assert out["after_kill"] < 20.0  # well within the run's timeout: no hang
    assert len(out["pids"]) >= 3  # raylet, gcs_server and the workers at least
    left = wait_gone(set(out["pids"]))
    assert not left, f"processes of the killed run still alive: {sorted(left)}"


JOIN_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import multigpu
    from multigpu.errors import PlanError
    from multigpu.partition import Cluster, DeviceSpec, LinkSpec

    address = sys.argv[1]
    cl = Cluster(devices=(DeviceSpec("driver", 1e9, 0, backend="numpy"),
                          DeviceSpec("pi", 1e9, 0, backend="numpy", resources={"pi1": 1}),
                          DeviceSpec("desk", 1e9, 0, backend="numpy", resources={"desk": 1})),
                 source="driver", default_link=LinkSpec(1e8, 1e-3))
    x = np.random.default_rng(0).random((3, 1, 28, 28), dtype=np.float32)
    r = multigpu.run_partitioned("lenet", None, ["pi"] * 5 + ["desk"] * 5, x, cl, address=address)
    import ray
    out = {"workers": r.workers, "still_connected": ray.is_initialized(), "outputs": r.outputs.tolist()}
    bad = Cluster(devices=cl.devices[:1] + (DeviceSpec("gpu", 1e9, 0, backend="numpy", resources={"GPU": 1}),),
                  source="driver")
    try:
        multigpu.run_partitioned("lenet", None, ["gpu"] * 10, x, bad, address=address)
    except PlanError as e:
        out["missing"] = str(e)
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_joining_a_started_cluster_pins_workers_by_resources_and_leaves_it_running(tmp_path):
    """`ray start --head` with custom resources (as on each host of a real cluster),
    then a run with --address: each device's worker lands where its resources are,
    the driver disconnects afterwards, and the cluster keeps running."""
    import tempfile

    temp = tempfile.mkdtemp(prefix="mgray", dir="/tmp")  # short: Ray's socket paths have a length limit
    # Two distinct free ports, held open together while chosen: the GCS's, and the dashboard
    # agent's, whose fixed default (52365) a random GCS port can hit (Ray then refuses to start).
    with socket.socket() as gcs_sock, socket.socket() as agent_sock:
        gcs_sock.bind(("", 0))
        agent_sock.bind(("", 0))
        port, agent_port = gcs_sock.getsockname()[1], agent_sock.getsockname()[1]
    ray_bin = str(Path(sys.executable).parent / "ray")
    # The cluster's own token, as a real cluster's head would hand its hosts: the test must
    # not depend on a ~/.ray/auth_token that an earlier run or test happened to leave.
    from multigpu.lab.raynodes import write_token

    token = write_token(tmp_path / "auth_token")
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    start = subprocess.run(
        [
            ray_bin,
            "start",
            "--head",
            f"--port={port}",
            f"--dashboard-agent-listen-port={agent_port}",
            "--num-cpus=2",
            '--resources={"pi1": 1, "desk": 1}',
            f"--temp-dir={temp}",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )

    def started() -> set[int]:
        roots = set()
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if temp in Path(f"/proc/{entry}/cmdline").read_text(errors="replace"):
                        roots.add(int(entry))
                except OSError:
                    pass
        return roots | {c for r in roots for c in descendants(r)}

    try:
        assert start.returncode == 0, start.stderr[-2000:]
        proc = subprocess.run(
            [sys.executable, "-c", JOIN_SCRIPT, f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=170,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert {w["device"] for w in out["workers"]} == {"pi", "desk"} and not out["still_connected"]
        x = np.random.default_rng(0).random((3, 1, 28, 28), dtype=np.float32)
        np.testing.assert_allclose(np.array(out["outputs"]), reference(x, LENET.init_params(0)), atol=1e-5)
        assert "asks for Ray resource GPU=1" in out["missing"]
        assert started(), "the cluster the run joined must still be running"
    finally:
        pids = started()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert not wait_gone(pids)
