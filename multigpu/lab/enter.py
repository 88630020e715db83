"""Start a process inside a lab host: its network namespace, its hostname (a UTS
namespace) and its cgroups, joined between fork and exec so the program's first
instruction already runs there.

``setns(2)`` is used directly rather than ``ip netns exec``, which also remounts
``/sys`` for the namespace: that hides ``/sys/fs/cgroup``, and a process then cannot
read its own CPU quota (``multigpu.execution.cores`` does, to report a host's cores).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable
from dataclasses import dataclass

from multigpu.errors import LabError

__all__ = ["HostEntry"]

CLONE_NEWNET = 0x40000000
CLONE_NEWUTS = 0x04000000


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


@dataclass(frozen=True)
class HostEntry:
    """Where a process of host ``host`` goes: the network and UTS namespace files and the
    cgroups' ``cgroup.procs`` files."""

    host: str
    netns: str
    uts: str
    procs_files: tuple[str, ...]

    def preexec(self) -> Callable[[], None]:
        """A ``preexec_fn`` for ``subprocess.Popen`` that puts the child into the host.

        The namespace files are opened here, in the parent, so that a missing host fails
        before the fork with a LabError; the child only calls setns and writes its pid.
        """
        try:
            net_fd = os.open(self.netns, os.O_RDONLY | os.O_CLOEXEC)
            uts_fd = os.open(self.uts, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise LabError(
                f"host {self.host!r} is not up ({e.filename}: {e.strerror}); bring the lab up first "
                f"(multigpu lab up CLUSTER)"
            ) from None
        libc = _libc()
        setns = libc.setns
        files = [f.encode() for f in self.procs_files]

        def enter() -> None:
            pid = str(os.getpid()).encode()
            for f in files:
                fd = os.open(f, os.O_WRONLY)
                os.write(fd, pid)
                os.close(fd)
            if setns(net_fd, CLONE_NEWNET) != 0 or setns(uts_fd, CLONE_NEWUTS) != 0:
                raise OSError(ctypes.get_errno(), "setns into the lab host failed")

        enter.fds = (net_fd, uts_fd)  # type: ignore[attr-defined]  # mypy types no attributes on a function
        return enter

    @staticmethod
    def release(fn: Callable[[], None]) -> None:
        """Close the namespace files a ``preexec`` function holds (after the child started)."""
        for fd in getattr(fn, "fds", ()):
            try:
                os.close(fd)
            except OSError:
                pass
