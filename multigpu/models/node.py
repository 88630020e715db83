"""A model's node (a layer and the names of the nodes it consumes) and its named inputs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from multigpu.errors import ModelError
from multigpu.models.layers import Layer

INPUT = "input"  # the name of a one-input model's input in every node's inputs

#: The dtypes a model input may have: float32 values (images) or int64 ids and masks.
INPUT_DTYPES = ("float32", "int64")


@dataclass(frozen=True)
class Input:
    """A named model input: its per-example ``shape`` and its ``dtype`` (``"float32"`` or ``"int64"``).

    Token ids and attention masks are int64; the shape of a sequence input is the length the
    model is measured at (``layer_stats``); a run may feed any length its layers accept.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ModelError(f"a model input is named {self.name!r}; give it a non-empty name, e.g. 'input_ids'")
        shape = tuple(int(s) for s in self.shape)
        if not shape or min(shape) < 1:
            raise ModelError(f"input {self.name!r}: shape={tuple(self.shape)} must be positive dims, e.g. (128,)")
        object.__setattr__(self, "shape", shape)
        if self.dtype not in INPUT_DTYPES:
            raise ModelError(f"input {self.name!r}: dtype={self.dtype!r} is unknown; use one of {list(INPUT_DTYPES)}")

    @property
    def itemsize(self) -> int:
        """Bytes per value."""
        return np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Node:
    """One node of a model: ``layer`` applied to the outputs of the nodes (or model inputs) named in ``inputs``."""

    name: str
    layer: Layer
    inputs: tuple[str, ...] = (INPUT,)
