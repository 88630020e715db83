"""From an ONNX graph to a ``Model``: fold what the input shapes fix, translate what runs.

Every value of the ONNX graph is one of three kinds:

* a **constant**: a ``Constant`` node, an integer initializer, a shape, or anything computed
  from constants alone (shape subgraphs: Shape, Gather, Unsqueeze, Concat, ConstantOfShape,
  Range, ...). It is folded with NumPy (``multigpu.models.onnx_numpy``) for the given input shapes.
* a **parameter**: a floating-point initializer, or what an op computes from parameters and
  constants alone (torch's pre-transposed ``MatMul`` weights, a slice of a position table).
  That is folded too, and the folded tensor is the trainable parameter of the node that
  consumes it (a Transpose of a weight becomes the weight, stored transposed). A parameter
  that two run-time nodes consume is copied into each (untied); one-element parameters in
  arithmetic are constants.
* a **run-time value**: anything computed from a model input. Each ONNX node that makes one
  becomes a node of the ``Model`` (``onnx_layers``), or none at all (Identity, a same-type Cast).

Shapes are static: the importer works at the given input shapes. When every input's batch
axis is dynamic in the file, it folds the graph a second time at the next batch and keeps the
reshape targets and constants as functions of the batch, so the model runs at any batch;
otherwise the model runs at the given batch only (``OnnxImport.batch``).

``builder`` holds the walk of one fold and its bookkeeping; each run-time op's translation is a
``_t_<Op>`` method in ``math_ops``, ``nn_ops`` or ``shape_ops``, joined here in ``_Builder``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from math import prod
from typing import Any, Literal

import numpy as np

from multigpu.errors import OnnxError
from multigpu.models.layers import BatchNorm2d
from multigpu.models.node import Input, Node

# RUNTIME_OPS and SUPPORTED_OPS are imported from here too (the package __init__, the node tests)
from multigpu.models.onnx_import.builder import RUNTIME_OPS, SUPPORTED_OPS, Value, _Pass  # noqa: F401
from multigpu.models.onnx_import.load import load_model, need_onnx, opset_version
from multigpu.models.onnx_import.math_ops import MathOps
from multigpu.models.onnx_import.nn_ops import NNOps
from multigpu.models.onnx_import.shape_ops import ShapeOps
from multigpu.models.onnx_layers import GroupMember, OnnxGroup, OnnxOp
from multigpu.models.onnx_numpy import numpy_dtype


class _Builder(MathOps, NNOps, ShapeOps):
    """One fold of an ONNX graph at given full input shapes, with every op's translation."""


