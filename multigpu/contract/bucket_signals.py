"""Counting gradients into buckets, for adapters that signal buckets during backward.

An adapter's ``value_and_grad(..., buckets=, on_bucket=)`` (see ``multigpu.contract.protocol``)
tells the caller when each bucket's gradients are in ``out``. The frameworks differ in how
they learn that one parameter's gradient is final (a torch hook, a Paddle hook, the reference's
walk); what follows from it is the same everywhere and lives here once, as does cutting the
caller's ``out`` (one buffer, or one buffer per bucket) into per-parameter views.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any


class BucketSignals:
    """Calls ``on_bucket(k)`` once bucket k's last parameter is marked done.

    ``buckets[k] = (first, stop)`` as in the protocol. ``done(i)`` marks parameter i
    (a second mark of the same parameter counts nothing); ``rest()`` marks every
    parameter not yet marked (those the function did not use: their gradient is zero).
    """

    def __init__(self, buckets: Sequence[tuple[int, int]], on_bucket: Callable[[int], None]):
        self.on_bucket = on_bucket
        self.missing = [b - a for a, b in buckets]
        self.bucket_of = [k for k, (a, b) in sorted(enumerate(buckets), key=lambda kb: kb[1][0]) for _ in range(a, b)]
        self.marked = [False] * len(self.bucket_of)

    def done(self, i: int) -> None:
        """Parameter ``i``'s gradient is in the buffer."""
        if self.marked[i]:
            return
        self.marked[i] = True
        k = self.bucket_of[i]
        self.missing[k] -= 1
        if self.missing[k] == 0:
            self.on_bucket(k)

    def pending(self) -> list[int]:
        """The parameters not marked yet, in order."""
        return [i for i, m in enumerate(self.marked) if not m]

    def rest(self) -> None:
        """Mark every parameter not marked yet."""
        for i in self.pending():
            self.done(i)


class KeptBuffers(list):
    """Bucket buffers that their owner keeps from step to step (one replica's), remembering the
    views cut from them.

    A view shares its buffer's memory, so it stays valid as long as the buffer does, and a
    caller that hands the same buffers every step needs each view cut once. Cutting them
    anew was a tenth of MXNet's host thread in a LeNet step here (about 0.9 ms an
    ``unflatten``, four a step). A memo is keyed by what it was cut for and by the buffers
    the list holds then, so replacing a buffer never returns a stale view.
    """

    def __init__(self, buffers: Iterable[Any] = ()) -> None:
        super().__init__(buffers)
        self._memo: dict[Hashable, Any] = {}

    def views(self, key: Hashable, cut: Callable[[], Any]) -> Any:
        """``cut()``'s result for ``key``, cut on the first call for these buffers and remembered."""
        full = (key, tuple(map(id, self)))  # the list holds its buffers, so their ids are theirs
        got = self._memo.get(full)
        if got is None:
            got = self._memo[full] = cut()
        return got


def gradient_views(
    backend: Any, out: Any, shapes: Sequence[Sequence[int]], buckets: Sequence[tuple[int, int]] | None = None
) -> list[Any]:
    """Return a view of ``out`` per parameter gradient, then the value's one-element view.

    ``out`` is the protocol's one buffer ``[grads..., value]``, or (with ``buckets``) a list of
    bucket buffers: ``out[k]`` holds the gradients of parameters ``first .. stop - 1`` of
    ``buckets[k]``, and ``out[0]`` the value after them. ``backend`` is the adapter whose
    ``unflatten`` makes the views (they share the buffers' memory: no copy); a ``KeptBuffers``
    remembers them from call to call.
    """
    if not isinstance(out, (list, tuple)):
        return list(backend.unflatten(out, [*shapes, (1,)]))
    assert buckets is not None and len(buckets) == len(out)  # the contract checks both
    if isinstance(out, KeptBuffers):
        key = ("gradients", tuple(map(tuple, shapes)), tuple(map(tuple, buckets)))
        return list(out.views(key, lambda: _bucket_views(backend, list(out), shapes, buckets)))
    return _bucket_views(backend, out, shapes, buckets)


def _bucket_views(
    backend: Any, out: Sequence[Any], shapes: Sequence[Sequence[int]], buckets: Sequence[tuple[int, int]]
) -> list[Any]:
    views: list[Any] = [None] * (len(shapes) + 1)
    for k, ((first, stop), buffer) in enumerate(zip(buckets, out)):
        pieces = backend.unflatten(buffer, [*shapes[first:stop], *([(1,)] if k == 0 else [])])
        views[first:stop] = pieces[: stop - first]
        if k == 0:
            views[-1] = pieces[-1]
    return views
