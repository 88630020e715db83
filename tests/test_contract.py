"""The conformance suite: every installed adapter, and a third party's registered by entry
point, raises the same exception for the same bad call and agrees at the edges of the
protocol (grad mode, empty tensors, dtypes, fresh buffers, no device read in the step)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from conformance_cases import CASES, CPU, CPU1, THIRD_PARTY, f32, third_party_off_path, third_party_on_path
from conftest import BACKENDS
from hypothesis import given, settings
from hypothesis import strategies as st

import multigpu
from multigpu import models
from multigpu.contract.checked import CheckedBackend
from multigpu.errors import InputError
from multigpu.parallel.agreement import random_batches

ADAPTERS = [*BACKENDS, THIRD_PARTY]


@pytest.fixture(scope="module", autouse=True)
def third_party() -> Iterator[None]:
    """The third-party distribution is visible to this module only (others count backends)."""
    third_party_on_path()
    yield
    third_party_off_path()


def backend(name: str) -> CheckedBackend:
    """What ``multigpu.backend(name)`` hands out: the adapter behind the contract."""
    return multigpu.backend(name)


def no_grad(name: str) -> Any:
    """The framework's own "record no gradients" context."""
    if name == "torch":
        import torch

        return torch.no_grad()
    if name == "paddle":
        import paddle

        return paddle.no_grad()
    if name == "mxnet":
        import mxnet

        return mxnet.autograd.pause()
    return contextlib.nullcontext()


def test_third_party_adapter_is_found_by_entry_point():
    assert THIRD_PARTY in multigpu.registered_backends() and THIRD_PARTY in multigpu.available_backends()
    be = backend(THIRD_PARTY)
    assert isinstance(be, CheckedBackend) and isinstance(be, multigpu.Backend)
    assert type(be.adapter).__module__ == "mgpu_lenient.adapter"


# -- the same exception for the same bad call -------------------------------------------


@pytest.mark.parametrize("name", ADAPTERS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_call_raises_the_same_exception_everywhere(case, name):
    with pytest.raises(Exception) as info:
        case.call(backend(name))
    assert type(info.value) is case.raises, f"{name}: {type(info.value).__name__}: {info.value}"
    assert str(info.value)  # a message that names the problem


def test_the_third_party_adapter_alone_is_lenient():
    """Without the contract the third party's adapter misbehaves as the old reference did:
    the checks above pass because of the core, not because of each adapter."""
    raw = backend(THIRD_PARTY).adapter
    dst = raw.from_numpy(np.zeros(3, np.float32), CPU)
    raw.assign_(dst, raw.from_numpy(np.ones(1, np.float32), CPU))  # broadcasts
    assert raw.to_numpy(dst).tolist() == [1, 1, 1]
    loss = raw.softmax_cross_entropy(
        raw.from_numpy(np.zeros((1, 3), np.float32), CPU), raw.from_numpy(np.array([-1]), CPU)
    )  # wraps
    assert np.isfinite(raw.to_numpy(loss)).all()
    assert len(raw.split(raw.from_numpy(np.zeros((3, 1), np.float32), CPU), [1, 1])) == 2


def test_the_reference_alone_is_stricter_than_the_contract():
    """The raw NumPy reference checks every label and refuses ops that mix replicas."""
    raw = backend("numpy").adapter
    with pytest.raises(InputError, match="label -1"):
        raw.softmax_cross_entropy(
            raw.from_numpy(np.zeros((1, 3), np.float32), CPU), raw.from_numpy(np.array([-1]), CPU)
        )
    with pytest.raises(InputError, match="mixes devices"):
        raw.dense(
            raw.from_numpy(np.zeros((1, 2), np.float32), CPU),
            raw.from_numpy(np.zeros((2, 2), np.float32), CPU1),
            raw.from_numpy(np.zeros(2, np.float32), CPU),
        )


# -- generated bad inputs ----------------------------------------------------------------

shapes = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)


