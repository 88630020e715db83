"""The transformer op set's network layers on PyTorch: layer norm, embedding, masks, dropout, sequence loss.

A mixin that ``adapter.TorchBackend`` inherits; the contract (``multigpu.contract.protocol``) has
checked every argument (shapes, dtypes, id and label ranges) before these run. Each uses
``torch.nn.functional``'s own op where one exists, with every argument explicit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


class NNOps:
    """Layer norm, embedding lookup, masked fill, dropout with a given mask and per-position cross-entropy."""

    def layer_norm(self, x: Tensor, gamma: Tensor, beta: Tensor, eps: float) -> Tensor:
        """Normalize over x's trailing axes (gamma's shape) with the biased variance, then scale and shift."""
        # NOTE: torch names the normalized axes by their shape (normalized_shape), as the protocol
        # does with gamma's shape; Paddle's kernel counts them from begin_norm_axis instead.
        return F.layer_norm(x, normalized_shape=tuple(gamma.shape), weight=gamma, bias=beta, eps=float(eps))

    def embedding(self, ids: Tensor, table: Tensor) -> Tensor:
        """Return ``table[ids]`` (ids.shape + (D,)); the table's gradient adds the rows of repeated ids."""
        # NOTE: padding_idx=None: torch would give a padding row a zero gradient, the protocol does not;
        # max_norm=None: torch would renormalize the table's rows in place. Sparse gradients and
        # scale_grad_by_freq are off so the gradient is the dense sum over repeats. The ids are int64
        # (from_numpy's integer dtype), which F.embedding takes as they are.
        return F.embedding(
            ids, table, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False
        )

    def masked_fill(self, x: Tensor, mask: Tensor, value: float) -> Tensor:
        """Return x with ``value`` where ``mask`` (broadcast to x) is nonzero; no gradient there."""
        # NOTE: Tensor.masked_fill needs a bool mask; the protocol's is float32 or int64 0/1, so it is
        # cast (nonzero -> True). The mask broadcasts to x's shape as numpy's does, and the fill keeps
        # -inf exact (a multiply-and-add form would give -inf * 0 = NaN).
        return torch.masked_fill(x, mask.to(torch.bool), float(value))

    def dropout(self, x: Tensor, keep: Tensor, rate: float) -> Tensor:
        """Return ``x * keep / (1 - rate)`` with the core's 0/1 mask ``keep``."""
        # NOTE: F.dropout draws its mask from torch's own generator, which no other framework
        # reproduces; the core draws ``keep`` instead, and this applies torch's scaling (inverted
        # dropout: kept units are divided by 1 - rate in training, nothing at inference).
        # One multiply by 1 / (1 - rate), as F.dropout's kernel scales (not a division per element).
        return torch.mul(torch.mul(x, keep), 1.0 / (1.0 - float(rate)))

    def cross_entropy(self, logits: Tensor, labels: Tensor, ignore_index: int) -> Tensor:
        """Return the per-position loss over the last axis, of the labels' shape; 0 where ignored."""
        classes = logits.shape[-1]
        # NOTE: F.cross_entropy wants the classes on axis 1 ((N, C, d1, ...)); the protocol's are on the
        # last axis, so both are flattened to (N, C) and (N,) and the loss is shaped back. Its
        # defaults are reduction="mean" and ignore_index=-100: passed as "none" and the caller's index,
        # which gives an ignored position a loss of 0 and no gradient.
        loss = F.cross_entropy(
            logits.reshape(-1, classes),
            labels.reshape(-1),
            weight=None,
            ignore_index=int(ignore_index),
            reduction="none",
            label_smoothing=0.0,
        )
        return loss.reshape(labels.shape)
