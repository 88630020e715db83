"""``Dropout``: inverted dropout with a mask the core draws (``multigpu.models.context``).

In a training run (``RunContext(training=True, seed, step, devices)``) each unit is kept
with probability ``1 - rate`` and the kept ones are scaled by ``1 / (1 - rate)``; the mask
comes from ``dropout_mask`` keyed by the seed, the step and the node, so every backend
drops the same units. In inference it passes its input on (no op at all).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

from multigpu.errors import ModelError
from multigpu.models.layers import ContextLayer, Shape


@dataclass(frozen=True)
class Dropout(ContextLayer):
    """Inverted dropout of ``rate`` in training runs; the identity in inference."""

    rate: float = 0.1
    kind = "dropout"

    def __post_init__(self) -> None:
        if isinstance(self.rate, bool) or not isinstance(self.rate, (int, float)) or not 0 <= self.rate < 1:
            raise ModelError(f"Dropout rate={self.rate!r} must be a number in [0, 1), e.g. 0.1")

    def flops(self, in_shape: Shape) -> int:
        return prod(in_shape)  # one multiply per element in training

    def call(self, backend: Any, params: Sequence[Any], xs: Sequence[Any], node: Any) -> Any:
        x = xs[0]
        if not node.training or self.rate == 0:
            return x
        keep = node.keep_mask(backend, backend.shape(x), self.rate, 0, f"Dropout {self.name!r}")
        return backend.dropout(x, keep, float(self.rate))
