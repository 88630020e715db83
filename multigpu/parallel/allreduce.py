"""Allreduce (sum) across devices, built from protocol primitives only.

Every algorithm leaves each replica's tensor holding the exact elementwise sum, in
place, in its own buffer.

* ``naive``: the textbook's: sum into the first replica, then copy back.
* ``ring``: reduce-scatter then all-gather over n chunks; each device sends
  2(n-1)/n of the data instead of the first device receiving (n-1) copies.
* ``fused``: one flat buffer per device (``value_and_grad`` already returns the
  gradients that way) and one sum of those buffers per step instead of one per
  parameter; ``flat_schedule`` picks a reduce or the ring by device kind.
* ``native``: the adapter's own collective, where it offers ``native_allreduce``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import prod
from typing import Any

from multigpu.contract.protocol import Device
from multigpu.errors import InputError, UnknownAlgorithmError
from multigpu.parallel.split import shard_sizes

ALGORITHMS = ("naive", "ring", "fused", "native")
"""The allreduce algorithms ``DataParallel(allreduce=...)`` takes ("native" where the adapter offers one)."""


def naive_allreduce(backend: Any, tensors: Sequence[Any], devices: Sequence[Device]) -> None:
    """Sum every tensor into ``tensors[0]``, then copy the sum back to every device."""
    for t in tensors[1:]:
        backend.add_(tensors[0], backend.copy_to(t, devices[0]))
    for t, d in zip(tensors[1:], devices[1:]):
        backend.assign_(t, backend.copy_to(tensors[0], d))


def ring_allreduce(backend: Any, tensors: Sequence[Any], devices: Sequence[Device]) -> None:
    """Reduce-scatter then all-gather around the ring of devices, chunk by chunk."""
    n = len(tensors)
    shape = backend.shape(tensors[0])
    numel = prod(shape)
    if n == 1 or numel == 0:  # nothing to exchange
        return
    # Fewer elements than devices: one element per chunk, and the rest carry nothing.
    sizes = shard_sizes(numel, n) if numel >= n else [1] * numel + [0] * (n - numel)
    present = [c for c, s in enumerate(sizes) if s]  # zero-length chunks carry nothing
    chunks: list[list[Any | None]] = []
    for t in tensors:
        parts = backend.split(backend.reshape(t, (-1,)), [sizes[c] for c in present])
        row: list[Any | None] = [None] * n
        for c, p in zip(present, parts):
            row[c] = p
        chunks.append(row)

    def step(combine: Callable[[Any, Any], None], offset: int) -> None:
        for s in range(n - 1):
            # Within one step every device sends a different chunk index, so the
            # sequential order here equals the simultaneous exchange of a real ring.
            for i in range(n):
                c, j = (i + offset - s) % n, (i + 1) % n
                if chunks[i][c] is not None:
                    combine(chunks[j][c], backend.copy_to(chunks[i][c], devices[j]))

    step(backend.add_, 0)  # afterwards device i holds the full sum of chunk i+1
    step(backend.assign_, 1)
    for t, row in zip(tensors, chunks):
        flat = backend.concat([row[c] for c in present])
        backend.assign_(t, backend.reshape(flat, shape))


def reduce_to_first(backend: Any, tensors: Sequence[Any]) -> None:
    """In place: ``tensors[0]`` becomes the sum of all; the others are left as they are."""
    for t in tensors[1:]:
        backend.add_(tensors[0], t)  # add_ moves src to dst's device itself


def broadcast_from_first(backend: Any, tensors: Sequence[Any]) -> None:
    """In place: every tensor becomes a copy of ``tensors[0]``."""
    for t in tensors[1:]:
        backend.assign_(t, tensors[0])


def flat_schedule(devices: Sequence[Device], group: Any | None = None) -> str:
    """Return how one flat buffer per device is summed: ``"ring"``, ``"reduce"`` or ``"shared"``.

    * ``"shared"`` (CPU replicas): the replicas share host memory, so one reduce into
      the first buffer suffices and every replica reads it; a broadcast would copy
      within the same memory and move nothing between devices.
    * ``"ring"`` (three or more GPUs, one process): the ring's transfers between
      distinct GPUs run side by side. (Not yet measured: no GPU was available when
      ``benchmarks/allreduce.py`` was written; run it where one is.)
    * ``"reduce"`` (otherwise): reduce into the first device, sum across processes
      when there is a group, and copy the sum back to every device.

    One Python thread issues every transfer, so on CPU replicas the ring's 2(n-1)
    chunked rounds only add calls (``multigpu bench allreduce``).
    """
    if all(d.kind == "cpu" for d in devices):
        return "shared"
    if group is None and len(devices) > 2:
        return "ring"
    return "reduce"


def allreduce_flat(
    backend: Any, flats: Sequence[Any], devices: Sequence[Device], group: Any | None = None
) -> list[Any]:
    """Sum one flat buffer per local device, and across processes when ``group``.

    Returns, per device, the buffer that holds the sum for it: the device's own
    buffer, or under the ``"shared"`` schedule the first device's buffer for every
    CPU replica (the other buffers are then left as they were).
    """
    schedule = flat_schedule(devices, group)
    if schedule == "ring":
        ring_allreduce(backend, flats, devices)
        return list(flats)
    reduce_to_first(backend, flats)
    if group is not None:
        group.allreduce_(flats[0])
    if schedule == "shared":
        return [flats[0]] * len(flats)
    broadcast_from_first(backend, flats)
    return list(flats)


def fused_allreduce(backend: Any, grads: Sequence[Sequence[Any]], devices: Sequence[Device]) -> None:
    """Flatten each device's gradients into one buffer, sum the buffers, write back in place."""
    shapes = [backend.shape(g) for g in grads[0]]
    if not sum(prod(s) for s in shapes):  # only empty tensors: nothing to sum
        return
    flats = [backend.flatten(per_device) for per_device in grads]
    sums = allreduce_flat(backend, flats, devices)
    views = views_per_buffer(backend, sums, shapes)
    for per_device, flat in zip(grads, sums):
        for g, view in zip(per_device, views[id(flat)]):
            backend.assign_(g, view)


