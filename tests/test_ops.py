"""Each op against the NumPy reference (forward and gradients), and the reference's
own backward rules against finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from backends_numpy_ref import NumpyVar, numpy_backend
from conftest import FRAMEWORKS
from hypothesis import given, settings
from hypothesis import strategies as st

from multigpu.contract.op_check import OP_CASES, case_arrays, case_labels, run_case
from multigpu.contract.protocol import Device, pool_output_size

CPU = Device("cpu", 0)


@st.composite
def conv_case(draw):
    groups = draw(st.sampled_from([1, 2]))
    c = groups * draw(st.integers(1, 2))
    o = groups * draw(st.integers(1, 3))
    k = draw(st.integers(1, 4))
    pad = draw(st.integers(0, 2))
    stride = draw(st.integers(1, 3))
    h = draw(st.integers(max(1, k - 2 * pad), 9))
    w = draw(st.integers(max(1, k - 2 * pad), 9))
    return dict(
        b=draw(st.integers(1, 3)),
        c=c,
        o=o,
        k=k,
        pad=pad,
        stride=stride,
        h=h,
        w=w,
        groups=groups,
        seed=draw(st.integers(0, 2**16)),
    )


def _pool_area(case):
    """Output positions per channel of a pool case (floor or torch's ceil rounding)."""
    return int(np.prod([pool_output_size(case[n], case["k"], case["stride"], case["pad"], case["ceil"]) for n in "hw"]))


def _pool(b, x, case):
    pool = "avg_pool2d" if case["kind"] == "avg" else "max_pool2d"
    return getattr(b, pool)(x, case["k"], case["stride"], case["pad"], case["ceil"])


@st.composite
def pool_case(draw):
    k = draw(st.integers(1, 4))
    pad = draw(st.integers(0, k // 2))
    stride = draw(st.integers(1, 3))
    h = draw(st.integers(k, 9))
    w = draw(st.integers(k, 9))
    return dict(
        b=draw(st.integers(1, 3)),
        c=draw(st.integers(1, 3)),
        k=k,
        pad=pad,
        stride=stride,
        h=h,
        w=w,
        kind=draw(st.sampled_from(["avg", "max"])),
        ceil=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


def _through_loss(be, out, labels_np):
    """A nonlinear scalar on top of ``out`` so every element gets a distinct upstream gradient."""
    flat = be.reshape(out, (be.shape(out)[0], -1))
    return be.sum(be.softmax_cross_entropy(flat, be.from_numpy(labels_np, CPU)))


def _compare(be, ref, op, arrays, labels, atol):
    """Forward and gradients of ``op`` on ``be`` versus the reference."""
    outs, grads = [], []
    for b in (be, ref):
        ts = [b.from_numpy(a, CPU) for a in arrays]
        outs.append(b.to_numpy(op(b, *ts)))
        flat = b.value_and_grad(lambda ps: _through_loss(b, op(b, *ps), labels), ts)  # noqa: B023 (bound by an argument or called at once)
        grads.append([b.to_numpy(x) for x in b.unflatten(flat, [*(b.shape(t) for t in ts), (1,)])[:-1]])
    np.testing.assert_allclose(outs[0], outs[1], atol=atol, rtol=1e-4)
    for ga, gb in zip(*grads):
        np.testing.assert_allclose(ga, gb, atol=atol, rtol=1e-4)


@pytest.mark.parametrize("name", FRAMEWORKS)
@settings(max_examples=12)
@given(case=conv_case())
def test_conv2d_matches_reference(name, case):
    import multigpu

    be, ref = multigpu.backend(name), multigpu.backend("numpy")
    rng = np.random.default_rng(case["seed"])
    x = rng.standard_normal((case["b"], case["c"], case["h"], case["w"])).astype(np.float32)
    w = rng.standard_normal((case["o"], case["c"] // case["groups"], case["k"], case["k"])).astype(np.float32)
    bias = rng.standard_normal(case["o"]).astype(np.float32)
    oh = (case["h"] + 2 * case["pad"] - case["k"]) // case["stride"] + 1
    ow = (case["w"] + 2 * case["pad"] - case["k"]) // case["stride"] + 1
    labels = rng.integers(0, case["o"] * oh * ow, case["b"])
    op = lambda b, x, w, bias: b.conv2d(x, w, bias, case["stride"], case["pad"], case["groups"])  # noqa: E731
    _compare(be, ref, op, [x, w, bias], labels, atol=2e-5)


@pytest.mark.parametrize("name", FRAMEWORKS)
@settings(max_examples=15)
@given(case=pool_case())
def test_pooling_matches_reference(name, case):
    import multigpu

    be, ref = multigpu.backend(name), multigpu.backend("numpy")
    rng = np.random.default_rng(case["seed"])
    # Negative inputs make a wrong max-pool padding value (0 instead of -inf) visible.
    x = (rng.standard_normal((case["b"], case["c"], case["h"], case["w"])) - 1.0).astype(np.float32)
    labels = rng.integers(0, case["c"] * _pool_area(case), case["b"])
    op = lambda b, x: _pool(b, x, case)  # noqa: E731
    _compare(be, ref, op, [x], labels, atol=1e-5)


@pytest.mark.parametrize("name", FRAMEWORKS)
@settings(max_examples=10)
@given(b=st.integers(1, 5), fin=st.integers(1, 12), fout=st.integers(2, 12), seed=st.integers(0, 2**16))
def test_dense_relu_cross_entropy_match_reference(name, b, fin, fout, seed):
    import multigpu

    be, ref = multigpu.backend(name), multigpu.backend("numpy")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, fin)).astype(np.float32)
    w = rng.standard_normal((fin, fout)).astype(np.float32)
    bias = rng.standard_normal(fout).astype(np.float32)
    labels = rng.integers(0, fout, b)
    op = lambda bk, x, w, bias: bk.relu(bk.dense(x, w, bias))  # noqa: E731
    _compare(be, ref, op, [x, w, bias], labels, atol=1e-5)
    # The loss itself, per example, never reduced by a framework default.
    per = [
        bk.to_numpy(bk.softmax_cross_entropy(bk.from_numpy(x @ w, CPU), bk.from_numpy(labels, CPU))) for bk in (be, ref)
    ]
    assert per[0].shape == (b,)
    np.testing.assert_allclose(per[0], per[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_argmax_reshape_and_math(name):
    import multigpu

    be = multigpu.backend(name)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((5, 7)).astype(np.float32)
    t = be.from_numpy(a, CPU)
    np.testing.assert_array_equal(be.to_numpy(be.argmax(t, 1)), a.argmax(1))
    np.testing.assert_array_equal(be.to_numpy(be.argmax(t, 0)), a.argmax(0))
    assert be.shape(be.reshape(t, (7, -1))) == (7, 5)
    parts = be.split(t, [2, 3])
    assert [be.shape(p) for p in parts] == [(2, 7), (3, 7)]
    np.testing.assert_array_equal(be.to_numpy(be.concat(parts)), a)
    be.add_(parts[0], be.from_numpy(np.ones((2, 7), np.float32), Device("cpu", 1)))
    np.testing.assert_array_equal(be.to_numpy(t), a)  # split returned copies, not views
    np.testing.assert_allclose(be.to_numpy(parts[0]), a[:2] + 1)
    be.assign_(parts[1], be.from_numpy(np.zeros((3, 7), np.float32), CPU))
    assert not be.to_numpy(parts[1]).any()
    be.sgd_([t], [be.from_numpy(np.ones_like(a), CPU)], 0.5)
    np.testing.assert_allclose(be.to_numpy(t), a - 0.5)


def test_value_and_grad_does_not_accumulate(be):
    rng = np.random.default_rng(2)
    w = be.from_numpy(rng.standard_normal((4, 3)), CPU)
    b = be.from_numpy(np.zeros(3), CPU)
    x = be.from_numpy(rng.standard_normal((6, 4)), CPU)
    y = be.from_numpy(rng.integers(0, 3, 6), CPU)
    fn = lambda ps, x, y: be.sum(be.softmax_cross_entropy(be.dense(x, ps[0], ps[1]), y))  # noqa: E731
    g1 = be.to_numpy(be.value_and_grad(fn, [w, b], x, y))
    g2 = be.to_numpy(be.value_and_grad(fn, [w, b], x, y))
    assert g1.shape == (4 * 3 + 3 + 1,)
    np.testing.assert_array_equal(g1, g2)


def test_copies_are_new_buffers(be):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = be.from_numpy(a, CPU)
    a[0, 0] = 100.0
    assert be.to_numpy(t)[0, 0] == 0.0, "from_numpy must copy"
    for target in (CPU, Device("cpu", 1)):
        c = be.copy_to(t, target)
        be.add_(c, be.from_numpy(np.ones((2, 3), np.float32), target))
        np.testing.assert_array_equal(be.to_numpy(t), np.arange(6).reshape(2, 3))
    out = be.to_numpy(t)
    out[:] = -1
    assert be.to_numpy(t)[1, 2] == 5.0, "to_numpy must copy"


# -- the reference's own backward, by central finite differences in float64 ----------


def _fd_check(op, arrays, labels, eps=1e-6, atol=1e-6, constants=()):
    """Central differences of the float64 ``arrays`` against the reference's backward; ``constants``
    (ids, labels, masks) are passed after them, as they are, and not differentiated."""
    ref = numpy_backend()
    leaves = [NumpyVar(a.astype(np.float64), CPU) for a in arrays]
    fixed = [NumpyVar(np.asarray(c), CPU) for c in constants]
    lab = NumpyVar(labels, CPU)
    loss = lambda ps: _through_loss_np(ref, op(ref, *ps, *fixed), lab)  # noqa: E731
    grads = ref.unflatten(ref.value_and_grad(loss, leaves), [*(leaf.data.shape for leaf in leaves), (1,)])
    for leaf, g in zip(leaves, grads):
        flat = leaf.data.reshape(-1)
        num = np.empty_like(flat)
        for i in range(flat.size):
            old = flat[i]
            flat[i] = old + eps
            up = float(loss(leaves).data)
            flat[i] = old - eps
            down = float(loss(leaves).data)
            flat[i] = old
            num[i] = (up - down) / (2 * eps)
        np.testing.assert_allclose(g.data.reshape(-1), num, atol=atol, rtol=1e-5)


def _through_loss_np(ref, out, lab):
    return ref.sum(ref.softmax_cross_entropy(ref.reshape(out, (out.data.shape[0], -1)), lab))


@settings(max_examples=8)
@given(case=conv_case())
def test_reference_conv_backward_by_finite_differences(case):
    rng = np.random.default_rng(case["seed"])
    x = rng.standard_normal((case["b"], case["c"], case["h"], case["w"]))
    w = rng.standard_normal((case["o"], case["c"] // case["groups"], case["k"], case["k"]))
    bias = rng.standard_normal(case["o"])
    oh = (case["h"] + 2 * case["pad"] - case["k"]) // case["stride"] + 1
    ow = (case["w"] + 2 * case["pad"] - case["k"]) // case["stride"] + 1
    labels = rng.integers(0, case["o"] * oh * ow, case["b"])
    _fd_check(
        lambda b, x, w, bias: b.conv2d(x, w, bias, case["stride"], case["pad"], case["groups"]), [x, w, bias], labels
    )


@settings(max_examples=10)
@given(case=pool_case())
def test_reference_pool_backward_by_finite_differences(case):
    rng = np.random.default_rng(case["seed"])
    x = rng.standard_normal((case["b"], case["c"], case["h"], case["w"])) - 1.0
    labels = rng.integers(0, case["c"] * _pool_area(case), case["b"])
    _fd_check(lambda b, x: _pool(b, x, case), [x], labels)


@settings(max_examples=8)
@given(b=st.integers(1, 4), fin=st.integers(1, 6), fout=st.integers(2, 6), seed=st.integers(0, 2**16))
def test_reference_dense_relu_backward_by_finite_differences(b, fin, fout, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal((b, fin)), rng.standard_normal((fin, fout)), rng.standard_normal(fout)]
    _fd_check(lambda bk, x, w, bias: bk.relu(bk.dense(x, w, bias)), arrays, rng.integers(0, fout, b))


def test_pool_conventions_are_explicit(be):
    """count_include_pad=True and floor rounding, whatever the framework's default."""
    x = be.from_numpy(np.ones((1, 1, 5, 5), np.float32), CPU)
    out = be.to_numpy(be.avg_pool2d(x, 2, 2, 1, False))
    assert out.shape == (1, 1, 3, 3)  # floor((5 + 2 - 2) / 2) + 1
    assert out[0, 0, 0, 0] == pytest.approx(0.25)  # three padded zeros count in the divisor
    m = be.to_numpy(be.max_pool2d(be.from_numpy(-np.ones((1, 1, 5, 5), np.float32), CPU), 3, 2, 1, False))
    assert m.shape == (1, 1, 3, 3) and (m == -1).all()  # padding never wins


def test_ceil_mode_pooling_by_formula(be):
    """torch's ceil mode, written out: the output size rounds up; the last window's divisor
    counts the padded zeros it covers but not its overhang; a window that would start in
    the right padding is dropped (Paddle's and MXNet's own ceil modes keep it)."""
    ones = be.from_numpy(np.ones((1, 1, 6, 6), np.float32), CPU)
    out = be.to_numpy(be.avg_pool2d(ones, 3, 2, 0, True))
    assert out.shape == (1, 1, 3, 3)  # ceil((6 - 3) / 2) + 1; floor gives 2
    np.testing.assert_allclose(out, 1.0)  # the overhang is not in the divisor: 2x2 cells / 4
    out = be.to_numpy(be.avg_pool2d(ones, 3, 2, 1, True))
    assert out.shape == (1, 1, 4, 4)  # ceil((6 + 2 - 3) / 2) + 1
    # Per axis: the first window covers 1 pad + 2 cells (3), the middle ones 3 cells, the last
    # 1 cell + 1 pad and an overhang of 1 (divisor 2).
    axis = np.array([2 / 3, 1, 1, 1 / 2])
    np.testing.assert_allclose(out[0, 0], np.outer(axis, axis), rtol=1e-6)
    x = be.from_numpy(-np.arange(35, dtype=np.float32).reshape(1, 1, 5, 7), CPU)
    m = be.to_numpy(be.max_pool2d(x, 3, 3, 1, True))
    assert m.shape == (1, 1, 2, 3)  # H: a third window would start at padded row 6 = 5 + 1: dropped
    want = -np.arange(35).reshape(5, 7)[[0, 2]][:, [0, 2, 5]]  # each window's top-left real cell wins
    np.testing.assert_array_equal(m[0, 0], want)


# -- the ops ResNet-style models need (issue 15) ------------------------------------


@pytest.mark.parametrize("name", FRAMEWORKS)
@pytest.mark.parametrize("case", OP_CASES, ids=[c.name for c in OP_CASES])
def test_every_op_case_matches_reference(name, case):
    """The cases ``multigpu check`` prints: forward and every gradient, the ResNet ops among them."""
    import multigpu

    be, ref = multigpu.backend(name), multigpu.backend("numpy")
    labels = case_labels(case, ref)
    (out, grads), (want, want_grads) = run_case(be, case, labels), run_case(ref, case, labels)
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=1e-4)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(g, w, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_batch_norm_statistics_follow_torchs_convention(name):
    """Batch mean and the UNBIASED variance come back (torch's running_var); inference uses given statistics."""
    import multigpu

    be = multigpu.backend(name)
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 3, 2, 5)) * 3 + 1).astype(np.float32)
    g, beta = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    t = [be.from_numpy(a, CPU) for a in (x, g, beta)]
    y, mean, var = (be.to_numpy(v) for v in be.batch_norm_train(*t, 1e-5))
    np.testing.assert_allclose(mean, x.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(var, x.var(axis=(0, 2, 3), ddof=1), rtol=1e-5)
    biased = x.var(axis=(0, 2, 3)).reshape(1, 3, 1, 1)
    want = (x - x.mean(axis=(0, 2, 3), keepdims=True)) / np.sqrt(biased + 1e-5) * g.reshape(1, 3, 1, 1) + beta.reshape(
        1, 3, 1, 1
    )
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)  # normalized with the biased variance
    rm, rv = rng.standard_normal(3).astype(np.float32), rng.random(3).astype(np.float32) + 0.5
    inf = be.to_numpy(be.batch_norm(*t, be.from_numpy(rm, CPU), be.from_numpy(rv, CPU), 1e-5))
    want = (x - rm.reshape(1, 3, 1, 1)) / np.sqrt(rv.reshape(1, 3, 1, 1) + 1e-5) * g.reshape(1, 3, 1, 1) + beta.reshape(
        1, 3, 1, 1
    )
    np.testing.assert_allclose(inf, want, rtol=1e-4, atol=1e-5)
    table = be.to_numpy(be.batch_norm_stats(t[0], 1, 3))  # row 1 of 3: count, mean, centred sum of squares
    centred = ((x - x.mean(axis=(0, 2, 3), keepdims=True)) ** 2).sum(axis=(0, 2, 3))
    np.testing.assert_allclose(table[1], [np.full(3, 40.0), x.mean(axis=(0, 2, 3)), centred], rtol=1e-5, atol=1e-6)
    assert table.shape == (3, 3, 3) and not table[[0, 2]].any()


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_whole_buffer_math_matches_numpy(name):
    import multigpu

    be = multigpu.backend(name)
    rng = np.random.default_rng(4)
    y, x1, x2 = rng.standard_normal((3, 7)).astype(np.float32)
    x2 = np.abs(x2)
    t = lambda a: be.from_numpy(a, CPU)  # noqa: E731
    out = t(y)
    be.axpby_(out, 0.9, be.from_numpy(x1, Device("cpu", 1)), 0.3)
    want = 0.9 * y + 0.3 * x1
    np.testing.assert_allclose(be.to_numpy(out), want, rtol=1e-6)
    be.addcmul_(out, 0.5, t(x1), t(x2), -2.0)
    want = 0.5 * want - 2.0 * x1 * x2
    np.testing.assert_allclose(be.to_numpy(out), want, rtol=1e-5, atol=1e-6)
    be.addcdiv_sqrt_(out, t(x1), t(x2), -0.01, 0.7, 1e-8)
    want = want - 0.01 * x1 / (np.sqrt(x2) / 0.7 + 1e-8)
    np.testing.assert_allclose(be.to_numpy(out), want, rtol=1e-5, atol=1e-6)
    be.scale_(out, 0.25)
    np.testing.assert_allclose(be.to_numpy(out), 0.25 * want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", OP_CASES, ids=[c.name for c in OP_CASES])
def test_reference_backward_of_every_op_case_by_finite_differences(case):
    labels = case_labels(case, numpy_backend())
    _fd_check(case.op, case_arrays(case, np.float64), labels, atol=2e-6, constants=case.constants)


def test_reference_inference_batch_norm_backward_by_finite_differences():
    rng = np.random.default_rng(9)
    x, g, b = rng.standard_normal((2, 3, 2, 2)), rng.standard_normal(3), rng.standard_normal(3)
    mean, var = NumpyVar(rng.standard_normal(3), CPU), NumpyVar(rng.random(3) + 0.5, CPU)
    _fd_check(lambda bk, x, g, b: bk.batch_norm(x, g, b, mean, var, 1e-5), [x, g, b], rng.integers(0, 12, 2))


# -- the transformer and ONNX ops (issues 37 and 38) -----------------------------------


@st.composite
def broadcast_shapes(draw, min_rank=2, max_rank=4):
    """A result shape of rank ``min_rank..max_rank`` and two operand shapes that broadcast to it (numpy's rule)."""
    out = draw(st.lists(st.integers(1, 3), min_size=min_rank, max_size=max_rank))

    def operand():
        rank = draw(st.integers(1, len(out)))
        return tuple(d if draw(st.booleans()) else 1 for d in out[len(out) - rank :])

    x, y = operand(), operand()
    if len(x) < len(out) and len(y) < len(out) or np.broadcast_shapes(x, y) != tuple(out):
        x = tuple(out)  # one operand spans the result, so the scalar sees every output element
    return x, y


def _labels_for(shape, rng):
    """Labels for ``_through_loss``: one class of the flattened output per row of axis 0."""
    return rng.integers(0, int(np.prod(shape[1:])), shape[0])


_BINARY = {
    "add": lambda b, x, y: b.add(x, y),
    "subtract": lambda b, x, y: b.subtract(x, y),
    "multiply": lambda b, x, y: b.multiply(x, y),
    # a divisor kept away from zero: y * y + 1 (the constant one broadcasts too)
    "divide": lambda b, x, y, one: b.divide(x, b.add(b.multiply(y, y), one)),
}


@settings(max_examples=20)
@given(shapes=broadcast_shapes(), op=st.sampled_from(sorted(_BINARY)), seed=st.integers(0, 2**16))
def test_reference_broadcasting_backward_by_finite_differences(shapes, op, seed):
    """Each operand's gradient is summed back to its own shape, whichever side broadcasts."""
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s) for s in shapes]
    out = np.broadcast_shapes(*shapes)
    constants = (np.ones(1),) if op == "divide" else ()
    _fd_check(_BINARY[op], arrays, _labels_for(out, rng), constants=constants)


@pytest.mark.parametrize("name", FRAMEWORKS)
@settings(max_examples=8)
@given(shapes=broadcast_shapes(), op=st.sampled_from(sorted(_BINARY)), seed=st.integers(0, 2**16))
def test_broadcasting_arithmetic_matches_reference(name, shapes, op, seed):
    import multigpu

    be, ref = multigpu.backend(name), multigpu.backend("numpy")
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    labels = _labels_for(np.broadcast_shapes(*shapes), rng)
    if op == "divide":
        fn = lambda b, x, y: _BINARY["divide"](b, x, y, b.from_numpy(np.ones(1, np.float32), CPU))  # noqa: E731
    else:
        fn = _BINARY[op]
    _compare(be, ref, fn, arrays, labels, atol=2e-5)


@settings(max_examples=12)
@given(
    batch=broadcast_shapes(min_rank=1, max_rank=2),
    m=st.integers(1, 3),
    k=st.integers(1, 3),
    n=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_reference_matmul_backward_by_finite_differences(batch, m, k, n, seed):
    """Batched matmul with broadcast leading axes (either operand may have fewer)."""
    rng = np.random.default_rng(seed)
    xs, ys = (*batch[0], m, k), (*batch[1][1:], k, n)  # y drops a leading axis: ranks may differ
    out = np.broadcast_shapes(xs[:-2], ys[:-2]) + (m, n)
    _fd_check(lambda b, x, y: b.matmul(x, y), [rng.standard_normal(xs), rng.standard_normal(ys)], _labels_for(out, rng))


@st.composite
def shape_and_axes(draw):
    """A shape of rank 2..4 and a non-empty set of its axes, some given as negative numbers."""
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=2, max_size=4)))
    axes = draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape), unique=True))
    return shape, [a - len(shape) if draw(st.booleans()) else a for a in axes]


