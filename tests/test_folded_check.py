"""The collective check folded into the step's own exchange (``CheckedGroup``'s fast path), in one process:
two ranks of the reference engine on threads, each engine wrapped to record every call it gets.

The same deviations on every framework's engine run in ``dist_scenarios.py`` (phase 5b).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from test_distributed import _both, _reference_pair

import multigpu
from multigpu import models
from multigpu.contract.protocol import Device
from multigpu.distributed.checked_group import FIELDS, CheckedGroup, split_code
from multigpu.distributed.job import free_port
from multigpu.errors import CollectiveMismatchError, InputError
from multigpu.parallel.agreement import random_batches
from multigpu.parallel.data_parallel import DataParallel

CPU = Device("cpu", 0)
HEADER = 2 * FIELDS  # the floats of a header exchange between two ranks


class Counting:
    """An engine group that records (call, floats) for every call it gets, then makes it on ``engine``."""

    def __init__(self, engine):
        self._engine = engine
        self.rank, self.world_size, self.timeout, self.device = (
            engine.rank,
            engine.world_size,
            engine.timeout,
            engine.device,
        )
        self.log: list[tuple[str, int]] = []

    def allreduce_(self, flat):
        self.log.append(("allreduce_", flat.data.size))
        self._engine.allreduce_(flat)

    def allreduce_async_(self, flat):
        self.log.append(("allreduce_async_", flat.data.size))
        return self._engine.allreduce_async_(flat)

    def broadcast_(self, flat, src=0):
        self.log.append(("broadcast_", flat.data.size))
        self._engine.broadcast_(flat, src)

    def barrier(self):
        self.log.append(("barrier", 0))
        self._engine.barrier()

    def close(self):
        self._engine.close()


def _counted_pair():
    be, plain = _reference_pair(free_port())
    engines = [Counting(g.engine) for g in plain]
    return be, [CheckedGroup(e, be) for e in engines], engines


def _bucket_set(be, group, sizes: Sequence[int], scale: float) -> list[list[float]]:
    """Announce and sum buckets of ``sizes`` holding ``scale * (1, 2, ...)``; return the sums without the flag."""
    bufs = [be.from_numpy(scale * np.arange(1, n + 1, dtype=np.float32), CPU) for n in sizes]
    group.announce_buckets(list(sizes))
    waits = [group.allreduce_async_(b) for b in bufs]  # every bucket started before any is waited for
    for w in waits:
        w()
    sums = [be.to_numpy(b).tolist() for b in bufs]
    return [sums[0][:-1], *sums[1:]]


def _expected(sizes: Sequence[int]) -> list[list[float]]:
    """Two ranks' sums of ``_bucket_set`` with scales 1 and 2."""
    return [[3.0 * (i + 1) for i in range(n - (k == 0))] for k, n in enumerate(sizes)]


@pytest.mark.parametrize("devices", [1, 2])
def test_a_steady_bucketed_step_makes_its_bucket_sums_and_nothing_else(devices):
    """DataParallel's first step is checked by a header; every later one makes exactly its bucket sums,
    bucket 0 one float longer (the flag), and trains as one process with all the devices does (with two
    devices a rank, the local devices' buffers are reduced, flag slot included, before the group's sum)."""
    _, groups, engines = _counted_pair()
    m = models.lenet()
    X, y = random_batches(m, 1, 16, seed=4)[0]
    trainers: list = [None, None]
    logs: list = [[], []]

    def run(r: int) -> None:
        trainers[r] = tr = DataParallel(
            m, backend="numpy", devices=f"cpu:{devices}", lr=0.1, seed=3, process_group=groups[r], bucket_mb=0.05
        )
        for _ in range(3):
            before = len(engines[r].log)
            tr.train_batch(X, y)
            logs[r].append(engines[r].log[before:])

    assert _both(run) == [None, None]
    layout = trainers[0]._layout
    sums = [("allreduce_async_", n) for n in [layout.sizes[0] + 1, *layout.sizes[1:]]]
    assert len(sums) >= 3 and groups[0].reserved_floats == 1
    for r in (0, 1):
        first, *steady = logs[r]
        assert first == [("allreduce_async_", HEADER), *sums]  # the first step: its header, then its buckets
        assert steady == [sums, sums]
    one = DataParallel(m, backend="numpy", devices=f"cpu:{2 * devices}", lr=0.1, seed=3)
    for _ in range(3):
        one.train_batch(X, y)
    for r in (0, 1):
        for a, b in zip(trainers[r].get_params(), one.get_params()):
            np.testing.assert_allclose(a, b, atol=1e-5)
    _both(lambda r: groups[r].close())


DEVIATIONS = {
    "size": (lambda be, g: g.allreduce_(be.from_numpy(np.ones(5, np.float32), CPU)), "(allreduce_ of 5 floats)"),
    "op": (lambda be, g: g.barrier(), "(barrier)"),
    "split": (
        lambda be, g: _bucket_set(be, g, [5, 2], 2.0),
        f"(2 bucket allreduces of 7 floats in all (split code {split_code([5, 2])})",
    ),
}


