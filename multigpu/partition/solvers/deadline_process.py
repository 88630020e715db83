"""A function run in a fresh Python process that is ended at a deadline.

HiGHS checks its time limit only between its steps. On a model of millions of nonzeros its
setup and its root's analytic centre run for tens of seconds past any limit: the makespan
MILP of ResNet-50 on 16 devices (29 million nonzeros) took 8 s to hand over and its LP
relaxation 34 s more under a limit of 1 ms. A process can be ended on time, and a solve's
answer (a plan and a bound) is a few kilobytes to send back.

The child is a fresh ``python`` that runs ``_child``: it reads the pickled
function and arguments on its standard input and writes the pickled result on a copy of its
standard output, which it points at standard error first (HiGHS's log writes to descriptor 1).
A fresh interpreter, not a fork: the parent's HiGHS threads and frameworks stay behind, and a
user's script without a ``__main__`` guard is not run again (multiprocessing's spawn would).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from multigpu.errors import SolverError

__all__ = ["GRACE_S", "Call", "ChildFailed", "call_until", "wall_deadline"]

#: How long after the deadline the parent waits for the child's answer before it ends the child:
#: a solve that stops at its limit still has its result to write (a time limit is met to 1 s).
GRACE_S = 0.5

# ``-c`` rather than ``-m``: the package imports this module first, and runpy warns about that.
# ``-c`` puts the working directory first on the child's path; it goes, so that the child
# imports the parent's modules (its path, on PYTHONPATH), not a ``multigpu`` folder where it runs.
# It first sleeps the call's ``delay`` (its first argument), before any import: a child ended
# while it sleeps has cost its parent nothing but its start.
_CHILD = (
    "import sys, time; time.sleep(float(sys.argv[1])); '' in sys.path and sys.path.remove(''); "
    "from multigpu.partition.solvers.deadline_process import _child; _child()"
)


class ChildFailed(SolverError):
    """The child process ended without an answer: its function raised (the traceback is on
    standard error), or the process was killed or exited early. A caller with a plan in hand
    goes on without the child's; one without a plan lets it propagate."""


def wall_deadline(deadline: float) -> float:
    """The ``time.perf_counter`` instant ``deadline`` as a ``time.time`` instant, which another
    process can read (perf_counter's reference point is undefined)."""
    return time.time() + (deadline - time.perf_counter())


def call_until(fn: Callable[..., Any], args: tuple, deadline: float) -> tuple[bool, Any]:
    """``fn(*args)`` in a child process: (True, its result), or (False, None) when it has not
    answered by ``deadline`` (a ``time.perf_counter`` instant) plus ``GRACE_S``; the child is
    then killed. ``fn`` must be a module-level function and its arguments picklable. Raises
    ChildFailed (a SolverError) when the child fails (its traceback is on standard error)."""
    return Call(fn, args).result(deadline)


class Call:
    """``fn(*args)`` started in a child process, which runs while this one goes on (the child is
    a second core's work); ``result`` collects it by a deadline, ``cancel`` ends it. A thread
    feeds the call to the child and reads its answer, so that neither side waits on a full pipe."""

    def __init__(self, fn: Callable[..., Any], args: tuple, delay: float = 0.0) -> None:
        """Start ``fn(*args)`` in a child that waits ``delay`` seconds first (it imports nothing
        until then, so that a call ended early takes no CPU from this process)."""
        payload = pickle.dumps((fn, args))
        self._name = fn.__name__
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, repr(max(0.0, float(delay)))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            # The parent's import path, so that the child finds every module the parent's pickle names.
            env={**os.environ, "PYTHONPATH": _parent_path()},
        )
        self._out: list[bytes] = []
        self._thread = threading.Thread(target=self._talk, args=(payload,), daemon=True)
        self._thread.start()

    def _talk(self, payload: bytes) -> None:
        try:
            out, _ = self._proc.communicate(payload)
        except (OSError, ValueError):  # the child was ended while the call was still being sent
            out = b""
        self._out.append(out)

    @property
    def answered(self) -> bool:
        """Whether the child has ended (answered or failed): ``result`` then returns at once."""
        return not self._thread.is_alive()

    def result(self, deadline: float) -> tuple[bool, Any]:
        """(True, the call's result), or (False, None) when the child has not answered by
        ``deadline`` plus ``GRACE_S`` (it is then ended). Raises ChildFailed when it failed."""
        try:
            self._thread.join(timeout=max(0.0, deadline + GRACE_S - time.perf_counter()))
            if self._thread.is_alive():
                return False, None
        finally:
            self.cancel()  # the deadline, or the parent interrupted: the child goes too
        out = self._out[0] if self._out else b""
        code = self._proc.returncode
        if code != 0 or not out:
            why = "exited with code 0 before it answered" if code == 0 else f"failed with exit code {code}"
            raise ChildFailed(
                f"the solver's child process for {self._name} {why} (any traceback is on standard error "
                f"above); rerun without time_limit to solve in this process"
            )
        return True, pickle.loads(out)

    def cancel(self) -> None:
        """End the child if it still runs (nothing if it has answered)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._thread.join()


def _parent_path() -> str:
    """This process's import path for the child's PYTHONPATH, its working-directory entry ("")
    spelled out."""
    return os.pathsep.join(os.path.abspath(p) if p else os.getcwd() for p in sys.path)


def _child() -> None:
    """The child's side: read the pickled call on standard input, answer on standard output."""
    result_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything written to descriptor 1 (HiGHS's log) goes to standard error
    sys.stdout = sys.stderr
    fn, args = pickle.load(sys.stdin.buffer)
    result = fn(*args)
    result_out.write(pickle.dumps(result))
    result_out.flush()