@settings(max_examples=20)
@given(case=shape_and_axes(), kind=st.sampled_from(["reduce_sum", "reduce_mean"]), seed=st.integers(0, 2**16))
def test_reference_reductions_backward_by_finite_differences(case, kind, seed):
    shape, axes = case
    rng = np.random.default_rng(seed)
    keep = len(axes) == len(shape) or bool(seed % 2)  # a reduction of every axis keeps them: the scalar needs rows
    out = np.sum(np.zeros(shape), axis=tuple(axes), keepdims=keep).shape
    if not out:
        out = (1,)
    _fd_check(
        lambda b, x: b.reshape(getattr(b, kind)(x, axes, keep), out),
        [rng.standard_normal(shape)],
        _labels_for(out, rng),
    )


@settings(max_examples=15)
@given(case=shape_and_axes(), seed=st.integers(0, 2**16), spread=st.sampled_from([1.0, 10.0]))
def test_reference_softmax_and_layer_norm_backward_by_finite_differences(case, seed, spread):
    """Softmax along any axis (large inputs too: it must stay stable); layer norm over the trailing axes."""
    shape, axes = case
    rng = np.random.default_rng(seed)
    labels = _labels_for(shape, rng)
    _fd_check(lambda b, x: b.softmax(x, axes[0]), [rng.standard_normal(shape) * spread], labels)
    trailing = shape[len(shape) - len(axes) :]
    arrays = [rng.standard_normal(shape) * spread, rng.standard_normal(trailing), rng.standard_normal(trailing)]
    _fd_check(lambda b, x, g, c: b.layer_norm(x, g, c, 1e-5), arrays, labels, atol=5e-6)


