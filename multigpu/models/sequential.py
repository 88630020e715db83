"""``Sequential``: the chain case of ``Model`` (each layer consumes the previous one)."""

from __future__ import annotations

from collections.abc import Sequence

from multigpu.errors import ModelError
from multigpu.models.graph import BYTES_PER_VALUE, LayerStats, Model
from multigpu.models.layers import JoinLayer, Layer

__all__ = ["BYTES_PER_VALUE", "LayerStats", "Sequential"]


class Sequential(Model):
    """A chain of layers applied to inputs of per-example shape ``input_shape``.

    Unnamed layers are called by kind and count (``conv2d1``, ``relu2``). ``init``
    defaults to He init, as ``Model``'s (a network of a few ReLU layers learns from the
    first epoch); ``init="textbook"`` gives the textbook's N(0, 0.01^2) weights and zero
    biases, which ``multigpu.models.lenet()`` uses. Blocks with branches (``Residual``,
    ``Parallel``) need ``Model``.
    """

    def __init__(self, layers: Sequence[Layer], input_shape: Sequence[int], name: str = "sequential", init: str = "he"):
        if not isinstance(layers, (list, tuple)) or not layers:
            raise ModelError("Sequential needs at least one layer")
        for layer in layers:
            if not isinstance(layer, Layer):
                raise ModelError(
                    f"Sequential layers must be Layer specs, got {layer!r}; blocks with branches "
                    "(Residual, Parallel, Chain) go into multigpu.models.Model"
                )
            if isinstance(layer, JoinLayer):
                raise ModelError(
                    f"Sequential is a chain, so {layer.kind} has nothing to join; build branches "
                    "with multigpu.models.Model and Residual or Parallel"
                )
        super().__init__(list(layers), input_shape, name=name, init=init)
