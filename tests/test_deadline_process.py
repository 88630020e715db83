"""A function in a child process ended at a deadline (``solvers.deadline_process``): the
makespan MILP's solves run there under a time limit, since HiGHS's setup outlasts its limit."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from multigpu.errors import SolverError
from multigpu.partition.solvers.deadline_process import Call, ChildFailed, call_until


def _add(a: int, b: int) -> int:
    print("this line must not reach the result")  # the child's standard output is not the channel
    return a + b


def _sleep_then_answer(seconds: float) -> str:
    time.sleep(seconds)
    return "late"


def _fail() -> None:
    raise ValueError("boom")


def _quit_silently() -> None:
    os._exit(0)  # a child that ends "successfully" without writing its answer


def test_a_child_answers_with_the_functions_result() -> None:
    assert call_until(_add, (2, 3), time.perf_counter() + 120.0) == (True, 5)


def test_a_child_still_running_at_the_deadline_is_ended() -> None:
    # Order, not timing: the call returns long before the child would have answered.
    t0 = time.perf_counter()
    assert call_until(_sleep_then_answer, (300.0,), time.perf_counter() + 1.0) == (False, None)
    assert time.perf_counter() - t0 < 300.0


def test_a_failing_child_is_a_solver_error_naming_its_exit_code() -> None:
    with pytest.raises(SolverError, match=r"_fail failed with exit code 1"):
        call_until(_fail, (), time.perf_counter() + 120.0)


def test_a_child_that_exits_without_an_answer_says_so() -> None:
    # Seen once in a benchmark (an EOFError then): exit code 0 and nothing on the channel.
    with pytest.raises(ChildFailed, match=r"_quit_silently exited with code 0 before it answered"):
        call_until(_quit_silently, (), time.perf_counter() + 120.0)


def test_a_started_call_runs_beside_this_process_until_collected() -> None:
    # The makespan MILP's child works while the parent looks for the plan of least T. The
    # call returns at once: the 300 s child is still running after it, then cancel ends it.
    sleeper = Call(_sleep_then_answer, (300.0,))
    adder = Call(_add, (2, 3))
    assert sleeper._proc.poll() is None
    assert adder.result(time.perf_counter() + 120.0) == (True, 5)
    assert sleeper._proc.poll() is None  # collecting one call leaves the other running
    sleeper.cancel()
    assert sleeper._proc.poll() is not None


def test_a_cancelled_call_is_not_a_result() -> None:
    call = Call(_sleep_then_answer, (300.0,))
    call.cancel()
    with pytest.raises(SolverError, match="failed with exit code -9"):
        call.result(time.perf_counter() + 120.0)


def test_the_child_imports_the_parents_modules_not_a_folder_where_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ``python -c`` puts the working directory first on the path: a checkout of another version
    # there (found by comparing two versions side by side) was imported in place of the parent's.
    fake = tmp_path / "multigpu"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('the multigpu folder in the working directory')\n")
    monkeypatch.chdir(tmp_path)
    assert call_until(_add, (2, 3), time.perf_counter() + 120.0) == (True, 5)
