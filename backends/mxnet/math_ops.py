"""The transformer and ONNX op set's tensor math on MXNet 1.9: products, layout, elementwise, reductions, slicing.

A mixin that ``adapter.MXNetBackend`` inherits; the contract (``multigpu.contract.protocol``) has
checked every argument before these run. Each op is one of ``mx.nd``'s own, recorded by
``mx.autograd`` inside ``value_and_grad``, with every argument passed explicitly. The classic
NDArray API differs from numpy in three ways that matter here: ``+``/``elemwise_*`` do not
broadcast (``broadcast_*`` do), ``batch_dot`` multiplies 3-D stacks of equal batch size only, and
an array has at least one axis (a reduction over every axis gives shape (1,), not ()).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import mxnet as mx
import numpy as np

# NOTE: MXNet ships no type information, so mypy reads NDArray as Any; imported by name (as adapter.py
# does), not assigned from mx.nd, so that mypy takes it as a type rather than a variable.
from mxnet.ndarray import NDArray

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def broadcast_to(x: NDArray, shape: tuple[int, ...]) -> NDArray:
    """Return ``x`` broadcast to ``shape`` by numpy's rule (x itself when it already has it)."""
    if x.shape == shape:
        return x
    # NOTE: broadcast_to wants equal ranks (it stretches 1s only), so missing leading axes are
    # added as 1s first. Its gradient sums back to x's shape.
    if x.ndim < len(shape):
        x = x.reshape((1,) * (len(shape) - x.ndim) + x.shape)
    return mx.nd.broadcast_to(x, shape=shape)


def _binary(same: Callable[..., NDArray], broadcast: Callable[..., NDArray], x: NDArray, y: NDArray) -> NDArray:
    """Apply the elementwise kernel for equal shapes, the broadcasting one otherwise."""
    # NOTE: elemwise_* (and NDArray's operators between arrays) refuse unequal shapes; broadcast_*
    # take numpy's rule (different ranks too) and sum a broadcast operand's gradient back to its
    # shape. The elemwise kernels are kept for equal shapes, the common case (a residual join),
    # where they can run in place and fuse under MKL-DNN.
    if x.shape == y.shape:
        return same(x, y)
    return broadcast(x, y)


def _axes(axes: Sequence[int], ndim: int) -> tuple[int, ...]:
    """Non-negative axes, in the order given."""
    return tuple(int(a) % ndim for a in axes)


