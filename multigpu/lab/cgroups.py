"""A lab host's cgroups (v1): its CPU quota, CPU accounting and memory limit.

Each host gets ``<creator's cgroup>/mgl-<lab>/<host>`` in the cpu, cpuacct and memory
hierarchies, below the cgroup of the process that brought the lab up (so a sandbox
that accounts for that process keeps accounting for the lab). Every process started
in the host joins all three before it runs anything (``Lab`` does it for the Ray node
and for ``exec``), and its children inherit them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from multigpu.errors import LabError
from multigpu.lab.system import CGROUP_ROOT, CONTROLLERS

__all__ = ["HostCgroups", "find_lab_cgroups", "own_cgroup", "process_cgroup"]

#: How deep below a controller's root a lab's cgroups are looked for after a crash.
SEARCH_DEPTH = 5


def process_cgroup(controller: str, pid: str = "self") -> Path:
    """The directory of process ``pid``'s cgroup in the v1 ``controller`` hierarchy."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError as e:
        raise LabError(f"cannot read /proc/{pid}/cgroup: {e.strerror}") from None
    for line in lines:
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return CGROUP_ROOT / controller / path.lstrip("/")
    return CGROUP_ROOT / controller


def own_cgroup(controller: str) -> Path:
    """This process's cgroup directory in ``controller``."""
    return process_cgroup(controller)


def _write(path: Path, value: str, what: str) -> None:
    try:
        path.write_text(value)
    except OSError as e:
        raise LabError(f"{what}: cannot write {value!r} to {path}: {e.strerror}") from None


@dataclass(frozen=True)
class HostCgroups:
    """The cgroups of one lab host: ``dirs[controller]`` is its directory there."""

    host: str
    dirs: dict[str, str]

    @classmethod
    def at(cls, lab_dir_name: str, host: str, parents: dict[str, str] | None = None) -> HostCgroups:
        """The cgroups ``<parent>/<lab_dir_name>/<host>`` (parents: this process's cgroups)."""
        parents = parents or {c: str(own_cgroup(c)) for c in CONTROLLERS}
        return cls(host, {c: str(Path(parents[c]) / lab_dir_name / host) for c in CONTROLLERS})

    def create(self, cores: float, period_us: int, quota_us: int, memory: int | None) -> None:
        """Make the directories and set the CPU quota and the memory limit (no swap either)."""
        what = f"host {self.host!r}"
        for d in self.dirs.values():
            try:
                Path(d).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise LabError(f"{what}: cannot create cgroup {d}: {e.strerror}") from None
        cpu = Path(self.dirs["cpu"])
        _write(cpu / "cpu.cfs_period_us", str(period_us), what)
        _write(cpu / "cpu.cfs_quota_us", str(quota_us), what)
        if memory is not None:
            mem = Path(self.dirs["memory"])
            _write(mem / "memory.limit_in_bytes", str(int(memory)), what)
            if (mem / "memory.memsw.limit_in_bytes").exists():
                _write(mem / "memory.memsw.limit_in_bytes", str(int(memory)), what)

    def set_memory(self, limit: int | None) -> None:
        """Set the memory limit (bytes; None: unlimited), the swap limit beside it."""
        mem = Path(self.dirs["memory"])
        value = "-1" if limit is None else str(int(limit))
        both = [mem / "memory.memsw.limit_in_bytes", mem / "memory.limit_in_bytes"]
        # memsw must stay >= the limit: raise memsw first, lower it last.
        order = both if limit is None or int(limit) > (self.memory()["limit"] or 0) else both[::-1]
        for f in order:
            if f.exists():
                _write(f, value, f"host {self.host!r}")

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` file of each controller (a process joins by writing its pid)."""
        return [str(Path(d) / "cgroup.procs") for d in self.dirs.values()]

    def pids(self) -> set[int]:
        """Every process in any of the host's cgroups."""
        out: set[int] = set()
        for f in self.procs_files:
            try:
                out |= {int(x) for x in Path(f).read_text().split()}
            except OSError:
                pass
        return out

    def cpu_seconds(self) -> float | None:
        """CPU seconds every process of the host has used (cpuacct), None if unreadable."""
        try:
            return int((Path(self.dirs["cpuacct"]) / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return None

    def memory(self) -> dict[str, int | None]:
        """Bytes in use, the peak, the limit, and how many times the kernel's OOM killer
        killed a process here (``oom_kills``; None where the kernel does not count)."""
        mem = Path(self.dirs["memory"])

        def read(name: str) -> int | None:
            try:
                return int((mem / name).read_text().split()[0])
            except (OSError, ValueError, IndexError):
                return None

        kills = None
        try:
            m = re.search(r"^oom_kill (\d+)$", (mem / "memory.oom_control").read_text(), re.MULTILINE)
            kills = int(m.group(1)) if m else None
        except OSError:
            pass
        return {
            "usage": read("memory.usage_in_bytes"),
            "peak": read("memory.max_usage_in_bytes"),
            "limit": read("memory.limit_in_bytes"),
            "failcnt": read("memory.failcnt"),
            "oom_kills": kills,
        }

    def remove(self) -> list[str]:
        """Remove the directories (and the lab's, once empty); return the ones still busy."""
        busy = []
        for d in self.dirs.values():
            p = Path(d)
            try:
                if p.exists():
                    p.rmdir()
            except OSError:
                busy.append(d)
            try:
                if (
                    p.parent.name.startswith("mgl-")
                    and p.parent.exists()
                    and not any(x.is_dir() for x in p.parent.iterdir())
                ):
                    p.parent.rmdir()
            except OSError:
                pass
        return busy


def find_lab_cgroups(prefix: str) -> Iterator[Path]:
    """Every cgroup directory named ``prefix*`` in the lab's controllers (a lab's, after a crash)."""
    for c in CONTROLLERS:
        root = CGROUP_ROOT / c
        todo = [(root, 0)]
        while todo:
            d, depth = todo.pop()
            try:
                subs = [x for x in d.iterdir() if x.is_dir()]
            except OSError:
                continue
            for x in subs:
                if x.name.startswith(prefix):
                    yield x
                elif depth < SEARCH_DEPTH:
                    todo.append((x, depth + 1))


def remove_tree(path: Path) -> bool:
    """Remove a cgroup directory and its children (bottom up); False if one is still busy."""
    ok = True
    for sub in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        try:
            sub.rmdir()
        except OSError:
            ok = False
    try:
        path.rmdir()
    except OSError:
        ok = False
    return ok


def tree_pids(path: Path) -> set[int]:
    """Every process in ``path`` or below it."""
    out: set[int] = set()
    for f in [path / "cgroup.procs", *path.rglob("cgroup.procs")]:
        try:
            out |= {int(x) for x in f.read_text().split()}
        except OSError:
            pass
    return out


def join(pid: int, procs_files: list[str]) -> None:
    """Move process ``pid`` into the cgroups whose ``cgroup.procs`` files are given."""
    for f in procs_files:
        fd = os.open(f, os.O_WRONLY)
        try:
            os.write(fd, str(pid).encode())
        finally:
            os.close(fd)