def _resolve_shapes(
    proto: Any, given: Any, inits: set[str], batch: int | None = None
) -> tuple[dict[str, tuple[int, ...]], dict[str, Any], bool]:
    """Each graph input's full shape and dtype, and whether every input's batch axis is dynamic
    (``batch`` fills a dynamic axis 0 of an input that ``given`` leaves out)."""
    inputs = [i for i in proto.graph.input if i.name not in inits]
    if not inputs:
        raise OnnxError("the ONNX graph has no inputs (only initializers); there is nothing to run it on")
    if given is not None and not isinstance(given, Mapping):
        if len(inputs) != 1:
            raise OnnxError(
                f"the graph has {len(inputs)} inputs {[i.name for i in inputs]}: give input_shapes as a dict "
                "{name: shape}"
            )
        given = {inputs[0].name: given}
    given = dict(given or {})
    unknown = [k for k in given if k not in {i.name for i in inputs}]
    if unknown:
        raise OnnxError(
            f"input_shapes names {unknown}, which are not graph inputs; the inputs are {[i.name for i in inputs]}"
        )
    shapes, dtypes, dynamic = {}, {}, True
    for inp in inputs:
        ttype = inp.type.tensor_type
        if not inp.type.HasField("tensor_type"):
            raise OnnxError(f"input {inp.name!r} is not a tensor (sequences and maps are not supported)")
        dtype = np.dtype(numpy_dtype(ttype.elem_type))
        if dtype.kind not in "fiub":
            raise OnnxError(f"input {inp.name!r} has dtype {dtype}; inputs are float or integer tensors")
        dims = list(ttype.shape.dim) if ttype.HasField("shape") else None
        want = given.get(inp.name)
        if want is not None:
            try:
                want = tuple(int(d) for d in want)
            except (TypeError, ValueError):
                raise OnnxError(f"input_shapes[{inp.name!r}]={want!r} must be a tuple of ints") from None
            if any(d < 1 for d in want):
                raise OnnxError(f"input_shapes[{inp.name!r}]={want} must be positive dims")
            if dims is not None and len(dims) != len(want):
                raise OnnxError(f"input {inp.name!r} has rank {len(dims)} but input_shapes gives {want}")
            for k, (d, w) in enumerate(zip(dims or [], want)):
                if d.HasField("dim_value") and d.dim_value != w:
                    raise OnnxError(
                        f"input {inp.name!r} fixes axis {k} to {d.dim_value} but input_shapes gives {w}; "
                        f"give {d.dim_value} (or export with that axis dynamic)"
                    )
        else:
            if dims is None:
                raise OnnxError(
                    f"input {inp.name!r} has no shape in the file; pass input_shapes={{{inp.name!r}: (...)}}"
                )
            bad = [k for k, d in enumerate(dims) if not d.HasField("dim_value") and not (k == 0 and batch)]
            if bad:
                names = [dims[k].dim_param or "?" for k in bad]
                raise OnnxError(
                    f"input {inp.name!r} has dynamic dimension(s) {names} at axis {bad} and no shape was given; "
                    f"pass input_shapes={{{inp.name!r}: (...)}} with every dimension"
                )
            want = tuple(int(d.dim_value) if d.HasField("dim_value") else int(batch or 0) for d in dims)
        if dims is None or not dims or dims[0].HasField("dim_value"):
            dynamic = False
        if not want:
            raise OnnxError(f"input {inp.name!r} is a scalar; inputs need a batch axis")
        shapes[inp.name] = want
        dtypes[inp.name] = np.dtype(np.float32) if dtype.kind == "f" else np.dtype(np.int64)
    return shapes, dtypes, dynamic


@dataclass
class OnnxImport:
    """What ``from_onnx`` returns: the model, its parameters and its state (BatchNorm's running statistics).

    Unpacks as ``model, params, state = from_onnx(...)``. ``param_names`` gives each parameter's
    ONNX name (the initializer it came from), ``batch`` the one batch the model runs at (None: any
    batch), ``frozen_batchnorms`` the BatchNorm nodes a group runs with their running statistics
    as constants, ``ungrouped`` the name scopes that could not become one node, and why.
    """

    model: Any
    params: list[np.ndarray]
    state: list[np.ndarray]
    param_names: list[str]
    batch: int | None
    opset: int
    output: str
    frozen_batchnorms: list[str] = field(default_factory=list)
    ungrouped: dict[str, str] = field(default_factory=dict)

    def __iter__(self) -> Any:
        return iter((self.model, self.params, self.state))


def _choose_output(proto: Any, output: str | None, values: Mapping[str, Value]) -> Value:
    names = [o.name for o in proto.graph.output]
    if output is None:
        if len(names) != 1:
            raise OnnxError(
                f"the graph has {len(names)} outputs {names}; a model has one: pass output= one of them "
                f"(e.g. output={names[0]!r})"
            )
        output = names[0]
    if output not in values:
        raise OnnxError(f"output={output!r} is no value of the graph; its outputs are {names}")
    v = values[output]
    if v.kind == "unused":
        raise OnnxError(f"output={output!r} is an output of {v.node} that the importer does not compute")
    if v.kind != "run":
        raise OnnxError(f"output {output!r} does not depend on any input (it folds to a constant); choose another")
    if v.node in {i.name for i in proto.graph.input}:
        raise OnnxError(f"output {output!r} is the input itself; the graph computes nothing")
    return v


def _prune(nodes: list[Node], out: str) -> list[Node]:
    by_name = {n.name: n for n in nodes}
    keep, stack = set(), [out]
    while stack:
        name = stack.pop()
        if name in keep or name not in by_name:
            continue
        keep.add(name)
        stack.extend(by_name[name].inputs)
    return [n for n in nodes if n.name in keep]


