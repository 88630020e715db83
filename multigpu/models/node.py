"""A model's node: a layer and the names of the nodes it consumes."""

from __future__ import annotations

from dataclasses import dataclass

from multigpu.models.layers import Layer

INPUT = "input"  # the name of the model's input in every node's inputs


@dataclass(frozen=True)
class Node:
    """One node of a model: ``layer`` applied to the outputs of the nodes named in ``inputs``."""

    name: str
    layer: Layer
    inputs: tuple[str, ...] = (INPUT,)
