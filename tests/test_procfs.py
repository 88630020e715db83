"""``multigpu.procfs.stat``: the stat fields of a process, from a real /proc and from a fake
one whose command name holds spaces and parentheses."""

from __future__ import annotations

import os
from pathlib import Path

from multigpu.procfs.stat import PPID, START, STATE, STIME, UTIME, stat_fields


def test_this_process_has_its_parent_and_a_live_state() -> None:
    fields = stat_fields(os.getpid())
    assert fields is not None
    assert int(fields[PPID]) == os.getppid()
    assert fields[STATE] in "RS"


def test_a_command_name_with_parentheses_and_spaces_is_read_past(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    rest = ["S", "7"] + ["0"] * 9 + ["150", "25"] + ["0"] * 6 + ["9876"]
    (tmp_path / "42" / "stat").write_text(f"42 (odd) name (x)) {' '.join(rest)}\n")
    fields = stat_fields(42, tmp_path)
    assert fields is not None
    assert (fields[STATE], fields[PPID], fields[UTIME], fields[STIME], fields[START]) == ("S", "7", "150", "25", "9876")


def test_a_process_that_is_gone_reads_as_none(tmp_path: Path) -> None:
    assert stat_fields(42, tmp_path) is None