def _linear_axis(s1: tuple[int, ...], s2: tuple[int, ...], batch: int) -> tuple[int, int, int] | None | Literal[False]:
    """The one axis where shapes at ``batch`` and ``batch + 1`` differ, as ``(axis, a, c)`` (its length is
    ``a * batch + c``); None when they are equal, False when they differ otherwise."""
    if len(s1) != len(s2):
        return False
    diffs = [k for k, (d1, d2) in enumerate(zip(s1, s2)) if d1 != d2]
    if not diffs:
        return None
    if len(diffs) > 1 or s2[diffs[0]] < s1[diffs[0]]:
        return False
    k = diffs[0]
    a = s2[k] - s1[k]
    return (k, a, s1[k] - a * batch)


def _batch_const(c1: np.ndarray, c2: np.ndarray, batch: int) -> tuple[str, Any] | None:
    """How a host op's integer constant follows the batch, from its values at ``batch`` and ``batch + 1``:
    ``("linear", pairs)`` for a shape vector, ``("rows", (row0, delta))`` for one row per example; None otherwise."""
    if c1.dtype.kind not in "iu" or c2.dtype.kind not in "iu":
        return None
    if c1.ndim == 1 and c1.shape == c2.shape:
        return ("linear", tuple((int(b - a), int(a - (b - a) * batch)) for a, b in zip(c1, c2)))
    if c1.ndim and c1.shape[0] == batch and c2.shape == (batch + 1, *c1.shape[1:]) and np.array_equal(c2[:batch], c1):
        row0, delta = c2[0], c2[1] - c2[0]
        steps = np.arange(batch + 1).reshape(-1, *([1] * row0.ndim))
        if np.array_equal(c2, row0[None] + steps * delta[None]):
            return ("rows", (row0.copy(), delta.copy()))
    return None


def _generic(first: _Pass, second: _Pass, batch: int, nodes: list[Node]) -> list[Node] | None:
    """The nodes of ``first`` made to run at any batch, from a second fold at ``batch + 1``; None when
    some value does not follow the batch linearly on one axis (the model then runs at ``batch`` only)."""
    for name, v in first.values.items():
        w = second.values.get(name)
        if v.kind != "run" or w is None:
            continue
        if w.kind != "run" or _linear_axis(v.shape, w.shape, batch) is False:
            return None
    others = {n.name: n for n in second.nodes}
    out, updates = [], {}
    for node in nodes:
        layer = node.layer
        other = others.get(node.name)
        if other is None or type(other.layer) is not type(layer):
            return None
        if isinstance(layer, OnnxOp):
            assert isinstance(other.layer, OnnxOp)  # the same type as layer (checked above)
            values = []
            for v1, v2 in zip(layer.values, other.layer.values):
                if v1.shape == v2.shape:
                    values.append(v1)
                elif (
                    v1.ndim and v1.shape[0] == batch and v2.shape == (batch + 1, *v1.shape[1:]) and (v1 == v1[:1]).all()
                ):
                    values.append(np.ascontiguousarray(v1[:1]))  # a weight expanded over the batch: one row
                else:
                    return None
            consts, batch_consts = [], []
            for k, (c1, c2) in enumerate(zip(layer.consts, other.layer.consts)):
                follows = _batch_const(c1, c2, batch) if layer.op == "host" else None
                if c1.shape == c2.shape and np.array_equal(c1, c2):
                    consts.append(c1)
                elif follows is not None:
                    consts.append(c1)
                    batch_consts.append((k, *follows))
                elif (
                    c1.ndim and c1.shape[0] == batch and c2.shape == (batch + 1, *c1.shape[1:]) and (c1 == c1[:1]).all()
                ):
                    consts.append(np.ascontiguousarray(c1[:1]))  # the same for every example: broadcast one row
                else:
                    return None
            args = layer.args
            found = _linear_axis(layer.in_full, other.layer.in_full, batch)
            if found is False:
                return None
            s1, s2 = first.shape_args.get(node.name, []), second.shape_args.get(node.name, [])
            if s1:
                t1, t2 = s1[0], s2[0]
                if len(t1) != len(t2) or (found is None and t1 != t2):
                    return None
                pairs = tuple((b - a, a - (b - a) * batch) for a, b in zip(t1, t2))
                args = (pairs,) if layer.op == "reshape" else (args[0], pairs)
            if batch_consts and not found:
                return None  # the batch cannot be read off the first operand
            updates[node.name] = list(values)  # what the model's parameter list holds
            layer = dataclasses.replace(
                layer,
                consts=tuple(consts),
                values=tuple(values),
                args=args,
                batch=None,
                batch_from=found or None,
                batch_consts=tuple(batch_consts),
            )
        out.append(Node(node.name, layer, node.inputs))
    first.params.update(updates)
    return out


