"""The emulated lab, brought up once for this module from the shipped ``lab`` cluster
(5 hosts: two Pi-class hosts on WiFi, two desktop hosts and an iMac on a LAN), with the
CLI, and taken down by the last test, which checks that the machine is as it was.

Scaled to run in seconds: links 5x the file's bandwidths (WiFi 5 MB/s, LAN 50 MB/s), the
slowest device half a core; pi2's memory is lowered to 200 MB so that AlexNet's fc6 and
fc7 (218 MB of parameters) do not fit it.

Needs root (network namespaces, tc, cgroups): skipped, with that reason, elsewhere.
Long measurements (the predicted-against-measured table, the report's experiment, bus
bandwidth) are in ``multigpu bench plans --lab`` and ``multigpu bench lab``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from multigpu.lab.system import scheduler_tick_us
from multigpu.partition import Constraints, autopartition, graph_from_model, load_cluster
from multigpu.partition.units import fmt_bytes

HERE = Path(__file__).resolve().parent
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="the lab needs root: it creates network namespaces, shapes links with tc and limits hosts with cgroups",
    ),
]

SCALE = 5.0
CPU_SCALE = 0.5
PI2_MEMORY = 200e6
#: The batch of the profile and of the plan run on it: LeNet's pool1 then carries 865 KB over
#: WiFi (0.17 s at 5 MB/s) and pool2 205 KB, so the run's time is its transfers', as in the
#: report's lab. At batch 1 the same hops (14 KB, 3 KB) take 1-3 ms beside Ray's 10-20 ms per
#: hop, and a 2-core machine's scheduling noise moved the end-to-end error from -42% to +43%.
BATCH = 64
FC = ["fc6", "relu6", "fc7", "relu7"]  # 218 MB of AlexNet's parameters: more than pi2 has


def multigpu(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "multigpu", *args], check=False, capture_output=True, text=True, timeout=timeout
    )


def machine_state() -> dict:
    """What the lab could leave behind: namespaces, links, cgroups, folders, Ray processes."""
    from multigpu.lab.cgroups import find_lab_cgroups

    ns = sorted(p.name for p in Path("/run/netns").glob("mgl-*")) if Path("/run/netns").exists() else []
    links = subprocess.run(["ip", "-o", "link"], check=False, capture_output=True, text=True).stdout
    ray = []
    for pid in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "mgl-" in cmd and ("raylet" in cmd or "gcs_server" in cmd or "ray" in cmd):
            ray.append(cmd[:120])
    return {
        "netns": ns,
        "links": sorted(re.findall(r"^\d+: ([^:@]+)", links, re.MULTILINE)),
        "cgroups": sorted(str(p) for p in find_lab_cgroups("mgl-")),
        "ray": sorted(ray),
        "run": sorted(p.name for p in Path("/run/multigpu-lab").glob("*"))
        if Path("/run/multigpu-lab").exists()
        else [],
        "tmp": sorted(p.name for p in Path("/tmp").glob("mgl-*")),
    }


@pytest.fixture(scope="module")
def before() -> dict:
    return machine_state()


@pytest.fixture(scope="module")
def lab(before, tmp_path_factory):
    from multigpu.lab import Lab, down_all

    data = load_cluster("lab").to_dict()
    for d in data["devices"]:
        if d["name"] == "pi2":
            d["memory"] = PI2_MEMORY
    folder = tmp_path_factory.mktemp("lab")
    (folder / "lab.json").write_text(json.dumps(data))
    t0 = time.monotonic()
    up = multigpu(
        "lab",
        "up",
        str(folder / "lab.json"),
        "--backend",
        "numpy",
        "--device-backend",
        "imac=torch",
        "--cpu-scale",
        str(CPU_SCALE),
        "--bandwidth-scale",
        str(SCALE),
        "--json",
    )
    assert up.returncode == 0, up.stderr
    st = json.loads(up.stdout)
    lab = Lab.attach(st["id"])
    lab.up_seconds = time.monotonic() - t0
    lab.folder = folder
    yield lab
    down_all(st["id"])  # the last test takes it down already; this is for a failed run


def variant(lab, folder: Path, **changes) -> Path:
    """The lab's emulated cluster with other fields (e.g. another source), as a file."""
    data = json.loads(lab.cluster_file.read_text())
    data.update(changes)
    if "source" in changes:
        data["sink"] = changes["source"]
    path = folder / f"variant-{abs(hash(json.dumps(changes, sort_keys=True)))}.json"
    path.write_text(json.dumps(data))
    return path