@pytest.mark.parametrize("name", ADAPTERS)
@settings(max_examples=15)
@given(dst_shape=shapes, src_shape=shapes, op=st.sampled_from(["assign_", "add_"]))
def test_in_place_math_never_broadcasts_or_resizes(name, dst_shape, src_shape, op):
    be = backend(name)
    before = np.arange(np.prod(dst_shape), dtype=np.float32).reshape(dst_shape)
    dst = be.from_numpy(before, CPU)
    src = be.from_numpy(np.ones(src_shape, np.float32), CPU1)
    if dst_shape == src_shape:
        getattr(be, op)(dst, src)
        want = before + 1 if op == "add_" else np.ones(dst_shape, np.float32)
        np.testing.assert_array_equal(be.to_numpy(dst), want)
        return
    with pytest.raises(InputError, match="equal shapes"):
        getattr(be, op)(dst, src)
    got = be.to_numpy(dst)
    assert got.shape == dst_shape  # never resized (paddle's assign did)
    np.testing.assert_array_equal(got, before)


@pytest.mark.parametrize("name", ADAPTERS)
@settings(max_examples=15)
@given(rows=st.integers(1, 6), sizes=st.lists(st.integers(-2, 6), min_size=1, max_size=4))
def test_split_takes_exactly_the_rows(name, rows, sizes):
    be = backend(name)
    x = be.from_numpy(np.arange(rows * 2, dtype=np.float32).reshape(rows, 2), CPU)
    if sum(sizes) == rows and min(sizes) >= 1:
        parts = be.split(x, sizes)
        assert [be.shape(p)[0] for p in parts] == sizes
        np.testing.assert_array_equal(np.concatenate([be.to_numpy(p) for p in parts]), be.to_numpy(x))
    else:
        with pytest.raises(InputError, match="split"):
            be.split(x, sizes)


@pytest.mark.parametrize("name", ADAPTERS)
@settings(max_examples=15)
@given(classes=st.integers(1, 6), labels=st.lists(st.integers(-200, 200), min_size=1, max_size=5))
def test_labels_outside_the_classes_are_refused(name, classes, labels):
    be, ref = backend(name), backend("numpy")
    logits = np.random.default_rng(classes).standard_normal((len(labels), classes)).astype(np.float32)

    def call(b):
        return b.to_numpy(
            b.softmax_cross_entropy(
                b.from_numpy(logits, CPU),  # noqa: E731
                b.from_numpy(np.array(labels), CPU),
            )
        )

    if all(0 <= v < classes for v in labels):
        np.testing.assert_allclose(call(be), call(ref), atol=1e-5)
    else:
        with pytest.raises(InputError, match="out of range"):
            call(be)


# -- the edges of the protocol, by value -----------------------------------------------


def _loss(be: Any, ps: list[Any], x: Any, y: Any) -> Any:
    return be.sum(be.softmax_cross_entropy(be.dense(x, ps[0], ps[1]), y))


def _problem(be: Any) -> tuple[list[Any], Any, Any]:
    rng = np.random.default_rng(5)
    params = [be.from_numpy(rng.standard_normal((4, 3)), CPU), be.from_numpy(rng.standard_normal(3), CPU)]
    return params, be.from_numpy(rng.standard_normal((6, 4)), CPU), be.from_numpy(rng.integers(0, 3, 6), CPU)


def _loss_problem(name: str) -> tuple[Any, list[Any], Any, Any, Any]:
    """The backend, ``_problem``'s tensors on it, and the loss of its parameters."""
    be = backend(name)
    params, x, y = _problem(be)
    return be, params, x, y, lambda ps, x, y: _loss(be, ps, x, y)


@pytest.mark.parametrize("name", ADAPTERS)
def test_value_and_grad_ignores_the_callers_no_grad_mode(name):
    be, params, x, y, fn = _loss_problem(name)
    free = be.to_numpy(be.value_and_grad(fn, params, x, y))
    with no_grad(name):
        inside = be.to_numpy(be.value_and_grad(fn, params, x, y))
    assert np.abs(free[:-1]).max() > 0.01  # real gradients, not zeros
    np.testing.assert_allclose(inside, free, rtol=1e-6, atol=1e-7)
    ref_params, rx, ry = _problem(backend("numpy"))
    want = backend("numpy").value_and_grad(lambda ps, x, y: _loss(backend("numpy"), ps, x, y), ref_params, rx, ry)
    np.testing.assert_allclose(free, backend("numpy").to_numpy(want), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ADAPTERS)
