"""How many CPU cores this process may use: its CPU affinity, capped by a cgroup quota
(a container limited to 1.5 CPUs of a 64-core machine has 1.5 cores, not 64; a host of
the emulated lab limited to a quarter of a core has 0.25)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["usable_cores"]


def _own_dir(root: Path, controller: str) -> Path:
    """This process's cgroup directory in the v1 hierarchy of ``controller`` (its root when
    /proc/self/cgroup does not say: inside a container the root is the container's own)."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            if controller in names.split(","):
                own = root / controller / path.lstrip("/")
                if own.is_dir():
                    return own
    except (OSError, ValueError):
        pass
    return root / controller


def _cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs the cgroup quota allows, or None without one (v2 ``cpu.max``, v1 ``cfs_quota_us``
    of this process's own cgroup and every one above it: the smallest counts)."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    base = root / "cpu"
    d = _own_dir(root, "cpu")
    found: float | None = None
    while True:
        try:
            quota_us = int((d / "cpu.cfs_quota_us").read_text())
            period_us = int((d / "cpu.cfs_period_us").read_text())
            if quota_us > 0 and period_us > 0:
                found = quota_us / period_us if found is None else min(found, quota_us / period_us)
        except (OSError, ValueError):
            pass
        if d == base or base not in d.parents:
            return found
        d = d.parent


def usable_cores() -> float:
    """Cores this process may run on: the CPU affinity set (or the CPU count), capped by
    the cgroup's CPU quota."""
    try:
        n = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - macOS has no sched_getaffinity
        n = float(os.cpu_count() or 1)
    quota = _cgroup_quota()
    return min(n, quota) if quota is not None and quota > 0 else n
