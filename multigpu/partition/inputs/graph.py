"""Layer graphs: a chain of layers with FLOPs, parameter bytes and output bytes.

A graph comes from a JSON file (``{"input_bytes": ..., "layers": [...]}``) or from a
built-in model's per-layer accounting (``load_graph("alexnet", batch=1)``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Union

import numpy as np

from multigpu.checks import check_count
from multigpu.partition.exceptions import ClusterError
from multigpu.partition.inputs.files import read_structured_file
from multigpu.partition.inputs.validate import check_keys, check_name, check_number, check_number_fields

__all__ = ["Graph", "LayerSpec", "load_graph", "graph_from_model"]

GRAPH_KEYS = ("input_bytes", "layers")
LAYER_KEYS = ("name", "flops", "param_bytes", "output_bytes")


@dataclass(frozen=True)
class LayerSpec:
    """One layer: ``flops`` (FLOPs for one pass), ``param_bytes`` and ``output_bytes``."""

    name: str
    flops: float
    param_bytes: float
    output_bytes: float

    def __post_init__(self) -> None:
        check_name(self.name, "layer name")
        check_number_fields(self, f"layer {self.name!r}", flops={"unit": "FLOPs"},
                            param_bytes={"unit": "bytes; 0 for a layer without parameters"},
                            output_bytes={"unit": "bytes"})


@dataclass(frozen=True)
class Graph:
    """A chain of ``layers``; layer 1 receives ``input_bytes`` from the cluster's source."""

    layers: tuple[LayerSpec, ...]
    input_bytes: float
    name: str = field(default="graph", compare=False)

    def __post_init__(self) -> None:
        layers = tuple(self.layers)
        if not layers:
            raise ClusterError(f"graph {self.name!r} has no layers; list at least one under \"layers\"")
        seen: set[str] = set()
        for i, layer in enumerate(layers):
            if not isinstance(layer, LayerSpec):
                raise ClusterError(f"layers[{i}] must be a LayerSpec, got {type(layer).__name__}")
            if layer.name in seen:
                raise ClusterError(f"duplicate layer name {layer.name!r}; layer names must be unique "
                                   f"(pins and reports refer to layers by name)")
            seen.add(layer.name)
        object.__setattr__(self, "layers", layers)
        object.__setattr__(self, "input_bytes", check_number(
            self.input_bytes, f"graph {self.name!r}: input_bytes", unit="bytes"))

    @property
    def n(self) -> int:
        """Number of layers."""
        return len(self.layers)

    @property
    def names(self) -> list[str]:
        """Layer names in chain order."""
        return [layer.name for layer in self.layers]

    @cached_property
    def _index(self) -> dict[str, int]:
        return {layer.name: i for i, layer in enumerate(self.layers)}

    def index(self, name: Union[str, int]) -> int:
        """Position (0-based) of a layer given by name or index; ClusterError if unknown."""
        if isinstance(name, (int, np.integer)) and not isinstance(name, bool):
            if not 0 <= int(name) < self.n:
                raise ClusterError(f"layer index {name} is outside 0..{self.n - 1}")
            return int(name)
        try:
            return self._index[name]  # type: ignore[index]
        except (KeyError, TypeError):
            shown = ", ".join(self.names[:12]) + (", ..." if self.n > 12 else "")
            raise ClusterError(f"unknown layer {name!r}; layers are: {shown}") from None

    @cached_property
    def flops(self) -> np.ndarray:
        """FLOPs per layer, shape (n,)."""
        return self._column("flops")

    @cached_property
    def param_bytes(self) -> np.ndarray:
        """Parameter bytes per layer, shape (n,)."""
        return self._column("param_bytes")

    @cached_property
    def output_bytes(self) -> np.ndarray:
        """Output-activation bytes per layer, shape (n,)."""
        return self._column("output_bytes")

    @cached_property
    def input_bytes_per_layer(self) -> np.ndarray:
        """Bytes each layer receives: ``input_bytes`` for layer 1, else the previous output."""
        arr = np.concatenate([[self.input_bytes], self.output_bytes[:-1]])
        arr.flags.writeable = False
        return arr

    @cached_property
    def activation_bytes(self) -> np.ndarray:
        """Largest activation a layer holds: max(its input, its output), shape (n,)."""
        arr = np.maximum(self.input_bytes_per_layer, self.output_bytes)
        arr.flags.writeable = False
        return arr

    def _column(self, attr: str) -> np.ndarray:
        arr = np.array([getattr(layer, attr) for layer in self.layers], dtype=float)
        arr.flags.writeable = False
        return arr

    @classmethod
    def from_dict(cls, data: Any, name: str = "graph") -> "Graph":
        """Build a graph from the parsed JSON structure; ClusterError on a bad key or value."""
        check_keys(data, f"{name}: graph", GRAPH_KEYS)
        raw = data["layers"]
        if not isinstance(raw, list):
            raise ClusterError(f"{name}: \"layers\" must be a list of layer objects, got {type(raw).__name__}")
        if not raw:
            raise ClusterError(f"{name}: \"layers\" is empty; a graph needs at least one layer")
        layers = []
        for i, layer in enumerate(raw):
            check_keys(layer, f"{name}: layers[{i}]", LAYER_KEYS)
            layers.append(LayerSpec(name=layer["name"], flops=layer["flops"],
                                    param_bytes=layer["param_bytes"], output_bytes=layer["output_bytes"]))
        return cls(layers=tuple(layers), input_bytes=data["input_bytes"], name=name)

    def to_dict(self) -> dict[str, Any]:
        """The JSON structure of this graph (round-trips through ``from_dict``)."""
        return {"input_bytes": self.input_bytes,
                "layers": [{"name": x.name, "flops": x.flops, "param_bytes": x.param_bytes,
                            "output_bytes": x.output_bytes} for x in self.layers]}


def graph_from_model(model: Any, batch: int = 1) -> Graph:
    """The layer graph of a ``Sequential`` for ``batch`` examples (from ``layer_stats``)."""
    stats = model.layer_stats(check_count(batch, "batch", error=ClusterError))
    layers = tuple(LayerSpec(name=s.name, flops=s.flops, param_bytes=s.param_bytes,
                             output_bytes=s.output_bytes) for s in stats)
    name = getattr(model, "name", "model")
    return Graph(layers=layers, input_bytes=model.input_bytes(int(batch)),
                 name=f"{name}(batch={int(batch)})")


def load_graph(path: Union[str, "os.PathLike[str]"], batch: int = 1) -> Graph:
    """Read a graph from a JSON file, or build it from a built-in model name.

    A built-in name (``lenet``, ``alexnet``) wins over a file of the same name; write
    ``./alexnet`` to force the file. ``batch`` only applies to built-in models.
    Raises ClusterError for a missing or malformed file and any bad key or value.
    """
    from multigpu import models  # local: models pulls in the layer specs only when needed

    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if text is None:
        raise ClusterError(f"graph must be a file path or a model name, got {type(path).__name__}")
    if text in models.MODELS:
        return graph_from_model(models.get(text), batch)
    p = Path(text)
    if not p.exists():
        raise ClusterError(f"no graph file {text!r}; give a path to a .json graph file or a built-in "
                           f"model name: {', '.join(sorted(models.MODELS))}")
    if p.is_dir():
        raise ClusterError(f"graph path {text!r} is a directory; give a .json file")
    if p.suffix.lower() != ".json":
        raise ClusterError(f"graph file {text!r} has suffix {p.suffix or '(none)'!r}; graphs are JSON "
                           f"files named .json")
    return Graph.from_dict(read_structured_file(p, "graph"), name=p.stem)
