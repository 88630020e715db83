"""A function in a child process ended at a deadline (``solvers.deadline_process``): the
makespan MILP's solves run there under a time limit, since HiGHS's setup outlasts its limit."""

from __future__ import annotations

import time

import pytest

from multigpu.errors import SolverError
from multigpu.partition.solvers.deadline_process import call_until


def _add(a: int, b: int) -> int:
    print("this line must not reach the result")  # the child's standard output is not the channel
    return a + b


def _sleep_then_answer(seconds: float) -> str:
    time.sleep(seconds)
    return "late"


def _fail() -> None:
    raise ValueError("boom")


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