def views_per_buffer(backend: Any, flats: Sequence[Any], shapes: Sequence[Sequence[int]]) -> dict[int, list[Any]]:
    """Return ``{id(flat): unflatten(flat, shapes)}``, unflattening each distinct buffer once
    (under the ``"shared"`` schedule every CPU replica holds the same buffer)."""
    views: dict[int, list[Any]] = {}
    for f in flats:
        if id(f) not in views:
            views[id(f)] = backend.unflatten(f, shapes)
    return views


def check_algorithm(backend: Any, algorithm: str) -> str:
    """Return ``algorithm`` if ``backend`` supports it; raise UnknownAlgorithmError otherwise."""
    if algorithm not in ALGORITHMS:
        raise UnknownAlgorithmError(f"unknown allreduce algorithm {algorithm!r}; choose one of {list(ALGORITHMS)}")
    if algorithm == "native" and not hasattr(backend, "native_allreduce"):
        raise UnknownAlgorithmError(
            f"backend {backend.name!r} offers no native allreduce; use 'naive', 'ring' or 'fused'"
        )
    return algorithm


def allreduce_grads(
    backend: Any, grads: Sequence[Sequence[Any]], devices: Sequence[Device], algorithm: str = "fused"
) -> None:
    """Allreduce per-device gradient lists (``grads[device][param]``) in place."""
    check_algorithm(backend, algorithm)
    if len(grads) != len(devices):
        raise InputError(f"{len(grads)} gradient lists for {len(devices)} devices; pass one list per device")
    if len(devices) == 1:
        return
    if algorithm == "fused":
        fused_allreduce(backend, grads, devices)
        return
    one: Callable[[Any, Sequence[Any], Sequence[Device]], None] = {
        "naive": naive_allreduce,
        "ring": ring_allreduce,
        "native": lambda b, ts, ds: b.native_allreduce(list(ts)),
    }[algorithm]
    for i in range(len(grads[0])):
        one(backend, [g[i] for g in grads], devices)
