"""Gradient buckets: the layout, the adapters' signals during backward, the checked group's one
header per step, and a bucketed two-rank step equal to one process with two devices."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from recording_backend import Recording, host_reads
from test_distributed import _both, _reference_pair
from test_no_host_sync import _tiny_resnet

import multigpu
from multigpu import models
from multigpu.contract.bucket_signals import KeptBuffers, gradient_views
from multigpu.contract.protocol import Device
from multigpu.distributed.checked_group import CheckedGroup
from multigpu.distributed.job import free_port
from multigpu.errors import AdapterError, CollectiveMismatchError, InputError
from multigpu.parallel.agreement import random_batches
from multigpu.parallel.buckets import plan_buckets
from multigpu.parallel.data_parallel import DataParallel

CPU = Device("cpu", 0)
MIB_FLOATS = (1 << 20) // 4


def test_buckets_fill_from_the_last_parameter_with_a_small_first_one():
    shapes = [(MIB_FLOATS // 2,), (10,), (3 * MIB_FLOATS,), (MIB_FLOATS,), (MIB_FLOATS // 4,), (7,)]
    layout = plan_buckets(shapes, bucket_mb=2.0, first_mb=1.0)
    # bucket 0: parameters 3..5 reach 1 MiB; bucket 1: parameter 2 alone exceeds 2 MiB; bucket 2: the rest
    assert layout.params == ((3, 6), (2, 3), (0, 2))
    total = sum(int(np.prod(s)) for s in shapes)
    assert layout.slices[0][1] == total + 1  # the loss travels with bucket 0
    assert layout.slices[-1][0] == 0
    assert all(a == b for (a, _), (_, b) in zip(layout.slices, layout.slices[1:]))  # contiguous, back to front
    assert sum(layout.sizes) == total + 1
    assert [p for (p,) in layout.pieces()] == layout.sizes[::-1]
    lenet = models.lenet().param_shapes
    assert plan_buckets(lenet).params == ((0, len(lenet)),)  # LeNet fits the first bucket, as in DDP
    for bad in (0, -1, float("nan"), "25"):
        with pytest.raises(InputError, match="bucket_mb"):
            plan_buckets(lenet, bad)


def _loss(b, model):
    def fn(ps, x, y):
        return b.sum(b.softmax_cross_entropy(model.apply(b, [ps], [x])[0], y))

    return fn


@pytest.mark.parametrize("per_bucket", [False, True], ids=["one-buffer", "buffer-per-bucket"])
@pytest.mark.parametrize("unused", [False, True], ids=["all-used", "one-unused"])
@pytest.mark.parametrize("model", ["lenet", "tiny-resnet"])
def test_each_bucket_is_signalled_once_with_its_gradients_final(backend_name, unused, model, per_bucket):
    """On every adapter: a bucket's slice (or its own buffer) already holds its final gradients when it is
    signalled, every bucket is signalled once, and the buffers equal the unbucketed value_and_grad's (with
    BatchNorm's batch statistics as aux outputs for the ResNet)."""
    b = multigpu.backend(backend_name)
    m = models.lenet() if model == "lenet" else _tiny_resnet()
    aux = model != "lenet"
    ps = [b.from_numpy(p, CPU) for p in m.init_params(0)]
    X, y = random_batches(m, 1, 6, seed=2)[0]
    x, t = b.from_numpy(X, CPU), b.from_numpy(y, CPU)
    loss = DataParallel(m, backend=b)._loss if aux else _loss(b, m)
    fn = (lambda q, x, y: loss(q[:-1], x, y)) if unused else loss
    params = [*ps, b.from_numpy(np.ones(3, np.float32), CPU)] if unused else ps
    size = sum(int(np.prod(b.shape(p))) for p in params)
    layout = plan_buckets([b.shape(p) for p in params], bucket_mb=0.05 if model == "lenet" else 0.002, first_mb=0.001)
    assert len(layout.params) >= 3
    plain = b.value_and_grad(fn, params, x, t, aux=aux)
    want = b.to_numpy(plain[0] if aux else plain)
    out = (
        [b.from_numpy(np.full(n, 7.0, np.float32), CPU) for n in layout.sizes]
        if per_bucket
        else b.from_numpy(np.full(size + 1, 7.0, np.float32), CPU)
    )
    seen: dict[int, np.ndarray] = {}

    def ready(k: int) -> None:
        a, e = layout.slices[k]
        seen[k] = b.to_numpy(out[k]) if per_bucket else b.to_numpy(out)[a:e]

    got = b.value_and_grad(fn, params, x, t, out=out, buckets=layout.params, on_bucket=ready, aux=aux)
    if aux:
        got, stats = got
        np.testing.assert_allclose(b.to_numpy(stats), b.to_numpy(plain[1]), rtol=1e-5, atol=1e-6)
    assert got is out and sorted(seen) == list(range(len(layout.params)))
    whole = np.concatenate([b.to_numpy(o) for o in reversed(out)]) if per_bucket else b.to_numpy(out)
    np.testing.assert_allclose(whole, want, rtol=1e-5, atol=1e-6)
    for k, (a, e) in enumerate(layout.slices):
        np.testing.assert_allclose(seen[k], want[a:e], rtol=1e-5, atol=1e-6, err_msg=f"bucket {k}")


