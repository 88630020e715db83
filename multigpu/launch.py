"""Start a multi-process job on this node and supervise it until it ends, one way or another.

The rendezvous is each framework's own: the adapter's ``launch_plan(job)`` returns the
variables its engine reads (torch's ``env://`` set as torchrun sets it, Paddle's
``PADDLE_*`` as ``paddle.distributed.launch`` sets them, MXNet's ``DMLC_*`` roles as
its dmlc tracker sets them) and any service processes it needs (MXNet's scheduler and
parameter servers). The supervision is one for all engines:

* ports are picked free on a single node, so jobs run side by side;
* every child runs in its own session and dies with the launcher (``PR_SET_PDEATHSIG``);
* the first rank or service that fails stops the whole job: each child's process
  group and every descendant get SIGTERM, then SIGKILL after a grace period, on
  success, on failure and on Ctrl-C alike;
* ``RankFailedError`` names the rank that failed first, how (exit status or signal),
  and its last error line.

This module imports no framework: adapters' package ``__init__`` files are
framework-free, and every framework is loaded only inside the child processes.
"""
from __future__ import annotations

import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, TextIO

from .errors import InputError, RankFailedError
from .registry import adapter_module

# Variables every rank receives, whatever the engine (read by ``multigpu.distributed``).
ENV_BACKEND = "MULTIGPU_BACKEND"
ENV_RANK = "MULTIGPU_RANK"
ENV_WORLD_SIZE = "MULTIGPU_WORLD_SIZE"
ENV_LOCAL_RANK = "MULTIGPU_LOCAL_RANK"
ENV_LOCAL_WORLD_SIZE = "MULTIGPU_LOCAL_WORLD_SIZE"
ENV_MASTER_ADDR = "MULTIGPU_MASTER_ADDR"
ENV_MASTER_PORT = "MULTIGPU_MASTER_PORT"
ENV_TIMEOUT = "MULTIGPU_TIMEOUT"
ENV_INIT_TIMEOUT = "MULTIGPU_INIT_TIMEOUT"
ENV_JOB_ID = "MULTIGPU_JOB_ID"
ENV_CHECK = "MULTIGPU_CHECK"

DEFAULT_TIMEOUT = 60.0
DEFAULT_INIT_TIMEOUT = 300.0
DEFAULT_MULTI_HOST_PORT = 29500  # torchrun's default; every node must agree on it
GRACE = 3.0  # seconds between SIGTERM and SIGKILL
POLL = 0.02


@dataclass(frozen=True)
class Job:
    """What this node's launcher knows about the job."""

    backend: str
    nproc: int  # ranks on this node
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0  # 0: pick a free port (single node only)
    node_addr: Optional[str] = None  # this node's address as the other nodes reach it
    timeout: float = DEFAULT_TIMEOUT
    init_timeout: float = DEFAULT_INIT_TIMEOUT
    servers: int = 1  # MXNet parameter servers per node
    check: bool = True  # the header exchange before each collective
    job_id: str = ""

    @property
    def world_size(self) -> int:
        """Ranks across every node."""
        return self.nproc * self.nnodes

    def rank(self, local_rank: int) -> int:
        """The global rank of this node's ``local_rank``."""
        return self.node_rank * self.nproc + local_rank

    @property
    def host(self) -> str:
        """This node's address for engines that announce one (loopback on one node)."""
        if self.node_addr:
            return self.node_addr
        return "127.0.0.1" if self.nnodes == 1 else ""


@dataclass
class Service:
    """A process an engine needs besides the ranks (e.g. MXNet's scheduler and servers)."""

    name: str
    argv: list[str]
    env: dict[str, str]


