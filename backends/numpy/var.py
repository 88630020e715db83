"""The reference's tensor (``Var``, an array with the graph edge that made it) and the node maker every op uses."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from multigpu.contract.protocol import Device
from multigpu.errors import InputError

Backward = Callable[[np.ndarray], Sequence[np.ndarray | None]]


class Var:
    """An array on a logical device, with the graph edge that produced it."""

    __slots__ = ("backward", "data", "device", "parents")

    def __init__(
        self, data: np.ndarray, device: Device, parents: tuple[Var, ...] = (), backward: Backward | None = None
    ):
        self.data, self.device, self.parents, self.backward = data, device, parents, backward

    def __repr__(self) -> str:
        return f"Var({self.data!r}, device={self.device})"


class Graph:
    """What every op mixin builds on: ``_node`` records an op's output and its backward rule."""

    def _node(self, data: np.ndarray, parents: tuple[Var, ...], backward: Backward) -> Var:
        """A new Var made from ``parents``; refuses operands on different CPU replicas."""
        device = parents[0].device
        if any(p.device != device for p in parents[1:]):
            raise InputError(f"an op mixes devices {[str(p.device) for p in parents]}; copy to one first")
        return Var(data, device, parents, backward)


def unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum the gradient ``g`` of a broadcast result back to an operand's own ``shape``."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    summed = g.sum(axis=tuple(range(lead))) if lead else g
    ones = tuple(i for i, n in enumerate(shape) if n == 1 and summed.shape[i] != 1)
    return summed.sum(axis=ones, keepdims=True) if ones else summed