def test_kept_bucket_buffers_are_cut_once_and_give_each_call_its_own_gradients(backend_name):
    """On every adapter: with the bucket buffers as KeptBuffers, a second value_and_grad (another batch)
    reuses the views cut by the first and still writes that batch's gradients, equal to the unbucketed
    call's; a buffer replaced in the list gets views of its own."""
    b = multigpu.backend(backend_name)
    m = models.lenet()
    ps = [b.from_numpy(p, CPU) for p in m.init_params(0)]
    shapes = [b.shape(p) for p in ps]
    layout = plan_buckets(shapes, bucket_mb=0.05, first_mb=0.001)
    assert len(layout.params) >= 3
    out = KeptBuffers(b.from_numpy(np.full(n, 7.0, np.float32), CPU) for n in layout.sizes)
    first = gradient_views(b, out, shapes, layout.params)
    assert all(v is w for v, w in zip(first, gradient_views(b, out, shapes, layout.params)))
    for seed in (2, 3):
        X, y = random_batches(m, 1, 6, seed=seed)[0]
        x, t = b.from_numpy(X, CPU), b.from_numpy(y, CPU)
        want = b.to_numpy(b.value_and_grad(_loss(b, m), ps, x, t))
        got = b.value_and_grad(_loss(b, m), ps, x, t, out=out, buckets=layout.params, on_bucket=lambda k: None)
        assert got is out
        np.testing.assert_allclose(
            np.concatenate([b.to_numpy(o) for o in reversed(out)]), want, rtol=1e-5, atol=1e-6, err_msg=f"batch {seed}"
        )
    assert all(v is w for v, w in zip(first, gradient_views(b, out, shapes, layout.params)))
    out[1] = b.from_numpy(np.zeros(layout.sizes[1], np.float32), CPU)
    fresh = gradient_views(b, out, shapes, layout.params)
    a, e = layout.params[1]
    assert all(fresh[i] is not first[i] for i in range(a, e))
    b.assign_(fresh[a], b.from_numpy(np.ones(shapes[a], np.float32), CPU))
    assert b.to_numpy(out[1])[: int(np.prod(shapes[a]))].min() == 1.0  # the new views are the new buffer's


def test_an_adapter_that_misses_or_repeats_a_bucket_breaks_the_contract():
    from multigpu.contract.checked import CheckedBackend

    class Skips:  # an adapter that signals bucket 0 twice, or never
        def __init__(self, inner, signals):
            self.inner, self.signals = inner, signals

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def value_and_grad(self, fn, params, *inputs, aux=False, out=None, buckets=None, on_bucket=None):
            flat = self.inner.value_and_grad(fn, params, *inputs, out=out)
            for k in self.signals:
                on_bucket(k)
            return flat

    numpy = multigpu.backend("numpy")
    for signals, match in (([0, 0], "signalled bucket 0 after \\[0\\]"), ([1], "signalled buckets \\[1\\] of 2")):
        be = CheckedBackend(Skips(numpy.adapter, signals))
        ps = [be.from_numpy(np.ones(2, np.float32), CPU), be.from_numpy(np.ones(3, np.float32), CPU)]
        out = be.from_numpy(np.zeros(6, np.float32), CPU)
        with pytest.raises(AdapterError, match=match):
            be.value_and_grad(
                lambda q, be=be: be.sum(be.add(q[0], q[0])),
                ps,
                out=out,
                buckets=[(1, 2), (0, 1)],
                on_bucket=lambda k: None,
            )