@pytest.mark.parametrize("kind", sorted(DEVIATIONS))
def test_a_rank_leaving_the_fast_path_is_named_with_both_sides_and_the_group_goes_on(kind):
    be, groups, engines = _counted_pair()
    sizes = [4, 3]
    fast = [("allreduce_async_", 4), ("allreduce_async_", 3)]
    for step in range(2):  # the header's step, then the fast path
        before = len(engines[0].log)
        assert _both(lambda r: _bucket_set(be, groups[r], sizes, r + 1.0)) == [_expected(sizes)] * 2
        assert engines[0].log[before:] == ([("allreduce_async_", HEADER)] if step == 0 else []) + fast
    deviate, side = DEVIATIONS[kind]
    before = [len(e.log) for e in engines]
    out = _both(lambda r: _bucket_set(be, groups[r], sizes, 1.0) if r == 0 else deviate(be, groups[r]))
    for r, exc in enumerate(out):
        assert isinstance(exc, CollectiveMismatchError), exc
        assert f"rank {r} of 2" in str(exc)
        assert f"rank 0 is at call #3 (2 bucket allreduces of 7 floats in all (split code {split_code(sizes)}))" in str(
            exc
        )
        assert f"rank 1 is at call #3 {side}" in str(exc)
    # rank 1 ran the predicted buckets with zeros and the flag, then its header; rank 0 its buckets, then its header
    for e, b in zip(engines, before):
        assert [n for _, n in e.log[b:]] == [4, 3, HEADER]
    for step in range(2):  # the group goes on: a header agrees again, then the fast path
        before = len(engines[0].log)
        assert _both(lambda r: _bucket_set(be, groups[r], sizes, r + 1.0)) == [_expected(sizes)] * 2
        assert engines[0].log[before:] == ([("allreduce_async_", HEADER)] if step == 0 else []) + fast
    _both(lambda r: groups[r].close())


def test_the_split_code_tells_splits_of_one_total_apart():
    splits = [[1, 2, 1], [2, 0, 2], [4], [2, 2], [3, 1], [1, 3], [0, 4]]  # the first two shared a weighted sum
    assert len({(sum(s), len(s), split_code(s)) for s in splits}) == len(splits)
    assert all(0 <= split_code(s) < 2**24 for s in [[10**9, 3], [5] * 500])


def test_a_pattern_change_made_by_every_rank_proceeds_and_is_learned():
    """After steady steps every rank makes an evaluation sum: each runs the predicted buckets with the flag
    raised, the headers agree, the sum is right. The step after it is checked by a header the first time,
    and runs on the fast path once that succession has been validated."""
    be, groups, engines = _counted_pair()
    sizes = [4, 3]

    def evaluation(r: int) -> list[float]:
        t = be.from_numpy(np.full(3, r + 1.0, np.float32), CPU)
        groups[r].allreduce_(t)
        return be.to_numpy(t).tolist()

    headers_per_round = []
    for _ in range(3):
        before = len(engines[0].log)
        for _ in range(2):
            assert _both(lambda r: _bucket_set(be, groups[r], sizes, r + 1.0)) == [_expected(sizes)] * 2
        assert _both(evaluation) == [[3.0, 3.0, 3.0]] * 2
        headers_per_round.append(
            engines[0].log[before:].count(("allreduce_async_", HEADER))
            + engines[0].log[before:].count(("allreduce_", HEADER))
        )
    assert engines[0].log[-4:] == [
        ("allreduce_async_", 4),
        ("allreduce_async_", 3),
        ("allreduce_", HEADER),
        ("allreduce_", 3),
    ]  # predicted buckets with zeros, header, the sum
    # rounds 1 and 2: the evaluation's header and the next step's (nothing had followed an evaluation yet);
    # round 3: the evaluation's only, the step after it predicted from round 2
    assert headers_per_round == [2, 2, 1]
    _both(lambda r: groups[r].close())


def test_bucket_0_needs_room_for_the_flag_and_no_check_reserves_nothing():
    class Unused:  # an engine that must not be reached
        rank, world_size, timeout, device = 0, 2, 5.0, CPU

    be = multigpu.backend("numpy")
    checked, unchecked = CheckedGroup(Unused(), be), CheckedGroup(Unused(), be, check=False)
    assert (checked.reserved_floats, unchecked.reserved_floats) == (1, 0)
    with pytest.raises(
        InputError,
        match=r"announce_buckets\(\[1, 4\]\) needs .* bucket 0 larger than the 1 "
        r"float\(s\) reserved for the check \(reserved_floats\)",
    ):
        checked.announce_buckets([1, 4])
    unchecked.announce_buckets([1, 4])  # nothing reserved, nothing exchanged