@settings(max_examples=15)
@given(
    kind=st.sampled_from(["tanh", "sigmoid", "gelu exact", "gelu tanh", "erf", "sqrt", "scale"]),
    shape=st.lists(st.integers(1, 4), min_size=2, max_size=3).map(tuple),
    spread=st.sampled_from([1.0, 4.0]),
    seed=st.integers(0, 2**16),
)
def test_reference_elementwise_backward_by_finite_differences(kind, shape, spread, seed):
    ops = {
        "tanh": lambda b, x: b.tanh(x),
        "sigmoid": lambda b, x: b.sigmoid(x),
        "gelu exact": lambda b, x: b.gelu(x, False),
        "gelu tanh": lambda b, x: b.gelu(x, True),
        "erf": lambda b, x: b.erf(x),
        "scale": lambda b, x: b.scale(x, -1.5),
    }
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * spread
    if kind == "sqrt":
        x, op = np.abs(x) + 0.5, lambda b, x: b.sqrt(x)  # away from sqrt's pole at 0
    else:
        op = ops[kind]
    _fd_check(op, [x], _labels_for(shape, rng))


@settings(max_examples=15)
@given(
    vocab=st.integers(1, 6),
    dim=st.integers(1, 3),
    ids_shape=st.lists(st.integers(1, 4), min_size=1, max_size=2).map(tuple),
    seed=st.integers(0, 2**16),
)
def test_reference_embedding_backward_adds_repeated_rows(vocab, dim, ids_shape, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, ids_shape)  # few rows: ids repeat
    out = (*ids_shape, dim)
    _fd_check(
        lambda b, t, i: b.embedding(i, t), [rng.standard_normal((vocab, dim))], _labels_for(out, rng), constants=(ids,)
    )