@dataclass
class LaunchPlan:
    """An adapter's answer to ``launch_plan(job)``: variables per local rank and services."""

    rank_env: list[dict[str, str]]
    services: list[Service] = field(default_factory=list)


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_job(job: Job) -> Job:
    """Return ``job`` with a port picked and a job id; raise InputError for a bad setting."""
    def bad(name: str, value: Any, fix: str) -> None:
        raise InputError(f"{name}={value!r} is not valid; {fix}")

    if isinstance(job.nproc, bool) or not isinstance(job.nproc, int) or job.nproc < 1:
        bad("nproc", job.nproc, "use a positive integer, e.g. --nproc 2")
    if isinstance(job.nnodes, bool) or not isinstance(job.nnodes, int) or job.nnodes < 1:
        bad("nnodes", job.nnodes, "use a positive integer")
    if not isinstance(job.node_rank, int) or not 0 <= job.node_rank < job.nnodes:
        bad("node_rank", job.node_rank, f"use 0..{job.nnodes - 1} (one distinct value per node)")
    if not isinstance(job.master_port, int) or not 0 <= job.master_port < 65536:
        bad("master_port", job.master_port, "use a TCP port in 1..65535")
    for name in ("timeout", "init_timeout"):
        value = getattr(job, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            bad(name, value, "use a positive number of seconds, e.g. 60")
    if job.servers < 1:
        bad("servers", job.servers, "use at least 1 parameter server per node")
    module = adapter_module(job.backend)
    if not hasattr(module, "launch_plan"):
        raise InputError(f"backend {job.backend!r} has no multi-process engine; "
                         "use numpy, torch, paddle or mxnet")
    port = job.master_port
    if port == 0:
        if job.nnodes > 1:
            port = DEFAULT_MULTI_HOST_PORT
        else:
            port = free_port(job.master_addr)
    return replace(job, master_port=port, job_id=job.job_id or uuid.uuid4().hex[:12])


def rank_env(job: Job, local_rank: int) -> dict[str, str]:
    """The ``MULTIGPU_*`` variables of one local rank."""
    return {ENV_BACKEND: job.backend, ENV_RANK: str(job.rank(local_rank)),
            ENV_WORLD_SIZE: str(job.world_size), ENV_LOCAL_RANK: str(local_rank),
            ENV_LOCAL_WORLD_SIZE: str(job.nproc), ENV_MASTER_ADDR: job.master_addr,
            ENV_MASTER_PORT: str(job.master_port), ENV_TIMEOUT: repr(float(job.timeout)),
            ENV_INIT_TIMEOUT: repr(float(job.init_timeout)), ENV_JOB_ID: job.job_id,
            ENV_CHECK: "1" if job.check else "0"}


def command_argv(command: Sequence[str]) -> list[str]:
    """Turn ``launch``'s command into argv: a multigpu sub-command, a .py script, or a program."""
    from .cli import COMMANDS

    if not command:
        raise InputError("no command given; write it after '--', e.g. 'multigpu launch --nproc 2 -- train --epochs 1'")
    first = command[0]
    if first == "launch":
        raise InputError("'launch' cannot launch itself; give the command each rank runs, e.g. 'train'")
    if first in COMMANDS:
        return [sys.executable, "-m", "multigpu", *command]
    if first.endswith(".py"):
        if not Path(first).is_file():
            raise InputError(f"script {first!r} does not exist; pass a path to a Python file")
        return [sys.executable, *command]
    return list(command)


# -- children --------------------------------------------------------------------
_GROUP_ERROR = re.compile(r"rank \d+ of \d+ \([^)]*\): ")  # how CheckedGroup's errors begin
_ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|Interrupt|Exit)\b.*|.*\berror\b.*", re.IGNORECASE)


def _set_pdeathsig() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the launcher's own cleanup still applies


class _Child:
    """One supervised process: its output is forwarded and its tail kept for error messages."""

    def __init__(self, label: str, argv: list[str], env: dict[str, str], out: Optional[TextIO],
                 prefix: bool):
        self.label = label
        self.tail: deque[str] = deque(maxlen=64)
        self.ended_at: Optional[float] = None
        try:
            self.popen = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                          start_new_session=True, preexec_fn=_set_pdeathsig)
        except OSError as exc:
            raise InputError(f"cannot start {label}: {argv[0]!r}: {exc.strerror}") from exc
        self.pid = self.popen.pid
        self._reader = threading.Thread(target=self._read, args=(out, prefix), daemon=True,
                                        name=f"multigpu-{label}")
        self._reader.start()

    def _read(self, out: Optional[TextIO], prefix: bool) -> None:
        assert self.popen.stderr is not None
        fd, pending = self.popen.stderr.fileno(), ""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            text = chunk.decode(errors="replace")
            if out is not None and not prefix:
                _write(out, text)
            pending += text
            *lines, pending = pending.split("\n")
            for line in lines:
                self._keep(line)
                if out is not None and prefix:
                    _write(out, f"[{self.label}] {line}\n")
        if pending:
            self._keep(pending)
            if out is not None and prefix:
                _write(out, f"[{self.label}] {pending}\n")

    def _keep(self, line: str) -> None:
        line = line.split("\r")[-1].rstrip()  # a progress bar redraws with \r
        if line:
            self.tail.append(line)

    def poll(self) -> Optional[int]:
        rc = self.popen.poll()
        if rc is not None and self.ended_at is None:
            self.ended_at = time.monotonic()
        return rc

    def join_output(self, timeout: float = 2.0) -> None:
        self._reader.join(timeout)

    def how(self) -> str:
        """How the process ended, for messages: "exited with status 1" or "was killed by SIGKILL"."""
        rc = self.popen.returncode
        if rc is None:
            return "is still running"
        if rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            return f"was killed by {name}"
        return f"exited with status {rc}"

    def last_error(self) -> str:
        lines = list(self.tail)
        for line in reversed(lines):
            if _ERROR_LINE.match(line.strip()):
                return line.strip()
        return lines[-1].strip() if lines else ""


