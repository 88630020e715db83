"""``Model``: a network as a DAG of named nodes, with shape inference, accounting, init and a runner.

A model is built from blocks composed as in torch, Gluon or Paddle
(``multigpu.models.blocks``: a list is a chain, ``Residual`` a main path plus a
shortcut, ``Parallel`` branches joined by add or concat), or from explicit nodes
(:meth:`Model.from_nodes`), each naming the nodes it consumes (``"input"`` is the
model's input). A model may have several named inputs (``Input``: token ids and an
attention mask, say), and any node may consume any of them. Either way it becomes one
list of nodes in one topological order:

* parameters are listed node by node in that order (for ResNet-18: the order of
  torchvision's ``named_parameters()``), and so is the state (BatchNorm's running mean,
  then running variance, per BatchNorm node: torchvision's buffer order without the
  batch counter);
* ``layer_stats`` gives each node's shapes, FLOPs, parameter and output bytes, and
  the names of its inputs: the layer graph the planner prices;
* ``run`` runs any subset of nodes (a stage) given the tensors it consumes, and
  ``apply`` runs the whole model on several replicas in lockstep, which synchronized
  BatchNorm needs (every device's forward meets at each BatchNorm node).

Both take a ``RunContext`` (``multigpu.models.context``) for the layers that read one:
dropout (training or inference, its seed and step) and layers that need a constant on
the replica's device (a causal mask).

A model never imports a framework: a backend walks it.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from math import prod
from typing import Any, cast

import numpy as np

from multigpu.errors import ModelError, ParamsError
from multigpu.models.batchnorm import BatchNormMode, RunningStatistics
from multigpu.models.blocks import flatten
from multigpu.models.context import RunContext
from multigpu.models.layers import INIT_SCHEMES, BatchNorm2d, ContextLayer, JoinLayer, Layer, Shape
from multigpu.models.node import INPUT, Input, Node

BYTES_PER_VALUE = 4  # float32 everywhere


@dataclass(frozen=True)
class LayerStats:
    """Per-node accounting for a given batch: the layer graph the cost model uses.

    ``inputs`` names the nodes whose outputs this node consumes (or the model's inputs,
    ``"input"`` for a one-input model); ``input_shape`` is the first one's shape.
    """

    name: str
    kind: str
    input_shape: Shape
    output_shape: Shape
    params: int
    param_bytes: int
    macs: int
    flops: int
    output_bytes: int
    inputs: tuple[str, ...] = field(default=())


def _check_names(nodes: Sequence[Node], model: str, input_names: Sequence[str]) -> None:
    seen: set[str] = set()
    for node in nodes:
        if not isinstance(node, Node):
            raise ModelError(f"model {model!r}: {node!r} is not a Node; use Node(name, layer, inputs)")
        if not isinstance(node.name, str) or not node.name:
            raise ModelError(f"model {model!r}: a node has the name {node.name!r}; give every node a non-empty name")
        if node.name in input_names:
            raise ModelError(
                f"model {model!r}: no node may be called {node.name!r}, the name of a model input; rename it"
            )
        if node.name in seen:
            raise ModelError(f"model {model!r}: two nodes are called {node.name!r}; give each node its own name")
        seen.add(node.name)
        if not isinstance(node.layer, Layer):
            raise ModelError(f"model {model!r}: node {node.name!r} holds {node.layer!r}, which is not a layer spec")
        inputs = node.inputs
        if isinstance(inputs, str) or not isinstance(inputs, (tuple, list)) or not inputs:
            raise ModelError(
                f"model {model!r}: node {node.name!r} has inputs {inputs!r}; give a tuple of node "
                f"names, e.g. ({INPUT!r},)"
            )
        join = isinstance(node.layer, JoinLayer)
        if isinstance(node.layer, ContextLayer):
            low, high = node.layer.min_inputs, node.layer.max_inputs
            if not low <= len(inputs) <= high:
                raise ModelError(
                    f"model {model!r}: node {node.name!r} ({node.layer.kind}) takes {low}..{high} inputs "
                    f"(its main input first), got {list(inputs)}"
                )
        elif join and len(inputs) < 2:
            raise ModelError(
                f"model {model!r}: node {node.name!r} ({node.layer.kind}) joins branches and needs at "
                f"least 2 inputs, got {list(inputs)}"
            )
        elif not join and len(inputs) != 1:
            raise ModelError(
                f"model {model!r}: node {node.name!r} ({node.layer.kind}) takes one input, got "
                f"{list(inputs)}; join branches first with an Add or Concat node"
            )
        if len(set(inputs)) != len(inputs):
            raise ModelError(f"model {model!r}: node {node.name!r} lists an input twice: {list(inputs)}")


def _find_cycle(pending: dict[str, Node]) -> list[str]:
    """One cycle among nodes that a topological sort could not place (each has a pending input)."""
    start = next(iter(pending))
    path, where = [start], {start: 0}
    while True:
        nxt = next(n for n in pending[path[-1]].inputs if n in pending)
        if nxt in where:
            return path[where[nxt] :] + [nxt]
        where[nxt] = len(path)
        path.append(nxt)


def _topological(nodes: Sequence[Node], model: str, input_names: Sequence[str]) -> list[Node]:
    """The nodes in a topological order, as close to the given order as possible (stable Kahn)."""
    names = {node.name for node in nodes}
    for node in nodes:
        for inp in node.inputs:
            if inp not in input_names and inp not in names:
                raise ModelError(
                    f"model {model!r}: node {node.name!r} consumes {inp!r}, which is neither a node "
                    f"nor {' or '.join(map(repr, input_names))} (a model input); check the spelling or add that node"
                )
    position = {node.name: i for i, node in enumerate(nodes)}
    waiting = {node.name: sum(inp not in input_names for inp in node.inputs) for node in nodes}
    consumers: dict[str, list[str]] = {}
    for node in nodes:
        for inp in node.inputs:
            consumers.setdefault(inp, []).append(node.name)
    ready = [position[n.name] for n in nodes if waiting[n.name] == 0]
    heapq.heapify(ready)
    order: list[Node] = []
    while ready:
        node = nodes[heapq.heappop(ready)]
        order.append(node)
        for c in consumers.get(node.name, []):
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(ready, position[c])
    if len(order) < len(nodes):
        placed = {n.name for n in order}
        cycle = _find_cycle({n.name: n for n in nodes if n.name not in placed})
        raise ModelError(
            f"model {model!r}: nodes {' -> '.join(reversed(cycle))} form a cycle; a model is a DAG: "
            "make one of them consume an earlier node instead"
        )
    return order


def _input_specs(input_shape: Sequence[int] | None, inputs: Sequence[Input] | None, name: str) -> list[Input]:
    """The model's input specs from either ``input_shape`` (one float32 input called ``"input"``) or ``inputs``."""
    if inputs is None:
        if input_shape is None:
            raise ModelError(f"model {name!r}: give input_shape, e.g. (1, 28, 28), or inputs=[Input(...), ...]")
        try:
            shape = tuple(int(s) for s in input_shape)
        except (TypeError, ValueError):
            shape = ()
        if not shape or min(shape) < 1:
            raise ModelError(f"model {name!r}: input_shape={input_shape!r} must be positive dims, e.g. (1, 28, 28)")
        return [Input(INPUT, shape)]
    if input_shape is not None:
        raise ModelError(f"model {name!r}: give input_shape or inputs, not both (inputs carry their shapes)")
    specs = list(inputs)
    if not specs or any(not isinstance(spec, Input) for spec in specs):
        raise ModelError(
            f"model {name!r}: inputs={inputs!r} must be a non-empty list of Input(name, shape, dtype), "
            "e.g. [Input('input_ids', (128,), 'int64')]"
        )
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ModelError(f"model {name!r}: two inputs share a name in {names}; give each its own")
    return specs


