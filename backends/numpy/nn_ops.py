"""The reference's neural-network ops for transformers: softmax, layer norm, embedding, masked fill,
dropout and the per-position cross-entropy, each with its backward written by hand.

As everywhere in the reference, each op keeps its input's dtype (float64 for the
finite-difference tests) and checks every id and label itself, on every call.
"""

from __future__ import annotations

import numpy as np

from multigpu.backends.numpy.var import Graph, Var
from multigpu.contract.checked import check_index_span, span_of


def _log_softmax(z: np.ndarray, axis: int) -> np.ndarray:
    """log softmax along ``axis`` with the maximum subtracted first (no overflow)."""
    shifted = z - z.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


class NNOps(Graph):
    """Softmax, layer norm, embedding, masked fill, dropout and cross-entropy."""

    def softmax(self, x: Var, axis: int) -> Var:
        """exp(x - max) / sum along ``axis``; the gradient is s * (g - sum(g * s))."""
        ax = int(axis)
        with np.errstate(invalid="ignore"):  # a row of -inf gives NaN, as the frameworks do
            s = np.exp(_log_softmax(x.data, ax))
        return self._node(s, (x,), lambda g: (s * (g - (g * s).sum(axis=ax, keepdims=True)),))

    def layer_norm(self, x: Var, gamma: Var, beta: Var, eps: float) -> Var:
        """Normalize over the trailing axes of gamma's shape with the biased variance, then scale and shift."""
        xd, gd = x.data, gamma.data
        t = xd.dtype.type
        axes = tuple(range(xd.ndim - gd.ndim, xd.ndim))
        lead = tuple(range(xd.ndim - gd.ndim))
        mean = xd.mean(axis=axes, keepdims=True, dtype=xd.dtype)
        centered = xd - mean
        inv = t(1) / np.sqrt((centered * centered).mean(axis=axes, keepdims=True, dtype=xd.dtype) + t(eps))
        xhat = centered * inv
        out = xhat * gd + beta.data

        def backward(g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            dxhat = g * gd
            dx = inv * (
                dxhat - dxhat.mean(axis=axes, keepdims=True) - xhat * (dxhat * xhat).mean(axis=axes, keepdims=True)
            )
            return dx, (g * xhat).sum(axis=lead), g.sum(axis=lead)

        return self._node(out, (x, gamma, beta), backward)

    def embedding(self, ids: Var, table: Var) -> Var:
        """table[ids]; the table's gradient adds the rows of repeated ids (np.add.at)."""
        idx, td = ids.data, table.data
        if idx.size:
            check_index_span(span_of(idx), td.shape[0], "embedding")

        def backward(g: np.ndarray) -> tuple[None, np.ndarray]:
            dt = np.zeros_like(td)
            np.add.at(dt, idx.reshape(-1), g.reshape(-1, td.shape[1]))
            return None, dt

        return self._node(td[idx], (ids, table), backward)

    def masked_fill(self, x: Var, mask: Var, value: float) -> Var:
        """x with ``value`` where the (broadcast) mask is nonzero; x's gradient is zero there."""
        xd = x.data
        hit = np.broadcast_to(mask.data != 0, xd.shape)
        out = np.where(hit, xd.dtype.type(value), xd)
        return self._node(out, (x, mask), lambda g: (np.where(hit, g.dtype.type(0), g), None))

    def dropout(self, x: Var, keep: Var, rate: float) -> Var:
        """x * keep / (1 - rate), the mask given; the gradient is masked and scaled the same way."""
        factor = keep.data.astype(x.data.dtype) * x.data.dtype.type(1 / (1 - rate))
        return self._node(x.data * factor, (x, keep), lambda g: (g * factor, None))

    def cross_entropy(self, logits: Var, labels: Var, ignore_index: int) -> Var:
        """Per-position -log softmax(logits)[..., label]; 0 loss and 0 gradient where label == ignore_index."""
        z, idx = logits.data, labels.data
        check_index_span(span_of(idx), z.shape[-1], "cross_entropy", ignore_index)
        logp = _log_softmax(z, -1)
        counted = idx != ignore_index
        safe = np.where(counted, idx, 0)[..., None]
        out = np.where(counted, -np.take_along_axis(logp, safe, axis=-1)[..., 0], z.dtype.type(0))

        def backward(g: np.ndarray) -> tuple[np.ndarray, None]:
            d = np.exp(logp)
            np.put_along_axis(d, safe, np.take_along_axis(d, safe, axis=-1) - d.dtype.type(1), axis=-1)
            return d * np.where(counted, g, g.dtype.type(0))[..., None], None

        return self._node(out.astype(z.dtype), (logits, labels), backward)
