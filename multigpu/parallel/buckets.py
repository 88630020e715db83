"""Gradient buckets: the cross-process sum started during backward, bucket by bucket.

A bucket is a run of consecutive parameters, and each bucket of a replica's gradients is
a buffer of its own, ``value_and_grad(..., out=[buffer per bucket])``: the gradients are
views of their bucket's buffer (DDP's ``gradient_as_bucket_view``: backward writes there,
no copy into a bucket), and an engine that orders work by buffer (MXNet's tracks one
variable per NDArray and its slices) starts a bucket's sum after the writes to that
bucket only, not after the whole backward. Buckets are numbered from the end of the
parameters, because backward produces the last layers' gradients first: bucket 0 holds
the last parameters and the loss, which the forward already knows. As in DDP and
``paddle.DataParallel``, the first bucket is small (1 MiB, or ``bucket_mb`` if smaller) so
that its sum starts early; the others hold up to ``bucket_mb`` MiB.

``value_and_grad(..., buckets=layout.params, on_bucket=...)`` calls ``on_bucket(k)`` as
soon as bucket k's gradients are in the buffer (the adapter decides when: a post-
accumulate hook in torch, a tensor hook in Paddle, the engine's order in MXNet).
``BucketedSum.ready`` then starts every bucket up to the first one not yet ready, in
bucket order, so every rank starts the same collectives in the same order whatever
order its framework finished them in.

A process group may reserve floats at the end of bucket 0 (``reserved_floats``: the checked
group's flag, which tells every rank whether all of them called this step's sums): bucket 0's
buffer is that much longer, ``value_and_grad`` writes into the view before them, and the
group's sum carries them with the gradients, in the same exchange.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from math import prod
from typing import Any

from multigpu.checks import check_positive
from multigpu.contract.bucket_signals import KeptBuffers
from multigpu.contract.protocol import Device
from multigpu.parallel.allreduce import broadcast_from_first, flat_schedule, reduce_to_first

DEFAULT_BUCKET_MB = 25.0
"""DDP's ``bucket_cap_mb`` and Paddle's ``comm_buffer_size``."""
FIRST_BUCKET_MB = 1.0
"""DDP's first bucket and Paddle's ``last_comm_buffer_size`` (the one filled first)."""
_MIB = 1 << 20
_FLOAT = 4  # bytes of a float32


@dataclass(frozen=True)
class BucketLayout:
    """Where each bucket lies.

    ``params[k]`` is ``(first, stop)``: bucket k holds parameters ``first .. stop - 1``;
    ``slices[k]`` is ``(start, stop)`` of its floats in ``[grads..., loss]`` (bucket 0's
    includes the loss), i.e. in the flat parameters without the loss. Bucket 0 is at the end.
    """

    params: tuple[tuple[int, int], ...]
    slices: tuple[tuple[int, int], ...]

    @property
    def sizes(self) -> list[int]:
        """The number of floats of each bucket, in bucket order."""
        return [b - a for a, b in self.slices]

    def pieces(self) -> list[tuple[int]]:
        """The ``[grads..., loss]`` floats cut into buckets in buffer order (for ``unflatten``): the last bucket
        first."""
        return [(b - a,) for a, b in reversed(self.slices)]

    def param_views(self, backend: Any, flat: Any) -> list[Any]:
        """Views of a flat buffer of the parameters' length (parameters, optimizer state) cut into buckets,
        in bucket order."""
        pieces = self.pieces()
        pieces[-1] = (pieces[-1][0] - 1,)  # bucket 0 without the loss
        return list(reversed(backend.unflatten(flat, pieces))) if len(pieces) > 1 else [flat]


def plan_buckets(
    shapes: Sequence[Sequence[int]], bucket_mb: float = DEFAULT_BUCKET_MB, first_mb: float = FIRST_BUCKET_MB
) -> BucketLayout:
    """Return the buckets for parameters of ``shapes``, filled from the last parameter backwards.

    A bucket closes once it holds at least its cap (the smaller of ``first_mb`` and ``bucket_mb``
    for bucket 0, ``bucket_mb`` after it), so a parameter is never split, and a parameter larger than the cap gets a
    bucket of its own (DDP's rule). Raises InputError for a cap that is not a positive number.
    """
    check_positive(bucket_mb, "bucket_mb", unit="MiB", example=25)
    check_positive(first_mb, "first_mb", unit="MiB", example=1)
    sizes = [int(prod(s)) for s in shapes]
    offsets = [0]
    for n in sizes:
        offsets.append(offsets[-1] + n)
    params: list[tuple[int, int]] = []
    stop, filled = len(sizes), 0
    for i in range(len(sizes) - 1, -1, -1):
        filled += sizes[i] * _FLOAT
        cap = (min(first_mb, bucket_mb) if not params else bucket_mb) * _MIB
        if filled >= cap or i == 0:
            params.append((i, stop))
            stop, filled = i, 0
    slices = [(offsets[a], offsets[b] + (1 if k == 0 else 0)) for k, (a, b) in enumerate(params)]
    return BucketLayout(tuple(params), tuple(slices))


def bucket_without_reserved(backend: Any, buffer: Any, size: int, reserved: int) -> Any:
    """The first ``size`` floats of bucket 0's ``buffer`` (a view), without the ``reserved`` ones after them."""
    return buffer if not reserved else backend.unflatten(buffer, [(size,), (reserved,)])[0]


def _outputs(backend: Any, buffers: Sequence[Any], size: int, reserved: int) -> KeptBuffers:
    """``value_and_grad``'s ``out``: the bucket buffers with bucket 0 cut before the reserved floats."""
    return KeptBuffers([bucket_without_reserved(backend, buffers[0], size, reserved), *buffers[1:]])


class BucketedSum:
    """Sum every replica's bucket buffers over local devices and processes, bucket by bucket.

    ``buffers[r][k]`` is replica r's buffer of bucket k (bucket 0 ends with the loss, then
    ``reserved`` floats that belong to the process group); ``outputs[r]`` are the same with
    bucket 0 cut before the reserved floats (a view), for ``value_and_grad``. The callback
    ``ready(k)`` is handed to the last replica's ``value_and_grad``: the earlier
    replicas' backward has been queued already, so bucket k is then complete on every
    device; it is reduced into the first device's buffer and its sum across processes
    starts (``group.allreduce_async_``). ``finish()`` waits for every bucket and returns,
    per device, the bucket buffers that hold the sum (as ``allreduce_flat`` does for one
    buffer). Nothing is read back to the host. Buffers handed in as ``KeptBuffers`` (kept
    from step to step) have their views cut once, not every step.
    """

    def __init__(
        self,
        backend: Any,
        group: Any,
        buffers: Sequence[Sequence[Any]],
        devices: Sequence[Device],
        layout: BucketLayout,
        reserved: int = 0,
    ):
        self.backend, self.group, self.devices, self.layout = backend, group, devices, layout
        self.reserved = reserved
        self.buffers = [b if isinstance(b, KeptBuffers) else KeptBuffers(b) for b in buffers]
        size = layout.sizes[0]
        self.outputs = [
            b.views(("outputs", size, reserved), partial(_outputs, backend, b, size, reserved)) for b in self.buffers
        ]
        self.schedule = flat_schedule(devices, group)
        self._ready = [False] * len(layout.params)
        self._started = 0
        self._waits: list[Callable[[], None]] = []

    @property
    def sizes(self) -> list[int]:
        """The number of floats of each bucket's buffer, reserved floats included (what the group sums)."""
        return [self.layout.sizes[0] + self.reserved, *self.layout.sizes[1:]]

    def ready(self, k: int) -> None:
        """Bucket ``k`` is complete: start the sum of every bucket from the next one due up to the first not ready."""
        self._ready[k] = True
        while self._started < len(self._ready) and self._ready[self._started]:
            views = [b[self._started] for b in self.buffers]
            reduce_to_first(self.backend, views)
            self._waits.append(self.group.allreduce_async_(views[0]))
            self._started += 1

    def finish(self) -> list[KeptBuffers]:
        """Wait for every bucket's sum; return the summed bucket buffers of each device."""
        if self._started != len(self._ready):  # the contract makes every adapter signal every bucket
            raise AssertionError(f"bucket {self._started} was never signalled ready")
        for wait in self._waits:
            wait()
        if self.schedule == "shared":
            return [self.buffers[0]] * len(self.buffers)
        for k in range(len(self._ready)):
            broadcast_from_first(self.backend, [b[k] for b in self.buffers])
        return self.buffers

    def gradients(self, sums: Sequence[Any]) -> tuple[list[Any], Any]:
        """One device's summed bucket buffers as (gradient per bucket, in bucket order; the loss)."""
        pieces = [(self.layout.sizes[0] - 1,), (1,)] + ([(self.reserved,)] if self.reserved else [])

        def cut() -> tuple[Any, Any]:
            grad0, loss = self.backend.unflatten(sums[0], pieces)[:2]
            return grad0, loss

        grad0, loss = sums.views(("gradients", tuple(pieces)), cut) if isinstance(sums, KeptBuffers) else cut()
        return [grad0, *sums[1:]], loss
