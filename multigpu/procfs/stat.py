"""The fields of ``/proc/PID/stat``: one reader for every layer that needs a process's
parent, state, start time or CPU time."""

from __future__ import annotations

from pathlib import Path

__all__ = ["PPID", "START", "STATE", "STIME", "UTIME", "stat_fields"]

# Positions in the fields after the command name (``proc(5)`` numbers them from 3 on).
STATE, PPID, UTIME, STIME, START = 0, 1, 11, 12, 19


def stat_fields(pid: int, proc: Path = Path("/proc")) -> list[str] | None:
    """The fields of process ``pid``'s stat line after its command name, state first
    (``STATE``, ``PPID``, ``UTIME``, ``STIME`` and ``START`` index them); None when the
    process is gone or its entry cannot be read. The command name sits in parentheses and
    may itself hold spaces and parentheses, so the line is split after its last ")"."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    _, sep, tail = text.rpartition(")")
    return tail.split() if sep else None
