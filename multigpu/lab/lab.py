"""``Lab``: a cluster file brought up as network namespaces, shaped links, cgroups and a
Ray node per host, and always taken down again.

    with multigpu.lab.Lab("lab", backend="torch") as lab:
        lab.run("pi1", ["multigpu", "run", "--address", lab.address, ...])

What it builds (``design`` says how the figures are chosen): for each host a network
namespace ``mgl-<id>-<host>`` with its own hostname, an address from 198.18.0.0/24 on
a veth to the lab's switch namespace, htb classes per destination on its egress, and
cgroups ``mgl-<id>/<host>`` (CPU quota, memory limit, CPU accounting); a keeper
process that every daemon hangs from; a Ray head on one host and a node on each of
the others. Everything it makes carries the prefix ``mgl-`` and the lab's id, and a
lab's state lives in ``/run/multigpu-lab/<id>``.

Teardown always happens: ``__exit__`` (an exception or Ctrl-C included), ``down``,
SIGTERM while the ``with`` block runs, and, after a crash, the next ``Lab`` or
``multigpu lab up``, which removes every lab whose keeper is gone before it builds.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from multigpu.errors import InputError, LabError
from multigpu.lab import cgroups as cg
from multigpu.lab import network, raynodes
from multigpu.lab.enter import HostEntry
from multigpu.lab.plan import MIN_PERIOD_US, LabPlan, design
from multigpu.lab.state import KEEPER_FILE, REQUESTS, STATUS_FILE
from multigpu.lab.system import CONTROLLERS, process_start, require_support, run, scheduler_tick_us
from multigpu.partition.inputs.cluster import Cluster, EngineProfile, Link, load_cluster
from multigpu.procfs.stat import STATE, stat_fields

__all__ = ["LAB_ROOT", "PREFIX", "Lab", "down_all", "labs", "leftovers"]

#: Every namespace, interface, cgroup and folder the lab makes starts with this.
PREFIX = "mgl-"
#: Where each lab keeps its state (a tmpfs: gone after a reboot, like the namespaces).
LAB_ROOT = Path("/run/multigpu-lab")
#: Where each host's Ray keeps its sockets and logs.
TMP_ROOT = Path("/tmp")
ID = re.compile(r"[0-9a-f]{6}")
KILL_GRACE = 3.0
START_TIMEOUT = 180.0


def _netns(lab_id: str, host: str) -> str:
    return f"{PREFIX}{lab_id}-{host}"


def _switch(lab_id: str) -> str:
    return f"{PREFIX}{lab_id}-switch"


def _alive(pid: int | None, lab_id: str) -> bool:
    if not pid:
        return False
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    stat = stat_fields(pid)
    alive = stat is not None and stat[STATE] != "Z"
    return alive and b"multigpu.lab.keeper" in cmd and any(lab_id.encode() in c for c in cmd)


def _live_pids(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        stat = stat_fields(pid)
        if stat is not None and stat[STATE] != "Z":
            out.add(pid)
    return out


def _signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _lab_pids(lab_id: str) -> set[int]:
    """Every process of lab ``lab_id``: in its namespaces or its cgroups."""
    pids: set[int] = set()
    for ns in network.namespaces(f"{PREFIX}{lab_id}-"):
        pids |= network.ns_pids(ns)
    for d in cg.find_lab_cgroups(f"{PREFIX}{lab_id}"):
        pids |= cg.tree_pids(d)
    pids.discard(os.getpid())
    return pids


def _kill_lab_processes(lab_id: str, grace: float = KILL_GRACE) -> set[int]:
    """SIGTERM every process of the lab, SIGKILL what is left after ``grace``; return the
    processes still there (none, normally) once they are gone or reaped."""
    pids = _live_pids(_lab_pids(lab_id))
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = _live_pids(pids | _lab_pids(lab_id))
    for _ in range(3):  # a dying daemon may still fork; kill until the lab is empty
        pids = _live_pids(pids | _lab_pids(lab_id))
        if not pids:
            break
        _signal_all(pids, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = _live_pids(pids)
    return pids


def _zombies_gone(pids: set[int], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.05)


def teardown(lab_id: str) -> list[str]:
    """Remove everything lab ``lab_id`` made: its processes, keeper, namespaces, cgroups and
    folders. Return what could not be removed (normally nothing)."""
    state_dir = LAB_ROOT / lab_id
    state: dict[str, Any] = {}
    try:
        state = json.loads((state_dir / "state.json").read_text())
    except (OSError, ValueError):
        pass
    killed = _lab_pids(lab_id)
    left = _kill_lab_processes(lab_id)
    keeper = state.get("keeper")
    if keeper and keeper != os.getpid() and _alive(keeper, lab_id):  # (the keeper may be the one tearing down)
        _signal_all({keeper}, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        while _alive(keeper, lab_id) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(keeper, lab_id):
            _signal_all({keeper}, signal.SIGKILL)
    _zombies_gone(killed)
    problems = [f"process {p} would not die" for p in sorted(left)]
    for ns in network.namespaces(f"{PREFIX}{lab_id}-"):
        network.delete_namespace(ns)
    problems += [f"namespace {ns}" for ns in network.namespaces(f"{PREFIX}{lab_id}-")]
    for d in sorted(cg.find_lab_cgroups(f"{PREFIX}{lab_id}"), key=lambda p: -len(p.parts)):
        if d.exists() and not cg.remove_tree(d):
            problems.append(f"cgroup {d}")
    if state_dir.exists():
        for uts in state_dir.glob("*.uts"):
            subprocess.run(["umount", str(uts)], check=False, capture_output=True)
        shutil.rmtree(state_dir, ignore_errors=True)
    tmp = TMP_ROOT / f"{PREFIX}{lab_id}"
    if tmp.exists():
        shutil.rmtree(tmp, ignore_errors=True)
    return problems


def _ids_on_machine() -> set[str]:
    ids: set[str] = set()
    for ns in network.namespaces(PREFIX):
        m = re.match(rf"{PREFIX}([0-9a-f]{{6}})-", ns)
        if m:
            ids.add(m.group(1))
    for d in cg.find_lab_cgroups(PREFIX):
        m = ID.fullmatch(d.name[len(PREFIX) :])
        if m:
            ids.add(m.group(0))
    if LAB_ROOT.exists():
        ids |= {p.name for p in LAB_ROOT.iterdir() if ID.fullmatch(p.name)}
    for p in TMP_ROOT.glob(f"{PREFIX}*"):
        if ID.fullmatch(p.name[len(PREFIX) :]):
            ids.add(p.name[len(PREFIX) :])
    return ids


def _state(lab_id: str) -> dict[str, Any]:
    try:
        return json.loads((LAB_ROOT / lab_id / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def labs() -> list[dict[str, Any]]:
    """The labs up on this machine (their state: id, cluster, hosts, Ray address, ...)."""
    out = []
    for lab_id in sorted(_ids_on_machine()):
        st = _state(lab_id)
        if st and _alive(st.get("keeper"), lab_id):
            out.append(st)
    return out


def leftovers() -> list[str]:
    """Ids of labs whose keeper is gone (a crash) but whose namespaces, cgroups or folders remain."""
    return sorted(i for i in _ids_on_machine() if not _alive(_state(i).get("keeper"), i))


def down_all(lab_id: str | None = None) -> dict[str, list[str]]:
    """Take down lab ``lab_id`` (default: every lab on the machine, leftovers included);
    return, per lab, what could not be removed."""
    from multigpu.lab.accounting import clean_dead

    ids = sorted(_ids_on_machine()) if lab_id is None else [lab_id]
    out = {i: teardown(i) for i in ids}
    clean_dead()  # and what a killed benchmark's CPU accounting left
    return out


@dataclass(frozen=True)
class _Host:
    name: str
    netns: str
    uts: str
    cgroups: cg.HostCgroups

    def entry(self) -> HostEntry:
        return HostEntry(self.name, str(network.NETNS_DIR / self.netns), self.uts, tuple(self.cgroups.procs_files))


def _backend_map(cluster: Cluster, backend: None | str | Mapping[str, str]) -> dict[str, str | None]:
    if backend is None or isinstance(backend, str):
        return {d.name: d.backend or backend for d in cluster.devices}
    unknown = [k for k in backend if k not in cluster.names]
    if unknown:
        raise InputError(
            f"backend for device {unknown[0]!r}: cluster {cluster.name!r} has no such device; "
            f"its devices are {', '.join(cluster.names)}"
        )
    return {d.name: backend.get(d.name, d.backend) for d in cluster.devices}


class Lab:
    """An emulated copy of ``cluster`` on this machine (see the module docstring).

    ``cluster``: a Cluster or a cluster file / shipped name. ``cpu_scale``,
    ``bandwidth_scale``, ``max_cores``, ``head``: as ``design`` takes them.
    ``backend``: the backend of every device without one (a name), or per device
    (``{"pi2": "paddle"}``), written into the emulated cluster (``cluster_file``) with
    ``threads`` math threads per worker. ``ray=False`` brings up no Ray nodes.
    ``keep_up=True`` leaves the lab up after this process exits (until ``multigpu lab
    down``), as ``multigpu lab up`` does; otherwise it goes down with this process, even
    when the process is killed (the lab's keeper sees it die). ``echo`` receives progress lines.

    Raises LabUnsupportedError (not root, no namespaces, no htb, no cgroup v1) before
    anything is made, and LabError when building fails (after taking down what was made).
    """

    def __init__(
        self,
        cluster: Cluster | str | os.PathLike[str],
        *,
        cpu_scale: float = 0.25,
        bandwidth_scale: float = 1.0,
        max_cores: float | None = None,
        head: str | None = None,
        backend: None | str | Mapping[str, str] = None,
        threads: int | None = 1,
        ray: bool = True,
        keep_up: bool = False,
        echo: Callable[[str], None] | None = None,
    ):
        self.source_cluster = cluster if isinstance(cluster, Cluster) else load_cluster(cluster)
        self.plan: LabPlan = design(
            self.source_cluster,
            cpu_scale=cpu_scale,
            bandwidth_scale=bandwidth_scale,
            max_cores=max_cores,
            head=head,
            tick_us=scheduler_tick_us(),
        )
        self.backends = _backend_map(self.source_cluster, backend)
        self.threads = threads
        self.ray = ray
        self.keep_up = keep_up
        self.echo = echo or (lambda s: None)
        self.id = ""
        self.hosts: dict[str, _Host] = {}
        self._old_sigterm: Any = None

    # -- where things are ---------------------------------------------------------
    @property
    def state_dir(self) -> Path:
        """This lab's state folder (token, emulated cluster, logs)."""
        return LAB_ROOT / self.id

    @property
    def token(self) -> Path:
        """The file holding the lab's Ray token (mode 0600)."""
        return self.state_dir / "ray-token"

    @property
    def address(self) -> str:
        """The Ray head's ``ADDRESS:PORT`` (what ``multigpu run --address`` takes)."""
        return raynodes.head_address(self.plan)

    @property
    def cluster_file(self) -> Path:
        """The emulated cluster (``emulated_cluster``) as a JSON file."""
        return self.state_dir / "cluster.json"

    def env(self) -> dict[str, str]:
        """The variables every process in the lab gets (token authentication, Ray settings)."""
        return {
            **raynodes.ray_env(self.token, self.plan),
            "MULTIGPU_LAB": self.id,
            "MULTIGPU_LAB_RAY_ADDRESS": self.address,
        }

    def emulated_cluster(self) -> Cluster:
        """The cluster as the lab emulates it: each device with its backend, ``threads`` and
        Ray resource ``{device: 1}`` (which pins its worker to its host), each link at the
        lab's rate and with no latency (the lab adds none); compute figures as the file has
        them (``multigpu profile`` measures the emulated ones)."""
        src = self.source_cluster
        devices = []
        for d in src.devices:
            res = dict(d.resources or {})
            res.pop("GPU", None)  # the lab has no GPU; the host's share stands in for it
            res[d.name] = 1.0
            devices.append(
                replace(
                    d,
                    backend=self.backends[d.name],
                    device="cpu" if self.backends[d.name] else None,
                    threads=self.threads if self.backends[d.name] else None,
                    resources=res,
                    host=None,
                )
            )
        links = []
        names = src.names
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                ha, hb = self.plan.host_of(a).name, self.plan.host_of(b).name
                if ha == hb:
                    continue
                ln = self.plan.link(ha, hb)
                if not ln.blocked:
                    links.append(Link((a, b), ln.bandwidth, 0.0))
        return Cluster(
            devices=tuple(devices),
            source=src.source,
            links=tuple(links),
            default_link=None,
            sink=src.sink,
            # Of the engine's figures only the warm passes carry over: the rest were measured
            # on the source cluster's hosts, and ``multigpu profile`` measures the lab's own.
            engine=EngineProfile(src.engine.name, warm_pass=src.engine.warm_pass) if src.engine else None,
            name=f"{src.name}-lab",
        )

    # -- life cycle ---------------------------------------------------------------
    def __enter__(self) -> Lab:
        self.up()
        if threading.current_thread() is threading.main_thread():
            # SIGTERM (a CI runner's timeout, `kill`) unwinds the with block like Ctrl-C does.
            def on_term(signum: int, frame: Any) -> None:
                raise KeyboardInterrupt(f"signal {signum}")

            self._old_sigterm = signal.signal(signal.SIGTERM, on_term)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None
        self.down()

    def up(self) -> Lab:
        """Build the lab; return it. Removes the leftovers of crashed labs first."""
        require_support()
        for old in leftovers():
            self.echo(f"lab: removing the leftovers of lab {old} (its keeper is gone)")
            teardown(old)
        self.id = secrets.token_hex(3)
        while self.id in _ids_on_machine():
            self.id = secrets.token_hex(3)
        try:
            self._build()
        except BaseException:
            self.echo(f"lab {self.id}: building failed; taking down what was made")
            teardown(self.id)
            self.id = ""
            raise
        return self

    def down(self) -> None:
        """Take the lab down (idempotent); LabError if something could not be removed."""
        if not self.id:
            return
        lab_id, self.id = self.id, ""
        problems = teardown(lab_id)
        self.hosts = {}
        if problems:
            raise LabError(f"lab {lab_id}: could not remove {', '.join(problems)}; run `multigpu lab down`")

    def _build(self) -> None:
        plan = self.plan
        LAB_ROOT.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.state_dir.mkdir(mode=0o700)
        raynodes.write_token(self.token)
        tmp = TMP_ROOT / f"{PREFIX}{self.id}"
        tmp.mkdir(mode=0o700)
        parents = {c: str(cg.own_cgroup(c)) for c in CONTROLLERS}
        self.hosts = {
            h.name: _Host(
                h.name,
                _netns(self.id, h.name),
                str(self.state_dir / f"{h.name}.uts"),
                cg.HostCgroups.at(f"{PREFIX}{self.id}", h.name, parents),
            )
            for h in plan.hosts
        }
        self._write_state(keeper=None)
        t0 = time.perf_counter()
        self.echo(f"lab {self.id}: {len(plan.hosts)} hosts of cluster {plan.cluster.name!r}")
        network.build_network(plan, {n: h.netns for n, h in self.hosts.items()}, _switch(self.id), f"m{self.id}v")
        for h in plan.hosts:
            host = self.hosts[h.name]
            Path(host.uts).touch(mode=0o600)
            run(["unshare", f"--uts={host.uts}", "hostname", h.name], f"host {h.name!r}: its hostname")
            host.cgroups.create(h.cores, h.period_us, h.quota_us, h.memory)
        self.emulated_cluster_write()
        keeper = self._start_keeper(tmp)
        self._write_state(keeper=keeper)
        if self.ray:
            self._wait_keeper(keeper)
        self.echo(
            f"lab {self.id}: up in {time.perf_counter() - t0:.1f} s"
            + (f"; Ray head at {self.address}" if self.ray else "")
        )

    def emulated_cluster_write(self) -> Path:
        """Write ``emulated_cluster()`` to ``cluster_file`` (and the cluster it emulates beside
        it, ``source.json``); return the path."""
        self.cluster_file.with_name("source.json").write_text(json.dumps(self.source_cluster.to_dict(), indent=1))
        self.cluster_file.write_text(json.dumps(self.emulated_cluster().to_dict(), indent=1) + "\n")
        return self.cluster_file

    def _node_item(self, host: str, head: bool) -> dict[str, Any]:
        """What the keeper needs to start ``host``'s Ray node."""
        h = self.plan.host(host)
        entry = self.hosts[host].entry()
        return {
            "host": host,
            "argv": raynodes.node_command(self.plan, h, TMP_ROOT / f"{PREFIX}{self.id}" / host, head=head),
            "env": self.env(),
            "timeout": START_TIMEOUT,
            "entry": {**vars(entry), "procs_files": list(entry.procs_files)},
        }

    def _start_keeper(self, tmp: Path) -> int:
        groups: list[list[dict[str, Any]]] = []
        if self.ray:
            others = [h.name for h in self.plan.hosts if h.name != self.plan.head]
            groups = [[self._node_item(self.plan.head, head=True)]]
            if others:
                groups.append([self._node_item(h, head=False) for h in others])
        owner = None if self.keep_up else {"pid": os.getpid(), "start": process_start(os.getpid())}
        (self.state_dir / KEEPER_FILE).write_text(json.dumps({"groups": groups, "owner": owner}))
        with open(self.state_dir / "keeper.log", "ab") as log:  # the keeper keeps its own copy of the descriptor
            p = subprocess.Popen(
                [sys.executable, "-m", "multigpu.lab.keeper", str(self.state_dir)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd="/",
            )
        self._keeper = p
        if self.ray:
            self.echo(f"lab {self.id}: starting Ray: head on {self.plan.head}, a node on each other host")
        return p.pid

    def _wait_keeper(self, keeper: int) -> None:
        status_file = self.state_dir / STATUS_FILE
        deadline = time.monotonic() + START_TIMEOUT * 2
        while not status_file.exists():
            if self._keeper.poll() is not None:  # (its cmdline is the parent's until it has exec'd)
                try:
                    log = (self.state_dir / "keeper.log").read_text(errors="replace").strip().splitlines()
                except OSError:
                    log = []
                raise LabError(
                    f"lab {self.id}: its keeper died while starting the Ray nodes: "
                    f"{' | '.join(log[-3:]) or 'it wrote nothing'}"
                )
            if time.monotonic() > deadline:
                raise LabError(f"lab {self.id}: the Ray nodes did not start within {START_TIMEOUT * 2:g} s")
            time.sleep(0.1)
        status = json.loads(status_file.read_text())
        if not status["ok"]:
            host = self.plan.host(status["failed"])
            mem = self.hosts[host.name].cgroups.memory()
            hint = ""
            if mem.get("oom_kills") and host.memory is not None:
                hint = (
                    f"; the kernel killed {mem['oom_kills']} process(es) there for memory: its limit of "
                    f"{host.memory / 1e6:.0f} MB is below what a Ray node needs (raise the device's memory)"
                )
            raise LabError(
                f"lab {self.id}: the Ray node of host {host.name!r} did not start "
                f"({status['status']}): {status.get('tail', '')}{hint}"
            )

    def _write_state(self, keeper: int | None) -> None:
        state = {
            "id": self.id,
            "keeper": keeper,
            "cluster": self.plan.cluster.name,
            "ray": self.ray,
            "address": self.address if self.ray else None,
            "token": str(self.token),
            "cluster_file": str(self.cluster_file),
            "plan": self.plan.to_dict(),
            "hosts": {n: {"netns": h.netns, "uts": h.uts, "cgroups": h.cgroups.dirs} for n, h in self.hosts.items()},
            "created": time.time(),
        }
        tmp = self.state_dir / "state.json.tmp"
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.state_dir / "state.json")

    # -- using it -----------------------------------------------------------------
    def _host(self, host: str) -> _Host:
        if not self.id:
            raise LabError("the lab is not up; use `with Lab(...) as lab:` or call lab.up()")
        if host not in self.hosts:
            raise InputError(f"the lab has no host {host!r}; its hosts are: {', '.join(self.hosts)}")
        return self.hosts[host]

    def popen(
        self, host: str, argv: Sequence[str], env: Mapping[str, str] | None = None, lab_env: bool = True, **kwargs: Any
    ) -> subprocess.Popen:
        """Start ``argv`` inside ``host`` (its namespace, hostname and cgroups) with the lab's
        environment (``env()``, unless ``lab_env`` is False: a process without the token)
        added to ``env`` (default: this process's); return the Popen."""
        base = dict(os.environ if env is None else env)
        return start_in(self._host(host).entry(), argv, {**base, **self.env()} if lab_env else base, **kwargs)

    def run(
        self,
        host: str,
        argv: Sequence[str],
        timeout: float = 300.0,
        check: bool = False,
        env: Mapping[str, str] | None = None,
        lab_env: bool = True,
    ) -> subprocess.CompletedProcess:
        """Run ``argv`` inside ``host`` and wait (output captured as text); return it."""
        p = self.popen(host, argv, env=env, lab_env=lab_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            raise LabError(
                f"host {host!r}: `{' '.join(argv)}` did not finish within {timeout:g} s; it was killed "
                f"(last output: {(err or out).strip()[-300:]})"
            ) from None
        done = subprocess.CompletedProcess(list(argv), p.returncode, out, err)
        if check and p.returncode != 0:
            raise LabError(
                f"host {host!r}: `{' '.join(argv)}` exited with status {p.returncode}: {(err or out).strip()[-500:]}"
            )
        return done

    def call(self, host: str, target: str, *args: Any, timeout: float = 3600.0, **kwargs: Any) -> Any:
        """Call ``target`` ("module:function") with the arguments inside ``host`` (a fresh Python
        process there, with the lab's environment) and return its result (both picklable).
        LabError carries the exception it raised, with its traceback."""
        import pickle
        import tempfile

        with tempfile.TemporaryDirectory(prefix="mgl-call-") as d:
            src, dst = Path(d) / "in.pickle", Path(d) / "out.pickle"
            src.write_bytes(pickle.dumps((target, args, kwargs)))
            p = self.popen(host, [sys.executable, "-m", "multigpu.lab.call", str(src), str(dst)])
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                raise LabError(f"host {host!r}: {target} did not return within {timeout:g} s; it was killed") from None
            if not dst.exists():
                raise LabError(
                    f"host {host!r}: {target} ended (status {p.returncode}) without a result "
                    f"(killed, perhaps for memory: {self.hosts[host].cgroups.memory()})"
                )
            status, value = pickle.loads(dst.read_bytes())
        if status == "error":
            name, message, trace = value
            raise LabError(f"host {host!r}: {target} raised {name}: {message}\n{trace}")
        return value

    def listening(self, host: str) -> list[tuple[str, int, str]]:
        """Every listening TCP socket in ``host``: (address, port, process names), from ``ss -ltnp``."""
        out = self.run(host, ["ss", "-ltnpH"], lab_env=False).stdout
        rows = []
        for line in out.splitlines():
            fields = line.split()
            if len(fields) < 4:
                continue
            addr, _, port = fields[3].rpartition(":")
            procs = ",".join(sorted(set(re.findall(r'\("([^"]+)"', line))))
            rows.append((addr.strip("[]"), int(port), procs))
        return rows

    def reach(self, src: str, address: str, ports: Sequence[int], timeout: float = 2.0) -> dict[int, str]:
        """From host ``src``, open a TCP connection to each port of ``address``: "open", or the
        error that refused it (ConnectionRefusedError, TimeoutError, ...)."""
        code = (
            "import socket,sys\nfor p in sys.argv[3:]:\n s=socket.socket();s.settimeout(float(sys.argv[2]))\n"
            " try: s.connect((sys.argv[1],int(p)));print(p,'open')\n"
            " except OSError as e: print(p,type(e).__name__)\n s.close()"
        )
        out = self.run(src, [sys.executable, "-c", code, address, str(timeout), *map(str, ports)], lab_env=False).stdout
        return {int(p): what for p, what in (line.split() for line in out.splitlines() if line.strip())}

    def link(self, host: str, up: bool) -> None:
        """Take ``host``'s network interface down (``up=False``: every link of the host is cut at
        once, as a pulled cable or a radio out of range) or bring it back."""
        network.set_link(self._host(host).netns, up)

    def restart(self, host: str) -> None:
        """Start ``host``'s Ray node again after a fault took it down (its processes are killed
        first; the head cannot be restarted, as its cluster state would be lost)."""
        if not self.ray:
            raise LabError("the lab runs no Ray nodes (it was brought up with ray=False)")
        if host == self.plan.head:
            raise InputError(f"host {host!r} holds the Ray head, which cannot be restarted; bring the lab up again")
        self._host(host)
        self.kill(host)
        deadline = time.monotonic() + 10.0
        while self.pids(host) and time.monotonic() < deadline:
            time.sleep(0.05)
        req = secrets.token_hex(4)
        answer = self.state_dir / f"request-{req}.json"
        line = json.dumps({"id": req, "group": [self._node_item(host, head=False)]}) + "\n"
        fd = os.open(self.state_dir / REQUESTS, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        deadline = time.monotonic() + START_TIMEOUT
        while not answer.exists():
            if time.monotonic() > deadline:
                raise LabError(f"host {host!r}: its Ray node did not start again within {START_TIMEOUT:g} s")
            time.sleep(0.1)
        got = json.loads(answer.read_text())
        answer.unlink()
        if not got["ok"]:
            raise LabError(f"host {host!r}: its Ray node did not start again ({got['status']}): {got.get('tail', '')}")

    def kill(self, host: str, sig: int = signal.SIGKILL) -> list[int]:
        """Send ``sig`` to every process of ``host`` (its Ray node included); return their pids."""
        h = self._host(host)
        pids = _live_pids(network.ns_pids(h.netns) | h.cgroups.pids())
        pids.discard(os.getpid())
        _signal_all(pids, sig)
        return sorted(pids)

    def set_memory(self, host: str, limit: int | None) -> None:
        """Change ``host``'s memory limit while the lab is up (bytes; None lifts it), e.g. to
        let a Pi-class host run what it could run only with swap. LabError when the host
        already uses more than the new limit."""
        self._host(host).cgroups.set_memory(limit)

    def pids(self, host: str | None = None) -> set[int]:
        """The live processes of ``host`` (default: of every host)."""
        names = [host] if host else list(self.hosts)
        out: set[int] = set()
        for n in names:
            h = self._host(n)
            out |= network.ns_pids(h.netns) | h.cgroups.pids()
        return _live_pids(out)

    def cpu_seconds(self) -> float:
        """CPU seconds the lab's hosts have used so far (every process in their cgroups)."""
        return sum(h.cgroups.cpu_seconds() or 0.0 for h in self.hosts.values())

    def status(self) -> dict[str, Any]:
        """What is up: per host its address, devices, CPU share, memory and CPU used, processes,
        and the bytes each shaped class has carried."""
        hosts = []
        for h in self.plan.hosts:
            host = self.hosts[h.name]
            stats = network.class_stats(host.netns)
            hosts.append(
                {
                    "name": h.name,
                    "address": h.address,
                    "devices": list(h.devices),
                    "cores": h.cores,
                    "memory_limit": h.memory,
                    "memory": host.cgroups.memory(),
                    "cpu_seconds": host.cgroups.cpu_seconds(),
                    "processes": len(self.pids(h.name)),
                    "shaped_bytes": stats,
                }
            )
        return {
            "id": self.id,
            "cluster": self.plan.cluster.name,
            "address": self.address if self.ray else None,
            "token": str(self.token),
            "cluster_file": str(self.cluster_file),
            "hosts": hosts,
            "links": self.plan.to_dict()["links"],
            "notes": list(self.plan.notes),
        }

    @classmethod
    def attach(cls, lab_id: str | None = None) -> Lab:
        """The ``Lab`` of a lab already up (``multigpu lab exec`` uses it): lab ``lab_id``, or
        the only one. InputError when there is none or several and no id."""
        up = labs()
        if lab_id is not None:
            up = [s for s in up if s["id"] == lab_id]
            if not up:
                raise InputError(f"no lab {lab_id!r} is up; `multigpu lab status` lists the labs")
        if not up:
            raise InputError("no lab is up; bring one up with `multigpu lab up CLUSTER`")
        if len(up) > 1:
            raise InputError(f"{len(up)} labs are up ({', '.join(s['id'] for s in up)}); choose one with --lab ID")
        st = up[0]
        lab = cls.__new__(cls)
        lab.source_cluster = replace(
            load_cluster(Path(st["cluster_file"]).with_name("source.json")), name=st["cluster"]
        )
        p = st["plan"]
        lab.plan = design(
            lab.source_cluster,
            cpu_scale=p["cpu_scale"],
            bandwidth_scale=p["bandwidth_scale"],
            max_cores=p["max_cores"],
            head=p["head"],
            # A lab brought up before the period kept to the tick had periods from 1 ms.
            tick_us=p.get("tick_us", MIN_PERIOD_US),
        )
        emulated = load_cluster(st["cluster_file"])
        lab.backends = {d.name: d.backend for d in emulated.devices}
        lab.threads = next((d.threads for d in emulated.devices if d.threads), None)
        lab.ray = st["ray"]
        lab.keep_up = True
        lab.echo = lambda s: None
        lab.id = st["id"]
        lab._old_sigterm = None
        lab.hosts = {n: _Host(n, h["netns"], h["uts"], cg.HostCgroups(n, h["cgroups"])) for n, h in st["hosts"].items()}
        return lab


def start_in(entry: HostEntry, argv: Sequence[str], env: Mapping[str, str], **kwargs: Any) -> subprocess.Popen:
    """Start ``argv`` in the host ``entry`` describes, with environment ``env``."""
    fn = entry.preexec()
    try:
        # preexec_fn enters the host's namespaces and cgroups between fork and exec (no Python runs there but it)
        return subprocess.Popen(list(argv), env=dict(env), preexec_fn=fn, **kwargs)  # noqa: PLW1509
    except FileNotFoundError:
        raise InputError(f"host {entry.host!r}: no program {argv[0]!r}; give a path or a program on PATH") from None
    finally:
        HostEntry.release(fn)