def _write(out: TextIO, text: str) -> None:
    try:
        out.write(text)
        out.flush()
    except (OSError, ValueError):
        pass  # the launcher's own output is gone; keep supervising


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _signal_tree(child: _Child, sig: int) -> None:
    pids = _descendants(child.pid)
    for target in (child.pid, *pids):
        try:
            os.killpg(target, sig) if target == child.pid else os.kill(target, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop(children: Sequence[_Child], grace: float = GRACE) -> None:
    """SIGTERM every child's tree, SIGKILL what is left after ``grace`` seconds, reap all."""
    alive = [c for c in children if c.poll() is None]
    for c in alive:
        _signal_tree(c, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive and time.monotonic() < deadline:
        alive = [c for c in alive if c.poll() is None]
        time.sleep(POLL)
    for c in children:
        # SIGKILL the group too: a grandchild may outlive its parent.
        _signal_tree(c, signal.SIGKILL)
    for c in children:
        c.popen.wait()
        c.poll()
        c.join_output()


# -- the supervisor --------------------------------------------------------------
def run(job: Job, command: Sequence[str], env: Optional[dict[str, str]] = None,
        out: Optional[TextIO] = None, on_start: Optional[Callable[[list[int]], None]] = None) -> Job:
    """Run ``command`` as ``job.nproc`` ranks of ``job`` on this node; return when all succeed.

    ``out`` receives every child's stderr (rank 0 unchanged, the others prefixed with
    ``[rank r]``); the default is this process's stderr. Raises RankFailedError naming
    the first rank or service that failed, InputError for a bad job or command, and
    KeyboardInterrupt after stopping every child on Ctrl-C. Returns the job as run
    (with its port and id).
    """
    job = check_job(job)
    argv = command_argv(command)
    plan: LaunchPlan = adapter_module(job.backend).launch_plan(job)
    base = dict(os.environ if env is None else env)
    if job.nproc > 1 and "OMP_NUM_THREADS" not in base:
        # As torchrun does: N ranks on one node share its cores.
        base["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // job.nproc))
    with _DeferredInterrupt() as interrupted:
        _supervise(job, plan, argv, base, sys.stderr if out is None else out, on_start, interrupted)
    return job


class _DeferredInterrupt:
    """Turn Ctrl-C into a flag that the supervisor checks between polls.

    Python raises KeyboardInterrupt between any two bytecodes; raised inside
    ``Popen.poll`` it can leave the Popen's internal waitpid lock held, and the
    cleanup's ``wait()`` then blocks forever. Outside the main thread, where no
    handler can be installed, Ctrl-C reaches the main thread as usual.
    """

    def __enter__(self) -> threading.Event:
        self.flag, self.old = threading.Event(), None
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGINT, lambda signum, frame: self.flag.set())
        return self.flag

    def __exit__(self, *exc: Any) -> None:
        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)


def _supervise(job: Job, plan: LaunchPlan, argv: list[str], base: dict[str, str], sink: TextIO,
               on_start: Optional[Callable[[list[int]], None]], interrupted: threading.Event) -> None:
    services: list[_Child] = []
    ranks: list[_Child] = []
    try:
        for s in plan.services:
            services.append(_Child(s.name, s.argv, {**base, **s.env}, sink, prefix=True))
        for local in range(job.nproc):
            rank = job.rank(local)
            child_env = {**base, **plan.rank_env[local], **rank_env(job, local)}
            ranks.append(_Child(f"rank {rank}", argv, child_env, sink, prefix=rank != 0))
        children = services + ranks
        if on_start is not None:
            on_start([c.pid for c in children])
        while True:
            if interrupted.is_set():
                raise KeyboardInterrupt
            done = [c for c in ranks if c.poll() == 0]
            # A service that exits 0 has finished its part (MXNet's end once every worker
            # has said goodbye); a rank left waiting on it hits its collective deadline.
            failed = [c for c in children if c.poll() not in (None, 0)]
            if failed:
                # Give simultaneous failures a moment to land, then report the cause first.
                time.sleep(0.2)
                failed = [c for c in children if c.poll() not in (None, 0)]
                running = [c.label for c in children if c.poll() is None]
                stop(children)
                error = RankFailedError(_failure_message(job, failed, running))
                error.status = failed[0].popen.returncode
                raise error
            if len(done) == len(ranks):
                break
            time.sleep(POLL)
        deadline = time.monotonic() + 10.0  # services end once every worker has left
        while any(c.poll() is None for c in services) and time.monotonic() < deadline:
            if interrupted.is_set():
                raise KeyboardInterrupt
            time.sleep(POLL)
    finally:
        stop(services + ranks)


def _failure_message(job: Job, failed: list[_Child], running: list[str]) -> str:
    def cause_rank(c: _Child) -> tuple[int, float]:
        # A rank whose peer died fails with a collective error a moment later; the
        # rank that failed on its own (a signal, another exception) is the cause.
        err = c.last_error()
        if (c.popen.returncode or 0) < 0:
            return (0, c.ended_at or 0.0)
        secondary = "Collective" in err or _GROUP_ERROR.search(err) is not None
        return (2 if secondary else 1, c.ended_at or 0.0)

    failed.sort(key=cause_rank)
    first = failed[0]
    err = first.last_error()
    msg = f"{first.label} (pid {first.pid}) {first.how()}" + (f": {err}" if err and first.popen.returncode and
                                                              first.popen.returncode > 0 else "")
    others = [f"{c.label} {c.how()}" + (f" ({c.last_error()})" if c.last_error() else "") for c in failed[1:]]
    if others:
        msg += "; then " + "; ".join(others)
    if running:
        msg += f"; stopped {', '.join(running)} (still running)"
    return f"{job.backend} job {job.job_id} failed: {msg}"
