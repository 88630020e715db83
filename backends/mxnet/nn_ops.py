"""The transformer op set's network layers on MXNet 1.9: layer norm, embedding, masks, dropout, sequence loss.

A mixin that ``adapter.MXNetBackend`` inherits; the contract (``multigpu.contract.protocol``) has
checked every argument (shapes, dtypes, id and label ranges) before these run. Each uses
``mx.nd``'s own operator where one exists, with every argument explicit.
"""

from __future__ import annotations

import math

import mxnet as mx
import numpy as np

# NOTE: MXNet ships no type information, so mypy reads NDArray as Any; imported by name (as adapter.py
# does), not assigned from mx.nd, so that mypy takes it as a type rather than a variable.
from mxnet.ndarray import NDArray

from multigpu.backends.mxnet.math_ops import broadcast_to


class NNOps:
    """Layer norm, embedding lookup, masked fill, dropout with a given mask and per-position cross-entropy."""

    def layer_norm(self, x: NDArray, gamma: NDArray, beta: NDArray, eps: float) -> NDArray:
        """Normalize over x's trailing axes (gamma's shape) with the biased variance, then scale and shift."""
        # NOTE: MXNet's LayerNorm normalizes ONE axis (axis=-1 here) with gamma and beta of that
        # axis' length. Over several trailing axes x is viewed as (..., prod) and gamma, beta flat,
        # then shaped back; reshape is a view, and the gradients go back through it.
        if gamma.ndim == 1:
            return mx.nd.LayerNorm(x, gamma, beta, axis=-1, eps=float(eps), output_mean_var=False)
        size = math.prod(gamma.shape)
        lead = x.shape[: x.ndim - gamma.ndim]
        y = mx.nd.LayerNorm(
            x.reshape((*lead, size)),
            gamma.reshape((size,)),
            beta.reshape((size,)),
            axis=-1,
            eps=float(eps),
            output_mean_var=False,
        )
        return y.reshape(x.shape)

    def embedding(self, ids: NDArray, table: NDArray) -> NDArray:
        """Return ``table[ids]`` (ids.shape + (D,)); the table's gradient adds the rows of repeated ids."""
        vocab, dim = table.shape
        # NOTE: MXNet's Embedding takes ids of any dtype (float32 by default in Gluon) and clamps an
        # id outside 0..V-1 to the nearest row; the contract gives int64 ids in range only. With
        # sparse_grad=False the table's gradient is dense and accumulates repeated ids (AddTakeGrad);
        # value_and_grad's grad_req="write" replaces the whole gradient once per backward.
        return mx.nd.Embedding(
            data=ids, weight=table, input_dim=int(vocab), output_dim=int(dim), dtype="float32", sparse_grad=False
        )

    def masked_fill(self, x: NDArray, mask: NDArray, value: float) -> NDArray:
        """Return x with ``value`` where ``mask`` (broadcast to x) is nonzero; no gradient there."""
        # NOTE: the legacy where() wants a condition of x's shape (or 1-D over its first axis), so the
        # mask is broadcast explicitly; any dtype is a condition (nonzero is true). The fill is a
        # selection, so -inf stays exact (mask * value would give -inf * 0 = NaN), and where's gradient
        # into x is zero where the mask is set. The mask is a constant: its own gradient is zero.
        condition = broadcast_to(mask.detach(), x.shape)
        fill = mx.nd.full(x.shape, float(value), ctx=x.context, dtype=np.float32)
        return mx.nd.where(condition, fill, x)

    def dropout(self, x: NDArray, keep: NDArray, rate: float) -> NDArray:
        """Return ``x * keep / (1 - rate)`` with the core's 0/1 mask ``keep``."""
        # NOTE: mx.nd.Dropout draws its mask from MXNet's own generator (and only in training mode),
        # which no other framework reproduces; the core draws ``keep`` instead, and this applies the
        # same inverted scaling: one multiply by 1 / (1 - rate) (float32 in _mul_scalar's kernel), as
        # Dropout's kernel scales, not a division per element.
        return mx.nd.elemwise_mul(x, keep) * (1.0 / (1.0 - float(rate)))

    def cross_entropy(self, logits: NDArray, labels: NDArray, ignore_index: int) -> NDArray:
        """Return the per-position loss over the last axis, of the labels' shape; 0 where ignored."""
        # NOTE: dtype="float32", not None: an explicit None makes log_softmax's output float64; and
        # temperature=None, not 1.0: an explicit 1.0 takes a kernel 10-20x slower on CPU.
        logp = mx.nd.log_softmax(logits, axis=-1, temperature=None, dtype="float32", use_length=False)
        # NOTE: pick's mode="clip" clamps an index to 0..C-1, so an ignored label (-100, say) picks a
        # real class; that loss is multiplied by 0 below, which also zeroes its gradient. MXNet has no
        # ignore_index of its own (SoftmaxOutput's ignore_label works on its fused output, not a loss).
        picked = mx.nd.pick(logp, labels, axis=-1, keepdims=False, mode="clip")
        counted = (labels != int(ignore_index)).astype(np.float32, copy=True)
        return mx.nd.negative(mx.nd.elemwise_mul(picked, counted))