def test_value_and_grad_gives_zeros_for_unused_params_and_fresh_buffers(name):
    be = backend(name)
    params, x, y = _problem(be)
    values = [be.to_numpy(p) for p in params]
    spare = be.from_numpy(np.ones((2, 2), np.float32), CPU)
    first = be.value_and_grad(lambda ps, x, y: _loss(be, ps[:2], x, y), [*params, spare], x, y)
    kept = be.to_numpy(first)
    assert kept.shape == (12 + 3 + 4 + 1,) and not kept[15:19].any()
    const = be.to_numpy(be.value_and_grad(lambda ps, x: be.sum(x), params, x))  # uses no parameter
    assert not const[:-1].any() and const[-1] == pytest.approx(float(be.to_numpy(x).sum()), rel=1e-5)
    other = be.from_numpy(np.zeros((6, 4), np.float32), CPU)
    be.value_and_grad(lambda ps, x, y: _loss(be, ps[:2], x, y), [*params, spare], other, y)
    np.testing.assert_array_equal(be.to_numpy(first), kept)  # a later call never writes into it
    for p, v in zip(params, values):  # the caller's params are left as they were
        np.testing.assert_array_equal(be.to_numpy(p), v)


@pytest.mark.parametrize("name", ADAPTERS)
def test_value_and_grad_writes_into_out_and_returns_it(name):
    be, params, x, y, fn = _loss_problem(name)
    fresh = be.to_numpy(be.value_and_grad(fn, params, x, y))
    out = be.from_numpy(np.full(fresh.shape, np.nan, np.float32), CPU)
    assert be.value_and_grad(fn, params, x, y, out=out) is out
    np.testing.assert_array_equal(be.to_numpy(out), fresh)
    spare = be.from_numpy(np.ones((2, 2), np.float32), CPU)  # unused: zero, whatever out held before
    big = be.from_numpy(np.full(fresh.size + 4, np.nan, np.float32), CPU)
    flat, aux = be.value_and_grad(
        lambda ps, x, y: (fn(ps[:2], x, y), [be.relu(x)]), [*params, spare], x, y, aux=True, out=big
    )
    got = be.to_numpy(flat)
    assert flat is big and not got[15:19].any() and np.isfinite(got).all() and be.shape(aux) == (24,)


@pytest.mark.parametrize("name", ADAPTERS)
@pytest.mark.parametrize("kind", ["float16", "float64", "int8", "uint8", "int32"])
def test_from_numpy_gives_float32_or_int64(name, kind):
    be = backend(name)
    t = be.from_numpy(np.array([[1, 2], [3, 4]], dtype=kind), CPU)
    want = np.float32 if kind.startswith("float") else np.int64
    assert be.dtype(t) == want and be.to_numpy(t).dtype == want
    np.testing.assert_array_equal(be.to_numpy(t), [[1, 2], [3, 4]])


@pytest.mark.parametrize("name", ADAPTERS)
def test_empty_tensors_behave_the_same_everywhere(name):
    be = backend(name)
    e = be.from_numpy(np.zeros((0, 3), np.float32), CPU)
    assert be.shape(e) == (0, 3) and be.to_numpy(be.copy_to(e, CPU1)).shape == (0, 3)
    be.add_(e, be.from_numpy(np.zeros((0, 3), np.float32), CPU1))  # nothing to add
    be.assign_(e, e)
    be.sgd_([e, f32(be, 2)], [e, be.from_numpy(np.ones(2, np.float32), CPU)], 1.0)
    flat = be.flatten([e, be.from_numpy(np.arange(2, dtype=np.float32), CPU)])
    np.testing.assert_array_equal(be.to_numpy(flat), [0, 1])  # the empty part contributes nothing
    views = be.unflatten(flat, [(0,), (2,)])
    assert [be.shape(v) for v in views] == [(0,), (2,)]


