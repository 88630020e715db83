"""How many CPU cores this process may use: its CPU affinity, capped by a cgroup quota
(a container limited to 1.5 CPUs of a 64-core machine has 1.5 cores, not 64)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

__all__ = ["usable_cores"]


def _cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> Optional[float]:
    """CPUs the cgroup quota allows, or None without one (v2 ``cpu.max``, v1 ``cfs_quota_us``)."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def usable_cores() -> float:
    """Cores this process may run on: the CPU affinity set (or the CPU count), capped by
    the cgroup's CPU quota."""
    try:
        n = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):   # pragma: no cover - macOS has no sched_getaffinity
        n = float(os.cpu_count() or 1)
    quota = _cgroup_quota()
    return min(n, quota) if quota is not None and quota > 0 else n
