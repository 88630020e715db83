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
from multigpu.contract.protocol import Device

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
    oh = (case["h"] + 2 * case["pad"] - case["k"]) // case["stride"] + 1
    ow = (case["w"] + 2 * case["pad"] - case["k"]) // case["stride"] + 1
    labels = rng.integers(0, case["c"] * oh * ow, case["b"])
    pool = "avg_pool2d" if case["kind"] == "avg" else "max_pool2d"
    op = lambda b, x: getattr(b, pool)(x, case["k"], case["stride"], case["pad"])  # noqa: E731
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


def _fd_check(op, arrays, labels, eps=1e-6, atol=1e-6):
    ref = numpy_backend()
    leaves = [NumpyVar(a.astype(np.float64), CPU) for a in arrays]
    lab = NumpyVar(labels, CPU)
    loss = lambda ps: _through_loss_np(ref, op(ref, *ps), lab)  # noqa: E731
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
    oh = (case["h"] + 2 * case["pad"] - case["k"]) // case["stride"] + 1
    ow = (case["w"] + 2 * case["pad"] - case["k"]) // case["stride"] + 1
    labels = rng.integers(0, case["c"] * oh * ow, case["b"])
    pool = "avg_pool2d" if case["kind"] == "avg" else "max_pool2d"
    _fd_check(lambda b, x: getattr(b, pool)(x, case["k"], case["stride"], case["pad"]), [x], labels)


@settings(max_examples=8)
@given(b=st.integers(1, 4), fin=st.integers(1, 6), fout=st.integers(2, 6), seed=st.integers(0, 2**16))
def test_reference_dense_relu_backward_by_finite_differences(b, fin, fout, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal((b, fin)), rng.standard_normal((fin, fout)), rng.standard_normal(fout)]
    _fd_check(lambda bk, x, w, bias: bk.relu(bk.dense(x, w, bias)), arrays, rng.integers(0, fout, b))


def test_pool_conventions_are_explicit(be):
    """count_include_pad=True and floor rounding, whatever the framework's default."""
    x = be.from_numpy(np.ones((1, 1, 5, 5), np.float32), CPU)
    out = be.to_numpy(be.avg_pool2d(x, 2, 2, 1))
    assert out.shape == (1, 1, 3, 3)  # floor((5 + 2 - 2) / 2) + 1
    assert out[0, 0, 0, 0] == pytest.approx(0.25)  # three padded zeros count in the divisor
    m = be.to_numpy(be.max_pool2d(be.from_numpy(-np.ones((1, 1, 5, 5), np.float32), CPU), 3, 2, 1))
    assert m.shape == (1, 1, 3, 3) and (m == -1).all()  # padding never wins


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
    _fd_check(case.op, case_arrays(case, np.float64), labels, atol=2e-6)


def test_reference_inference_batch_norm_backward_by_finite_differences():
    rng = np.random.default_rng(9)
    x, g, b = rng.standard_normal((2, 3, 2, 2)), rng.standard_normal(3), rng.standard_normal(3)
    mean, var = NumpyVar(rng.standard_normal(3), CPU), NumpyVar(rng.random(3) + 0.5, CPU)
    _fd_check(lambda bk, x, g, b: bk.batch_norm(x, g, b, mean, var, 1e-5), [x, g, b], rng.integers(0, 12, 2))
