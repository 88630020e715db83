"""Layer graphs: a DAG of layers with FLOPs, parameter bytes and output bytes.

A graph comes from a JSON or TOML file (``{"input_bytes": ..., "layers": [...]}``), from
a built-in model's per-layer accounting (``load_graph("alexnet", batch=1)``), or from a
shipped graph file by name (``load_graph("resnet50")``, see ``shipped_graphs``).

A layer may list ``inputs``: the names of the layers whose outputs it consumes, with
``"input"`` meaning the graph's input (it starts at the cluster's source). Without
``inputs`` a layer consumes the previous one (the first layer consumes the input), so a
chain file means what it always meant. Layers are listed in a topological order (each
after its inputs), and the last layer's output goes to the sink. Refused, each with the
name and the fix: an unknown input, a cycle, a layer listed twice, a layer no path from
the input reaches, a layer listed before one of its inputs, and a layer other than the
last whose output no layer consumes.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from multigpu.checks import check_count
from multigpu.partition.exceptions import GraphError
from multigpu.partition.inputs.files import read_structured_file
from multigpu.partition.inputs.validate import check_keys, check_name, check_number, check_number_fields

__all__ = ["INPUT", "Graph", "LayerSpec", "graph_from_model", "load_graph", "shipped_graphs"]

GRAPH_KEYS = ("input_bytes", "layers")
LAYER_KEYS = ("name", "flops", "param_bytes", "output_bytes")
LAYER_KEYS_OPTIONAL = ("inputs",)
INPUT = "input"  # the graph's input, in a layer's ``inputs``


@dataclass(frozen=True)
class LayerSpec:
    """One layer: ``flops`` (FLOPs for one pass), ``param_bytes`` and ``output_bytes``;
    ``inputs`` names the layers it consumes (``"input"``: the graph's input), None for
    the previous layer (the graph's input for the first)."""

    name: str
    flops: float
    param_bytes: float
    output_bytes: float
    inputs: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        check_name(self.name, "layer name", GraphError)
        if self.name == INPUT:
            raise GraphError(
                f'a layer is named {INPUT!r}, which names the graph\'s input in "inputs"; rename the layer'
            )
        check_number_fields(
            self,
            f"layer {self.name!r}",
            flops={"unit": "FLOPs", "error": GraphError},
            param_bytes={"unit": "bytes; 0 for a layer without parameters", "error": GraphError},
            output_bytes={"unit": "bytes", "error": GraphError},
        )
        if self.inputs is not None:
            object.__setattr__(self, "inputs", _check_inputs(self.name, self.inputs))


def _check_inputs(name: str, inputs: Any) -> tuple[str, ...]:
    what = f"layer {name!r}: inputs"
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
        raise GraphError(
            f'{what} must be a list of layer names (or "input"), e.g. [{str(inputs)!r}]; got {type(inputs).__name__}'
        )
    out = tuple(check_name(x, f"{what}: an entry", GraphError) for x in inputs)
    if not out:
        raise GraphError(
            f"{what} is empty, so no path from the input reaches layer {name!r}; list the "
            f'layers it consumes, or "input" for the graph\'s input (or leave "inputs" out: '
            f"the previous layer)"
        )
    twice = next((x for i, x in enumerate(out) if x in out[:i]), None)
    if twice is not None:
        raise GraphError(f"{what} lists {twice!r} twice; list each input once")
    if name in out:
        raise GraphError(f"{what} lists the layer itself, a cycle; a layer consumes earlier layers only")
    return out


@dataclass(frozen=True)
class Graph:
    """A DAG of ``layers`` in a topological order; the layers consuming ``"input"`` receive
    ``input_bytes`` from the cluster's source, and the last layer's output goes to the sink.

    ``producers[i]`` lists the layers layer i consumes (-1: the graph's input),
    ``consumers[i]`` the layers consuming layer i; ``edge_src``/``edge_dst`` are the
    layer-to-layer edges ordered by consumer (for a chain: i -> i+1), and
    ``input_consumers`` the layers consuming the graph's input.
    """

    layers: tuple[LayerSpec, ...]
    input_bytes: float
    name: str = field(default="graph", compare=False)

    def __post_init__(self) -> None:
        layers = tuple(self.layers)
        if not layers:
            raise GraphError(f'graph {self.name!r} has no layers; list at least one under "layers"')
        seen: dict[str, int] = {}
        for i, layer in enumerate(layers):
            if not isinstance(layer, LayerSpec):
                raise GraphError(f"layers[{i}] must be a LayerSpec, got {type(layer).__name__}")
            if layer.name in seen:
                raise GraphError(
                    f"duplicate layer name {layer.name!r} (layers[{seen[layer.name]}] and "
                    f"layers[{i}]); layer names must be unique (inputs, pins and reports refer "
                    f"to layers by name): rename one"
                )
            seen[layer.name] = i
        # One form per graph: inputs that name the previous layer are the default.
        layers = tuple(
            dataclasses.replace(x, inputs=None) if x.inputs == _default_inputs(layers, i) else x
            for i, x in enumerate(layers)
        )
        object.__setattr__(self, "layers", layers)
        object.__setattr__(
            self,
            "input_bytes",
            check_number(self.input_bytes, f"graph {self.name!r}: input_bytes", unit="bytes", error=GraphError),
        )
        object.__setattr__(self, "producers", _resolve_producers(layers, seen, self.name))

    producers: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

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

    def index(self, name: str | int) -> int:
        """Position (0-based) of a layer given by name or index; GraphError if unknown."""
        if isinstance(name, (int, np.integer)) and not isinstance(name, bool):
            if not 0 <= int(name) < self.n:
                raise GraphError(f"layer index {name} is outside 0..{self.n - 1}")
            return int(name)
        found = self._index.get(name) if isinstance(name, str) else None
        if found is None:
            shown = ", ".join(self.names[:12]) + (", ..." if self.n > 12 else "")
            raise GraphError(f"unknown layer {name!r}; layers are: {shown}")
        return found

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
    def is_chain(self) -> bool:
        """True when every layer consumes the previous one only (the first: the input)."""
        return all(p == ((i - 1,) if i else (-1,)) for i, p in enumerate(self.producers))

    @cached_property
    def consumers(self) -> tuple[tuple[int, ...], ...]:
        """The layers consuming each layer's output, in layer order (empty for the last)."""
        out: list[list[int]] = [[] for _ in range(self.n)]
        for c, prods in enumerate(self.producers):
            for p in prods:
                if p >= 0:
                    out[p].append(c)
        return tuple(tuple(x) for x in out)

    @cached_property
    def edge_src(self) -> np.ndarray:
        """Producer of each layer-to-layer edge, ordered by consumer (then input order)."""
        return self._edges[0]

    @cached_property
    def edge_dst(self) -> np.ndarray:
        """Consumer of each layer-to-layer edge (non-decreasing)."""
        return self._edges[1]

    @cached_property
    def _edges(self) -> tuple[np.ndarray, np.ndarray]:
        pairs = [(p, c) for c, prods in enumerate(self.producers) for p in prods if p >= 0]
        src = np.array([p for p, _ in pairs], dtype=np.intp)
        dst = np.array([c for _, c in pairs], dtype=np.intp)
        for arr in (src, dst):
            arr.flags.writeable = False
        return src, dst

    @cached_property
    def input_consumers(self) -> np.ndarray:
        """The layers consuming the graph's input (for a chain: [0])."""
        arr = np.array([c for c, prods in enumerate(self.producers) if -1 in prods], dtype=np.intp)
        arr.flags.writeable = False
        return arr

    @cached_property
    def input_bytes_per_layer(self) -> np.ndarray:
        """Bytes each layer receives: the summed outputs of its inputs (``input_bytes`` for the
        graph's input); for a chain, ``input_bytes`` for layer 1, else the previous output."""
        out = np.concatenate([[self.input_bytes], self.output_bytes])  # index p + 1
        if self.is_chain:
            arr = out[:-1].copy()
        else:
            arr = np.array([sum(out[p + 1] for p in prods) for prods in self.producers], dtype=float)
        arr.flags.writeable = False
        return arr

    @cached_property
    def activation_bytes(self) -> np.ndarray:
        """Largest activation a layer holds: max(its inputs, its output), shape (n,)."""
        arr = np.maximum(self.input_bytes_per_layer, self.output_bytes)
        arr.flags.writeable = False
        return arr

    def _column(self, attr: str) -> np.ndarray:
        arr = np.array([getattr(layer, attr) for layer in self.layers], dtype=float)
        arr.flags.writeable = False
        return arr

    @classmethod
    def from_dict(cls, data: Any, name: str = "graph") -> Graph:
        """Build a graph from the parsed JSON/TOML structure; GraphError on a bad key or value."""
        check_keys(data, f"{name}: graph", GRAPH_KEYS, error=GraphError)
        raw = data["layers"]
        if not isinstance(raw, list):
            raise GraphError(f'{name}: "layers" must be a list of layer objects, got {type(raw).__name__}')
        if not raw:
            raise GraphError(f'{name}: "layers" is empty; a graph needs at least one layer')
        layers = []
        for i, layer in enumerate(raw):
            check_keys(layer, f"{name}: layers[{i}]", LAYER_KEYS, LAYER_KEYS_OPTIONAL, GraphError)
            layers.append(
                LayerSpec(
                    name=layer["name"],
                    flops=layer["flops"],
                    param_bytes=layer["param_bytes"],
                    output_bytes=layer["output_bytes"],
                    inputs=layer.get("inputs"),
                )
            )
        return cls(layers=tuple(layers), input_bytes=data["input_bytes"], name=name)

    def to_dict(self) -> dict[str, Any]:
        """The JSON structure of this graph (round-trips through ``from_dict``); ``inputs``
        only where a layer consumes something other than the previous layer."""
        out = []
        for _i, x in enumerate(self.layers):
            d: dict[str, Any] = {
                "name": x.name,
                "flops": x.flops,
                "param_bytes": x.param_bytes,
                "output_bytes": x.output_bytes,
            }
            if x.inputs is not None:
                d["inputs"] = list(x.inputs)
            out.append(d)
        return {"input_bytes": self.input_bytes, "layers": out}


def _default_inputs(layers: Sequence[LayerSpec], i: int) -> tuple[str, ...]:
    return (layers[i - 1].name,) if i else (INPUT,)


def _resolve_producers(layers: Sequence[LayerSpec], index: dict[str, int], graph: str) -> tuple[tuple[int, ...], ...]:
    """Each layer's producers (-1: the input), after checking that every input exists, the
    graph has no cycle, each layer comes after its inputs, and only the last layer's
    output goes unused. GraphError naming the layer and the fix otherwise."""
    names = [x.name for x in layers]
    listed = [x.inputs if x.inputs is not None else _default_inputs(layers, i) for i, x in enumerate(layers)]
    for i, ins in enumerate(listed):
        for nm in ins:
            if nm != INPUT and nm not in index:
                shown = ", ".join(repr(x) for x in [INPUT, *names[:i]][-12:])
                raise GraphError(
                    f"graph {graph!r}: layer {names[i]!r} lists input {nm!r}, which is no layer of "
                    f"the graph; name a layer listed before it or {INPUT!r} (the graph's input), "
                    f"e.g. one of {shown}"
                )
    producers = tuple(tuple(-1 if nm == INPUT else index[nm] for nm in ins) for ins in listed)
    cycle = _find_cycle(producers)
    if cycle:
        path = " -> ".join(repr(names[c]) for c in cycle)
        raise GraphError(
            f"graph {graph!r} has a cycle: {path} (each consumes the one before it); a graph is "
            f"a DAG: remove one of these inputs"
        )
    for i, prods in enumerate(producers):
        late = [p for p in prods if p > i]
        if late:
            raise GraphError(
                f"graph {graph!r}: layer {names[i]!r} consumes {names[late[0]]!r}, which is listed "
                f"after it; list the layers in an order where each comes after its inputs "
                f"(a topological order): move {names[late[0]]!r} before {names[i]!r}"
            )
    used = {p for prods in producers for p in prods}
    unused = [names[i] for i in range(len(layers) - 1) if i not in used]
    if unused:
        raise GraphError(
            f"graph {graph!r}: the output of layer {unused[0]!r} goes to no layer, and only the "
            f"last layer ({names[-1]!r}) sends its output to the sink; make a later layer consume "
            f"it, move it last, or remove it"
        )
    return producers


def _find_cycle(producers: Sequence[Sequence[int]]) -> list[int]:
    """A cycle (each layer consuming the one before it, first = last) or []."""
    state = [0] * len(producers)  # 0 new, 1 on the current path, 2 done
    for start in range(len(producers)):
        if state[start]:
            continue
        path, stack = [start], [iter(producers[start])]
        state[start] = 1
        while stack:
            nxt = next((p for p in stack[-1] if p >= 0 and state[p] != 2), None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state[nxt] == 1:
                cyc = path[path.index(nxt) :] + [nxt]
                return cyc[::-1]  # producer first
            else:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(producers[nxt]))
    return []


def graph_from_model(model: Any, batch: int = 1) -> Graph:
    """The layer graph of a model (a ``Sequential``, or a graph model whose ``layer_stats``
    name each node's ``inputs``) for ``batch`` examples. Raises GraphError for a bad batch
    or a model whose nodes do not form a graph (see ``Graph``)."""
    stats = model.layer_stats(check_count(batch, "batch", error=GraphError))
    # a model's named inputs (token ids and an attention mask) all arrive from the source: the graph's input
    named = set(getattr(model, "input_names", ()))

    def sources(s: Any) -> tuple[str, ...] | None:
        listed = [INPUT if n in named else n for n in (getattr(s, "inputs", ()) or ())]
        return tuple(dict.fromkeys(listed)) or None

    layers = tuple(
        LayerSpec(name=s.name, flops=s.flops, param_bytes=s.param_bytes, output_bytes=s.output_bytes, inputs=sources(s))
        for s in stats
    )
    name = getattr(model, "name", "model")
    return Graph(layers=layers, input_bytes=model.input_bytes(int(batch)), name=f"{name}(batch={int(batch)})")


def _graphs_dir() -> Path:
    return Path(str(resources.files("multigpu.partition.inputs").joinpath("graphs")))


def shipped_graphs() -> list[str]:
    """Names of the graph files shipped with the package (``load_graph(name)``)."""
    d = _graphs_dir()
    return sorted(p.stem for p in d.iterdir() if p.suffix == ".json") if d.is_dir() else []


def load_graph(path: str | os.PathLike[str], batch: int = 1) -> Graph:
    """Read a graph from a ``.json``/``.toml`` file, or build it from a built-in model name or an
    ONNX model (``.onnx``, imported with ``from_onnx``), or read a shipped graph file by name
    (``shipped_graphs()``).

    A built-in model name (``lenet``, ``alexnet``) wins over a file of the same name, and
    an existing file over a shipped graph; write ``./alexnet`` to force the file.
    ``batch`` only applies to built-in models and ONNX files (a graph file states its own batch).
    Raises GraphError for a missing or malformed file and any bad key or value.
    """
    from multigpu import models  # local: models pulls in the layer specs only when needed

    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if text is None:
        raise GraphError(f"graph must be a file path or a model name, got {type(path).__name__}")
    if text in models.MODELS:
        return graph_from_model(models.get(text), batch)
    p = Path(text)
    if not p.exists() and text in shipped_graphs():
        p = _graphs_dir() / f"{text}.json"
    if not p.exists():
        raise GraphError(
            f"no graph file {text!r}; give a path to a .json/.toml graph file, a built-in "
            f"model name ({', '.join(sorted(models.MODELS))}) or a shipped graph "
            f"({', '.join(shipped_graphs()) or 'none'})"
        )
    if p.is_dir():
        raise GraphError(f"graph path {text!r} is a directory; give a .json or .toml file")
    if p.suffix.lower() == ".onnx":  # an ONNX model, imported at this batch (multigpu.models.from_onnx)
        return graph_from_model(models.from_onnx(p, batch=batch).model, batch)
    if p.suffix.lower() not in (".json", ".toml"):
        raise GraphError(
            f"graph file {text!r} has suffix {p.suffix or '(none)'!r}; graphs are JSON or TOML "
            f"files named .json or .toml"
        )
    return Graph.from_dict(read_structured_file(p, "graph", GraphError), name=p.stem)