class Model:
    """A network as a DAG of named nodes on inputs of per-example shape ``input_shape``.

    A model with several inputs, or with integer ones, names them in ``inputs`` (a list of
    ``Input(name, shape, dtype)``, the first the main one) instead of ``input_shape``; nodes
    consume them by name. ``input_shape`` is then the first input's shape.

    ``body`` is a layer, a block or a list (a chain) of them, composed as in torch
    (see ``multigpu.models.blocks``). ``init`` picks the init of ``init_params``:
    ``"he"`` (He init for convolutions, torch's Linear default for dense layers) or
    ``"textbook"`` (N(0, scale^2) weights, zero biases); BatchNorm always starts at
    gamma = 1, beta = 0. Raises ModelError naming the node for a spec that does not
    fit together (wrong joins, duplicate names, shapes).
    """

    def __init__(
        self,
        body: Any,
        input_shape: Sequence[int] | None = None,
        name: str = "model",
        init: str = "he",
        *,
        inputs: Sequence[Input] | None = None,
    ):
        specs = _input_specs(input_shape, inputs, name)
        self._setup(flatten(body, name, specs[0].name), specs, name, init, None)

    @classmethod
    def from_nodes(
        cls,
        nodes: Sequence[Node | tuple],
        input_shape: Sequence[int] | None = None,
        name: str = "model",
        output: str | None = None,
        init: str = "he",
        *,
        inputs: Sequence[Input] | None = None,
        init_scale: float | None = None,
    ) -> Model:
        """A model from explicit nodes (``Node`` or ``(name, layer, inputs)`` tuples) in any order.

        ``output`` names the node whose output is the model's (default: the last one
        listed). Raises ModelError naming the node for an unknown input, a cycle, a
        node whose output nothing uses, a duplicate name or a wrong join.
        ``inputs`` names several (or integer) model inputs, as in the constructor; ``init_scale``
        is the textbook scheme's default weight standard deviation (0.01 unless given).
        """
        listed = [Node(n[0], n[1], tuple(n[2])) if isinstance(n, tuple) and len(n) == 3 else n for n in nodes]
        model = cls.__new__(cls)
        model._setup(
            cast(list[Node], listed), _input_specs(input_shape, inputs, name), name, init, output, init_scale
        )  # _check_names rejects the rest
        return model

    # -- construction ----------------------------------------------------------
    def _setup(
        self,
        nodes: Sequence[Node],
        inputs: Sequence[Input],
        name: str,
        init: str,
        output: str | None,
        init_scale: float | None = None,
    ) -> None:
        if init not in INIT_SCHEMES:
            raise ModelError(f"init={init!r} is unknown; use one of {list(INIT_SCHEMES)}")
        if not nodes:
            raise ModelError(f"model {name!r} has no nodes; give it at least one layer")
        if init_scale is not None and not (isinstance(init_scale, (int, float)) and 0 < init_scale < float("inf")):
            raise ModelError(f"init_scale={init_scale!r} must be a finite number > 0, e.g. 0.02")
        self.name, self.init = name, init
        self.init_scale = 0.01 if init_scale is None else float(init_scale)
        self.inputs: dict[str, Input] = {spec.name: spec for spec in inputs}
        self.input_names: tuple[str, ...] = tuple(self.inputs)
        self.input_shape: Shape = inputs[0].shape
        _check_names(nodes, name, self.input_names)
        self.output = nodes[-1].name if output is None else output
        order = _topological(nodes, name, self.input_names)
        if self.output not in {n.name for n in order}:
            raise ModelError(f"model {name!r}: output={self.output!r} is no node; name one of its nodes")
        self.nodes: list[Node] = order
        self.index = {node.name: i for i, node in enumerate(order)}
        self.consumers: dict[str, list[str]] = {n.name: [] for n in order}
        for inp in self.input_names:
            self.consumers[inp] = []
        for node in order:
            for inp in node.inputs:
                self.consumers[inp].append(node.name)
        unused = [n.name for n in order if not self.consumers[n.name] and n.name != self.output]
        if unused:
            raise ModelError(
                f"model {name!r}: the output of node(s) {unused} is used by no node and is not the "
                f"model's output ({self.output!r}); connect them or remove them"
            )
        idle = [inp for inp in self.input_names if not self.consumers[inp]]
        if idle:
            raise ModelError(
                f"model {name!r}: no node consumes the model input(s) {idle}; name them in a node's inputs "
                "or leave them out of inputs"
            )
        if self.index[self.output] != len(order) - 1:  # nodes after the output feed nothing that counts
            later = [n.name for n in order[self.index[self.output] + 1 :]]
            raise ModelError(f"model {name!r}: node(s) {later} do not lead to the output {self.output!r}; remove them")
        self._infer_shapes()

    def _infer_shapes(self) -> None:
        shapes: dict[str, Shape] = {n: spec.shape for n, spec in self.inputs.items()}
        self._param_shapes: list[list[Shape]] = []
        self._state_shapes: list[list[Shape]] = []
        for node in self.nodes:
            ins = [shapes[n] for n in node.inputs]
            try:
                if isinstance(node.layer, JoinLayer):
                    out = node.layer.join_shape(ins)
                    pshapes, sshapes = [], []
                else:
                    if isinstance(node.layer, ContextLayer):
                        node.layer.check_inputs(ins)
                    out = node.layer.output_shape(ins[0])
                    pshapes, sshapes = node.layer.param_shapes(ins[0]), node.layer.state_shapes(ins[0])
            except ModelError as exc:
                sources = ", ".join(f"{n!r} {shapes[n]}" for n in node.inputs)
                raise ModelError(
                    f"model {self.name!r}: node {node.name!r} ({node.layer.kind}, inputs {sources}): {exc}"
                ) from None
            shapes[node.name] = out
            self._param_shapes.append(pshapes)
            self._state_shapes.append(sshapes)
        self.shapes = shapes
        self.output_shape: Shape = shapes[self.output]
        self._param_offsets = [int(o) for o in np.cumsum([0] + [len(p) for p in self._param_shapes])]
        self._state_offsets = [int(o) for o in np.cumsum([0] + [len(s) for s in self._state_shapes])]
        self.batch_norms = [i for i, n in enumerate(self.nodes) if isinstance(n.layer, BatchNorm2d)]
        self._bn_number = {i: k for k, i in enumerate(self.batch_norms)}
        last = {inp: -1 for inp in self.input_names}
        for i, node in enumerate(self.nodes):
            for inp in node.inputs:
                last[inp] = i
        self._last_use = last

    # -- what it is ------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.nodes)

    def __repr__(self) -> str:
        if len(self.inputs) == 1 and INPUT in self.inputs:
            return f"{type(self).__name__}({self.name!r}, {len(self)} nodes, input {self.input_shape})"
        shown = ", ".join(f"{s.name} {s.shape} {s.dtype}" for s in self.inputs.values())
        return f"{type(self).__name__}({self.name!r}, {len(self)} nodes, inputs {shown})"

    @property
    def layers(self) -> list[tuple[str, Layer]]:
        """``(name, layer)`` of every node, in order."""
        return [(n.name, n.layer) for n in self.nodes]

    @property
    def param_shapes(self) -> list[Shape]:
        """Shapes of all parameters, in model order."""
        return [s for shapes in self._param_shapes for s in shapes]

    @property
    def state_shapes(self) -> list[Shape]:
        """Shapes of the state (running mean, running variance per BatchNorm node), in order."""
        return [s for shapes in self._state_shapes for s in shapes]

    @property
    def num_classes(self) -> int:
        """Width of the output (the number of classes for a classifier)."""
        return prod(self.output_shape)

    def num_params(self) -> int:
        """Total number of scalar parameters."""
        return sum(prod(s) for s in self.param_shapes)

    def input_bytes(self, batch: int = 1, name: str | None = None) -> int:
        """Bytes of one batch of the input ``name`` (default: of every input together)."""
        specs = self.inputs.values() if name is None else [self.inputs[name]]
        return sum(batch * prod(spec.shape) * spec.itemsize for spec in specs)

    def param_names(self) -> list[str]:
        """``node.index`` names of the parameters in order (e.g. ``layer1.0.conv1.0``)."""
        return [f"{node.name}.{j}" for node, shapes in zip(self.nodes, self._param_shapes) for j in range(len(shapes))]

    def param_keys(self) -> list[str]:
        """``node.label`` names of the parameters in order (``encoder.layer.0.attention.self.query.weight``):
        the names torch's ``named_parameters()`` gives the same network where the node names follow it."""
        out = []
        for node, shapes in zip(self.nodes, self._param_shapes):
            if shapes:
                out += [f"{node.name}.{label}" for label in node.layer.param_labels(self.shapes[node.inputs[0]])]
        return out

    def torch_layouts(self) -> list[bool]:
        """Per parameter, True where torch stores it transposed (a dense weight: (out, in))."""
        return [
            label in node.layer.torch_transposed
            for node, shapes in zip(self.nodes, self._param_shapes)
            if shapes
            for label in node.layer.param_labels(self.shapes[node.inputs[0]])
        ]

    def min_training_examples(self) -> dict[str, int]:
        """Per BatchNorm node, the fewest examples one batch needs in training mode (2 when
        its input is 1x1: one value per channel has no variance)."""
        return {
            self.nodes[i].name: 2 if prod(self.shapes[self.nodes[i].inputs[0]][1:]) == 1 else 1
            for i in self.batch_norms
        }

    def layer_stats(self, batch: int = 1) -> list[LayerStats]:
        """Per-node FLOPs, parameter bytes, output-activation bytes and inputs for ``batch``."""
        if batch < 1:
            raise ModelError(f"batch={batch} must be >= 1")
        stats = []
        for node, pshapes in zip(self.nodes, self._param_shapes):
            ins = [self.shapes[n] for n in node.inputs]
            out = self.shapes[node.name]
            layer = node.layer
            if isinstance(layer, JoinLayer):
                macs, flops = 0, layer.join_flops(ins)
            else:
                macs, flops = layer.macs(ins[0]), layer.flops(ins[0])
            n = sum(prod(s) for s in pshapes)
            stats.append(
                LayerStats(
                    name=node.name,
                    kind=layer.kind,
                    input_shape=ins[0],
                    output_shape=out,
                    params=n,
                    param_bytes=n * BYTES_PER_VALUE,
                    macs=batch * macs,
                    flops=batch * flops,
                    output_bytes=batch * prod(out) * BYTES_PER_VALUE,
                    inputs=tuple(node.inputs),
                )
            )
        return stats

    # -- parameters and state ----------------------------------------------------
    def init_params(self, seed: int = 0, scale: float | None = None) -> list[np.ndarray]:
        """Return float32 parameters drawn with the model's init scheme from ``seed``
        (``scale`` is the textbook scheme's weight standard deviation; default the model's
        ``init_scale``: 0.01, or BERT's 0.02 for the text models)."""
        scale = self.init_scale if scale is None else scale
        rng = np.random.default_rng(seed)
        out: list[np.ndarray] = []
        for node in self.nodes:
            if not isinstance(node.layer, JoinLayer):
                out += node.layer.init_params(rng, self.shapes[node.inputs[0]], self.init, scale)
        return out

    def init_state(self) -> list[np.ndarray]:
        """Return the initial state: running mean 0 and variance 1 per BatchNorm node."""
        out: list[np.ndarray] = []
        for i in self.batch_norms:
            node = self.nodes[i]
            out += node.layer.init_state(self.shapes[node.inputs[0]])
        return out

    def _describe_param(self, i: int) -> str:
        for k, node in enumerate(self.nodes):
            if self._param_offsets[k] <= i < self._param_offsets[k + 1]:
                j = i - self._param_offsets[k]
                if node.layer.kind in ("conv2d", "dense"):
                    what = ["weight", "bias"]
                elif node.layer.kind == "batch_norm2d":
                    what = ["gamma", "beta"]
                else:
                    what = node.layer.param_labels(self.shapes[node.inputs[0]])
                return f"node {node.name!r}'s {what[j] if j < len(what) else f'parameter {j}'}"
        return "no node"

    def _check_arrays(self, arrays: Any, expected: list[Shape], what: str, describe: Any) -> list[np.ndarray]:
        if not isinstance(arrays, (list, tuple)):
            raise ParamsError(f"{what} must be a list of numpy arrays, got {type(arrays).__name__}")
        if len(arrays) != len(expected):
            raise ParamsError(
                f"{what} has {len(arrays)} arrays but {self.name} needs {len(expected)} with shapes {expected}"
            )
        out = []
        for i, (p, shape) in enumerate(zip(arrays, expected)):
            arr = np.asarray(p)
            if arr.shape != shape:
                raise ParamsError(f"{what}[{i}] has shape {arr.shape}; {describe(i)} of {self.name} needs {shape}")
            if not np.issubdtype(arr.dtype, np.floating):
                raise ParamsError(f"{what}[{i}] has dtype {arr.dtype}; pass floating-point arrays")
            if not np.all(np.isfinite(arr)):
                raise ParamsError(f"{what}[{i}] ({describe(i)}) contains NaN or infinity")
            out.append(arr.astype(np.float32, copy=True))
        return out

    def check_params(self, params: Sequence[Any]) -> list[np.ndarray]:
        """Return ``params`` as float32 numpy arrays; raise ParamsError naming the node on a mismatch."""
        return self._check_arrays(params, self.param_shapes, "params", self._describe_param)

    def check_state(self, state: Sequence[Any]) -> list[np.ndarray]:
        """Return the BatchNorm state as float32 arrays; raise ParamsError naming the node on a mismatch."""

        def describe(i: int) -> str:
            return f"node {self.nodes[self.batch_norms[i // 2]].name!r}'s running {('mean', 'variance')[i % 2]}"

        out = self._check_arrays(state, self.state_shapes, "state", describe)
        for i in range(1, len(out), 2):
            if (out[i] < 0).any():
                raise ParamsError(f"state[{i}] ({describe(i)}) holds a negative variance; a variance is >= 0")
        return out

    def node_params(self, params: Sequence[Any], index: int) -> Sequence[Any]:
        """Return the slice of the flat ``params`` list that node ``index`` owns."""
        return params[self._param_offsets[index] : self._param_offsets[index + 1]]

    layer_params = node_params  # the name the chain-era callers use

    # -- running -----------------------------------------------------------------
    def _feeds(self, x: Any) -> dict[str, Any]:
        """A replica's feeds from its input: a tensor (a one-input model's) or ``{input name: tensor}``."""
        if isinstance(x, Mapping):
            unknown = [k for k in x if k not in self.inputs]
            missing = [k for k in self.input_names if k not in x]
            if unknown or missing:
                raise ModelError(
                    f"model {self.name!r} takes the inputs {list(self.input_names)}; the feeds "
                    + (f"name unknown {unknown}" if unknown else f"lack {missing}")
                )
            return dict(x)
        if len(self.input_names) != 1:
            raise ModelError(
                f"model {self.name!r} takes several inputs {list(self.input_names)}: pass each replica's "
                "feeds as a dict {name: tensor}"
            )
        return {self.input_names[0]: x}

    def apply(
        self,
        backend: Any,
        params: Sequence[Sequence[Any]],
        xs: Sequence[Any],
        bn: BatchNormMode | None = None,
        context: RunContext | None = None,
    ) -> list[Any]:
        """Run the whole model on every replica in lockstep; return each replica's output.

        ``params[r]`` and ``xs[r]`` are replica r's parameter list and input batch (a
        tensor, or ``{input name: tensor}`` for a model with several inputs).
        ``bn`` says how BatchNorm nodes get their statistics (ModelError when the model
        has BatchNorm and none is given); ``context`` says whether dropout is on, with which
        seed and step, and on which device each replica runs (default: inference).
        """
        envs = [self._feeds(x) for x in xs]
        self._execute(backend, params, envs, range(len(self.nodes)), bn, keep={self.output}, context=context)
        return [env[self.output] for env in envs]

    def run(
        self,
        backend: Any,
        params: Sequence[Any],
        feeds: Mapping[str, Any],
        nodes: Sequence[str] | None = None,
        *,
        state: Sequence[Any] | None = None,
        bn: BatchNormMode | None = None,
        outputs: Sequence[str] | None = None,
        context: RunContext | None = None,
    ) -> dict[str, Any]:
        """Run a stage: the nodes named in ``nodes`` (default: every node), given ``feeds``,
        the tensors of the nodes outside it that it consumes (the model's inputs by name,
        ``"input"`` for a one-input model's). ``context`` is the run's context (see ``apply``).

        ``params`` is the model's full parameter list (entries the stage does not use may
        be None). BatchNorm nodes normalize with ``state`` (the running statistics, in
        state order) unless ``bn`` gives another mode. Returns ``{name: tensor}`` for
        ``outputs`` (default: the stage's nodes that nodes outside it, or the model's
        output, consume). Raises ModelError for an unknown node or a missing feed.
        """
        if nodes is None:
            stage = list(range(len(self.nodes)))
        else:
            unknown = [n for n in nodes if n not in self.index]
            if unknown:
                raise ModelError(
                    f"model {self.name!r} has no node(s) {unknown}; its nodes are {list(self.index)[:8]}..."
                )
            stage = sorted({self.index[n] for n in nodes})
        inside = {self.nodes[i].name for i in stage}
        needed = sorted({inp for i in stage for inp in self.nodes[i].inputs if inp not in inside})
        missing = [n for n in needed if n not in feeds]
        if missing:
            raise ModelError(
                f"model {self.name!r}: the stage consumes {missing}, which it does not compute; "
                f"pass their tensors in feeds (it needs {needed})"
            )
        if outputs is None:
            outputs = [n for n in inside if n == self.output or any(c not in inside for c in self.consumers[n])]
        else:
            absent = [n for n in outputs if n not in inside and n not in feeds]
            if absent:
                raise ModelError(f"model {self.name!r}: outputs {absent} are not computed by the stage")
        if bn is None and any(i in self._bn_number for i in stage):
            if state is None:
                raise ModelError(
                    f"model {self.name!r} has BatchNorm: pass state= (its running statistics, "
                    "e.g. model.init_state() or DataParallel.get_state()) or a BatchNorm mode"
                )
            bn = RunningStatistics([state])
        env = {k: feeds[k] for k in needed}
        self._execute(backend, [params], [env], stage, bn, keep=set(outputs), context=context)
        return {n: env[n] if n in env else feeds[n] for n in outputs}

    def forward(
        self,
        backend: Any,
        params: Sequence[Any],
        x: Any,
        start: int = 0,
        stop: int | None = None,
        *,
        state: Sequence[Any] | None = None,
        context: RunContext | None = None,
    ) -> Any:
        """Run nodes ``start..stop-1`` on ``x`` (inference) and return the last one's output.

        The slice must be a chain cut: it consumes only ``x`` (the output of node
        ``start - 1``, or the model's input; from the start, a model with several inputs
        takes ``{input name: tensor}``) and nothing after it consumes a node inside it but
        the last; else ModelError (run such a stage with ``run``).
        """
        stop = len(self.nodes) if stop is None else stop
        if not 0 <= start < stop <= len(self.nodes):
            raise ModelError(f"layer slice {start}:{stop} is outside 0:{len(self.nodes)}")
        feeds = self._feeds(x) if start == 0 else {self.nodes[start - 1].name: x}
        names = [self.nodes[i].name for i in range(start, stop)]
        result = self.run(backend, params, feeds, names, state=state, outputs=[names[-1]], context=context)
        return result[names[-1]]

    def _execute(
        self,
        backend: Any,
        params: Sequence[Sequence[Any]],
        envs: list[dict[str, Any]],
        stage: Sequence[int],
        bn: BatchNormMode | None,
        keep: set[str],
        context: RunContext | None = None,
    ) -> None:
        """Run the nodes ``stage`` (ascending) on every replica's environment; drop each tensor
        after its last use (unless kept), so inference holds few activations at a time."""
        if context is None:
            context = RunContext()  # inference: no dropout; a fresh one, so constants never outlive a run
        elif not isinstance(context, RunContext):
            raise ModelError(f"context={context!r} is not a RunContext; pass multigpu.models.RunContext(...)")
        for i in stage:
            node = self.nodes[i]
            layer = node.layer
            if isinstance(layer, BatchNorm2d):
                if bn is None:
                    raise ModelError(
                        f"model {self.name!r} has BatchNorm (node {node.name!r}): pass a BatchNorm "
                        "mode (running statistics for inference, batch statistics for training)"
                    )
                ys = bn(
                    backend,
                    self._bn_number[i],
                    layer,
                    [env[node.inputs[0]] for env in envs],
                    [self.node_params(p, i) for p in params],
                )
            elif isinstance(layer, JoinLayer):
                ys = [layer.join(backend, [env[n] for n in node.inputs]) for env in envs]
            elif isinstance(layer, ContextLayer):
                ys = [
                    layer.call(backend, self.node_params(p, i), [env[n] for n in node.inputs], context.at(i, r))
                    for r, (p, env) in enumerate(zip(params, envs))
                ]
            else:
                ys = [
                    layer.forward(backend, self.node_params(p, i), env[node.inputs[0]]) for p, env in zip(params, envs)
                ]
            for env, y in zip(envs, ys):
                env[node.name] = y
                for inp in node.inputs:
                    if self._last_use[inp] == i and inp not in keep:
                        env.pop(inp, None)