def _fix_batch(nodes: list[Node], batch: int) -> list[Node]:
    return [
        Node(n.name, dataclasses.replace(n.layer, batch=batch), n.inputs) if isinstance(n.layer, OnnxOp) else n
        for n in nodes
    ]


def from_onnx(
    source: Any,
    input_shapes: Any = None,
    *,
    output: str | None = None,
    group: int | Callable[[str], str | None] | None = None,
    name: str | None = None,
    batch: int | None = None,
) -> OnnxImport:
    """Import an ONNX model (a path or an ``onnx.ModelProto``) as a ``Model`` with its parameters and state.

    ``input_shapes`` gives each graph input's full shape, batch axis first (``{name: shape}``,
    or one shape for a one-input graph); it may be left out when the file fixes every
    dimension. ``output`` names the graph output that is the model's (needed when the graph
    has several). ``group`` coarsens the graph by the exporter's name scopes: an int ``d``
    makes every node whose name has ``d`` scopes or more (``/encoder/layer.0/...`` with ``d=2``)
    part of the node ``/encoder/layer.0``; a function maps an ONNX node name to its group (or
    None). ``batch`` fills the dynamic batch axis of the inputs ``input_shapes`` leaves out.
    Returns an ``OnnxImport`` (``model, params, state = from_onnx(...)``). Raises OnnxError
    (or UnsupportedOnnxError, naming the op, node and opset) for input it cannot import.
    """
    from multigpu.models.graph import Model

    proto = load_model(source)
    need_onnx()
    opset = opset_version(proto)
    inits = {t.name for t in proto.graph.initializer}
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise OnnxError(f"batch={batch!r} must be an integer >= 1")
    shapes, dtypes, dynamic = _resolve_shapes(proto, input_shapes, inits, batch)
    first = _Builder(proto, opset, shapes, dtypes).run()
    out = _choose_output(proto, output, first.values)
    assert out.node is not None  # _choose_output returns a run-time value, which names its node
    nodes = _prune(first.nodes, out.node)
    batch = next(iter(shapes.values()))[0]
    generic = None
    if dynamic and len({s[0] for s in shapes.values()}) == 1:
        try:
            second = _Builder(proto, opset, {k: (s[0] + 1, *s[1:]) for k, s in shapes.items()}, dtypes).run()
        except Exception:  # the graph does not fold at another batch (a fixed reshape): keep the given one
            second = None
        if second is not None:
            generic = _generic(first, second, batch, nodes)
    nodes = generic if generic is not None else _fix_batch(nodes, batch)
    used = {i for n in nodes for i in n.inputs}
    inputs = [Input(k, s[1:] or (1,), "float32" if dtypes[k].kind == "f" else "int64") for k, s in shapes.items()
              if k in used]  # fmt: skip
    frozen: list[str] = []
    ungrouped: dict[str, str] = {}
    if group is not None:
        nodes, frozen, ungrouped = _group(nodes, first, group, out.node, shapes)
    model = Model.from_nodes(nodes, inputs=inputs, name=name or proto.graph.name or "onnx", output=_final(nodes, out))
    params, names, state = [], [], []
    for node in model.nodes:
        if isinstance(node.layer, OnnxGroup):
            params += [np.array(v) for m in node.layer.members for v in first.params.get(m.name, [])]
            names += [s for m in node.layer.members for s in first.names.get(m.name, [])]
        else:
            params += first.params.get(node.name, [])
            names += first.names.get(node.name, [])
            state += first.state.get(node.name, [])
    return OnnxImport(model, params, state, names, None if generic is not None else batch, opset, model.output,
                      frozen, ungrouped)  # fmt: skip


def _final(nodes: list[Node], out: Value) -> str:
    names = {n.name for n in nodes}
    if out.node in names:
        return out.node
    return next(n.name for n in nodes if isinstance(n.layer, OnnxGroup) and out.node in n.layer.member_names)