@pytest.mark.parametrize("name", ADAPTERS)
@pytest.mark.parametrize("algorithm", multigpu.ALGORITHMS)
def test_allreduce_of_empty_tensors_is_a_no_op(name, algorithm):
    be = backend(name)
    devices = [CPU, CPU1]
    if algorithm == "native" and not hasattr(be, "native_allreduce"):
        with pytest.raises(multigpu.UnknownAlgorithmError, match="native"):
            multigpu.allreduce_grads(be, [[], []], devices, algorithm)
        return
    grads = [[be.from_numpy(np.zeros(0, np.float32), d), be.from_numpy(np.ones(2, np.float32), d)] for d in devices]
    multigpu.allreduce_grads(be, grads, devices, algorithm)
    for per in grads:
        assert be.shape(per[0]) == (0,)
        np.testing.assert_array_equal(be.to_numpy(per[1]), [2, 2])
    only_empty = [[be.from_numpy(np.zeros(0, np.float32), d)] for d in devices]
    multigpu.allreduce_grads(be, only_empty, devices, algorithm)  # the ring case


@pytest.mark.parametrize("name", ADAPTERS)
def test_assign_to_itself_and_unflatten_views(name):
    be = backend(name)
    t = f32(be, 4)
    before = be.to_numpy(t)
    be.assign_(t, t)
    np.testing.assert_array_equal(be.to_numpy(t), before)
    flat = be.from_numpy(np.zeros(6, np.float32), CPU)
    a, b = be.unflatten(flat, [(2,), (2, 2)])
    be.add_(flat, be.from_numpy(np.ones(6, np.float32), CPU))
    np.testing.assert_array_equal(be.to_numpy(b), np.ones((2, 2)))  # views share the storage


@pytest.mark.parametrize("name", ADAPTERS)
def test_the_step_reads_the_device_once_with_the_contract(name, monkeypatch):
    """Label checks use the range recorded on the host: one to_numpy per step, the loss."""
    be = backend(name)
    m = models.lenet()
    tr = multigpu.DataParallel(m, backend=be, devices="cpu:2", lr=0.1)
    X, y = random_batches(m, 1, 8)[0]
    tr.train_batch(X, y)
    reads = []
    real = be.adapter.to_numpy
    monkeypatch.setattr(be.adapter, "to_numpy", lambda t: (reads.append(1), real(t))[1])
    tr.train_batch(X, y)
    assert len(reads) == 1


def test_mxnet_value_and_grad_copies_no_parameter():
    """MXNet's step makes gradients land in views of the returned buffer: detach() + mark_variables,
    no copy of any parameter (the one copyto writes the loss value into the buffer)."""
    if "mxnet" not in BACKENDS:
        pytest.skip("mxnet is not installed")
    import mxnet as mx

    be = backend("mxnet")
    params, x, y = _problem(be)
    copies: list[tuple[int, ...]] = []
    real = mx.nd.NDArray.copyto
    patch = pytest.MonkeyPatch()
    patch.setattr(mx.nd.NDArray, "copyto", lambda self, other: (copies.append(self.shape), real(self, other))[1])
    patch.setattr(mx.nd.NDArray, "copy", lambda self: (copies.append(self.shape), real(self, self.context))[1])
    try:
        flat = be.value_and_grad(lambda ps, x, y: _loss(be, ps, x, y), params, x, y)
    finally:
        patch.undo()
    assert copies == [(1,)]  # only the value
    assert all(p.grad is None for p in params)  # the caller's arrays gained no gradient buffer
    assert be.to_numpy(flat).shape == (16,)


@pytest.mark.parametrize("name", ADAPTERS)
def test_relu_of_nan_is_as_documented(name):
    """The one documented difference (protocol.relu): Paddle's and MXNet's ReLU turn NaN into 0."""
    be = backend(name)
    out = be.to_numpy(be.relu(be.from_numpy(np.array([np.nan, -1, 0, 2, np.inf, -np.inf], np.float32), CPU)))
    np.testing.assert_array_equal(out[1:], [0, 0, 2, np.inf, 0])
    assert np.isnan(out[0]) == (name not in ("paddle", "mxnet"))


def test_the_table_script_reports_what_the_suite_asserts():
    """tests/conformance_table.py (the table in docs/conformance.md) shows the same classes."""
    import conformance_table

    rows = conformance_table.table(["numpy", THIRD_PARTY], raw=False)
    assert [row[1:] for row in rows] == [[c.raises.__name__] * 2 for c in CASES]


