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
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from multigpu.contract.registry import declaration
from multigpu.distributed.job import Job, LaunchPlan, check_job, rank_env
from multigpu.errors import InputError, RankFailedError
from multigpu.procfs.stat import PPID, stat_fields

GRACE = 3.0  # seconds between SIGTERM and SIGKILL
POLL = 0.02

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

    def __init__(self, label: str, argv: list[str], env: dict[str, str], out: TextIO | None, prefix: bool):
        self.label = label
        self.tail: deque[str] = deque(maxlen=64)
        self.ended_at: float | None = None
        try:
            self.popen = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=_set_pdeathsig,
            )
        except OSError as exc:
            raise InputError(f"cannot start {label}: {argv[0]!r}: {exc.strerror}") from exc
        self.pid = self.popen.pid
        self._reader = threading.Thread(target=self._read, args=(out, prefix), daemon=True, name=f"multigpu-{label}")
        self._reader.start()

    def _read(self, out: TextIO | None, prefix: bool) -> None:
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

    def poll(self) -> int | None:
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
        stat = stat_fields(int(entry))
        if stat is None:
            continue
        children.setdefault(int(stat[PPID]), []).append(int(entry))
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
def run(
    job: Job,
    command: Sequence[str],
    env: dict[str, str] | None = None,
    out: TextIO | None = None,
    on_start: Callable[[list[int]], None] | None = None,
) -> Job:
    """Run the argv ``command`` as ``job.nproc`` ranks of ``job`` on this node; return when all succeed.

    ``out`` receives every child's stderr (rank 0 unchanged, the others prefixed with
    ``[rank r]``); the default is this process's stderr. Raises RankFailedError naming
    the first rank or service that failed, InputError for a bad job or command, and
    KeyboardInterrupt after stopping every child on Ctrl-C. Returns the job as run
    (with its port and id).
    """
    # Ctrl-C becomes a flag from the first line: a KeyboardInterrupt raised while the job's plan
    # loads could be swallowed on the way (the launcher then ran its ranks as if never
    # interrupted: seen once in a README run, its stacks dumped in the poll loop).
    with _DeferredInterrupt() as interrupted:
        job = check_job(job)
        if not command:
            raise InputError("no command for the ranks to run; pass an argv such as [sys.executable, 'script.py']")
        argv = list(command)
        plan: LaunchPlan = declaration(job.backend).launch_plan(job)
        base = dict(os.environ if env is None else env)
        if job.nproc > 1 and "OMP_NUM_THREADS" not in base:
            # As torchrun does: N ranks on one node share its cores.
            base["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // job.nproc))
        if interrupted.is_set():
            raise KeyboardInterrupt
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


def _supervise(
    job: Job,
    plan: LaunchPlan,
    argv: list[str],
    base: dict[str, str],
    sink: TextIO,
    on_start: Callable[[list[int]], None] | None,
    interrupted: threading.Event,
) -> None:
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
    # On several hosts, say which one: the other nodes' launchers report their own ranks.
    on = f" on host {socket.gethostname()}" if job.nnodes > 1 else ""
    msg = f"{first.label} (pid {first.pid}{on}) {first.how()}" + (
        f": {err}" if err and first.popen.returncode and first.popen.returncode > 0 else ""
    )
    others = [f"{c.label} {c.how()}" + (f" ({c.last_error()})" if c.last_error() else "") for c in failed[1:]]
    if others:
        msg += "; then " + "; ".join(others)
    if running:
        msg += f"; stopped {', '.join(running)} (still running)"
    return f"{job.backend} job {job.job_id} failed: {msg}"
