"""The transformer op set's network layers on Paddle: layer norm, embedding, masks, dropout, sequence loss.

A mixin that ``adapter.PaddleBackend`` inherits; the contract (``multigpu.contract.protocol``) has
checked every argument (shapes, dtypes, id and label ranges) before these run. Each uses
``paddle.nn.functional``'s own op where one exists, with every argument explicit.
"""

from __future__ import annotations

import paddle
import paddle.nn.functional as F

Tensor = paddle.Tensor


class NNOps:
    """Layer norm, embedding lookup, masked fill, dropout with a given mask and per-position cross-entropy."""

    def layer_norm(self, x: Tensor, gamma: Tensor, beta: Tensor, eps: float) -> Tensor:
        """Normalize over x's trailing axes (gamma's shape) with the biased variance, then scale and shift."""
        # NOTE: Paddle's layer_norm kernel normalizes over the axes from begin_norm_axis on, which
        # F.layer_norm derives as x.ndim - len(normalized_shape) (the protocol's gamma.shape), but it
        # refuses a scale or bias of rank above 1 ("The dimensions of Input(Scale) must be 1"): they go
        # in flattened to prod(normalized_shape), as reshapes that carry the gradient back. Its eps is
        # called epsilon.
        # NOTE: the kernel also refuses begin_norm_axis = 0 ("should be greater than zero"), so x
        # normalized over all of its axes gets a leading axis of 1 first.
        whole = x.ndim == gamma.ndim
        y = F.layer_norm(
            paddle.reshape(x, [1, *x.shape]) if whole else x,
            normalized_shape=list(gamma.shape),
            weight=paddle.reshape(gamma, [-1]),
            bias=paddle.reshape(beta, [-1]),
            epsilon=float(eps),
        )
        return paddle.reshape(y, list(x.shape)) if whole else y

    def embedding(self, ids: Tensor, table: Tensor) -> Tensor:
        """Return ``table[ids]`` (ids.shape + (D,)); the table's gradient adds the rows of repeated ids."""
        # NOTE: padding_idx=None: Paddle would return zeros for a padding id and give its row no
        # gradient, the protocol does neither; max_norm=None: no renormalization of the rows; sparse
        # gradients and scale_grad_by_freq off, so the gradient is the dense sum over repeats. The ids
        # are int64 (from_numpy's integer dtype), which F.embedding takes as they are.
        return F.embedding(
            ids, table, padding_idx=None, max_norm=None, norm_type=2.0, sparse=False, scale_grad_by_freq=False
        )

    def masked_fill(self, x: Tensor, mask: Tensor, value: float) -> Tensor:
        """Return x with ``value`` where ``mask`` (broadcast to x) is nonzero; no gradient there."""
        # NOTE: paddle.masked_fill needs a bool mask; the protocol's is float32 or int64 0/1, so it is
        # cast (nonzero -> True). The mask broadcasts to x's shape as numpy's does, and the fill keeps
        # -inf exact (a multiply-and-add form would give -inf * 0 = NaN).
        return paddle.masked_fill(x, paddle.cast(mask, "bool"), float(value))

    def dropout(self, x: Tensor, keep: Tensor, rate: float) -> Tensor:
        """Return ``x * keep / (1 - rate)`` with the core's 0/1 mask ``keep``."""
        # NOTE: F.dropout draws its mask from Paddle's own generator, which no other framework
        # reproduces; the core draws ``keep`` instead, and this applies the scaling of Paddle's
        # default mode, upscale_in_train (kept units divided by 1 - rate in training; its other mode,
        # downscale_in_infer, would scale at inference instead).
        kept = paddle.multiply(x, keep)
        return paddle.scale(kept, scale=1.0 / (1.0 - float(rate)), bias=0.0, bias_after_scale=True, act=None)

    def cross_entropy(self, logits: Tensor, labels: Tensor, ignore_index: int) -> Tensor:
        """Return the per-position loss over the last axis, of the labels' shape; 0 where ignored."""
        classes = logits.shape[-1]
        # NOTE: Paddle's hard labels take the shape of the logits without the class axis or with it
        # as 1, and with reduction="none" it returns the loss with a trailing axis of 1 (in some
        # releases); flattening to (N, C) and (N,) and shaping the loss back as the labels avoids both.
        # Its defaults are reduction="mean" and ignore_index=-100: passed as "none" and the caller's
        # index, which gives an ignored position a loss of 0 and no gradient. soft_label=False and
        # use_softmax=True make it the softmax cross-entropy of integer labels.
        loss = F.cross_entropy(
            paddle.reshape(logits, [-1, classes]),
            paddle.reshape(labels, [-1]),
            weight=None,
            ignore_index=int(ignore_index),
            reduction="none",
            soft_label=False,
            axis=-1,
            use_softmax=True,
            label_smoothing=0.0,
        )
        return paddle.reshape(loss, list(labels.shape))
