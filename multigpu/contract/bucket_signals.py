"""Counting gradients into buckets, for adapters that signal buckets during backward.

An adapter's ``value_and_grad(..., buckets=, on_bucket=)`` (see ``multigpu.contract.protocol``)
tells the caller when each bucket's gradients are in ``out``. The frameworks differ in how
they learn that one parameter's gradient is final (a torch hook, a Paddle hook, the reference's
walk); what follows from it is the same everywhere and lives here once.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence


class BucketSignals:
    """Calls ``on_bucket(k)`` once bucket k's last parameter is marked done.

    ``buckets[k] = (first, stop)`` as in the protocol. ``done(i)`` marks parameter i
    (a second mark of the same parameter counts nothing); ``rest()`` marks every
    parameter not yet marked (those the function did not use: their gradient is zero).
    """

    def __init__(self, buckets: Sequence[tuple[int, int]], on_bucket: Callable[[int], None]):
        self.on_bucket = on_bucket
        self.missing = [b - a for a, b in buckets]
        self.bucket_of = [k for k, (a, b) in sorted(enumerate(buckets), key=lambda kb: kb[1][0])
                          for _ in range(a, b)]
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