def test_an_adapter_written_before_buckets_fills_the_bucket_buffers_through_the_contract():
    """An adapter whose value_and_grad takes no ``on_bucket`` gets no list ``out``: the contract copies its
    one buffer into the bucket buffers and signals every bucket when it returns."""
    from multigpu.contract.checked import CheckedBackend

    class Before:  # an adapter written before the bucket extension
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def value_and_grad(self, fn, params, *inputs, aux=False, out=None):
            assert not isinstance(out, list)
            return self.inner.value_and_grad(fn, params, *inputs, aux=aux, out=out)

    numpy = multigpu.backend("numpy")
    be = CheckedBackend(Before(numpy.adapter))
    ps = [be.from_numpy(np.arange(2, dtype=np.float32), CPU), be.from_numpy(np.ones(3, np.float32), CPU)]
    out = [be.from_numpy(np.zeros(n, np.float32), CPU) for n in (4, 2)]
    seen: list[int] = []
    got = be.value_and_grad(
        lambda q: be.add(be.sum(be.add(q[0], q[0])), be.sum(q[1])),
        ps,
        out=out,
        buckets=[(1, 2), (0, 1)],
        on_bucket=seen.append,
    )
    assert got is out and seen == [0, 1]
    assert be.to_numpy(out[0]).tolist() == [1, 1, 1, 5] and be.to_numpy(out[1]).tolist() == [2, 2]


@pytest.mark.parametrize("per_bucket", [True, False], ids=["buffer-per-bucket", "one-buffer"])
def test_mxnet_engine_lets_bucket_0_be_read_while_the_rest_of_backward_is_held(per_bucket):
    """MXNet's engine orders work by NDArray, and slices share their array's variable. Backward of parameter
    0 (bucket 1) is held by a gate that bucket 0's signal opens only after reading bucket 0: with a buffer
    per bucket the read returns at once (a push started there overlaps the rest of backward); in one
    buffer it waits until the gate gives up (which is why the step passes a buffer per bucket)."""
    mx = pytest.importorskip("mxnet")
    b, hold = multigpu.backend("mxnet"), 2.0
    gate = threading.Event()

    class Gate(mx.autograd.Function):
        def forward(self, x):
            return x.copy()

        def backward(self, g):
            gate.wait(hold)
            return g.copy()

    ps = [b.from_numpy(np.ones(3, np.float32), CPU), b.from_numpy(np.full(2, 2.0, np.float32), CPU)]
    out = (
        [b.from_numpy(np.zeros(n, np.float32), CPU) for n in (3, 3)]
        if per_bucket
        else b.from_numpy(np.zeros(6, np.float32), CPU)
    )
    waited: list[float] = []

    def on_bucket(k: int) -> None:
        if k == 0:
            t0 = time.perf_counter()
            (out[0] if per_bucket else out).wait_to_read()
            waited.append(time.perf_counter() - t0)
            gate.set()

    def fn(q):
        return b.add(b.sum(b.relu(Gate()(q[0]))), b.sum(b.add(q[1], q[1])))

    got = b.value_and_grad(fn, ps, out=out, buckets=[(1, 2), (0, 1)], on_bucket=on_bucket)
    values = np.concatenate([b.to_numpy(o) for o in reversed(got)]) if per_bucket else b.to_numpy(got)
    assert values.tolist() == [1, 1, 1, 2, 2, 11]  # gradients of parameters 0 and 1, then the value
    if per_bucket:
        assert waited[0] < hold / 2, waited
    else:
        assert waited[0] >= hold * 0.9, waited


def test_one_header_checks_the_buckets_and_a_mismatch_names_both_sides():
    """The first bucket set has no prediction to run on: one header checks it, and a mismatch there names both
    sides before a bucket reaches the engine. The next set runs on the fast path."""
    be, groups = _reference_pair(free_port())
    bufs = [[be.from_numpy(np.full(n, r + 1.0, np.float32), CPU) for n in (4, 2)] for r in (0, 1)]

    def buckets(r: int) -> list:
        groups[r].announce_buckets([4, 2])
        waits = [groups[r].allreduce_async_(t) for t in bufs[r]]
        for w in waits:
            w()
        return [be.to_numpy(bufs[r][0])[:-1].tolist(), be.to_numpy(bufs[r][1]).tolist()]  # the last float: the flag

    out = _both(lambda r: buckets(r) if r == 0 else groups[r].allreduce_(be.from_numpy(np.ones(6, np.float32), CPU)))
    assert all(isinstance(e, CollectiveMismatchError) for e in out), out
    for e in out:
        assert "rank 0 is at call #1 (2 bucket allreduces of 6 floats in all" in str(e)
        assert "rank 1 is at call #1 (allreduce_ of 6 floats)" in str(e)
    assert [be.to_numpy(b).tolist() for b in bufs[0]] == [[1] * 4, [1] * 2]  # no bucket reached the engine
    calls = groups[0].calls
    assert _both(buckets) == [[[3, 3, 3], [3, 3]]] * 2  # the group still works
    assert groups[0].calls == calls + 1  # one checked call for the whole step
    assert _both(buckets) == [[[6, 6, 6], [6, 6]]] * 2  # the same set again: the fast path
    _both(lambda r: groups[r].close())

    class Unused:  # an engine that must not be reached
        rank, world_size, timeout, device = 0, 2, 5.0, CPU

        def allreduce_(self, flat):
            raise AssertionError("the mismatch must be found before the engine is called")

    lone = CheckedGroup(Unused(), be)
    lone.announce_buckets([3, 2])
    with pytest.raises(
        CollectiveMismatchError,
        match="announced buckets of \\[3, 2\\] floats and then started one of 2 floats as bucket 0",
    ):
        lone.allreduce_async_(bufs[0][1])


