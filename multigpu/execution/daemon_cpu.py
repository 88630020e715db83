"""The CPU of a worker's node daemon: Ray's raylet, the process that starts the worker
(its parent), which moves every object between nodes. Pulling a stage's input from
another host and serving its output to the next are that process's work, not the
worker's, and on a host of the emulated lab it shares the host's CPU quota: on imac
(0.46 cores), streaming AlexNet's conv3..fc8 stage, the raylet spent 6.3 ms of CPU per
item (173 KB in, 4 KB out) against 24.6 ms in the worker itself (measured on this
project's 2-core machine), which the worker's own ``time.process_time`` never sees.

Read from ``/proc`` (Linux): each thread's ``schedstat`` (nanoseconds on a CPU), or
the process's ``stat`` (clock ticks) where that is missing; None where neither can
be read.
"""

from __future__ import annotations

import os
from pathlib import Path

from multigpu.procfs.stat import STIME, UTIME, stat_fields

__all__ = ["node_daemon", "process_cpu_seconds"]


def process_cpu_seconds(pid: int, proc: Path = Path("/proc")) -> float | None:
    """CPU seconds so far of process ``pid``, every thread; None if /proc cannot say."""
    base = proc / str(pid)
    try:
        total = 0
        for task in (base / "task").iterdir():
            total += int((task / "schedstat").read_text().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        pass
    fields = stat_fields(pid, proc)
    try:
        return None if fields is None else (int(fields[UTIME]) + int(fields[STIME])) / os.sysconf("SC_CLK_TCK")
    except (ValueError, IndexError):
        return None


def node_daemon(pid: int | None = None, proc: Path = Path("/proc")) -> tuple[int | None, float | None]:
    """(pid, CPU seconds so far) of the Ray worker's raylet: ``pid`` (default: this
    process's parent) when that process is a raylet; (None, None) where it is not, or
    cannot be read, so no other parent's CPU is ever counted as the daemon's."""
    pid = os.getppid() if pid is None else pid
    try:
        if (proc / str(pid) / "comm").read_text().strip() != "raylet":
            return None, None
    except OSError:
        return None, None
    seconds = process_cpu_seconds(pid, proc)
    return (pid, seconds) if seconds is not None else (None, None)