def test_an_adapter_that_breaks_the_result_layout_is_an_adapter_error():
    """A third party's bug (a value_and_grad buffer without the value) is named as such."""
    from multigpu.contract.checked import checked
    from multigpu.errors import AdapterError

    raw = backend(THIRD_PARTY).adapter
    broken = type(
        "Broken",
        (type(raw),),
        {
            "value_and_grad": lambda self, fn, params, *inputs: type(raw).unflatten(
                self, type(raw).value_and_grad(self, fn, params, *inputs), [(12,), (1,)]
            )[0]
        },
    )()
    be = checked(broken)
    w = be.from_numpy(np.ones((4, 3), np.float32), CPU)
    with pytest.raises(AdapterError, match=r"returned shape \(12,\); the contract says \(13,\)"):
        be.value_and_grad(lambda ps: be.sum(ps[0]), [w])


# -- the transformer and ONNX ops: ids and labels by their host-recorded span -------------


@pytest.mark.parametrize("name", ADAPTERS)
@settings(max_examples=15)
@given(
    classes=st.integers(1, 5),
    labels=st.lists(st.sampled_from([-100, -2, -1, 0, 1, 2, 3, 4, 5, 6]), min_size=1, max_size=6),
    ignore=st.sampled_from([-100, -1, 0, 5]),
)
def test_cross_entropy_takes_exactly_the_classes_and_the_ignore_index(name, classes, labels, ignore):
    """A label in 0..C-1 or equal to ignore_index passes, any other is refused, wherever it sits in the range;
    ignored positions give 0."""
    be, ref = backend(name), backend("numpy")
    logits = np.random.default_rng(classes).standard_normal((2, len(labels), classes)).astype(np.float32)
    ids = np.array([labels, labels[::-1]])

    def call(b):
        return b.to_numpy(b.cross_entropy(b.from_numpy(logits, CPU), b.from_numpy(ids, CPU), ignore))

    if all(0 <= v < classes or v == ignore for v in labels):
        got = call(be)
        np.testing.assert_allclose(got, call(ref), atol=1e-5)
        assert not got[ids == ignore].any()
    else:
        with pytest.raises(InputError, match="out of range"):
            call(be)


@pytest.mark.parametrize("name", ADAPTERS)
def test_ids_are_checked_from_the_host_without_a_device_read(name, monkeypatch):
    """Ids and labels made by from_numpy (of any rank; reshaped, copied, split or concatenated) carry
    their span: the checks read nothing back from the device."""
    be = backend(name)
    table, logits = f32(be, 6, 3), f32(be, 2, 2, 6)
    ids = be.from_numpy(np.array([[5, 0], [-100, 2]]), CPU)
    parts = be.split(be.reshape(ids, (4,)), [1, 3])
    joined = be.reshape(be.concat([be.copy_to(parts[1], CPU), parts[0]]), (2, 2))  # [0, -100, 2, 5]
    reads: list[int] = []
    real = be.adapter.to_numpy
    monkeypatch.setattr(be.adapter, "to_numpy", lambda t: (reads.append(1), real(t))[1])
    be.cross_entropy(logits, ids, -100)
    be.cross_entropy(logits, joined, -100)
    with pytest.raises(InputError, match="id -100"):
        be.embedding(joined, table)
    assert reads == []


def test_a_span_sets_aside_the_ignore_index_at_either_end_exactly():
    """The neighbours of the least and greatest values decide, without the values themselves."""
    from multigpu.contract.checked import check_index_span, merge_spans, span_of

    rng = np.random.default_rng(0)
    for _ in range(300):
        values = rng.integers(-3, 6, rng.integers(1, 6))
        ignore = int(rng.choice([-3, -1, 0, 5]))
        ok = all(0 <= v < 4 or v == ignore for v in values)
        halves = [span_of(values[: len(values) // 2 + 1]), span_of(values[len(values) // 2 :])]
        for span in (span_of(values), merge_spans(halves)):
            if ok:
                check_index_span(span, 4, "cross_entropy", ignore)
            else:
                with pytest.raises(InputError, match="out of range"):
                    check_index_span(span, 4, "cross_entropy", ignore)