def run_in(lab, host: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return lab.run(host, [sys.executable, "-m", "multigpu", *args], timeout=timeout)


# -- the lab as built ---------------------------------------------------------------
def test_every_host_is_a_namespace_with_its_address_name_share_and_limit(lab):
    st = lab.status()
    assert [h["name"] for h in st["hosts"]] == ["pi1", "pi2", "desk-cpu", "desk-gpu", "imac"]
    assert lab.up_seconds < 90
    for h, plan in zip(st["hosts"], lab.plan.hosts):
        assert h["address"] == plan.address and h["address"].startswith("198.18.0.")
        assert lab.run(h["name"], ["hostname"]).stdout.strip() == h["name"]
        quota = Path(lab.hosts[h["name"]].cgroups.dirs["cpu"], "cpu.cfs_quota_us").read_text()
        assert int(quota) == plan.quota_us
        limit = h["memory"]["limit"]
        assert (limit >= 2**62) if plan.memory is None else abs(limit - plan.memory) < 8192
        assert h["processes"] >= 2  # its Ray node
    # The Ray node of each host offers its device as a resource, with token authentication.
    assert Path(st["token"]).stat().st_mode & 0o077 == 0
    # Nothing leaves the lab: no route to the machine's own addresses.
    code = (
        "import socket\ntry: socket.create_connection(('192.0.2.1', 9), timeout=1)\nexcept OSError as e: print(e.errno)"
    )
    assert lab.run("pi1", [sys.executable, "-c", code]).stdout.strip() in ("101", "113")  # unreachable


def _throttled(lab, host: str) -> int:
    stat = Path(lab.hosts[host].cgroups.dirs["cpu"], "cpu.stat").read_text()
    return int(re.search(r"^throttled_time (\d+)", stat, re.MULTILINE).group(1))


def test_a_host_computes_at_its_cpu_share(lab):
    """A busy loop on pi1 (half a core) is held to its quota: it gets at most half a core of
    CPU time per second, and the cgroup throttles it. imac (0.91 cores) gets a quota over a
    period no shorter than the kernel's tick: with a period shorter than the tick (1098 us
    against 4 ms) a busy loop got 0.60 of a core here, at 4000 us 0.91.

    Only the caps are asserted. The machine's other load can make a host compute less than its
    share (CI measured 0.84 of imac's 0.91 once), never more than its quota allows, so how
    close a host comes to its share is a benchmark, not a test."""
    code = (
        "import time\nw,c=time.perf_counter(),time.process_time()\nx=0\nfor i in range(4_000_000): x+=i\n"
        "print((time.process_time()-c)/(time.perf_counter()-w))"
    )
    before = {"pi1": _throttled(lab, "pi1")}
    share = float(lab.run("pi1", [sys.executable, "-c", code]).stdout)
    assert share <= CPU_SCALE * 1.15, share
    assert _throttled(lab, "pi1") > before["pi1"]
    imac = lab.plan.host("imac")
    assert imac.period_us >= scheduler_tick_us()
    cpu = Path(lab.hosts["imac"].cgroups.dirs["cpu"])
    assert int((cpu / "cpu.cfs_period_us").read_text()) == imac.period_us
    assert int((cpu / "cpu.cfs_quota_us").read_text()) == imac.quota_us
    assert imac.quota_us == round(imac.cores * imac.period_us), imac
    got = float(lab.run("imac", [sys.executable, "-c", code]).stdout)
    assert 0 < got <= imac.cores * 1.1, (got, imac.cores)


def one_stream(lab, src: str, dst: str, nbytes: float) -> float:
    """The payload rate (bytes/s) of one TCP stream of ``nbytes`` from ``src`` to ``dst``."""
    addr = lab.plan.host(dst).address
    server = lab.popen(
        dst, [sys.executable, str(HERE / "lab_net.py"), "serve", addr, "5001"], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout.readline().strip() == "ready"
    got = lab.run(src, [sys.executable, str(HERE / "lab_net.py"), "send", addr, "5001", str(nbytes)])
    server.wait(timeout=30)
    return float(got.stdout)


#: Streams per rate: the best of them is the link's. The machine's other load can only make
#: a shaped link deliver less (a late tbf timer loses tokens, a throttled host sends late),
#: never more than its bucket allows, so, as with timeit's best of its repeats, the fastest
#: stream is the least disturbed one. One stream alone read 4.57 MB/s of 5 on CI (stop 23)
#: while the profile's fit, taken minutes before, read 5.06.
STREAMS = 3


def stream_rate(lab, src: str, dst: str, nbytes: float) -> float:
    """The best payload rate (bytes/s) of ``STREAMS`` TCP streams of ``nbytes`` from ``src`` to ``dst``."""
    return max(one_stream(lab, src, dst, nbytes) for _ in range(STREAMS))


#: How far below its rate a shaped link may deliver: tbf loses the tokens that arrive while
#: its timer is late and its bucket full (docs/guide/lab.md), and a CI machine's timers are
#: later than this one's (12% lost there with a bucket of half a millisecond, under 1% here).
#: Above its rate it can never deliver more than its bucket's millisecond.
SHAPED_BELOW, SHAPED_ABOVE = 0.15, 0.03


def test_links_are_shaped_per_pair(lab):
    """A TCP stream carries the pair's rate: WiFi and LAN out of one host differ."""
    rates = {
        (src, dst): stream_rate(lab, src, dst, nbytes)
        for src, dst, nbytes in (("pi1", "pi2", 6e6), ("desk-cpu", "imac", 40e6), ("desk-cpu", "pi2", 6e6))
    }
    wifi, lan = 1e6 * SCALE, 1e7 * SCALE
    for pair, nominal in ((("pi1", "pi2"), wifi), (("desk-cpu", "pi2"), wifi), (("desk-cpu", "imac"), lan)):
        assert 1 - SHAPED_BELOW < rates[pair] / nominal < 1 + SHAPED_ABOVE, (pair, rates)


# -- profile, plan, run across the hosts -------------------------------------------
#: The WiFi pairs the profile's fits are checked on.
WIFI = (("desk-cpu", "pi1"), ("imac", "pi1"))
#: How far a WiFi fit may lie from a TCP stream's rate over the same link.
FIT_TOLERANCE = 0.10
#: Profiles the fixture may take. A 2-core CI machine's other load can slow one profile's
#: large probes for seconds: CI at 4e0f7f3 fitted desk-cpu-pi1 at 4.22 MB/s, 16% under
#: streams of 5.00 MB/s taken a minute later (imac-pi1 4.73). When a fit misses its stream,
#: a second profile says whether the profiler or that minute's machine was wrong; the test
#: passes only on a profile whose every WiFi fit is within FIT_TOLERANCE of its stream, and
#: warns with the figures of any attempt before it.
PROFILE_ATTEMPTS = 2


def wifi_misses(result: dict, streams: dict) -> dict:
    """The WiFi pairs whose fitted bandwidth lies more than FIT_TOLERANCE from their stream."""
    fits = {frozenset(f["between"]): f["bandwidth"] for f in result["links"]}
    return {
        pair: (fits[frozenset(pair)], streams[pair])
        for pair in WIFI
        if abs(fits[frozenset(pair)] / streams[pair] - 1) >= FIT_TOLERANCE
    }


@pytest.fixture(scope="module")
def profiled(lab):
    """A profile of desk-cpu (the driver), imac (torch, LAN) and pi1 (numpy, WiFi), with the
    layers timed at ``BATCH`` rows, the plan test's, and the WiFi pairs' stream rates taken
    right after it. Its link probes span both of Ray's paths,
    as the plan's hops do (2.6 KB out of imac, 205 and 865 KB over WiFi): 256 bytes inside Ray's messages
    (the lab's threshold is 1 KiB), the rest through the object store; with only the large
    sizes, each link's latency would be the intercept of two points some 65 ms apart. The
    largest, 2 MiB (0.42 s over WiFi), sets the bandwidth: with 512 KiB the largest, a few
    milliseconds of a quota'd host's throttling on one median moved pi1-imac's fit by 17%
    (5.84 MB/s against a 4.98 MB/s stream, CI at a70d264); with 2 MiB three profiles here
    fitted 4.83-4.98 MB/s against streams of 4.99-5.00. Five repeats per size, so that one
    disturbed probe does not move a median."""
    data = json.loads(lab.cluster_file.read_text())
    data["devices"] = [d for d in data["devices"] if d["name"] in ("desk-cpu", "imac", "pi1")]
    data["links"] = [ln for ln in data["links"] if set(ln["between"]) <= {"desk-cpu", "imac", "pi1"}]
    data["source"] = data["sink"] = "desk-cpu"
    spec = lab.folder / "three.json"
    spec.write_text(json.dumps(data))
    out = lab.folder / "profile.json"
    attempts = []
    for _ in range(PROFILE_ATTEMPTS):
        t0 = time.monotonic()
        got = run_in(
            lab,
            "desk-cpu",
            "profile",
            "--cluster",
            str(spec),
            "--address",
            lab.address,
            "--out",
            str(out),
            "--sizes",
            "256,4096,65536,524288,2097152",
            "--repeats",
            "3",
            "--warmup",
            "1",
            "--link-repeats",
            "5",
            "--cpu-items",
            "10",
            "--batch-size",
            str(BATCH),
            "--quiet",
            "--json",
        )
        assert got.returncode == 0, got.stderr[-3000:]
        seconds = time.monotonic() - t0
        result = json.loads(got.stdout)
        streams = {pair: stream_rate(lab, pair[0], pair[1], 6e6) for pair in WIFI}
        attempts.append(
            {
                "misses": wifi_misses(result, streams),
                "streams": streams,
                "fits": {tuple(f["between"]): f["bandwidth"] for f in result["links"]},
            }
        )
        if not attempts[-1]["misses"]:
            break
    for earlier in attempts[:-1]:
        warnings.warn(
            f"a lab profile's WiFi fits missed their streams by more than {FIT_TOLERANCE:.0%} and "
            f"it was taken again: {earlier}",
            stacklevel=2,
        )
    return result, out, seconds, attempts


def test_profile_fits_the_shaped_links_and_measures_the_slowed_hosts(lab, profiled):
    result, _, _, attempts = profiled
    fits = {frozenset(f["between"]): f["bandwidth"] for f in result["links"]}
    # The fit is what the link delivers: a TCP stream's rate over it, whatever share of the
    # shaped rate this machine's timers let through (see SHAPED_BELOW).
    assert not attempts[-1]["misses"], attempts
    for pair in WIFI:
        assert 1 - SHAPED_BELOW < fits[frozenset(pair)] / (1e6 * SCALE) < 1.10, (pair, fits)
    assert fits[frozenset(("desk-cpu", "imac"))] > 3 * fits[frozenset(("desk-cpu", "pi1"))]  # the LAN pair
    flops = {d["name"]: d["flops"] for d in result["cluster"]["devices"]}
    assert all(f > 0 for f in flops.values())  # each host's effective speed, measured (see the benchmark)
    hosts = {d["name"]: d["host"] for d in result["cluster"]["devices"]}
    assert hosts == {"desk-cpu": "desk-cpu", "imac": "imac", "pi1": "pi1"}  # each on its own host
    assert result["hosts"]["pi1"] == pytest.approx(CPU_SCALE)  # the host's cores, from its quota


def test_a_plan_across_hosts_runs_and_its_transfers_are_predicted(lab, profiled):
    _, prof, *_ = profiled
    model = "lenet"
    cut = ["desk-cpu"] * 3 + ["pi1"] * 3 + ["imac"] * 4  # over WiFi to pi1, over WiFi to imac, over LAN back
    got = run_in(
        lab,
        "desk-cpu",
        "run",
        "--model",
        model,
        "--cluster",
        str(prof),
        "--address",
        lab.address,
        "--plan",
        ",".join(cut),
        "--random",
        str(12 * BATCH),
        "--batch-size",
        str(BATCH),
        "--json",
        "--timeout",
        "60",
    )
    assert got.returncode == 0, got.stderr[-3000:]
    out = json.loads(got.stdout)
    assert [w["host"] for w in out["workers"] if not w["local"]] == ["pi1", "imac"]
    rows = {r["what"]: r for r in out["compare"]}
    # The two WiFi hops carry 865 KB and 205 KB: the profile's fitted link prices them (here
    # within 0.5%; the limit leaves room for a CI machine's tbf losing a fifth of its rate
    # between the profile and the run), and they are most of the end-to-end time (0.9% here).
    wifi = [rows[f"hop desk-cpu -> pi1 ({fmt_bytes(865280)})"], rows[f"hop pi1 -> imac ({fmt_bytes(204800)})"]]
    assert all(abs(r["error"]) < 0.30 for r in wifi), out["compare"]
    assert sum(r["measured"] for r in wifi) > 0.5 * rows["end to end"]["measured"], out["compare"]
    assert abs(rows["end to end"]["error"]) < 0.25, out["compare"]


#: Streams payloads through imac and back, as a pipelined run's hops go: the driver on
#: desk-cpu waits for each result pulled from imac, and imac for each argument from desk-cpu.
ROUND_TRIPS = """
import json, sys
import numpy as np
import multigpu
from multigpu.execution import Session, engine
from multigpu.execution.worker import PROBE

model = multigpu.models.lenet()
with Session(sys.argv[1], address=sys.argv[2], timeout=60.0) as session:
    ws = session.workers
    engine.ray.get(ws.actors["imac"].prepare_profile.remote(model, None, 1, 0))
    engine.ray.get(ws.actors["imac"].set_probe_work.remote(2, 0.0))
    hops = []
    for size in (4096, 173056, 655360):
        x = np.zeros(size // 4, np.float32)
        got = engine.run_chain(ws, [("imac", PROBE)], ["imac"], [x] * 20, window=3)
        hops += [max(t[1] - t[0], t[3] - t[2]) for t in got.traces]
print(json.dumps(hops))
"""


def test_objects_pulled_across_hosts_are_seen_when_they_arrive(lab):
    """A process waiting for an object another node sends can miss the store's notice that it
    arrived and see it at its next look: Ray looks once a second, the lab every 10 ms
    (``RAY_get_check_signal_interval_milliseconds``). Without the lab's setting this test
    saw hops of 1.03 and 2.03 s; the same stream over the shipped lab's 10 MB/s LAN had a hop
    over a second in 8 runs of 9 at Ray's second, and none over 0.32 s at 10 ms."""
    got = lab.run(
        "desk-cpu",
        [sys.executable, "-c", ROUND_TRIPS, str(variant(lab, lab.folder, source="desk-cpu")), lab.address],
        timeout=300,
    )
    assert got.returncode == 0, got.stderr[-3000:]
    hops = json.loads(got.stdout.strip().splitlines()[-1])
    # 655 KB takes 13 ms at the LAN's 50 MB/s; Ray's look every second shows as hops of 1-2 s.
    assert len(hops) == 60 and max(hops) < 0.5, sorted(hops)[-5:]


# -- faults -------------------------------------------------------------------------
def _worker_up(lab, host: str, since: dict) -> bool:
    """True a few seconds after ``host``'s stage worker has its framework (torch) loaded: the
    run's items then flow (``since`` remembers when it was first seen loaded)."""
    for pid in lab.pids(host):
        try:
            if (
                b"StageWorker" in Path(f"/proc/{pid}/cmdline").read_bytes()
                and "libtorch" in Path(f"/proc/{pid}/maps").read_text()
            ):
                since.setdefault(pid, time.monotonic())
                return time.monotonic() - since[pid] > 4.0
        except OSError:
            continue
    return False


def _run_with_fault(lab, fault, timeout: str = "8"):
    p = lab.popen(
        "pi1",
        [
            sys.executable,
            "-m",
            "multigpu",
            "run",
            "--cluster",
            str(lab.cluster_file),
            "--address",
            lab.address,
            "--plan",
            "pi1*3,imac*4,desk-cpu*3",
            "--random",
            "5000",
            "--timeout",
            timeout,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline, since = time.monotonic() + 120, {}
    while not _worker_up(lab, "imac", since) and p.poll() is None:  # the fault hits a running plan
        assert time.monotonic() < deadline, "imac's worker did not start within 120 s"
        time.sleep(0.2)
    assert p.poll() is None, p.communicate()[1][-2000:]
    t0 = time.monotonic()
    fault()
    _, err = p.communicate(timeout=120)
    return p.returncode, err.strip().splitlines()[-1] + logs(lab, "imac"), time.monotonic() - t0


def logs(lab, host: str) -> str:
    """The last lines of a host's raylet log (for a failure's message)."""
    found = sorted(Path(f"/tmp/mgl-{lab.id}/{host}").glob("session_*/logs/raylet.out"))
    if not found:
        return ""
    lines = [x for x in found[-1].read_text(errors="replace").splitlines() if " W " in x or " E " in x]
    errs = sorted(found[-1].parent.glob("worker-*.err"), key=lambda f: f.stat().st_mtime)
    tail = errs[-1].read_text(errors="replace").strip().splitlines()[-8:] if errs else []
    return "\n[raylet of " + host + "] " + "\n".join(lines[-6:]) + "\n[newest worker's stderr] " + "\n".join(tail)


def test_a_link_down_or_a_killed_host_ends_a_run_with_an_error_naming_it(lab):
    before = lab.pids("pi1")
    rc, err, seconds = _run_with_fault(lab, lambda: lab.link("imac", False))
    lab.link("imac", True)
    # The link may go down while the run ships parameters (a loaded machine) or while it runs items.
    assert rc == 1 and "device 'imac'" in err and "host imac" in err and seconds < 20, (err, seconds)
    lab.restart("imac")
    rc, err, seconds = _run_with_fault(lab, lambda: lab.kill("imac"))
    assert rc == 1 and "on device 'imac'" in err and "host imac" in err and seconds < 20, (err, seconds)
    lab.restart("imac")
    time.sleep(1)
    assert lab.pids("pi1") <= before | lab.pids("pi1") and not any(
        "multigpu" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")
        for p in lab.pids("pi1")
        if Path(f"/proc/{p}/cmdline").exists()
    )  # the driver is gone, its workers too


def test_a_stage_that_does_not_fit_a_host_is_refused_and_a_forced_one_fails_naming_the_host(lab):
    import multigpu as mg
    from multigpu.errors import InfeasibleError

    alex = mg.models.alexnet()
    g = graph_from_model(alex, 1)
    cluster = load_cluster(lab.cluster_file)
    pins = {name: "pi2" for name in FC}
    with pytest.raises(InfeasibleError, match="memory|pi2"):
        autopartition(g, cluster, constraints=Constraints(pinned=pins))
    plan = ["desk-cpu"] * (len(alex) - len(FC)) + ["pi2"] * len(FC)
    t0 = time.monotonic()
    got = run_in(
        lab,
        "desk-cpu",
        "run",
        "--model",
        "alexnet",
        "--cluster",
        str(variant(lab, lab.folder, source="desk-cpu")),
        "--address",
        lab.address,
        "--plan",
        ",".join(plan),
        "--random",
        "1",
        "--timeout",
        "60",
    )
    seconds = time.monotonic() - t0
    assert got.returncode == 1, got.stdout[-2000:]
    err = got.stderr.strip().splitlines()[-1]
    assert "device 'pi2'" in err and "died" in err and seconds < 75, (err, seconds)
    assert lab.hosts["pi2"].cgroups.memory()["oom_kills"] >= 1
    lab.restart("pi2")


# -- multi-host data parallel -------------------------------------------------------
def _launch(lab, backend: str, out: Path, hosts=("desk-cpu", "imac"), script_args=("3",), port=29500, timeout="30"):
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
                "90",
                "--",
                str(HERE / "lab_rank.py"),
                str(out),
                *script_args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, h in enumerate(hosts)
    ]


@pytest.mark.parametrize("backend", ["torch", "paddle", "mxnet"])
def test_launch_on_two_hosts_equals_one_process_and_listens_only_on_their_addresses(lab, backend, tmp_path):
    from multigpu.contract.registry import available_backends

    if backend not in available_backends():
        pytest.skip(f"{backend} is not installed")
    procs = _launch(lab, backend, tmp_path)
    while not (tmp_path / "listening.rank0").exists() and all(p.poll() is None for p in procs):
        time.sleep(0.1)
    seen = {
        h: [
            row
            for row in lab.listening(h)
            if "ray" not in row[2] and "raylet" not in row[2] and "gcs_server" not in row[2]
        ]
        for h in ("desk-cpu", "imac")
    }
    outs = [p.communicate(timeout=180) for p in procs]
    # A string, not a list: pytest shortens a list's repr to a few hundred characters (CI at
    # 363db8b showed only a c10d warning of each host's output when rank 0 exited 1).
    assert [p.returncode for p in procs] == [0, 0], "\n".join(
        f"--- {h} (exit {p.returncode}) ---\n{o[1][-3000:]}" for h, p, o in zip(("desk-cpu", "imac"), procs, outs)
    )
    r0, r1 = np.load(tmp_path / "rank0.npz"), np.load(tmp_path / "rank1.npz")
    for i in range(8):
        np.testing.assert_array_equal(r0[f"p{i}"], r1[f"p{i}"])
        np.testing.assert_allclose(r0[f"p{i}"], r0[f"ref{i}"], atol=1e-5)
    for h, rows in seen.items():
        own = lab.plan.host(h).address
        for addr, port, _ in rows:
            if backend == "paddle" and h == "desk-cpu" and port == 29500:
                assert addr in ("0.0.0.0", "*")  # Paddle's store: every interface (see docs/reference/ports.md)
            else:
                assert addr == own, (h, rows)
    assert seen["desk-cpu"], "the job's master listened nowhere"


def test_a_link_down_during_launch_ends_both_hosts_with_an_error_naming_the_rank_and_host(lab, tmp_path):
    procs = _launch(lab, "numpy", tmp_path, script_args=("loop",), port=29510, timeout="5")
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"joined.rank{r}").exists() for r in (0, 1)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.1)
    t0 = time.monotonic()
    lab.link("imac", False)
    try:
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        lab.link("imac", True)
    seconds = time.monotonic() - t0
    assert [p.returncode for p in procs] == [1, 1] and seconds < 20
    last = [o[1].strip().splitlines()[-1] for o in outs]
    assert (
        "rank 0 (pid" in last[0]
        and "on host desk-cpu" in last[0]
        and "timed out" in last[0]
        or "sent nothing" in last[0]
    ), last
    assert "rank 1 (pid" in last[1] and "on host imac" in last[1], last


# -- who can reach a job ------------------------------------------------------------
def test_single_host_jobs_cannot_be_reached_and_ray_refuses_a_node_without_the_token(lab, tmp_path):
    from multigpu.contract.registry import available_backends

    # A Ray node without the lab's token tries to join (Ray retries for about 20 s first).
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    intruder: dict = {}

    def join() -> None:
        bad = tmp_path / "wrong-token"
        bad.write_text("0" * 64)
        intruder["run"] = lab.run(
            "pi2",
            [
                str(Path(sys.executable).with_name("ray")),
                "start",
                f"--address={lab.address}",
                f"--temp-dir={tmp_path / 'intruder'}",
                "--node-ip-address",
                lab.plan.host("pi2").address,
                "--num-cpus",
                "1",
            ],
            env={**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(bad)},
            lab_env=False,
            timeout=120,
        )

    thread = threading.Thread(target=join)
    thread.start()
    host, addr = "desk-gpu", lab.plan.host("desk-gpu").address
    before = {(a, p) for a, p, _ in lab.listening(host)}
    engines = [b for b in ("numpy", "torch", "paddle", "mxnet") if b in available_backends()]
    jobs = {}
    for b in engines:
        out = tmp_path / b
        out.mkdir()
        jobs[b] = (
            out,
            lab.popen(
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
                    str(HERE / "lab_rank.py"),
                    str(out),
                    "4",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
    local = tmp_path / "local.json"
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
    ray_run = lab.popen(
        host,
        [
            sys.executable,
            "-m",
            "multigpu",
            "run",
            "--cluster",
            str(local),
            "--plan",
            "d*3,w*7",
            "--random",
            "4000",
            "--timeout",
            "60",
        ],
        lab_env=False,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not all((o / "listening.rank0").exists() for o, _ in jobs.values()):
        assert time.monotonic() < deadline, {b: p.poll() for b, (_, p) in jobs.items()}
        time.sleep(0.2)
    rows = [r for r in lab.listening(host) if (r[0], r[1]) not in before]
    tried = lab.reach("pi1", addr, sorted({p for _, p, _ in rows}))
    for b, (_, p) in jobs.items():
        assert p.wait(timeout=120) == 0, (b, p.stderr.read()[-1500:])
    ray_run.kill()
    ray_run.wait()
    thread.join(timeout=120)
    open_ports = {port for port, what in tried.items() if what == "open"}
    wide = {(a, port, who) for a, port, who in rows if a not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")}
    # The only socket open to other hosts is Paddle's store (its C++ server takes a port, no address).
    assert all(port in open_ports for _, port, _ in wide), (wide, tried)
    assert len(wide) <= (1 if "paddle" in engines else 0), (wide, rows)
    assert len(rows) >= 6, rows  # the jobs and the local Ray instance did listen (on loopback)
    joined = intruder["run"]
    assert joined.returncode != 0 and ("Authentication" in joined.stderr or "InvalidAuthToken" in joined.stderr), (
        joined.stderr[-1500:]
    )


def test_down_leaves_the_machine_as_it_found_it(lab, before):
    t0 = time.monotonic()
    got = multigpu("lab", "down", "--lab", lab.id)
    assert got.returncode == 0 and f"lab {lab.id}: down" in got.stdout, got.stdout + got.stderr
    assert time.monotonic() - t0 < 30
    # Nothing this lab made is left: no namespace, link, cgroup, Ray process or folder that was not there
    # before it. Another job may add or remove its own meanwhile: a running benchmark's accounting cgroup
    # (mgl-acct-PID, of a live process) is not the lab's.
    after = machine_state()
    added = {k: sorted(set(after[k]) - set(before[k])) for k in after}
    added["cgroups"] = [c for c in added["cgroups"] if not _live_account(c)]
    assert added == {k: [] for k in after}
    assert not any(lab.id in x for v in after.values() for x in v)


def _live_account(path: str) -> bool:
    """True for the CPU-accounting cgroup of a live process (``multigpu.lab.accounting``)."""
    name = Path(path).name
    return name.startswith("mgl-acct-") and name[9:].isdigit() and Path(f"/proc/{name[9:]}").exists()
