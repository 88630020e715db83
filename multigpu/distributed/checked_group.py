"""A process group that reports mismatched collectives and never hangs, for every engine.

``CheckedGroup`` wraps an adapter's engine group (``multigpu.parallel.process_group``) and adds,
once for all engines:

* **a check that every rank calls the same collective**, folded into the step's own
  exchange. Every rank keeps the history of collectives that were validated as the
  same on every rank, and *predicts* the next one from it: the collective that most
  often followed the last validated one (the same again when none has followed it
  yet). The history is the same on every rank, so is the prediction. A bucket set
  (``announce_buckets``) that equals the prediction runs on the **fast path**: no
  header, and the last float of bucket 0 (``reserved_floats``) carries a flag set to
  0. A rank whose call differs from a predicted bucket set runs the predicted buckets
  anyway, with zeros and the flag set to 1 (same sizes, so the engine never sees two
  sizes), then exchanges the full header for its actual call. Every rank on the fast
  path reads the summed flag once bucket 0 is waited on: 0, the call is validated; more,
  someone deviated, and every rank exchanges the full header. If every header agrees
  (every rank changed pattern together, e.g. an evaluation after an epoch) the actual
  call proceeds; otherwise ``CollectiveMismatchError`` names every side;
* **the full header exchange** for every other call (the first ones, and any call
  that cannot carry a flag: a plain ``allreduce_`` of the caller's buffer, ``broadcast_``,
  ``barrier``, ``close``): every rank writes (op, call number, buffer size, source rank,
  bucket split code) into its own row of a ``world_size x 7`` buffer and the engine
  SUM-allreduces it, which works as an all-gather on every engine. Ranks that disagree
  raise ``CollectiveMismatchError`` naming every side, before the engine is asked to
  reduce buffers of different sizes (which hangs or corrupts memory). Either way the
  exchanges completed on every rank, so the group stays usable;
* **a deadline** on every engine call: a call that outlives ``timeout`` seconds
  prints a ``CollectiveTimeoutError`` line naming this rank and the call, and ends
  the process with status 1. A blocked engine call cannot be interrupted from
  Python, and a process whose peer is gone cannot continue anyway; the launcher
  then stops the other ranks (torch's NCCL watchdog does the same);
* **errors with context**: an engine failure becomes ``CollectiveError`` naming this
  rank, the call and the engine's own message; later calls fail at once.

A steady-state data-parallel step makes its bucket sums and nothing else (see
``benchmarks/dist_step.py`` for the check's measured share of a step); ``check=False``
drops the check.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from math import prod
from typing import Any, TypeVar

import numpy as np

from multigpu.errors import CollectiveError, CollectiveMismatchError, CollectiveTimeoutError, InputError, MultigpuError

R = TypeVar("R")
Call = tuple[str, int, int, int]  # what the header names: op, size, src (buckets: count), split code

OPS = ("allreduce_", "broadcast_", "barrier", "close", "buckets")
FIELDS = 7  # present, op, call number, size // 2**20, size % 2**20, src + 1 (buckets: count + 1), split code
_LOW = 1 << 20  # float32 holds integers below 2**24 exactly; split larger values
TIMEOUT_EXIT_STATUS = 1


def _describe(op: str, size: int, src: int, seq: int | None = None, split: int = 0) -> str:
    text = op if op in ("barrier", "close") else f"{op} of {size:,} floats"
    if op == "broadcast_":
        text += f" from rank {src}"
    if op == "buckets":
        text = f"{src} bucket allreduce{'s' if src != 1 else ''} of {size:,} floats in all (split code {split})"
    return text if seq is None else f"call #{seq} ({text})"


_CODE_PRIME = 16_777_213  # the largest prime below 2**24: every code is exact in a float32 header field


def split_code(sizes: Sequence[int]) -> int:
    """A number that tells bucket splits apart (exact in a float32 header field).

    A polynomial hash modulo a prime: two splits of the same total and count share a code
    only by a hash collision (a weighted sum, as before, gave [1, 2, 1] and [2, 0, 2] one code).
    """
    code = 0
    for s in sizes:
        code = (code * 1_000_003 + int(s) + 1) % _CODE_PRIME
    return code


def engine_error(exc: BaseException, context: str) -> CollectiveError:
    """The one translation of an engine's own exception (Gloo's, NCCL's, ps-lite's ...).

    Engine groups let their framework's exceptions through; this turns one into
    ``CollectiveTimeoutError`` when its message says it timed out, else ``CollectiveError``,
    with ``context`` and the message's first line.
    """
    text = (str(exc).strip().split("\n") or [""])[0]
    kind = CollectiveTimeoutError if "timed out" in text.lower() or "timeout" in text.lower() else CollectiveError
    return kind(f"{context}: {type(exc).__name__}: {text}")


class Watchdog:
    """One daemon thread that ends the process when an armed deadline passes.

    ``arm(seconds, message)`` sets the deadline (replacing any earlier one);
    ``disarm()`` clears it. On expiry ``message`` goes to stderr and the process
    exits with status 1. Arming is two attribute writes: the thread polls every
    ``POLL`` seconds instead of being woken, because waking a thread twice per
    collective costs a GIL hand-off on a busy core (measured: it doubled a small
    allreduce here).
    """

    POLL = 0.1

    def __init__(self) -> None:
        self._deadline: float | None = None
        self._message = ""
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float, message: str) -> None:
        self._message = message
        self._deadline = time.monotonic() + seconds
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="multigpu-watchdog", daemon=True)
            self._thread.start()

    def disarm(self) -> None:
        self._deadline = None

    def _run(self) -> None:
        while True:
            deadline, message = self._deadline, self._message
            if deadline is not None and time.monotonic() >= deadline and self._deadline == deadline:
                self._deadline = None
                self.on_expire(message)
            time.sleep(self.POLL)

    @staticmethod
    def on_expire(message: str) -> None:
        """Print ``message`` and end the process with status 1 (tests replace this)."""
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os.write(2, (message + "\n").encode())
            os._exit(TIMEOUT_EXIT_STATUS)


class CheckedGroup:
    """A ``ProcessGroup`` over an engine group: header check, deadline, errors with context.

    ``backend`` is the adapter whose tensors the engine takes. ``timeout`` defaults
    to the engine group's and may be changed at any time (it applies to the next call).
    """

    def __init__(self, engine: Any, backend: Any, check: bool = True, name: str = ""):
        self.engine = engine
        self.backend = backend
        self.check = check
        self.name = name or getattr(backend, "name", "engine")
        self.rank: int = int(engine.rank)
        self.world_size: int = int(engine.world_size)
        self.device = engine.device
        self.timeout: float = float(engine.timeout)
        self.calls = 0
        self._last: Call | None = None  # the last collective validated as the same on every rank
        self._after: dict[Call, dict[Call, int]] = {}  # validated collective -> how often each one followed it
        self._sizes: dict[Call, list[int]] = {}  # the bucket sizes of each validated bucket set
        self._begun: Call | None = None  # the call that an announce settled against the prediction
        self._fast = False  # the announced bucket set runs on the fast path: no header, bucket 0 has the flag
        self._unread: Callable[[], None] | None = None  # a fast bucket set's bucket 0 wait, until its flag is read
        self._open: list[Callable[[], None]] = []  # the waits of the fast bucket set's buckets started so far
        self._zero: Any = None  # a float 0 on the group's device, to clear the flag
        self._flag: tuple[Any, Any] | None = None  # (bucket 0's buffer, the view of its flag) of the last step
        self._pending: tuple[tuple[str, int, int], np.ndarray, Any, Callable[[], Any]] | None = None
        self._buckets: tuple[list[int], int] | None = None  # announced bucket sizes and their split code
        self._expect: list[int] = []  # sizes of the announced buckets not yet started
        self._failed: str | None = None
        self._closed = False
        self._watchdog = Watchdog()
        self._engine_label = getattr(engine, "label", "the engine")

    # -- the protocol ----------------------------------------------------
    def allreduce_(self, flat: Any) -> None:
        """In place: ``flat`` becomes the elementwise sum of every rank's ``flat``."""
        self._collective("allreduce_", self._numel(flat), -1, lambda: self.engine.allreduce_(flat))

    def broadcast_(self, flat: Any, src: int = 0) -> None:
        """In place: ``flat`` becomes rank ``src``'s ``flat`` on every rank."""
        if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < self.world_size:
            raise InputError(f"broadcast_ src={src!r} is not a rank; use 0..{self.world_size - 1}")
        self._collective("broadcast_", self._numel(flat), src, lambda: self.engine.broadcast_(flat, src))

    def allreduce_async_(self, flat: Any) -> Callable[[], None]:
        """Start the in-place sum of ``flat``; return the function that waits for it (and raises as
        ``allreduce_`` would, under the same deadline).

        After ``announce_buckets`` the announced sums are checked together: on the fast
        path by the flag in bucket 0, read when its wait returns (which then raises
        ``CollectiveMismatchError`` if a rank called something else), else by one header
        checked when the first of them starts; each must have the announced size.
        Otherwise the sum gets its own header, as ``allreduce_`` does. Engines without an
        asynchronous sum run it at once.
        """
        size = self._numel(flat)
        if self._buckets is None:
            pending = self._collective("allreduce_", size, -1, lambda: self._start(flat))
            what = _describe("allreduce_", size, -1, self.calls)
            return lambda: self._guarded(f"{what}, wait", pending)
        sizes, code = self._buckets
        index = len(sizes) - len(self._expect)
        what = f"call #{self.calls + (index == 0)}, bucket {index} of {len(sizes)} ({size:,} floats)"
        if self._failed is not None or self._closed:
            raise CollectiveError(f"{self._where()}: {what} on a group whose earlier call failed or closed")
        if size != self._expect[0]:
            self._failed = "a bucket of another size than announced"
            raise CollectiveMismatchError(
                f"{self._where()}: {what}: this rank announced buckets of {sizes} floats and then started "
                f"one of {size:,} floats as bucket {index}; the other ranks checked the announced sizes, so "
                "the job cannot continue; start exactly the announced buckets, in order"
            )
        call: Call = ("buckets", sum(sizes), len(sizes), code)
        fast = self._fast
        if index == 0 and fast:  # predicted by every rank: no header, the flag says whether all called it
            self.calls += 1
            self._begun = None
            flag = self._flag_view(flat, size)
            if self._zero is None:
                self._zero = self.backend.from_numpy(np.zeros(1, np.float32), self.device)
            self.backend.assign_(flag, self._zero)
        elif index == 0:  # the announced header is checked before the first bucket reaches the engine
            try:
                self._collective("buckets", sum(sizes), len(sizes), None, code)
            except CollectiveError:
                self._buckets, self._expect, self._fast = None, [], False  # no bucket started: still usable
                raise
        self._expect.pop(0)
        if not self._expect:
            self._buckets = None
        started = self._guarded(what, lambda: self._start(flat))

        def wait() -> None:
            self._guarded(f"{what}, wait", started)

        if not fast:
            return wait
        if index > 0:
            self._open.append(wait)
            return wait
        done: list[bool] = []

        def wait_and_read_flag() -> None:
            if done:
                return
            done.append(True)
            self._unread = None
            wait()
            # NOTE: one host read of one float, after the wait that the update needs anyway. Every
            # local device's backward is queued by then (the buckets start from the last device's
            # backward) and the later buckets' sums are already started, so nothing waits on it but
            # bucket 0's sum: on the CPU engines the wait made the sum readable, on NCCL the read
            # waits for the stream up to bucket 0's sum, which the update would wait for as well.
            raised = float(self.backend.to_numpy(flag).reshape(-1)[0])
            if raised == 0:
                self._open = []
                self._validated(call)
                return
            self._flag_raised(call, raised, what)

        self._unread = wait_and_read_flag
        return wait_and_read_flag

    def announce_buckets(self, sizes: Sequence[int]) -> None:
        """Check the next ``len(sizes)`` collectives, ``allreduce_async_`` of these sizes in this order,
        together, before the computation that fills them.

        The last ``reserved_floats`` floats of bucket 0 belong to the group: it writes
        the flag there. When this bucket set is what every rank predicted (the same step
        as before), it runs on the fast path, with no exchange of its own. Otherwise a
        predicted bucket set runs with zeros and the flag raised, and this set's header
        exchange starts now, to overlap the computation before the buckets (``DataParallel``
        announces its step's buckets before the forward); it is checked, and a mismatch
        reported with every side named, before the first bucket reaches the engine.
        Without the check the buckets go to the engine unchecked. Raises InputError for
        no sizes, a bucket 0 without room for the flag, or an earlier set not all started.
        """
        sizes = [int(n) for n in sizes]
        if not sizes or self._expect or sizes[0] <= self.reserved_floats:
            raise InputError(
                f"announce_buckets({sizes}) needs at least one size, bucket 0 larger than the "
                f"{self.reserved_floats} float(s) reserved for the check (reserved_floats), and the "
                f"buckets announced before ({self._expect} left) must all have started"
            )
        if not self.check:
            return
        code = split_code(sizes)
        call: Call = ("buckets", sum(sizes), len(sizes), code)
        self._fast, self._open = False, []
        if not (self._closed or self._failed):  # else the first bucket raises
            self._fast = self._begin(call)
            self._begun = call
        self._buckets, self._expect = (sizes, code), list(sizes)
        start = getattr(self.engine, "allreduce_async_", None)
        if self._fast or start is None or self._pending is not None or self._closed or self._failed:
            return  # the fast path has no header; without an asynchronous sum it is exchanged at bucket 0
        what = _describe("buckets", sum(sizes), len(sizes), self.calls + 1, code)
        mine, buf = self._header("buckets", sum(sizes), len(sizes), self.calls + 1, code)
        wait = self._guarded(f"{what}, header", lambda: start(buf))
        self._pending = (("buckets", sum(sizes), len(sizes)), mine, buf, wait)

    @property
    def reserved_floats(self) -> int:
        """How many floats at the end of an announced bucket set's bucket 0 the check writes (1; 0 without it)."""
        return 1 if self.check else 0

    def barrier(self) -> None:
        """Return once every rank has called ``barrier`` (the header exchange is one)."""
        self._collective("barrier", 0, -1, None if self.check else self.engine.barrier)

    def announce(self, op: str, size: int, src: int = -1) -> None:
        """Start the header exchange of the next collective now, to overlap the work before it.

        ``DataParallel`` announces its gradient allreduce before computing the gradients,
        so the header's round trip runs while the devices compute. The other ranks need
        not announce: each rank still makes exactly one header exchange per collective.
        A no-op without the check, or when the engine has no ``allreduce_async_``. The
        next call must be the announced collective: the other ranks have already seen its
        header.
        """
        start = getattr(self.engine, "allreduce_async_", None)
        if not self.check or start is None or self._pending is not None or self._closed or self._failed:
            return
        self._begin((op, size, src, 0))
        self._begun = (op, size, src, 0)
        what = _describe(op, size, src, self.calls + 1)
        mine, buf = self._header(op, size, src, self.calls + 1)
        wait = self._guarded(f"{what}, header", lambda: start(buf))
        self._pending = ((op, size, src), mine, buf, wait)

    def close(self) -> None:
        """Leave the group: a last checked barrier (unless a call failed), then the engine's close."""
        if self._closed:
            return
        try:
            if self._failed is None:
                self._collective("close", 0, -1, None if self.check else self.engine.barrier)
                self._guarded("close (engine)", self.engine.close)
        finally:
            self._closed = True
            self._watchdog.disarm()

    # -- internals -------------------------------------------------------
    def _numel(self, flat: Any) -> int:
        return int(prod(self.backend.shape(flat)))

    def _where(self) -> str:
        return f"rank {self.rank} of {self.world_size} ({self.name})"

    def _collective(self, op: str, size: int, src: int, run: Callable[[], R] | None, code: int = 0) -> Any:
        if self._closed:
            raise CollectiveError(f"{self._where()}: {op} on a closed process group; create a new one")
        if self._failed is not None:
            raise CollectiveError(
                f"{self._where()}: {op} on a group whose earlier call failed ({self._failed}); the job cannot continue"
            )
        if self._expect and op != "buckets":
            self._failed = "announced buckets, then another collective"
            raise CollectiveMismatchError(
                f"{self._where()}: {_describe(op, size, src, self.calls + 1)}: this rank announced "
                f"{len(self._expect)} more bucket(s) of {self._expect} floats first; the other ranks checked the "
                "announced buckets, so the job cannot continue; start every announced bucket first"
            )
        if self.check and self._begun is None:
            self._begin((op, size, src, code))  # a plain collective never runs on the fast path
        self._begun = None
        self.calls += 1
        what = _describe(op, size, src, self.calls, code)
        if self.check:
            self._exchange(op, size, src, what, code)
        return None if run is None else self._guarded(what, run)

    def _start(self, flat: Any) -> Callable[[], Any]:
        engine_start = getattr(self.engine, "allreduce_async_", None)
        if engine_start is None:
            self.engine.allreduce_(flat)
            return lambda: None
        return engine_start(flat)

    def _prediction(self) -> Call | None:
        """The collective every rank expects next: the one that most often followed the last validated
        collective (ties: the first seen), else the same again. Every rank validated the same history,
        so every rank predicts the same."""
        if self._last is None:
            return None
        after = self._after.get(self._last)
        return max(after, key=after.__getitem__) if after else self._last

    def _begin(self, call: Call) -> bool:
        """Settle ``call`` against the prediction; True when it runs on the fast path.

        Only a bucket set carries a flag. When one is predicted and ``call`` differs, this rank
        runs the predicted buckets with zeros and the flag raised, as the ranks on the fast
        path do with their gradients, so that they learn of it; it then needs the header.
        """
        if self._unread is not None:  # the previous fast bucket set is validated by its flag first
            self._unread()
        predicted = self._prediction()
        if predicted is None or predicted[0] != "buckets":
            return False  # nothing carries a flag: every rank exchanges the full header
        if predicted == call:
            return True
        sizes = self._sizes[predicted]
        what = (
            f"call #{self.calls + 1} ({call[0]}), the predicted {_describe(*predicted[:3], split=predicted[3])} "
            "run with zeros and the flag raised"
        )
        self._run_zeros(sizes, what, flag=True)
        return False

    def _run_zeros(self, sizes: Sequence[int], what: str, flag: bool) -> None:
        """Sum zero buffers of ``sizes`` (bucket 0's flag 1 if ``flag``), all started before any is waited
        for, as a bucketed step starts them (MXNet's group gives sums of one size in flight their own keys)."""
        bufs = []
        for k, n in enumerate(sizes):
            host = np.zeros(n, np.float32)
            host[-1] = 1.0 if flag and k == 0 else 0.0
            bufs.append(self.backend.from_numpy(host, self.device))

        def run() -> None:
            for wait in [self._start(b) for b in bufs]:
                wait()

        self._guarded(what, run)

    def _flag_raised(self, call: Call, raised: float, what: str) -> None:
        """A rank on the fast path saw the flag raised: finish the predicted set (zeros for the buckets not
        started), then exchange the full header, which names every side."""
        rest, self._buckets, self._expect, self._fast = self._expect, None, [], False
        if rest:
            self._run_zeros(rest, f"{what}: the rest of the predicted buckets, run with zeros", flag=False)
        for wait in self._open:  # every started sum completes before the header (MXNet's keys stay in step)
            wait()
        self._open = []
        self._exchange(*call[:3], _describe(*call[:3], self.calls, call[3]), call[3])
        self._last = None
        raise CollectiveMismatchError(
            f"{self._where()}: {what}: {raised:g} rank(s) flagged a different collective in bucket 0, yet every "
            "header names this one: a rank wrote into the float reserved for the check (reserved_floats)"
        )

    def _validated(self, call: Call) -> None:
        """Every rank called ``call``: it becomes the last validated collective, what follows it is counted."""
        if self._last is not None:
            after = self._after.setdefault(self._last, {})
            after[call] = after.get(call, 0) + 1
        if call[0] == "buckets" and call not in self._sizes and self._buckets is not None:
            self._sizes[call] = list(self._buckets[0])  # validated by the header, before bucket 0 starts
        self._last = call

    def _header(self, op: str, size: int, src: int, seq: int, code: int = 0) -> tuple[np.ndarray, Any]:
        mine = np.array([1, OPS.index(op) + 1, seq % _LOW, size // _LOW, size % _LOW, src + 1, code], np.float32)
        header = np.zeros((self.world_size, FIELDS), np.float32)
        header[self.rank] = mine
        return mine, self.backend.from_numpy(header.reshape(-1), self.device)

    def _exchange(self, op: str, size: int, src: int, what: str, code: int = 0) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            mine, buf = self._header(op, size, src, self.calls, code)

            def run() -> np.ndarray:
                self.engine.allreduce_(buf)
                return self.backend.to_numpy(buf)
        else:
            announced, mine, buf, wait = pending

            def run() -> np.ndarray:
                wait()
                return self.backend.to_numpy(buf)

        rows = self._guarded(f"{what}, header", run).reshape(self.world_size, FIELDS)
        if pending is not None and announced != (op, size, src):
            self._failed = "announced a different collective"
            raise CollectiveMismatchError(
                f"{self._where()}: {what}: this rank announced {_describe(*announced)} and then called "
                f"{_describe(op, size, src)}; the other ranks saw the announced header, so the job cannot "
                "continue; announce exactly the next collective"
            )
        if np.array_equal(rows, np.broadcast_to(mine, rows.shape)):
            self._validated((op, size, src, code))
            return
        self._last = None  # every rank raises: no prediction until the next header agrees
        bad = [r for r in range(self.world_size) if rows[r, 0] != 1]
        if bad:
            raise CollectiveMismatchError(
                f"{self._where()}: {what}: the header rows of rank(s) {bad} hold {rows[bad, 0].tolist()} "
                "entries instead of 1: two processes use the same rank or the ranks disagree on the "
                "world size; start every rank with the same world size and a distinct rank"
            )
        sides: dict[tuple[float, ...], list[int]] = {}
        for r in range(self.world_size):
            sides.setdefault(tuple(rows[r, 1:].tolist()), []).append(r)
        parts = []
        for key, ranks in sides.items():
            op_code, seq, hi, lo, src1, split = (int(v) for v in key)
            desc = _describe(OPS[op_code - 1], hi * _LOW + lo, src1 - 1, seq, split)
            parts.append(
                f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} "
                f"{'are' if len(ranks) > 1 else 'is'} at {desc}"
            )
        raise CollectiveMismatchError(
            f"{self._where()}: collective mismatch: {'; '.join(parts)}. Every rank must call the same "
            "collectives in the same order with buffers of the same size"
        )

    def _flag_view(self, flat: Any, size: int) -> Any:
        """The view of the flag, the last float of bucket 0's buffer ``flat``: cut once for the buffer a
        trainer hands in every step (cutting a view is most of a millisecond on MXNet's host thread)."""
        if self._flag is None or self._flag[0] is not flat:
            self._flag = (flat, self.backend.unflatten(flat, [(size - 1,), (1,)])[1])
        return self._flag[1]

    def _guarded(self, what: str, fn: Callable[[], R]) -> R:
        self._watchdog.arm(
            self.timeout,
            (
                f"multigpu.errors.CollectiveTimeoutError: {self._where()}: {what} timed out after "
                f"{self.timeout:g} s: another rank died, hangs, or stopped calling collectives; this "
                f"process exits with status {TIMEOUT_EXIT_STATUS} because a blocked engine call cannot be "
                "interrupted (raise the limit with --timeout or MULTIGPU_TIMEOUT if the work between "
                "collectives is that long)"
            ),
        )
        try:
            return fn()
        except CollectiveError as exc:
            self._failed = f"{what}: {type(exc).__name__}"
            raise type(exc)(f"{self._where()}: {what} failed: {exc}") from exc
        except MultigpuError:
            raise
        except Exception as exc:
            self._failed = f"{what}: {type(exc).__name__}"
            raise engine_error(exc, f"{self._where()}: {what} failed in {self._engine_label}") from exc
        finally:
            self._watchdog.disarm()
