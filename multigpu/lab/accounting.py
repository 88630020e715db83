"""CPU accounting for a run: the CPU seconds of this process and of everything it starts,
however far it runs from its parent (Ray's raylet and gcs_server, Ray's workers, a lab's
hosts), so that a benchmark can tell its own load from other people's.

As root (with cgroup v1's cpuacct controller), this process moves into a cpuacct cgroup
of its own, ``mgl-acct-<pid>``; its children and theirs inherit it wherever they are
re-parented, and a lab brought up from inside nests its hosts' cgroups below it, so
``cpuacct.usage`` counts all of them. Elsewhere a thread polls ``/proc`` for this
process's descendants and sums the CPU time each was last seen with (it misses what a
process used after the last poll and processes that lived less than a poll).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from multigpu.lab.cgroups import find_lab_cgroups, join, own_cgroup, remove_tree, tree_pids
from multigpu.lab.system import CGROUP_ROOT
from multigpu.procfs.stat import PPID, START, STIME, UTIME, stat_fields

__all__ = ["ACCOUNT_ENV", "CpuAccount", "clean_dead", "read_account"]

ACCT_PREFIX = "mgl-acct-"
POLL = 0.2
#: Set while an account is open to its cgroup folder, so that processes the run starts
#: elsewhere (in a lab host) can read the run's CPU seconds (``read_account``).
ACCOUNT_ENV = "MULTIGPU_CPU_ACCOUNT"


def read_account(folder: str) -> float | None:
    """CPU seconds so far of the cpuacct cgroup ``folder`` (an open account's), None if unreadable."""
    try:
        return int((Path(folder) / "cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        return None


def clean_dead() -> list[str]:
    """Remove the accounting cgroups of runs that died (their pid is gone); return them."""
    removed = []
    for d in list(find_lab_cgroups(ACCT_PREFIX)):
        pid = d.name[len(ACCT_PREFIX) :]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            for p in tree_pids(d):
                try:
                    join(p, [str(d.parent / "cgroup.procs")])
                except OSError:
                    pass
            if remove_tree(d):
                removed.append(str(d))
    return removed


class CpuAccount:
    """CPU seconds used by this process and every process it starts, from construction on
    (``seconds()``); ``method`` says how ("cgroup" or "proc"). Call ``close()`` at the end."""

    def __init__(self) -> None:
        self.method = "proc"
        self._dir: Path | None = None
        self._home: Path | None = None
        self._seen: dict[tuple[int, int], float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if os.geteuid() == 0 and (CGROUP_ROOT / "cpuacct" / "cgroup.procs").exists():
            try:
                home = own_cgroup("cpuacct")
                clean_dead()
                d = home / f"{ACCT_PREFIX}{os.getpid()}"
                d.mkdir(exist_ok=True)
                join(os.getpid(), [str(d / "cgroup.procs")])
                self._dir, self._home, self.method = d, home, "cgroup"
                os.environ[ACCOUNT_ENV] = str(d)
            except OSError:
                self._dir = None
        if self._dir is None:
            self._base = self._tree_total()
            self._thread = threading.Thread(target=self._poll, name="multigpu-cpu-account", daemon=True)
            self._thread.start()
        else:
            self._base = self._usage()

    def _usage(self) -> float:
        assert self._dir is not None
        try:
            return int((self._dir / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return 0.0

    # -- /proc fallback ---------------------------------------------------------
    def _tree_total(self) -> float:
        tick = os.sysconf("SC_CLK_TCK")
        children: dict[int, list[int]] = {}
        stats: dict[int, tuple[int, float]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            fields = stat_fields(int(entry))
            if fields is None:
                continue
            pid, ppid = int(entry), int(fields[PPID])
            children.setdefault(ppid, []).append(pid)
            stats[pid] = (int(fields[START]), (int(fields[UTIME]) + int(fields[STIME])) / tick)
        todo, mine = [os.getpid()], []
        while todo:
            p = todo.pop()
            mine.append(p)
            todo += children.get(p, [])
        for p in mine:
            if p in stats:
                start, cpu = stats[p]
                self._seen[(p, start)] = max(self._seen.get((p, start), 0.0), cpu)
        return sum(self._seen.values())

    def _poll(self) -> None:
        while not self._stop.wait(POLL):
            self._tree_total()

    # -- API --------------------------------------------------------------------
    def seconds(self) -> float:
        """CPU seconds used since construction by this process and its processes."""
        if self._dir is not None:
            return self._usage() - self._base
        return self._tree_total() - self._base

    def close(self) -> None:
        """Stop accounting: move this process (and anything still in the cgroup) back, remove it."""
        self._stop.set()
        if self._dir is not None and os.environ.get(ACCOUNT_ENV) == str(self._dir):
            del os.environ[ACCOUNT_ENV]
        if self._dir is not None and self._home is not None:
            for pid in {os.getpid()} | tree_pids(self._dir):
                try:
                    join(pid, [str(self._home / "cgroup.procs")])
                except OSError:
                    pass
            for _ in range(20):
                if remove_tree(self._dir):
                    break
                time.sleep(0.05)
            self._dir = None

    def __enter__(self) -> CpuAccount:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