def _bucketed_pair(model, X, y, bucket_mb):
    _, groups = _reference_pair(free_port())
    trainers: list = [None, None]
    losses: list = [[], []]

    def run(r: int) -> None:
        tr = DataParallel(
            model,
            backend="numpy",
            devices="cpu:1",
            lr=0.1,
            seed=3,
            process_group=groups[r],
            bucket_mb=bucket_mb,
            optimizer="sgd",
        )
        trainers[r] = tr
        for _ in range(3):
            losses[r].append(tr.train_batch(X, y))

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    _both(lambda r: groups[r].close())
    return trainers, losses


@pytest.mark.parametrize("model", ["lenet", "tiny-resnet"])
def test_two_bucketed_ranks_equal_one_process_with_two_devices(model):
    """Per-device BatchNorm too: each rank's running statistics are its shard's, as each device's are."""
    m = models.lenet() if model == "lenet" else _tiny_resnet()
    X, y = random_batches(m, 1, 16, seed=4)[0]
    trainers, losses = _bucketed_pair(m, X, y, bucket_mb=0.05 if model == "lenet" else 0.002)
    assert len(trainers[0]._layout.params) >= 3
    one = DataParallel(m, backend="numpy", devices="cpu:2", lr=0.1, seed=3)
    ref = [one.train_batch(X, y) for _ in range(3)]
    for r in (0, 1):
        np.testing.assert_allclose(losses[r], ref, atol=1e-5)
        for a, b in zip(trainers[r].get_params(), one.get_params()):
            np.testing.assert_allclose(a, b, atol=1e-5)
        for a, b in zip(trainers[r].get_state(), one.get_state(r)):
            np.testing.assert_allclose(a, b, atol=1e-5)


class _LoneGroup:
    """A process group of one rank whose sums start asynchronously (they are the identity)."""

    rank, world_size, timeout, device = 0, 1, 5.0, CPU

    def allreduce_(self, flat):
        pass

    def allreduce_async_(self, flat):
        return lambda: None

    def broadcast_(self, flat, src=0):
        pass


@pytest.mark.parametrize("devices", [1, 2])
def test_a_bucketed_step_reads_nothing_back_before_the_last_backward(backend_name, devices):
    """The buckets are reduced across devices from inside the last device's backward, after every other
    device was queued, and nothing is read back to the host until the loss after the update."""
    rec = Recording(multigpu.backend(backend_name))
    m = models.lenet()
    tr = DataParallel(
        m, backend=rec, devices=f"cpu:{devices}", lr=0.2, seed=1, process_group=_LoneGroup(), bucket_mb=0.05
    )
    X, y = random_batches(m, 1, 12, seed=1)[0]
    rec.log.clear()
    loss = tr.train_batch(X, y)
    events = list(rec.log)
    forwards = [i for i, e in enumerate(events) if e == "forward"]
    backwards = [i for i, e in enumerate(events) if e == "backward"]
    assert len(forwards) == len(backwards) == devices
    signals = [i for i, e in enumerate(events) if e.startswith("bucket:")]  # every device's, into its own buffers
    assert len(signals) == devices * len(tr._layout.params)
    last = [i for i in signals if i > forwards[-1]]  # the last device's start the sums
    assert len(last) == len(tr._layout.params) and forwards[-1] < last[0] < last[-1] < backwards[-1]
    assert not [events[i] for i in host_reads(events) if forwards[0] <= i <= backwards[-1]]
    crossing = [e for e in events[forwards[0] : forwards[-1]] if e in ("add_", "assign_", "copy_to")]
    assert not crossing, crossing
    assert [events[i] for i in host_reads(events)] == ["to_numpy"]
    plain = DataParallel(m, backend=backend_name, devices=f"cpu:{devices}", lr=0.2, seed=1)
    assert loss == pytest.approx(plain.train_batch(X, y), abs=1e-6)
    for a, b in zip(tr.get_params(), plain.get_params()):
        np.testing.assert_allclose(a, b, atol=1e-6)
