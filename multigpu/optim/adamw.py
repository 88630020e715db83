"""AdamW as ``torch.optim.AdamW`` defines it (decoupled weight decay, bias-corrected moments).

With the mean loss's gradient ``d = scale * g`` and step t (from 1):

* ``p *= 1 - lr * weight_decay``;
* ``m = beta1 * m + (1 - beta1) * d``; ``v = beta2 * v + (1 - beta2) * d * d``;
* ``p -= lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)``.

Four whole-buffer calls per replica; ``g`` is only read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from multigpu.checks import check_number
from multigpu.errors import InputError
from multigpu.optim.base import Optimizer


@dataclass(frozen=True)
class AdamW(Optimizer):
    """``torch.optim.AdamW(betas, eps, weight_decay)`` (torch's defaults); the lr comes per step."""

    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01
    name = "adamw"
    buffers = 2  # the first and second moments

    def __post_init__(self) -> None:
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise InputError(f"betas={self.betas!r} must be two numbers, e.g. (0.9, 0.999)")
        object.__setattr__(
            self,
            "betas",
            tuple(
                float(check_number(beta, f"betas[{i}]", minimum=0.0, maximum=1.0, example=0.9))
                for i, beta in enumerate(self.betas)
            ),
        )
        if max(self.betas) >= 1.0:
            raise InputError(f"betas={self.betas} must each be below 1 (a beta of 1 never moves), e.g. (0.9, 0.999)")
        check_number(self.eps, "eps", minimum=0.0, strict=True, example=1e-8)
        check_number(self.weight_decay, "weight_decay", minimum=0.0, example=0.01)

    def update(self, backend: Any, p: Any, g: Any, state: Sequence[Any], lr: float, scale: float, step: int) -> None:
        """One AdamW step on replica buffers (see the module docstring)."""
        b, (beta1, beta2) = backend, self.betas
        m, v = state
        if self.weight_decay:
            b.scale_(p, 1.0 - lr * float(self.weight_decay))
        b.axpby_(m, beta1, g, (1.0 - beta1) * scale)
        b.addcmul_(v, beta2, g, g, (1.0 - beta2) * scale * scale)
        b.addcdiv_sqrt_(p, m, v, -lr / (1.0 - beta1**step), math.sqrt(1.0 - beta2**step), float(self.eps))

    def config(self) -> dict[str, Any]:
        """The settings, with the name."""
        return {"name": self.name, **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}}
