"""SGD with momentum, dampening, Nesterov and weight decay, as ``torch.optim.SGD`` defines it.

With ``d = scale * g + weight_decay * p`` (the mean loss's gradient plus L2 decay):

* first step ``buf = d``; later ``buf = momentum * buf + (1 - dampening) * d``;
* Nesterov ``d = d + momentum * buf``, else ``d = buf``;
* ``p -= lr * d``.

Written so that ``g`` is only read (it may be shared by replicas) and ``d`` is never
materialized: two to four whole-buffer calls per replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from multigpu.checks import check_number
from multigpu.errors import InputError
from multigpu.optim.base import Optimizer


@dataclass(frozen=True)
class SGD(Optimizer):
    """``torch.optim.SGD(momentum, dampening, weight_decay, nesterov)``; the lr comes per step."""

    momentum: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    dampening: float = 0.0
    name = "sgd"

    def __post_init__(self) -> None:
        check_number(self.momentum, "momentum", minimum=0.0, example=0.9)
        check_number(self.weight_decay, "weight_decay", minimum=0.0, example=5e-4)
        check_number(self.dampening, "dampening", minimum=0.0, maximum=1.0, example=0.0)
        if not isinstance(self.nesterov, bool):
            raise InputError(f"nesterov={self.nesterov!r} must be True or False")
        if self.nesterov and (self.momentum == 0 or self.dampening != 0):
            raise InputError(
                f"nesterov=True needs momentum > 0 and dampening = 0 (torch's rule), got "
                f"momentum={self.momentum}, dampening={self.dampening}"
            )

    @property
    def buffers(self) -> int:
        """One momentum buffer with momentum, none without."""
        return 1 if self.momentum else 0

    def update(self, backend: Any, p: Any, g: Any, state: Sequence[Any], lr: float, scale: float, step: int) -> None:
        """One SGD step on replica buffers (see the module docstring)."""
        b, wd, m = backend, float(self.weight_decay), float(self.momentum)
        if not m:
            if wd:
                b.axpby_(p, 1.0 - lr * wd, g, -lr * scale)
            else:
                b.sgd_([p], [g], lr * scale)
            return
        buf = state[0]
        keep = 1.0 - float(self.dampening) if step > 1 else 1.0  # torch: the first buf is d itself
        b.axpby_(buf, m if step > 1 else 0.0, g, keep * scale)
        if wd:
            b.axpby_(buf, 1.0, p, keep * wd)
        if self.nesterov:  # p -= lr * (d + m * buf), with d = scale * g + wd * p
            b.axpby_(p, 1.0 - lr * wd, g, -lr * scale)
            b.axpby_(p, 1.0, buf, -lr * m)
        else:
            b.sgd_([p], [buf], lr)

    def config(self) -> dict[str, Any]:
        """The settings, with the name."""
        return {"name": self.name, **asdict(self)}
