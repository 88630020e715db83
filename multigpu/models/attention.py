"""Self-attention: ``MultiHeadAttention`` and the ``AttentionMask`` node that feeds it padding.

``AttentionMask`` consumes the token ids and the attention mask (Hugging Face's: 1 for a
token, 0 for padding; int64 or float32) and gives, per example, a (1, 1, S) float mask
that is 1 where a key is padding. ``MultiHeadAttention`` consumes the hidden states (S, D)
and, optionally, that mask; with ``causal`` it also hides every later position. Blocked
scores are filled with float32's lowest value before the softmax (as ``transformers``
adds it), so a row whose keys are all blocked gets equal weights, never NaN.

Cost per example, hidden size D, S tokens, H heads: the four projections take 4 S D^2
multiply-accumulates and the two matrix products (Q K^T and the weights times V) 2 S^2 D;
FLOPs are twice that, plus 4 S D for the projections' biases and 5 H S^2 for the scale,
the mask and the softmax (maximum, subtraction, exponential, sum, division).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from multigpu.errors import InputError, ModelError
from multigpu.models.layers import ContextLayer, Shape, _weights
from multigpu.models.transformer_layers import check_token_ids

#: What blocked attention scores are filled with (float32's lowest, as transformers uses).
BLOCKED = float(np.finfo(np.float32).min)

_PROJECTIONS = ("self.query", "self.key", "self.value", "output.dense")


def check_heads(heads: int, hidden: int, what: str = "MultiHeadAttention") -> int:
    """Return the head size ``hidden // heads``; ModelError when ``heads`` does not divide ``hidden``."""
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        raise ModelError(f"{what}: heads={heads!r} must be an integer >= 1")
    if hidden % heads:
        fits = [h for h in range(1, min(hidden, 64) + 1) if hidden % h == 0]
        raise ModelError(
            f"{what}: {heads} heads do not divide the hidden size {hidden}; choose heads that divide it "
            f"(e.g. one of {fits[-6:]}) or a hidden size that is a multiple of {heads}"
        )
    return hidden // heads


@dataclass(frozen=True)
class AttentionMask(ContextLayer):
    """Turns (input_ids, attention_mask) into the padding mask attention reads: (1, 1, S) per
    example, 1 where a key is padding. A mask whose shape is not the ids' raises InputError."""

    kind = "attention_mask"
    min_inputs = 2
    max_inputs = 2

    def check_inputs(self, in_shapes: Sequence[Shape]) -> None:
        if len(in_shapes[0]) != 1 or in_shapes[1] != in_shapes[0]:
            raise ModelError(
                f"the attention mask has shape {in_shapes[1]} per example but the ids {in_shapes[0]}; "
                "declare both inputs with the same (S,) shape"
            )

    def output_shape(self, in_shape: Shape) -> Shape:
        return (1, 1, in_shape[0])

    def flops(self, in_shape: Shape) -> int:
        return in_shape[0]

    def call(self, backend: Any, params: Sequence[Any], xs: Sequence[Any], node: Any) -> Any:
        ids, mask = xs
        shape = check_token_ids(backend, ids)
        mshape = tuple(backend.shape(mask))
        if mshape != shape:
            raise InputError(
                f"attention_mask has shape {mshape} but input_ids {shape}; pass one 0/1 per token, shaped "
                "as the ids (the tokenizer's attention_mask: 1 for a token, 0 for padding)"
            )
        b, s = shape
        # NOTE: masked_fill fills where its mask is set, and this mask is set where a token is:
        # turning it around needs ones on the replica's device (no op makes a tensor from nothing).
        ones = node.constant(backend, f"ones{b}x{s}", lambda: np.ones((b, 1, 1, s), np.float32), "AttentionMask")
        return backend.masked_fill(ones, backend.reshape(mask, (b, 1, 1, s)), 0.0)


