"""The transformer's layer specs beside attention: embeddings, layer norm and the activations.

Shapes are per example: token ids (S,) int64, hidden states (S, D). Each layer composes
protocol ops only (``embedding``, ``take``, ``add``, ``layer_norm``, ``gelu``, ...).

FLOPs per example (a multiply-accumulate counts two, as in ``multigpu.models.layers``):
a lookup counts none; adding positions or token types one per output element; layer norm
eight per element (mean, centre, square, mean, add eps and root, divide, scale, shift);
GELU eight, tanh and sigmoid four per element (the exponentials and the arithmetic around
them, counted as one each).

Parameter labels follow Hugging Face's BERT (``weight`` for a table or a LayerNorm's
gamma, ``bias`` for its beta), so a model whose node names follow BERT's modules maps onto
its checkpoint by name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from multigpu.errors import InputError, ModelError
from multigpu.models.layers import ContextLayer, Layer, Shape, _weights


def _need_sequence(layer: Layer, in_shape: Shape) -> tuple[int, int]:
    if len(in_shape) != 2:
        raise ModelError(
            f"{layer.kind} needs hidden states (S, D) per example but receives {in_shape}; put it after an Embedding"
        )
    return in_shape  # the length check above narrows it to (S, D)


def _positive(layer: Layer, **values: int) -> None:
    for attr, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ModelError(f"{type(layer).__name__} {attr}={v!r} must be an integer >= 1")


def check_token_ids(backend: Any, ids: Any, what: str = "input_ids") -> tuple[int, ...]:
    """Return the shape of the token-id tensor ``ids``; InputError for float ids (no device read)."""
    if backend.dtype(ids).kind not in "iu":
        raise InputError(
            f"{what} has dtype {backend.dtype(ids)}; token ids must be integers: pass ids.astype('int64') "
            "(a tokenizer's input_ids)"
        )
    return tuple(backend.shape(ids))


@dataclass(frozen=True)
class Embedding(Layer):
    """Token embedding: int64 ids (S,) -> rows of a (vocab_size, dim) table, (S, dim).

    An id outside ``0..vocab_size-1`` raises InputError (the range of ids made by
    ``from_numpy`` is known on the host); float ids raise InputError.
    """

    vocab_size: int = 1
    dim: int = 1
    kind = "embedding"

    def __post_init__(self) -> None:
        _positive(self, vocab_size=self.vocab_size, dim=self.dim)

    def _seq(self, in_shape: Shape) -> int:
        if len(in_shape) != 1:
            raise ModelError(f"Embedding needs token ids (S,) per example but receives {in_shape}")
        return in_shape[0]

    def param_shapes(self, in_shape: Shape) -> list[Shape]:
        self._seq(in_shape)
        return [(self.vocab_size, self.dim)]

    def param_labels(self, in_shape: Shape) -> list[str]:
        return ["weight"]

    def output_shape(self, in_shape: Shape) -> Shape:
        return (self._seq(in_shape), self.dim)

    def init_params(self, rng: np.random.Generator, in_shape: Shape, scheme: str, scale: float) -> list[np.ndarray]:
        return [_weights(rng, (self.vocab_size, self.dim), scale)]

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        check_token_ids(backend, x)
        return backend.embedding(x, params[0])


@dataclass(frozen=True)
class PositionEmbedding(Layer):
    """Learned absolute positions: adds row ``s`` of a (max_positions, dim) table to position ``s``.

    A sequence longer than ``max_positions`` raises ModelError when the model is built and
    InputError when it runs.
    """

    max_positions: int = 1
    kind = "position_embedding"

    def __post_init__(self) -> None:
        _positive(self, max_positions=self.max_positions)

    def _check(self, in_shape: Shape) -> tuple[int, int]:
        s, d = _need_sequence(self, in_shape)
        if s > self.max_positions:
            raise ModelError(
                f"a sequence of {s} tokens is longer than the position table ({self.max_positions} positions); "
                f"build the model for at most {self.max_positions} tokens"
            )
        return s, d

    def param_shapes(self, in_shape: Shape) -> list[Shape]:
        return [(self.max_positions, self._check(in_shape)[1])]

    def param_labels(self, in_shape: Shape) -> list[str]:
        return ["weight"]

    def output_shape(self, in_shape: Shape) -> Shape:
        self._check(in_shape)
        return in_shape

    def flops(self, in_shape: Shape) -> int:
        return prod(in_shape)

    def init_params(self, rng: np.random.Generator, in_shape: Shape, scheme: str, scale: float) -> list[np.ndarray]:
        return [_weights(rng, self.param_shapes(in_shape)[0], scale)]

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        s = backend.shape(x)[1]
        if s > self.max_positions:
            raise InputError(
                f"a sequence of {s} tokens is longer than the position table ({self.max_positions} positions); "
                f"truncate the input to {self.max_positions} tokens (a tokenizer's truncation to "
                f"max_length={self.max_positions})"
            )
        return backend.add(x, backend.take(params[0], list(range(s)), 0))


@dataclass(frozen=True)
class TokenTypeEmbedding(ContextLayer):
    """BERT's segment embedding: adds row ``t`` of a (types, dim) table at each token of type ``t``.

    Inputs: the hidden states (S, D), then optionally int64 token-type ids (S,); without
    them every token is of type 0 (a single-segment input, as sentence embedding feeds).
    """

    types: int = 2
    kind = "token_type_embedding"
    max_inputs = 2

    def __post_init__(self) -> None:
        _positive(self, types=self.types)

    def check_inputs(self, in_shapes: Sequence[Shape]) -> None:
        s, _ = _need_sequence(self, in_shapes[0])
        if len(in_shapes) == 2 and in_shapes[1] != (s,):
            raise ModelError(f"token type ids of shape {in_shapes[1]} do not match hidden states {in_shapes[0]}")

    def param_shapes(self, in_shape: Shape) -> list[Shape]:
        return [(self.types, _need_sequence(self, in_shape)[1])]

    def param_labels(self, in_shape: Shape) -> list[str]:
        return ["weight"]

    def flops(self, in_shape: Shape) -> int:
        return prod(in_shape)

    def init_params(self, rng: np.random.Generator, in_shape: Shape, scheme: str, scale: float) -> list[np.ndarray]:
        return [_weights(rng, self.param_shapes(in_shape)[0], scale)]

    def call(self, backend: Any, params: Sequence[Any], xs: Sequence[Any], node: Any) -> Any:
        if len(xs) == 1:
            return backend.add(xs[0], backend.take(params[0], [0], 0))
        b, s = backend.shape(xs[0])[:2]
        shape = check_token_ids(backend, xs[1], "token_type_ids")
        if shape != (b, s):
            raise InputError(f"token_type_ids have shape {shape}; pass one type per token, shape {(b, s)}")
        return backend.add(xs[0], backend.embedding(xs[1], params[0]))


@dataclass(frozen=True)
class LayerNorm(Layer):
    """Layer normalization over the last axis (the biased variance), gamma ``weight`` and beta ``bias``."""

    eps: float = 1e-5
    kind = "layer_norm"

    def __post_init__(self) -> None:
        if not (isinstance(self.eps, (int, float)) and not isinstance(self.eps, bool) and 0 < self.eps < math.inf):
            raise ModelError(f"LayerNorm eps={self.eps!r} must be a finite number > 0, e.g. 1e-5 (BERT: 1e-12)")

    def param_shapes(self, in_shape: Shape) -> list[Shape]:
        return [(in_shape[-1],), (in_shape[-1],)]

    def param_labels(self, in_shape: Shape) -> list[str]:
        return ["weight", "bias"]

    def flops(self, in_shape: Shape) -> int:
        return 8 * prod(in_shape)

    def init_params(self, rng: np.random.Generator, in_shape: Shape, scheme: str, scale: float) -> list[np.ndarray]:
        d = in_shape[-1]
        return [np.ones(d, np.float32), np.zeros(d, np.float32)]  # gamma = 1, beta = 0 in every scheme

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        return backend.layer_norm(x, params[0], params[1], float(self.eps))


@dataclass(frozen=True)
class GELU(Layer):
    """GELU: exact ``x * Phi(x)`` (erf; BERT's), or the tanh approximation (GPT-2's) when ``approximate``."""

    approximate: bool = False
    kind = "gelu"

    def __post_init__(self) -> None:
        if not isinstance(self.approximate, bool):
            raise ModelError(f"GELU approximate={self.approximate!r} must be True (tanh form) or False (erf form)")

    def flops(self, in_shape: Shape) -> int:
        return 8 * prod(in_shape)

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        return backend.gelu(x, self.approximate)


@dataclass(frozen=True)
class Tanh(Layer):
    """Elementwise hyperbolic tangent."""

    kind = "tanh"

    def flops(self, in_shape: Shape) -> int:
        return 4 * prod(in_shape)

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        return backend.tanh(x)


@dataclass(frozen=True)
class Sigmoid(Layer):
    """Elementwise logistic sigmoid ``1 / (1 + exp(-x))``."""

    kind = "sigmoid"

    def flops(self, in_shape: Shape) -> int:
        return 4 * prod(in_shape)

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        return backend.sigmoid(x)