class MathOps:
    """Matrix products, transposes, broadcasting arithmetic, activations, softmax, reductions and slicing."""

    def matmul(self, x: NDArray, y: NDArray) -> NDArray:
        """Return ``x @ y`` over the last two axes, broadcasting the leading ones."""
        xs, ys = x.shape, y.shape
        if len(ys) == 2:
            # NOTE: dot of an N-D x and a 2-D y contracts x's last axis with y's first: one GEMM over
            # every row of x, which is the broadcast product when y has no batch axes (a weight).
            return mx.nd.dot(x, y, transpose_a=False, transpose_b=False, forward_stype=None)
        # NOTE: batch_dot multiplies (B, M, K) by (B, K, N) only: the batch axes are broadcast to one
        # shape explicitly (the gradient of a broadcast operand sums back through broadcast_to) and
        # collapsed into one.
        batch = tuple(int(d) for d in np.broadcast_shapes(xs[:-2], ys[:-2]))
        n = math.prod(batch)
        xb = broadcast_to(x, batch + xs[-2:]).reshape((n, *xs[-2:]))
        yb = broadcast_to(y, batch + ys[-2:]).reshape((n, *ys[-2:]))
        out = mx.nd.batch_dot(xb, yb, transpose_a=False, transpose_b=False, forward_stype=None)
        return out.reshape((*batch, xs[-2], ys[-1]))

    def transpose(self, x: NDArray, perm: Sequence[int]) -> NDArray:
        """Return ``x`` with output axis i taken from input axis ``perm[i]``."""
        # NOTE: mx.nd.transpose with axes=() reverses the axes (numpy's default); the permutation is
        # always given. It copies (MXNet has no strided views).
        return mx.nd.transpose(x, axes=tuple(int(a) for a in perm))

    def add(self, x: NDArray, y: NDArray) -> NDArray:
        """Return ``x + y`` with numpy's broadcasting (differentiable)."""
        return _binary(mx.nd.elemwise_add, mx.nd.broadcast_add, x, y)

    def subtract(self, x: NDArray, y: NDArray) -> NDArray:
        """Return ``x - y`` with numpy's broadcasting."""
        return _binary(mx.nd.elemwise_sub, mx.nd.broadcast_sub, x, y)

    def multiply(self, x: NDArray, y: NDArray) -> NDArray:
        """Return ``x * y`` with numpy's broadcasting."""
        return _binary(mx.nd.elemwise_mul, mx.nd.broadcast_mul, x, y)

    def divide(self, x: NDArray, y: NDArray) -> NDArray:
        """Return ``x / y`` with numpy's broadcasting (a zero divisor gives inf or NaN)."""
        return _binary(mx.nd.elemwise_div, mx.nd.broadcast_div, x, y)

    def scale(self, x: NDArray, factor: float) -> NDArray:
        """Return ``x * factor`` (differentiable)."""
        # NOTE: an NDArray times a Python float is MXNet's _mul_scalar kernel (no broadcast array).
        return x * float(factor)

    def tanh(self, x: NDArray) -> NDArray:
        """Return tanh(x) elementwise."""
        return mx.nd.tanh(x)

    def sigmoid(self, x: NDArray) -> NDArray:
        """Return ``1 / (1 + exp(-x))`` elementwise."""
        return mx.nd.sigmoid(x)

    def gelu(self, x: NDArray, approximate: bool) -> NDArray:
        """Return GELU of x: exact ``x * Phi(x)`` (erf), or the tanh approximation."""
        if not approximate:
            # NOTE: in MXNet 1.9 LeakyReLU's act_type="gelu" is the exact erf form (2.0 renames it
            # "gelu_erf" beside "gelu_tanh"); slope and bounds are unused by it but passed all the same.
            return mx.nd.LeakyReLU(x, act_type="gelu", slope=0.25, lower_bound=0.125, upper_bound=0.334)
        # NOTE: 1.9 has no tanh-form GELU kernel; it is composed as torch and Paddle define it,
        # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
        cube = mx.nd.elemwise_mul(mx.nd.elemwise_mul(x, x), x)
        inner = mx.nd.elemwise_add(x, cube * 0.044715) * _SQRT_2_OVER_PI
        return mx.nd.elemwise_mul(x, mx.nd.tanh(inner) + 1.0) * 0.5

    def erf(self, x: NDArray) -> NDArray:
        """Return the error function of x elementwise."""
        return mx.nd.erf(x)

    def sqrt(self, x: NDArray) -> NDArray:
        """Return the square root of x elementwise (NaN below zero)."""
        return mx.nd.sqrt(x)

    def softmax(self, x: NDArray, axis: int) -> NDArray:
        """Return the softmax of x along ``axis`` (MXNet's kernel subtracts the maximum first)."""
        # NOTE: MXNet's softmax also takes a temperature and a length input (use_length=False: every
        # position of the axis counts). temperature=None is plain softmax: an explicit 1.0 takes a
        # generic kernel that is 10-20x slower on CPU (MXNet 1.9.1, a (16, 4, 64, 64) attention:
        # 10-13 ms against 0.6). dtype is spelled "float32": an explicit dtype=None reaches the C++
        # side as the string "None" and gives float64 output.
        return mx.nd.softmax(x, axis=int(axis), temperature=None, dtype="float32", use_length=False)

    def reduce_sum(self, x: NDArray, axes: Sequence[int], keepdims: bool) -> NDArray:
        """Return the sum of x over ``axes``; shape (1,) when every axis goes without ``keepdims``."""
        # NOTE: axis=() would mean every axis in MXNet and exclude=True the complement of axes; the
        # contract gives at least one axis, passed as they are. A legacy NDArray has at least one axis,
        # so a full reduction without keepdims is (1,) where numpy's is ().
        return mx.nd.sum(x, axis=_axes(axes, x.ndim), keepdims=bool(keepdims), exclude=False)

    def reduce_mean(self, x: NDArray, axes: Sequence[int], keepdims: bool) -> NDArray:
        """Return the mean of x over ``axes``; the same shapes as ``reduce_sum``."""
        return mx.nd.mean(x, axis=_axes(axes, x.ndim), keepdims=bool(keepdims), exclude=False)

    def take(self, x: NDArray, indices: Sequence[int], axis: int) -> NDArray:
        """Return the slices of x at the constant ``indices`` along ``axis``; repeats add in the gradient."""
        axis = int(axis) % x.ndim
        n = x.shape[axis]
        index = [int(i) % n for i in indices]  # the protocol takes numpy's -n..n-1
        if index == list(range(index[0], index[0] + len(index))):
            # A run of consecutive indices (ONNX's Slice and Split) is one slice, without an index array.
            return mx.nd.slice_axis(x, axis=axis, begin=index[0], end=index[0] + len(index))
        # NOTE: take's mode="clip" would clamp an index out of range and "wrap" would wrap it; both
        # are in range here (the contract checks them), and take's gradient adds repeated indices.
        where = mx.nd.array(np.asarray(index, dtype=np.int64), ctx=x.context, dtype=np.int64)
        return mx.nd.take(x, where, axis=axis, mode="clip")

    def concatenate(self, xs: Sequence[NDArray], axis: int) -> NDArray:
        """Concatenate along ``axis`` (differentiable)."""
        # NOTE: MXNet's concat names the axis dim= and takes the arrays as positional arguments.
        return mx.nd.concat(*xs, dim=int(axis) % xs[0].ndim)
