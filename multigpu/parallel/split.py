"""Split a minibatch across devices without losing a row."""

from __future__ import annotations

import numpy as np

from multigpu.errors import InputError


def shard_sizes(total: int, parts: int) -> list[int]:
    """Return ``parts`` sizes summing to ``total``; the first ``total % parts`` get one more.

    Raises InputError when ``total < parts`` (a device would receive no data).
    """
    if parts < 1:
        raise InputError(f"cannot split into {parts} parts; need at least 1")
    if total < parts:
        raise InputError(
            f"a batch of {total} example(s) cannot be split across {parts} devices; "
            f"use a batch of at least {parts} or fewer devices"
        )
    base, extra = divmod(total, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


def split_batch(X: np.ndarray, y: np.ndarray, parts: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Split ``X`` and ``y`` along axis 0 into ``parts`` consecutive shards.

    Uneven batches give the first shards one extra row each; concatenating the
    shards returns the batch. Raises InputError on a length mismatch or a batch
    smaller than ``parts``.
    """
    if len(X) != len(y):
        raise InputError(f"X has {len(X)} rows but y has {len(y)}; they must match")
    bounds = np.cumsum([0, *shard_sizes(len(X), parts)])
    return [(X[a:b], y[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
