"""The optimizer interface the data-parallel step calls, and optimizers by name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class Optimizer:
    """An update rule over one replica's flat buffers.

    The step passes the flat parameters ``p``, the flat gradient ``g`` of the summed
    per-example loss and ``scale`` (1 / global batch), so the gradient of the mean
    loss is ``scale * g``, the one ``torch.optim`` sees. ``g`` may be shared by several
    replicas (CPU replicas read one summed buffer), so an optimizer never writes it.
    ``step`` counts from 1, as torch's does. The learning rate comes with every step
    (a schedule sets it); everything else is the optimizer's own settings.
    """

    name = "optimizer"

    @property
    def buffers(self) -> int:
        """How many flat buffers of the parameters' length the optimizer keeps per replica
        (a subclass may set it as a class attribute, as AdamW does)."""
        return 0

    def update(self, backend: Any, p: Any, g: Any, state: Sequence[Any], lr: float, scale: float, step: int) -> None:
        """Update ``p`` (and ``state``) in place from the gradient ``scale * g``."""
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """The settings, JSON-able (checkpoints compare them)."""
        raise NotImplementedError
