"""The transformer and ONNX op set's tensor math on PyTorch: products, layout, elementwise, reductions, slicing.

A mixin that ``adapter.TorchBackend`` inherits; the contract (``multigpu.contract.protocol``) has
checked every argument before these run. Each op is torch's own, so autograd differentiates it
inside ``value_and_grad``; every argument is passed explicitly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


class MathOps:
    """Matrix products, transposes, broadcasting arithmetic, activations, softmax, reductions and slicing."""

    def matmul(self, x: Tensor, y: Tensor) -> Tensor:
        """Return ``x @ y`` over the last two axes, broadcasting the leading ones."""
        # torch.matmul's 1-D special cases never arise: the contract gives both rank >= 2.
        return torch.matmul(x, y)

    def transpose(self, x: Tensor, perm: Sequence[int]) -> Tensor:
        """Return ``x`` with output axis i taken from input axis ``perm[i]``."""
        # NOTE: torch.transpose swaps two axes; torch.permute is numpy's (and ONNX's) transpose.
        # It returns a strided view; later ops (reshape, matmul) copy when they need to.
        return torch.permute(x, tuple(int(a) for a in perm))

    def subtract(self, x: Tensor, y: Tensor) -> Tensor:
        """Return ``x - y`` with numpy's broadcasting."""
        # NOTE: torch.sub takes a multiplier of y (alpha); it is passed as 1 so no default counts.
        return torch.sub(x, y, alpha=1)

    def multiply(self, x: Tensor, y: Tensor) -> Tensor:
        """Return ``x * y`` with numpy's broadcasting."""
        return torch.mul(x, y)

    def divide(self, x: Tensor, y: Tensor) -> Tensor:
        """Return ``x / y`` with numpy's broadcasting (true division)."""
        # NOTE: rounding_mode=None is true division; "trunc"/"floor" would round the quotient.
        return torch.div(x, y, rounding_mode=None)

    def scale(self, x: Tensor, factor: float) -> Tensor:
        """Return ``x * factor`` (differentiable)."""
        return torch.mul(x, float(factor))

    def tanh(self, x: Tensor) -> Tensor:
        """Return tanh(x) elementwise."""
        return torch.tanh(x)

    def sigmoid(self, x: Tensor) -> Tensor:
        """Return ``1 / (1 + exp(-x))`` elementwise."""
        return torch.sigmoid(x)

    def gelu(self, x: Tensor, approximate: bool) -> Tensor:
        """Return GELU of x: exact (erf) or the tanh approximation."""
        # NOTE: torch names the form by a string, approximate="none" (erf) or "tanh"; the protocol's
        # flag is a bool (Paddle's convention).
        return F.gelu(x, approximate="tanh" if approximate else "none")

    def erf(self, x: Tensor) -> Tensor:
        """Return the error function of x elementwise."""
        return torch.erf(x)

    def sqrt(self, x: Tensor) -> Tensor:
        """Return the square root of x elementwise (NaN below zero)."""
        return torch.sqrt(x)

    def softmax(self, x: Tensor, axis: int) -> Tensor:
        """Return the softmax of x along ``axis`` (torch's kernel subtracts the maximum first)."""
        # NOTE: F.softmax without dim guesses an axis (with a deprecation warning); dtype=None
        # keeps float32.
        return F.softmax(x, dim=int(axis), dtype=None)

    def reduce_sum(self, x: Tensor, axes: Sequence[int], keepdims: bool) -> Tensor:
        """Return the sum of x over ``axes``."""
        # NOTE: torch's dim=None (or an empty tuple in older releases) means every axis; the contract
        # gives at least one axis, always passed as a tuple.
        return torch.sum(x, dim=tuple(int(a) for a in axes), keepdim=bool(keepdims), dtype=None)

    def reduce_mean(self, x: Tensor, axes: Sequence[int], keepdims: bool) -> Tensor:
        """Return the mean of x over ``axes``."""
        return torch.mean(x, dim=tuple(int(a) for a in axes), keepdim=bool(keepdims), dtype=None)

    def take(self, x: Tensor, indices: Sequence[int], axis: int) -> Tensor:
        """Return the slices of x at the constant ``indices`` along ``axis``; repeats add in the gradient."""
        n = x.shape[axis]
        # NOTE: index_select refuses negative indices; the protocol takes numpy's -n..n-1.
        index = torch.tensor([int(i) % n for i in indices], dtype=torch.int64, device=x.device)
        return torch.index_select(x, int(axis), index)

    def concatenate(self, xs: Sequence[Tensor], axis: int) -> Tensor:
        """Concatenate along ``axis`` (differentiable)."""
        return torch.cat(list(xs), dim=int(axis))