@settings(max_examples=15)
@given(
    lead=st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple),
    classes=st.integers(1, 5),
    ignore=st.sampled_from([-100, 0]),
    seed=st.integers(0, 2**16),
)
def test_reference_cross_entropy_backward_with_ignored_positions(lead, classes, ignore, seed):
    """Ignored positions give 0 loss and no gradient; the rest is -log softmax at the label."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, lead)
    labels[rng.random(lead) < 0.3] = ignore
    z = rng.standard_normal((*lead, classes)) * 3
    flat = lambda b, z, y: b.reshape(b.cross_entropy(z, y, ignore), (1, -1))  # noqa: E731 (every position in one row)
    _fd_check(flat, [z], rng.integers(0, int(np.prod(lead)), 1), constants=(labels,))
    ref = numpy_backend()
    loss = ref.cross_entropy(NumpyVar(z, CPU), NumpyVar(labels, CPU), ignore).data
    logp = z - z.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    want = np.where(
        labels == ignore, 0.0, -np.take_along_axis(logp, np.where(labels == ignore, 0, labels)[..., None], -1)[..., 0]
    )
    np.testing.assert_allclose(loss, want, rtol=1e-12, atol=1e-12)


@settings(max_examples=15)
@given(
    shape=st.lists(st.integers(1, 3), min_size=2, max_size=3).map(tuple),
    axis=st.integers(-3, 2),
    picks=st.lists(st.integers(-3, 2), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_reference_take_and_concatenate_backward_by_finite_differences(shape, axis, picks, seed):
    """take adds back into repeated positions; concatenate splits the gradient back."""
    ax = axis % len(shape)
    n = shape[ax]
    indices = [p for p in picks if -n <= p < n] or [0]
    rng = np.random.default_rng(seed)
    out = list(shape)
    out[ax] = len(indices)
    _fd_check(lambda b, x: b.take(x, indices, axis), [rng.standard_normal(shape)], _labels_for(out, rng))
    other = list(shape)
    other[ax] = 2
    out[ax] = n + 2 + n
    arrays = [rng.standard_normal(shape), rng.standard_normal(other)]
    _fd_check(lambda b, x, y: b.concatenate([x, y, x], axis), arrays, _labels_for(out, rng))


@settings(max_examples=10)
@given(shape=st.lists(st.integers(1, 3), min_size=2, max_size=4).map(tuple), seed=st.integers(0, 2**16))
def test_reference_masks_transpose_and_dropout_backward_by_finite_differences(shape, seed):
    """masked_fill (a broadcast mask, zero gradient where set), dropout (a given mask) and transpose."""
    rng = np.random.default_rng(seed)
    mask = (rng.random(shape[1:]) < 0.4).astype(np.float32)
    keep = (rng.random(shape) < 0.7).astype(np.float32)
    perm = tuple(rng.permutation(len(shape)))
    out = tuple(shape[p] for p in perm)
    _fd_check(
        lambda b, x, m, k: b.transpose(b.dropout(b.masked_fill(x, m, 2.5), k, 0.3), perm),
        [rng.standard_normal(shape)],
        _labels_for(out, rng),
        constants=(mask, keep),
    )


def test_transformer_ops_forward_values_by_formula(be):
    """Each new op's values against a formula written here, independently of every adapter (the
    reference included): erf from the math module, GELU's two forms, a stable softmax of large
    inputs, layer norm, ignored positions, a -inf fill, dropout's scale, take with repeats."""
    import math

    rng = np.random.default_rng(11)
    a = (rng.standard_normal((2, 3, 4)) * 2).astype(np.float32)
    x = be.from_numpy(a, CPU)
    got = lambda t: be.to_numpy(t)  # noqa: E731
    erf = np.vectorize(math.erf)(a.astype(np.float64))
    np.testing.assert_allclose(got(be.erf(x)), erf, rtol=1e-5, atol=1e-6)
    cdf = 0.5 * (1 + np.vectorize(math.erf)(a.astype(np.float64) / math.sqrt(2)))
    np.testing.assert_allclose(got(be.gelu(x, False)), a * cdf, rtol=1e-5, atol=1e-6)
    tanh_form = 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a.astype(np.float64) ** 3)))
    np.testing.assert_allclose(got(be.gelu(x, True)), tanh_form, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got(be.sigmoid(x)), 1 / (1 + np.exp(-a.astype(np.float64))), rtol=1e-5, atol=1e-7)
    big = be.from_numpy(np.array([[1000.0, 999.0, -1000.0]], np.float32), CPU)
    np.testing.assert_allclose(
        got(be.softmax(big, -1)), [[1 / (1 + math.exp(-1)), 1 / (1 + math.e), 0]], rtol=1e-5, atol=1e-7
    )
    g, c = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    norm = (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5) * g + c
    ln = be.layer_norm(x, be.from_numpy(g, CPU), be.from_numpy(c, CPU), 1e-5)
    np.testing.assert_allclose(got(ln), norm, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got(be.reduce_mean(x, [0, -1], False)), a.mean(axis=(0, 2)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got(be.take(x, [2, -1, 2], 1)), a[:, [2, 2, 2]], rtol=0)
    np.testing.assert_allclose(got(be.matmul(x, be.transpose(x, (0, 2, 1)))), a @ a.transpose(0, 2, 1), rtol=1e-5)
    labels = np.array([[1, -100, 3], [-100, 0, 2]])
    loss = got(be.cross_entropy(x, be.from_numpy(labels, CPU), -100))
    logp = a - np.log(np.exp(a).sum(-1, keepdims=True))
    want = np.where(labels == -100, 0, -np.take_along_axis(logp, np.maximum(labels, 0)[..., None], -1)[..., 0])
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)
    causal = be.from_numpy(np.triu(np.ones((3, 4), np.float32), 1), CPU)
    filled = got(be.masked_fill(x, causal, float("-inf")))
    assert np.isneginf(filled[:, 0, 1:]).all() and (filled[:, 2, :3] == a[:, 2, :3]).all()
    keep = (rng.random((2, 3, 4)) > 0.5).astype(np.float32)
    np.testing.assert_allclose(got(be.dropout(x, be.from_numpy(keep, CPU), 0.2)), a * keep / 0.8, rtol=1e-6)
    table = rng.standard_normal((5, 2)).astype(np.float32)
    ids = np.array([[4, 0, 4]])
    np.testing.assert_array_equal(got(be.embedding(be.from_numpy(ids, CPU), be.from_numpy(table, CPU))), table[ids])