@dataclass(frozen=True)
class MultiHeadAttention(ContextLayer):
    """Multi-head self-attention on hidden states (S, D), with its output projection.

    Inputs: the hidden states, then optionally the (1, 1, S) padding mask of an
    ``AttentionMask`` node. ``causal`` hides later positions (a decoder); ``dropout`` is
    the rate on the attention weights in training runs. Parameters, in order and named as
    BERT's ``attention`` module: ``self.query``, ``self.key``, ``self.value`` and
    ``output.dense``, each a ``weight`` (D, D) (in, out) and a ``bias`` (D,).
    """

    heads: int = 1
    causal: bool = False
    dropout: float = 0.0
    kind = "multi_head_attention"
    max_inputs = 2
    torch_transposed = tuple(f"{p}.weight" for p in _PROJECTIONS)

    def __post_init__(self) -> None:
        if isinstance(self.heads, bool) or not isinstance(self.heads, int) or self.heads < 1:
            raise ModelError(f"MultiHeadAttention heads={self.heads!r} must be an integer >= 1")
        if not isinstance(self.causal, bool):
            raise ModelError(f"MultiHeadAttention causal={self.causal!r} must be True or False")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise ModelError(f"MultiHeadAttention dropout={self.dropout!r} must be a number in [0, 1), e.g. 0.1")

    def _dims(self, in_shape: Shape) -> tuple[int, int]:
        if len(in_shape) != 2:
            raise ModelError(
                f"multi_head_attention needs hidden states (S, D) per example but receives {in_shape}; "
                "put it after an Embedding"
            )
        check_heads(self.heads, in_shape[1])
        return in_shape  # the length check above narrows it to (S, D)

    def check_inputs(self, in_shapes: Sequence[Shape]) -> None:
        s, _ = self._dims(in_shapes[0])
        if len(in_shapes) == 2 and in_shapes[1] != (1, 1, s):
            raise ModelError(
                f"the padding mask has shape {in_shapes[1]} per example; attention over {s} tokens needs (1, 1, {s}) "
                "(an AttentionMask node's output)"
            )

    def param_shapes(self, in_shape: Shape) -> list[Shape]:
        d = self._dims(in_shape)[1]
        return [(d, d), (d,)] * len(_PROJECTIONS)

    def param_labels(self, in_shape: Shape) -> list[str]:
        return [f"{p}.{w}" for p in _PROJECTIONS for w in ("weight", "bias")]

    def macs(self, in_shape: Shape) -> int:
        s, d = self._dims(in_shape)
        return 4 * s * d * d + 2 * s * s * d

    def flops(self, in_shape: Shape) -> int:
        s, d = self._dims(in_shape)
        return 2 * self.macs(in_shape) + 4 * s * d + 5 * self.heads * s * s

    def init_params(self, rng: np.random.Generator, in_shape: Shape, scheme: str, scale: float) -> list[np.ndarray]:
        d = self._dims(in_shape)[1]
        if scheme == "textbook":
            return [_weights(rng, (d, d), scale) if j % 2 == 0 else np.zeros(d, np.float32) for j in range(8)]
        bound = 1.0 / math.sqrt(d)  # torch's nn.Linear default, as Dense's "he" scheme
        return [rng.uniform(-bound, bound, (d, d) if j % 2 == 0 else (d,)).astype(np.float32) for j in range(8)]

    def call(self, backend: Any, params: Sequence[Any], xs: Sequence[Any], node: Any) -> Any:
        x = xs[0]
        b, s, d = backend.shape(x)
        h = self.heads
        dh = check_heads(h, d)
        wq, bq, wk, bk, wv, bv, wo, bo = params

        def heads(w: Any, bias: Any, perm: tuple[int, ...]) -> Any:
            return backend.transpose(backend.reshape(backend.dense(x, w, bias), (b, s, h, dh)), perm)

        q = heads(wq, bq, (0, 2, 1, 3))  # (B, H, S, dh)
        k = heads(wk, bk, (0, 2, 3, 1))  # (B, H, dh, S): K transposed for the product
        v = heads(wv, bv, (0, 2, 1, 3))
        scores = backend.scale(backend.matmul(q, k), 1.0 / math.sqrt(dh))
        if self.causal:
            later = node.constant(
                backend,
                f"causal{s}",
                lambda: np.triu(np.ones((s, s), np.float32), 1).reshape(1, 1, s, s),
                f"causal MultiHeadAttention {self.name!r}",
            )
            scores = backend.masked_fill(scores, later, BLOCKED)
        if len(xs) == 2:
            pad = xs[1]
            if tuple(backend.shape(pad)) != (b, 1, 1, s):
                raise InputError(
                    f"the padding mask has shape {tuple(backend.shape(pad))}; attention over ({b}, {s}) tokens "
                    f"needs ({b}, 1, 1, {s}) (feed the attention_mask shaped as the ids)"
                )
            scores = backend.masked_fill(scores, pad, BLOCKED)
        weights = backend.softmax(scores, -1)
        if node.training and self.dropout > 0:
            keep = node.keep_mask(backend, (b, h, s, s), self.dropout, 1, f"attention {self.name!r}")
            weights = backend.dropout(weights, keep, float(self.dropout))
        context = backend.reshape(backend.transpose(backend.matmul(weights, v), (0, 2, 1, 3)), (b, s, d))
        return backend.dense(context, wo, bo)
