"""The reference's math ops: matrix products, axes, broadcasting arithmetic, elementwise functions,
reductions and constant gathers, each with its backward written by hand.

Every op keeps its input's dtype (constants are cast to it), so the tests check these
rules in float64 against finite differences. Broadcasting gradients are summed back to
each operand's shape.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.special import erf as _erf

from multigpu.backends.numpy.var import Graph, Var, unbroadcast
from multigpu.errors import InputError


def _axes(axes: Sequence[int], ndim: int) -> tuple[int, ...]:
    """Axes as non-negative ints, sorted (the contract has checked them; raw calls may be negative)."""
    return tuple(sorted(int(a) % ndim for a in axes))


class MathOps(Graph):
    """Matmul, transpose, broadcasting arithmetic, tanh/sigmoid/GELU/erf/sqrt, reductions, take, concatenate."""

    def matmul(self, x: Var, y: Var) -> Var:
        """x @ y over the last two axes, the leading ones broadcast; each gradient summed to its operand."""
        xd, yd = x.data, y.data

        def backward(g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return unbroadcast(g @ np.swapaxes(yd, -1, -2), xd.shape), unbroadcast(
                np.swapaxes(xd, -1, -2) @ g, yd.shape
            )

        return self._node(np.matmul(xd, yd), (x, y), backward)

    def transpose(self, x: Var, perm: Sequence[int]) -> Var:
        """Axes permuted; the gradient is permuted back by the inverse permutation."""
        order = tuple(int(p) % x.data.ndim for p in perm)
        inverse = tuple(np.argsort(order))
        return self._node(np.transpose(x.data, order).copy(), (x,), lambda g: (np.transpose(g, inverse),))

    def add(self, x: Var, y: Var) -> Var:
        """x + y with broadcasting; each gradient summed back to its operand's shape."""
        xs, ys = x.data.shape, y.data.shape
        return self._node(x.data + y.data, (x, y), lambda g: (unbroadcast(g, xs), unbroadcast(g, ys)))

    def subtract(self, x: Var, y: Var) -> Var:
        """x - y with broadcasting."""
        xs, ys = x.data.shape, y.data.shape
        return self._node(x.data - y.data, (x, y), lambda g: (unbroadcast(g, xs), unbroadcast(-g, ys)))

    def multiply(self, x: Var, y: Var) -> Var:
        """x * y with broadcasting."""
        xd, yd = x.data, y.data
        return self._node(xd * yd, (x, y), lambda g: (unbroadcast(g * yd, xd.shape), unbroadcast(g * xd, yd.shape)))

    def divide(self, x: Var, y: Var) -> Var:
        """x / y with broadcasting; d/dy is -x / y**2."""
        xd, yd = x.data, y.data
        with np.errstate(divide="ignore", invalid="ignore"):  # a zero divisor gives inf or NaN, as numpy
            out = xd / yd

        def backward(g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            with np.errstate(divide="ignore", invalid="ignore"):
                return unbroadcast(g / yd, xd.shape), unbroadcast(-g * out / yd, yd.shape)

        return self._node(out, (x, y), backward)

    def scale(self, x: Var, factor: float) -> Var:
        """x * factor."""
        f = x.data.dtype.type(factor)
        return self._node(x.data * f, (x,), lambda g: (g * f,))

    def tanh(self, x: Var) -> Var:
        """tanh(x); the gradient is 1 - tanh(x)**2."""
        out = np.tanh(x.data)
        return self._node(out, (x,), lambda g: (g * (out.dtype.type(1) - out * out),))

    def sigmoid(self, x: Var) -> Var:
        """1 / (1 + exp(-x)), computed from exp(-|x|) so that no exp overflows."""
        xd = x.data
        one = xd.dtype.type(1)
        e = np.exp(-np.abs(xd))
        out = np.where(xd >= 0, one / (one + e), e / (one + e)).astype(xd.dtype)
        return self._node(out, (x,), lambda g: (g * out * (one - out),))

    def gelu(self, x: Var, approximate: bool) -> Var:
        """x * Phi(x) with erf, or the tanh form ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3)))``."""
        xd = x.data
        t = xd.dtype.type
        if approximate:
            c = t(math.sqrt(2.0 / math.pi))
            th = np.tanh(c * (xd + t(0.044715) * xd**3))
            out = t(0.5) * xd * (t(1) + th)
            dout = t(0.5) * (t(1) + th) + t(0.5) * xd * (t(1) - th * th) * c * (t(1) + t(3 * 0.044715) * xd * xd)
        else:
            cdf = t(0.5) * (t(1) + _erf(xd / t(math.sqrt(2.0))).astype(xd.dtype))
            out = xd * cdf
            dout = cdf + xd * np.exp(t(-0.5) * xd * xd) * t(1 / math.sqrt(2 * math.pi))
        return self._node(out, (x,), lambda g: (g * dout,))

    def erf(self, x: Var) -> Var:
        """erf(x); the gradient is 2 / sqrt(pi) exp(-x**2)."""
        xd = x.data
        out = _erf(xd).astype(xd.dtype)
        return self._node(out, (x,), lambda g: (g * xd.dtype.type(2 / math.sqrt(math.pi)) * np.exp(-xd * xd),))

    def sqrt(self, x: Var) -> Var:
        """sqrt(x) (NaN below zero); the gradient is 0.5 / sqrt(x)."""
        with np.errstate(invalid="ignore"):
            out = np.sqrt(x.data)

        def backward(g: np.ndarray) -> tuple[np.ndarray]:
            with np.errstate(divide="ignore", invalid="ignore"):
                return (g * out.dtype.type(0.5) / out,)

        return self._node(out, (x,), backward)

    def reduce_sum(self, x: Var, axes: Sequence[int], keepdims: bool) -> Var:
        """Sum over ``axes``; the gradient is broadcast back."""
        xd = x.data
        ax = _axes(axes, xd.ndim)
        out = np.asarray(xd.sum(axis=ax, keepdims=bool(keepdims), dtype=xd.dtype))

        def backward(g: np.ndarray) -> tuple[np.ndarray]:
            kept = g if keepdims else np.expand_dims(g, ax)
            return (np.broadcast_to(kept, xd.shape).copy(),)

        return self._node(out, (x,), backward)

    def reduce_mean(self, x: Var, axes: Sequence[int], keepdims: bool) -> Var:
        """Mean over ``axes``; the gradient is broadcast back and divided by the count."""
        xd = x.data
        ax = _axes(axes, xd.ndim)
        count = xd.dtype.type(math.prod(xd.shape[a] for a in ax))
        out = np.asarray(xd.sum(axis=ax, keepdims=bool(keepdims), dtype=xd.dtype) / count)

        def backward(g: np.ndarray) -> tuple[np.ndarray]:
            kept = g if keepdims else np.expand_dims(g, ax)
            return (np.broadcast_to(kept / count, xd.shape).copy(),)

        return self._node(out.astype(xd.dtype), (x,), backward)

    def take(self, x: Var, indices: Sequence[int], axis: int) -> Var:
        """The slices at ``indices`` along ``axis``; the gradient adds back into them (repeats add)."""
        xd = x.data
        ax = int(axis) % xd.ndim
        n = xd.shape[ax]
        if not len(indices) or any(not -n <= int(i) < n for i in indices):  # strict: nothing wraps past the ends
            raise InputError(f"take indices {list(indices)} must be ints in {-n}..{n - 1} for axis {ax} of {xd.shape}")
        idx = np.asarray([int(i) % n for i in indices], np.int64)

        def backward(g: np.ndarray) -> tuple[np.ndarray]:
            dx = np.zeros_like(xd)
            np.add.at(np.moveaxis(dx, ax, 0), idx, np.moveaxis(g, ax, 0))  # moveaxis gives views: dx is written
            return (dx,)

        return self._node(np.take(xd, idx, axis=ax), (x,), backward)

    def concatenate(self, xs: Sequence[Var], axis: int) -> Var:
        """Join along ``axis``; the gradient is split back."""
        ax = int(axis) % xs[0].data.ndim
        bounds = np.cumsum([0, *(v.data.shape[ax] for v in xs)])
        return self._node(
            np.concatenate([v.data for v in xs], axis=ax),
            tuple(xs),
            lambda g: tuple(np.take(g, np.arange(a, b), axis=ax) for a, b in zip(bounds[:-1], bounds[1:])),
        )
