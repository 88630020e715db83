"""``Sequential``: a chain of layer specs with shape inference, init and accounting."""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any, Optional, Sequence

import numpy as np

from multigpu.errors import ModelError, ParamsError
from multigpu.models.layers import Layer, Shape

BYTES_PER_VALUE = 4  # float32 everywhere


@dataclass(frozen=True)
class LayerStats:
    """Per-layer accounting for a given batch: the layer graph the cost model uses."""

    name: str
    kind: str
    input_shape: Shape
    output_shape: Shape
    params: int
    param_bytes: int
    macs: int
    flops: int
    output_bytes: int


class Sequential:
    """A chain of layers applied to inputs of per-example shape ``input_shape``."""

    def __init__(self, layers: Sequence[Layer], input_shape: Sequence[int], name: str = "sequential"):
        if not layers:
            raise ModelError("Sequential needs at least one layer")
        self.name = name
        self.input_shape: Shape = tuple(int(s) for s in input_shape)
        counts: dict[str, int] = {}
        named = []
        for layer in layers:
            if not isinstance(layer, Layer):
                raise ModelError(f"Sequential layers must be Layer specs, got {layer!r}")
            counts[layer.kind] = counts.get(layer.kind, 0) + 1
            label = layer.name or f"{layer.kind}{counts[layer.kind]}"
            named.append((label, layer))
        labels = [label for label, _ in named]
        if len(set(labels)) != len(labels):
            raise ModelError(f"Sequential layer names must be unique, got {labels}")
        self.layers: list[tuple[str, Layer]] = named
        # Shape inference once, so a bad spec fails at construction time.
        self._in_shapes: list[Shape] = []
        shape = self.input_shape
        self._param_shapes: list[list[Shape]] = []
        for _, layer in self.layers:
            self._in_shapes.append(shape)
            self._param_shapes.append(layer.param_shapes(shape))
            shape = layer.output_shape(shape)
        self.output_shape: Shape = shape
        offsets = np.cumsum([0] + [len(p) for p in self._param_shapes])
        self._param_offsets = [int(o) for o in offsets]

    def __len__(self) -> int:
        return len(self.layers)

    def __repr__(self) -> str:
        return f"Sequential({self.name!r}, {len(self)} layers, input {self.input_shape})"

    @property
    def param_shapes(self) -> list[Shape]:
        """Shapes of all parameters, in model order."""
        return [s for shapes in self._param_shapes for s in shapes]

    @property
    def num_classes(self) -> int:
        """Width of the output (the number of classes for a classifier)."""
        return prod(self.output_shape)

    def init_params(self, seed: int = 0, scale: float = 0.01) -> list[np.ndarray]:
        """Return float32 params: weights ~ N(0, scale^2), biases zero (the textbook init)."""
        rng = np.random.default_rng(seed)
        out = []
        for shape in self.param_shapes:
            if len(shape) == 1:
                out.append(np.zeros(shape, np.float32))
            else:
                out.append((rng.standard_normal(shape) * scale).astype(np.float32))
        return out

    def check_params(self, params: Sequence[Any]) -> list[np.ndarray]:
        """Return ``params`` as float32 numpy arrays; raise ParamsError on a mismatch."""
        expected = self.param_shapes
        if not isinstance(params, (list, tuple)):
            raise ParamsError(f"params must be a list of numpy arrays, got {type(params).__name__}")
        if len(params) != len(expected):
            raise ParamsError(
                f"params has {len(params)} arrays but {self.name} needs {len(expected)} "
                f"with shapes {expected}"
            )
        out = []
        for i, (p, shape) in enumerate(zip(params, expected)):
            arr = np.asarray(p)
            if arr.shape != shape:
                raise ParamsError(f"params[{i}] has shape {arr.shape}; {self.name} needs {shape}")
            if not np.issubdtype(arr.dtype, np.floating):
                raise ParamsError(f"params[{i}] has dtype {arr.dtype}; pass floating-point arrays")
            if not np.all(np.isfinite(arr)):
                raise ParamsError(f"params[{i}] contains NaN or infinity")
            out.append(arr.astype(np.float32, copy=True))
        return out

    def layer_params(self, params: Sequence[Any], index: int) -> Sequence[Any]:
        """Return the slice of the flat ``params`` list that layer ``index`` owns."""
        return params[self._param_offsets[index] : self._param_offsets[index + 1]]

    def forward(self, backend: Any, params: Sequence[Any], x: Any, start: int = 0,
                stop: Optional[int] = None) -> Any:
        """Run layers ``start..stop-1`` on ``x`` with ``backend``; ``params`` is the full list."""
        stop = len(self.layers) if stop is None else stop
        if not 0 <= start <= stop <= len(self.layers):
            raise ModelError(f"layer slice {start}:{stop} is outside 0:{len(self.layers)}")
        for i in range(start, stop):
            x = self.layers[i][1].forward(backend, self.layer_params(params, i), x)
        return x

    def input_bytes(self, batch: int = 1) -> int:
        """Bytes of one input batch (float32)."""
        return batch * prod(self.input_shape) * BYTES_PER_VALUE

    def layer_stats(self, batch: int = 1) -> list[LayerStats]:
        """Per-layer FLOPs, parameter bytes and output-activation bytes for ``batch``."""
        if batch < 1:
            raise ModelError(f"batch={batch} must be >= 1")
        stats = []
        for (label, layer), in_shape, pshapes in zip(self.layers, self._in_shapes, self._param_shapes):
            out = layer.output_shape(in_shape)
            n = sum(prod(s) for s in pshapes)
            stats.append(LayerStats(
                name=label, kind=layer.kind, input_shape=in_shape, output_shape=out,
                params=n, param_bytes=n * BYTES_PER_VALUE,
                macs=batch * layer.macs(in_shape), flops=batch * layer.flops(in_shape),
                output_bytes=batch * prod(out) * BYTES_PER_VALUE,
            ))
        return stats

    def num_params(self) -> int:
        """Total number of scalar parameters."""
        return sum(prod(s) for s in self.param_shapes)