def _scope(onnx_name: str, depth: int) -> str | None:
    parts = [p for p in onnx_name.split("/") if p]
    return "/" + "/".join(parts[:depth]) if len(parts) > depth else None


def _group(
    nodes: list[Node], first: _Pass, group: Any, output: str, shapes: Mapping[str, tuple[int, ...]]
) -> tuple[list[Node], list[str], dict[str, str]]:
    """Merge the nodes of each name scope into one ``OnnxGroup`` node where the scope has one output."""
    if callable(group):
        key_of = group
    elif isinstance(group, int) and not isinstance(group, bool) and group >= 1:
        key_of = lambda n: _scope(n, group)  # noqa: E731
    else:
        raise OnnxError(f"group={group!r} must be a scope depth >= 1 (e.g. 2 for /encoder/layer.0) or a function")
    keys = {n.name: key_of(first.scopes.get(n.name, n.name)) for n in nodes}
    members: dict[str, list[Node]] = {}
    for n in nodes:
        if keys[n.name] is not None:
            members.setdefault(keys[n.name], []).append(n)
    consumers: dict[str, list[str]] = {}
    for n in nodes:
        for i in n.inputs:
            consumers.setdefault(i, []).append(n.name)
    full = {v.node: v.shape for v in first.values.values() if v.kind == "run" and v.node}
    for k, s in shapes.items():
        full[k] = s
    ungrouped: dict[str, str] = {}
    merged: dict[str, Node] = {}
    frozen: list[str] = []
    taken = {n.name for n in nodes} | set(shapes)
    for key, group_nodes in members.items():
        if len(group_nodes) < 2:
            continue
        inside = {n.name for n in group_nodes}
        leaving = [
            n.name for n in group_nodes if n.name == output or any(c not in inside for c in consumers.get(n.name, []))
        ]
        if len(leaving) != 1 or leaving[0] != group_nodes[-1].name:
            ungrouped[key] = f"{len(leaving)} of its values are used outside it ({leaving[:4]})"
            continue
        if key in taken and key not in inside:
            ungrouped[key] = "its name is taken by another node"
            continue
        ext = list(dict.fromkeys(i for n in group_nodes for i in n.inputs if i not in inside))
        position = {n.name: j for j, n in enumerate(group_nodes)}
        subs = []
        for n in group_nodes:
            layer = n.layer
            if isinstance(layer, BatchNorm2d):
                layer, frozen = _frozen_bn(n, first, full[n.name][1:]), frozen + [n.name]
            refs = tuple(("at", position[i]) if i in inside else ("in", ext.index(i)) for i in n.inputs)
            in_shapes = tuple(full[i][1:] for i in n.inputs)
            subs.append(GroupMember(n.name, layer, refs, in_shapes))
        last = group_nodes[-1]
        merged[last.name] = Node(
            key, OnnxGroup(members=tuple(subs), out_shape=full[last.name][1:], name=key), tuple(ext)
        )
        for n in group_nodes[:-1]:
            merged[n.name] = None  # type: ignore[assignment]
    rename = {last: node.name for last, node in merged.items() if node is not None}
    out = []
    for n in nodes:
        if n.name in merged:
            if merged[n.name] is not None:
                m = merged[n.name]
                out.append(Node(m.name, m.layer, tuple(rename.get(i, i) for i in m.inputs)))
            continue
        out.append(Node(n.name, n.layer, tuple(rename.get(i, i) for i in n.inputs)))
    return out, frozen, ungrouped


def _frozen_bn(node: Node, first: _Pass, shape: tuple[int, ...]) -> OnnxOp:
    """A BatchNorm inside a group: its running statistics become constants (the group is for inference)."""
    assert isinstance(node.layer, BatchNorm2d)  # _group passes its BatchNorm2d nodes only
    mean, var = first.state.pop(node.name)
    names = first.names.get(node.name, ["scale", "bias"])
    gamma, beta = first.params[node.name]
    return OnnxOp(
        op="batch_norm_frozen",
        onnx_op="BatchNormalization",
        args=(float(node.layer.eps),),
        operands=(("x", 0), ("p", 0), ("p", 1), ("c", 0), ("c", 1)),
        consts=(mean, var),
        values=(gamma, beta),
        labels=tuple(names),
        out_shape=tuple(shape),
        flop_count=2 * prod(shape),
        name=node.name,
    )
