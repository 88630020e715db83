"""The transformer and ONNX op set's tensor math on Paddle: products, layout, elementwise, reductions, slicing.

A mixin that ``adapter.PaddleBackend`` inherits; the contract (``multigpu.contract.protocol``) has
checked every argument before these run. Each op is Paddle's own, so its eager autograd
differentiates it inside ``value_and_grad``; every argument is passed explicitly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import paddle
import paddle.nn.functional as F

Tensor = paddle.Tensor


class MathOps:
    """Matrix products, transposes, broadcasting arithmetic, activations, softmax, reductions and slicing."""

    def matmul(self, x: Tensor, y: Tensor) -> Tensor:
        """Return ``x @ y`` over the last two axes, broadcasting the leading ones."""
        # paddle.matmul's 1-D special cases never arise: the contract gives both rank >= 2.
        if x.ndim != y.ndim and min(x.ndim, y.ndim) > 2:
            # NOTE: Paddle 3.3's matmul computes these forward, but its backward (MatmulGradNode) raises
            # "Input dimension size should be equal to 2" when both operands are batched and of different
            # ranks ((2, 1, 3, 4) @ (3, 4, 5), say). Leading 1s on the shorter one (a view) give equal
            # ranks, which its backward handles; a rank-2 operand ((B, S, I) @ (I, O)) needs none.
            rank = max(x.ndim, y.ndim)
            x = paddle.reshape(x, [1] * (rank - x.ndim) + list(x.shape))
            y = paddle.reshape(y, [1] * (rank - y.ndim) + list(y.shape))
        return paddle.matmul(x, y, transpose_x=False, transpose_y=False)

    def transpose(self, x: Tensor, perm: Sequence[int]) -> Tensor:
        """Return ``x`` with output axis i taken from input axis ``perm[i]``."""
        return paddle.transpose(x, perm=[int(a) for a in perm])

    def subtract(self, x: Tensor, y: Tensor) -> Tensor:
        """Return ``x - y`` with numpy's broadcasting."""
        return paddle.subtract(x, y)

    def multiply(self, x: Tensor, y: Tensor) -> Tensor:
        """Return ``x * y`` with numpy's broadcasting."""
        return paddle.multiply(x, y)

    def divide(self, x: Tensor, y: Tensor) -> Tensor:
        """Return ``x / y`` with numpy's broadcasting (true division)."""
        return paddle.divide(x, y)

    def scale(self, x: Tensor, factor: float) -> Tensor:
        """Return ``x * factor`` (differentiable)."""
        # NOTE: paddle.scale computes scale * x + bias; bias=0.0 and bias_after_scale are passed so
        # no default counts, and act=None adds no activation.
        return paddle.scale(x, scale=float(factor), bias=0.0, bias_after_scale=True, act=None)

    def tanh(self, x: Tensor) -> Tensor:
        """Return tanh(x) elementwise."""
        return paddle.tanh(x)

    def sigmoid(self, x: Tensor) -> Tensor:
        """Return ``1 / (1 + exp(-x))`` elementwise."""
        return F.sigmoid(x)

    def gelu(self, x: Tensor, approximate: bool) -> Tensor:
        """Return GELU of x: exact (erf) or the tanh approximation."""
        # NOTE: Paddle's flag is a bool (the protocol's convention); torch's is a string.
        return F.gelu(x, approximate=bool(approximate))

    def erf(self, x: Tensor) -> Tensor:
        """Return the error function of x elementwise."""
        return paddle.erf(x)

    def sqrt(self, x: Tensor) -> Tensor:
        """Return the square root of x elementwise (NaN below zero)."""
        return paddle.sqrt(x)

    def softmax(self, x: Tensor, axis: int) -> Tensor:
        """Return the softmax of x along ``axis`` (Paddle's kernel subtracts the maximum first)."""
        # NOTE: Paddle's axis defaults to -1; it is always passed. dtype=None keeps float32.
        return F.softmax(x, axis=int(axis), dtype=None)

    def reduce_sum(self, x: Tensor, axes: Sequence[int], keepdims: bool) -> Tensor:
        """Return the sum of x over ``axes``."""
        # NOTE: Paddle's axis=None (or an empty list) means every axis; the contract gives at least one.
        return paddle.sum(x, axis=[int(a) for a in axes], dtype=None, keepdim=bool(keepdims))

    def reduce_mean(self, x: Tensor, axes: Sequence[int], keepdims: bool) -> Tensor:
        """Return the mean of x over ``axes``."""
        return paddle.mean(x, axis=[int(a) for a in axes], keepdim=bool(keepdims))

    def take(self, x: Tensor, indices: Sequence[int], axis: int) -> Tensor:
        """Return the slices of x at the constant ``indices`` along ``axis``; repeats add in the gradient."""
        n = x.shape[axis]
        # NOTE: index_select wants non-negative indices as an int tensor on x's place; the protocol
        # takes numpy's -n..n-1 as Python ints.
        index = paddle.to_tensor(np.array([int(i) % n for i in indices], np.int64), place=x.place, stop_gradient=True)
        return paddle.index_select(x, index, axis=int(axis) % x.ndim)

    def concatenate(self, xs: Sequence[Tensor], axis: int) -> Tensor:
        """Concatenate along ``axis`` (differentiable)."""
        return paddle.concat(list(xs), axis=int(axis))
