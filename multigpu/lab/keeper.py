"""The lab's keeper: the process every daemon of a lab hangs from.

``python -m multigpu.lab.keeper STATE_DIR`` becomes a child subreaper
(``PR_SET_CHILD_SUBREAPER``), runs the start commands listed in
``STATE_DIR/keeper.json`` (groups in order, the commands of a group at once, each in
its host), writes how they went to ``STATE_DIR/keeper-status.json``, and then reaps:
``ray start`` leaves its daemons behind when it exits, and they become the keeper's
children instead of init's. When the lab kills them they are reaped at once, so no
zombie is left for a PID 1 that may never wait for it. The keeper exits on SIGTERM.

A lab that a Python process brought up (``with Lab(...)``) names that process its
owner: when the owner dies without taking the lab down (killed, crashed), the keeper
takes it down itself. A lab from ``multigpu lab up`` has no owner and stays up until
``multigpu lab down``.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from multigpu.lab.state import KEEPER_FILE, REQUESTS, STATUS_FILE
from multigpu.lab.system import process_start

__all__ = ["main"]

PR_SET_CHILD_SUBREAPER = 36
OWNER_POLL = 0.5


def _start(item: dict[str, Any], logs: Path) -> tuple[subprocess.Popen, Any]:
    from multigpu.lab.enter import HostEntry

    entry = HostEntry(**{**item["entry"], "procs_files": tuple(item["entry"]["procs_files"])})
    fn = entry.preexec()
    try:
        with open(logs / f"{item['host']}.log", "ab") as log:  # the child keeps its own copy of the descriptor
            # preexec_fn enters the host's namespaces and cgroups between fork and exec; the keeper runs no threads
            p = subprocess.Popen(
                item["argv"],
                env={**os.environ, **item["env"]},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=fn,  # noqa: PLW1509
                cwd=item.get("cwd") or "/",
            )
    finally:
        HostEntry.release(fn)
    return p, item


def _tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    keep = [x for x in text if "Error" in x or "error" in x] or text
    return " | ".join(keep[-lines:])


def _run_groups(groups: list[list[dict[str, Any]]], logs: Path) -> dict[str, Any]:
    """Run each group's commands at once, the groups in order; stop at the first failure."""
    status: dict[str, Any] = {"ok": True, "started": []}
    for group in groups:
        running = [_start(item, logs) for item in group]
        for p, item in running:
            timeout = float(item.get("timeout", 120))
            try:
                rc: Any = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                rc = f"did not finish within {timeout:g} s"
            if rc != 0:
                status.update(ok=False, failed=item["host"], status=rc, tail=_tail(logs / f"{item['host']}.log"))
            else:
                status["started"].append(item["host"])
        if not status["ok"]:
            break
    return status


def _answer(path: Path, status: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(status))
    tmp.replace(path)


def main(argv: list[str]) -> int:
    """Run the keeper for the lab whose state lives in ``argv[0]``."""
    state = Path(argv[0])
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the terminal is the lab's to handle
    plan = json.loads((state / KEEPER_FILE).read_text())
    logs = state / "logs"
    logs.mkdir(exist_ok=True)
    fifo = state / REQUESTS
    if not fifo.exists():
        os.mkfifo(fifo, 0o600)
    requests = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # RDWR: no EOF while no writer is connected
    _answer(state / STATUS_FILE, _run_groups(plan.get("groups", []), logs))
    owner = plan.get("owner")
    checked = time.monotonic()
    pending = b""
    while not stop["now"]:
        if owner and time.monotonic() - checked > OWNER_POLL:
            checked = time.monotonic()
            if process_start(owner["pid"]) != owner["start"]:  # it died without taking the lab down
                from multigpu.lab.lab import teardown

                teardown(state.name)
                return 0
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pid = 0
        try:
            pending += os.read(requests, 65536)
        except BlockingIOError:
            pass
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            req = json.loads(line)
            _answer(state / f"request-{req['id']}.json", _run_groups([req["group"]], logs))
        if pid == 0:
            time.sleep(0.05)
    # Reap what is left (the lab killed it just before stopping the keeper).
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
