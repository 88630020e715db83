"""The commands the lab runs (``ip``, ``tc``, ``unshare``, ``mount``) and the check that
this machine can host a lab at all.

Every command goes through ``run``, so a failure reads the same everywhere: the
command, its exit status and its last error line, as a ``LabError``.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from multigpu.errors import LabError, LabUnsupportedError
from multigpu.procfs.stat import START, STATE, stat_fields

__all__ = [
    "CGROUP_ROOT",
    "CONTROLLERS",
    "DEFAULT_TICK_US",
    "TOOLS",
    "process_start",
    "require_support",
    "run",
    "scheduler_tick_us",
]

#: Where cgroup v1 mounts its controllers.
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: The cgroup v1 controllers the lab uses: CPU quota, CPU accounting, memory limit.
CONTROLLERS = ("cpu", "cpuacct", "memory")
#: Programs the lab runs.
TOOLS = ("ip", "tc", "unshare", "mount", "umount")
#: The scheduler tick taken where the kernel's configuration cannot be read: 4 ms (HZ=250,
#: Debian's and this machine's). A CFS period of at least this is also at least the tick of
#: any kernel with HZ of 250 or more.
DEFAULT_TICK_US = 4000


def run(
    argv: Sequence[str], what: str, *, check: bool = True, timeout: float = 30.0, stdin: str | None = None
) -> subprocess.CompletedProcess:
    """Run ``argv``; return the finished process. Raises LabError naming ``what``, the
    command and its last error line when it fails (``check``) or outlasts ``timeout``."""
    try:
        done = subprocess.run(list(argv), check=False, capture_output=True, text=True, timeout=timeout, input=stdin)
    except FileNotFoundError:
        raise LabError(
            f"{what}: the program {argv[0]!r} is not installed (apt-get install iproute2 util-linux)"
        ) from None
    except subprocess.TimeoutExpired:
        raise LabError(f"{what}: `{' '.join(argv)}` did not finish within {timeout:g} s") from None
    if check and done.returncode != 0:
        err = (done.stderr or done.stdout).strip().splitlines()
        raise LabError(
            f"{what}: `{' '.join(argv)}` exited with status {done.returncode}" + (f": {err[-1]}" if err else "")
        )
    return done


def process_start(pid: int) -> int | None:
    """The start time (clock ticks since boot) of process ``pid``, None when it is gone or a
    zombie: a pid with another start time is another process."""
    stat = stat_fields(pid)
    return None if stat is None or stat[STATE] == "Z" else int(stat[START])


def scheduler_tick_us(configs: Sequence[Path] | None = None) -> int:
    """The kernel's scheduler tick in microseconds (1e6 / CONFIG_HZ), read from its build
    configuration (``/proc/config.gz``, else ``/boot/config-RELEASE``); DEFAULT_TICK_US when
    neither can be read."""
    if configs is None:
        configs = [Path("/proc/config.gz"), Path(f"/boot/config-{os.uname().release}")]
    for path in configs:
        try:
            raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
        found = re.search(rb"^CONFIG_HZ=(\d+)$", raw, re.MULTILINE)
        if found and int(found.group(1)) > 0:
            return round(1e6 / int(found.group(1)))
    return DEFAULT_TICK_US


def require_support() -> None:
    """Raise LabUnsupportedError (one line, exit 2) unless this machine can host a lab:
    root, the tools, network namespaces with veth pairs, tc's htb qdisc, and cgroup v1's
    cpu, cpuacct and memory controllers."""
    if os.geteuid() != 0:
        raise LabUnsupportedError(
            "the lab needs root (it creates network namespaces, shapes links with tc and "
            "limits CPU and memory with cgroups); run it with sudo, or as root in a container "
            "started with --privileged"
        )
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise LabUnsupportedError(
            f"the lab needs {', '.join(missing)}, which this machine lacks; install them "
            f"(Debian/Ubuntu: apt-get install iproute2 util-linux mount)"
        )
    absent = [c for c in CONTROLLERS if not (CGROUP_ROOT / c / "cgroup.procs").exists()]
    if absent:
        raise LabUnsupportedError(
            f"the lab limits hosts with cgroup v1's {', '.join(CONTROLLERS)} controllers, but "
            f"{', '.join(str(CGROUP_ROOT / c) for c in absent)} is not mounted (a cgroup v2-only "
            f"system is not supported yet)"
        )
    probe = f"mgl-probe-{os.getpid()}"
    try:
        made = subprocess.run(["ip", "netns", "add", probe], check=False, capture_output=True, text=True, timeout=10)
        if made.returncode != 0:
            raise LabUnsupportedError(
                f"this kernel cannot create network namespaces (`ip netns add` says: "
                f"{made.stderr.strip() or made.returncode})"
            )
        veth = subprocess.run(
            ["ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1"],
            check=False,
            capture_output=True,
            text=True,
            timeout=10,
        )
        if veth.returncode != 0:
            raise LabUnsupportedError(
                f"this kernel cannot create veth pairs (`ip link add type veth` says: "
                f"{veth.stderr.strip() or veth.returncode})"
            )
        for qdisc in ("htb", "tbf"):
            args = ["tc", "-n", probe, "qdisc", "add", "dev", "p0", "root", "handle", "1:", qdisc]
            if qdisc == "tbf":
                args += ["rate", "8mbit", "burst", "32kbit", "latency", "50ms"]
            got = subprocess.run(args, check=False, capture_output=True, text=True, timeout=10)
            if got.returncode != 0:
                raise LabUnsupportedError(
                    f"this kernel lacks tc's {qdisc} qdisc, which shapes the lab's links "
                    f"(`tc qdisc add ... {qdisc}` says: {got.stderr.strip() or got.returncode})"
                )
            subprocess.run(
                ["tc", "-n", probe, "qdisc", "del", "dev", "p0", "root"], check=False, capture_output=True, timeout=10
            )
    finally:
        subprocess.run(["ip", "netns", "del", probe], check=False, capture_output=True, timeout=10)
