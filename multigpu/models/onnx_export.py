"""``to_onnx``: a graph ``Model`` and its parameters written as a standard ONNX model.

Every layer kind maps to standard ONNX ops, so any ONNX runtime runs the file:

* ``conv2d`` -> Conv; ``batch_norm2d`` -> BatchNormalization in inference mode with the
  running statistics (the state); ``relu``/``tanh``/``sigmoid`` -> Relu/Tanh/Sigmoid;
  ``max_pool2d`` -> MaxPool; ``avg_pool2d`` -> AveragePool with ``count_include_pad=1``
  (our average counts the padded zeros); ``global_avg_pool2d`` -> GlobalAveragePool;
  ``flatten`` -> Flatten; ``dense`` -> Gemm on (B, F), MatMul and Add on (B, S, F);
  ``add`` -> Add; ``concat`` -> Concat on the channel axis; ``identity`` and ``dropout``
  -> Identity (an export is for inference);
* ``embedding`` -> Gather; ``position_embedding`` -> Slice of the table and Add;
  ``token_type_embedding`` -> Gather (or the table's row 0) and Add; ``layer_norm`` ->
  LayerNormalization from opset 17, below it its decomposition (ReduceMean, Sub, Mul,
  Add, Sqrt, Div); ``gelu`` -> its Erf form, or its Tanh form for ``approximate``;
* ``attention_mask`` -> Cast, Not, Cast and Unsqueeze to the (B, 1, 1, S) padding mask;
  ``multi_head_attention`` -> MatMul, Add, Reshape, Transpose, Mul, Where (the causal and
  padding masks, filled with float32's lowest value as the layer does) and Softmax;
* an imported graph's ``onnx`` nodes (``multigpu.models.onnx_layers.OnnxOp``) -> the ONNX ops
  each stands for (a reshape whose target follows the batch computes it from the input's
  shape), and its ``onnx_group`` nodes -> their members' ops in order.

Names: each parameter is an initializer named as ``Model.param_keys()`` names it
(``conv1.weight``, ``encoder.layer.0.attention.self.query.weight``), the BatchNorm state
``NODE.running_mean`` and ``NODE.running_var`` (torch's buffer names); every node's output
is the tensor named as the node, so a stage file (``nodes=``) consumes and produces the
tensors the whole model has. Constants that are not parameters (the attention scale, a
causal mask) are Constant nodes. The model's inputs keep their names and dtypes (int64
ids and masks); their shapes are static, with a symbolic first dimension ``batch`` unless
``batch`` fixes it.

``onnx`` is imported when a model is exported, never when this module is.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from multigpu.contract.protocol import pool_output_size
from multigpu.errors import MissingDependencyError, OnnxExportError, UnsupportedLayerError
from multigpu.models.attention import BLOCKED
from multigpu.models.graph import Model
from multigpu.models.onnx_layers import OnnxGroup, OnnxOp

#: The opset written unless another is asked for (LayerNormalization exists from 17).
DEFAULT_OPSET = 17
#: The opsets ``to_onnx`` writes: Softmax on one axis and Unsqueeze's axes input need 13.
MIN_OPSET = 13
#: The most bytes one serialized ONNX file may take (protobuf's limit).
PROTOBUF_LIMIT = 2**31 - 1
#: Name of the symbolic batch dimension.
BATCH_DIM = "batch"

__all__ = [
    "BATCH_DIM",
    "DEFAULT_OPSET",
    "MIN_OPSET",
    "OnnxExportError",
    "UnsupportedLayerError",
    "supported_kinds",
    "to_onnx",
]


def _onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise MissingDependencyError(
            "exporting to ONNX needs the onnx package: pip install 'onnx==1.17.0' (the version the "
            "framework exporters share)"
        ) from None
    return onnx


def max_opset() -> int:
    """The newest opset the installed ``onnx`` package knows."""
    return int(_onnx().defs.onnx_opset_version())


class _Graph:
    """Collects ONNX nodes; names each op's output ``SCOPE/OpType_k`` unless it is a node's output."""

    def __init__(self, onnx: Any, opset: int, dtypes: dict[str, str] | None = None):
        self.onnx, self.opset = onnx, opset
        self.nodes: list[Any] = []
        self.count = 0
        self.dtypes: dict[str, str] = {} if dtypes is None else dtypes  # "float32" or "int64" per tensor name

    def op(self, op_type: str, inputs: Sequence[str], scope: str, out: str | None = None, **attrs: Any) -> str:
        """Add one op; return the name of its (only) output."""
        name = f"{scope}/{op_type}_{self.count}"
        self.count += 1
        output = name if out is None else out
        self.nodes.append(self.onnx.helper.make_node(op_type, list(inputs), [output], name=name, **attrs))
        return output

    def const(self, value: Any, scope: str, dtype: Any = np.float32) -> str:
        """A Constant node holding ``value`` as an array of ``dtype``."""
        array = np.asarray(value, dtype=dtype)
        name = f"{scope}/Constant_{self.count}"
        self.count += 1
        tensor = self.onnx.numpy_helper.from_array(array, name=name)
        self.nodes.append(self.onnx.helper.make_node("Constant", [], [name], name=name, value=tensor))
        return name

    def ints(self, values: Sequence[int], scope: str) -> str:
        """A 1-D int64 Constant (shapes, axes, slice bounds)."""
        return self.const(list(values), scope, np.int64)


# -- one emitter per layer kind ---------------------------------------------------------
# Each gets the graph, the layer, the names of its inputs, the name its output must have,
# the names of its parameters and state, and its main input's per-example shape.
Emitter = Callable[[_Graph, Any, list[str], str, list[str], list[str], tuple[int, ...]], None]


def _conv(g: _Graph, layer: Any, ins: list[str], out: str, ps: list[str], ss: list[str], shape: Any) -> None:
    p, k = layer.padding, layer.kernel
    g.op(
        "Conv", [ins[0], *ps], out, out, kernel_shape=[k, k], strides=[layer.stride] * 2, pads=[p] * 4,
        group=layer.groups,
    )  # fmt: skip


def _batch_norm(g: _Graph, layer: Any, ins: list[str], out: str, ps: list[str], ss: list[str], shape: Any) -> None:
    # Inference mode (training_mode 0, the default): the running statistics, as RunningStatistics.
    g.op("BatchNormalization", [ins[0], ps[0], ps[1], ss[0], ss[1]], out, out, epsilon=float(layer.eps))


def _unary(op_type: str) -> Emitter:
    def emit(g: _Graph, layer: Any, ins: list[str], out: str, ps: list[str], ss: list[str], shape: Any) -> None:
        g.op(op_type, [ins[0]], out, out)

    return emit


def _pool(op_type: str, **extra: Any) -> Emitter:
    def emit(g: _Graph, layer: Any, ins: list[str], out: str, ps: list[str], ss: list[str], shape: Any) -> None:
        k, p, step, attrs = layer.kernel, layer.padding, layer.step, dict(extra)
        # NOTE: MaxPool's pads never win (our max pads with -inf); AveragePool must count
        # them (count_include_pad=1), as our avg_pool2d divides by the padded window.
        if layer.ceil_mode:
            # NOTE: ONNX's ceil rule keeps a last window that starts in the right padding; torch's
            # (ours) drops it. Where they differ no ONNX attribute says ours.
            ours = [pool_output_size(n, k, step, p, True) for n in shape[-2:]]
            onnx = [-(-(n + 2 * p - k) // step) + 1 for n in shape[-2:]]
            if ours != onnx:
                raise OnnxExportError(
                    f"node {layer.name!r}: a ceil-mode pool over {tuple(shape[-2:])} has {ours} windows here and "
                    f"{onnx} in ONNX's rule (a window starting in the right padding); pad the input or use floor mode"
                )
            attrs["ceil_mode"] = 1
        g.op(op_type, [ins[0]], out, out, kernel_shape=[k, k], strides=[step] * 2, pads=[p] * 4, **attrs)

    return emit


def _flatten(g: _Graph, layer: Any, ins: list[str], out: str, ps: list[str], ss: list[str], shape: Any) -> None:
    g.op("Flatten", [ins[0]], out, out, axis=1)


def _dense(g: _Graph, layer: Any, ins: list[str], out: str, ps: list[str], ss: list[str], shape: Any) -> None:
    if len(shape) == 1:  # (B, F) @ (F, O) + b: one Gemm (our weight is (in, out): no transB)
        g.op("Gemm", [ins[0], ps[0], ps[1]], out, out)
    else:  # Gemm is 2-D only: a sequence (B, S, F) takes MatMul, which broadcasts the weight
        g.op("Add", [g.op("MatMul", [ins[0], ps[0]], out), ps[1]], out, out)


def _add(g: _Graph, layer: Any, ins: list[str], out: str, ps: list[str], ss: list[str], shape: Any) -> None:
    acc = ins[0]
    for k, x in enumerate(ins[1:], start=2):  # left to right, as Add.join sums
        acc = g.op("Add", [acc, x], out, out if k == len(ins) else None)


def _concat(g: _Graph, layer: Any, ins: list[str], out: str, ps: list[str], ss: list[str], shape: Any) -> None:
    g.op("Concat", ins, out, out, axis=1)


def _embedding(g: _Graph, layer: Any, ins: list[str], out: str, ps: list[str], ss: list[str], shape: Any) -> None:
    g.op("Gather", [ps[0], ins[0]], out, out, axis=0)


def _position(g: _Graph, layer: Any, ins: list[str], out: str, ps: list[str], ss: list[str], shape: Any) -> None:
    rows = g.op("Slice", [ps[0], g.ints([0], out), g.ints([shape[0]], out), g.ints([0], out)], out)
    g.op("Add", [ins[0], rows], out, out)


def _token_type(g: _Graph, layer: Any, ins: list[str], out: str, ps: list[str], ss: list[str], shape: Any) -> None:
    if len(ins) == 1:  # every token of type 0: the table's first row, broadcast
        rows = g.op("Slice", [ps[0], g.ints([0], out), g.ints([1], out), g.ints([0], out)], out)
    else:
        rows = g.op("Gather", [ps[0], ins[1]], out, axis=0)
    g.op("Add", [ins[0], rows], out, out)


def _mean_last(g: _Graph, x: str, scope: str) -> str:
    # NOTE: ReduceMean takes its axes as an attribute up to opset 17 and as an input from 18.
    if g.opset >= 18:
        return g.op("ReduceMean", [x, g.ints([-1], scope)], scope, keepdims=1)
    return g.op("ReduceMean", [x], scope, axes=[-1], keepdims=1)


def _layer_norm(g: _Graph, layer: Any, ins: list[str], out: str, ps: list[str], ss: list[str], shape: Any) -> None:
    if g.opset >= 17:
        g.op("LayerNormalization", [ins[0], ps[0], ps[1]], out, out, axis=-1, epsilon=float(layer.eps))
        return
    # Before opset 17: the decomposition the layer computes (biased variance).
    centered = g.op("Sub", [ins[0], _mean_last(g, ins[0], out)], out)
    var = _mean_last(g, g.op("Mul", [centered, centered], out), out)
    std = g.op("Sqrt", [g.op("Add", [var, g.const(layer.eps, out)], out)], out)
    scaled = g.op("Mul", [g.op("Div", [centered, std], out), ps[0]], out)
    g.op("Add", [scaled, ps[1]], out, out)


def _gelu(g: _Graph, layer: Any, ins: list[str], out: str, ps: list[str], ss: list[str], shape: Any) -> None:
    x = ins[0]
    if layer.approximate:  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        cube = g.op("Mul", [g.op("Mul", [x, x], out), x], out)
        inner = g.op("Add", [x, g.op("Mul", [cube, g.const(0.044715, out)], out)], out)
        t = g.op("Tanh", [g.op("Mul", [inner, g.const(math.sqrt(2.0 / math.pi), out)], out)], out)
    else:  # x * 0.5 (1 + erf(x / sqrt(2)))
        t = g.op("Erf", [g.op("Div", [x, g.const(math.sqrt(2.0), out)], out)], out)
    half = g.op("Mul", [g.op("Add", [t, g.const(1.0, out)], out), g.const(0.5, out)], out)
    g.op("Mul", [x, half], out, out)


def _attention_mask(g: _Graph, layer: Any, ins: list[str], out: str, ps: list[str], ss: list[str], shape: Any) -> None:
    # 1.0 where a key is padding (the mask is 0): Cast to bool is "nonzero", for int or float masks.
    pad = g.op("Cast", [g.op("Not", [g.op("Cast", [ins[1]], out, to=9)], out)], out, to=1)
    g.op("Unsqueeze", [pad, g.ints([1, 2], out)], out, out)


def _attention(g: _Graph, layer: Any, ins: list[str], out: str, ps: list[str], ss: list[str], shape: Any) -> None:
    s, d = shape
    h = layer.heads
    dh = d // h
    x = ins[0]

    def heads(w: str, b: str, perm: list[int]) -> str:
        y = g.op("Add", [g.op("MatMul", [x, w], out), b], out)
        # 0 copies the input's dimension (allowzero is 0): the batch stays symbolic.
        return g.op("Transpose", [g.op("Reshape", [y, g.ints([0, 0, h, dh], out)], out)], out, perm=perm)

    q = heads(ps[0], ps[1], [0, 2, 1, 3])  # (B, H, S, dh)
    k = heads(ps[2], ps[3], [0, 2, 3, 1])  # (B, H, dh, S)
    v = heads(ps[4], ps[5], [0, 2, 1, 3])
    scores = g.op("Mul", [g.op("MatMul", [q, k], out), g.const(1.0 / math.sqrt(dh), out)], out)
    blocked = g.const(BLOCKED, out)
    if layer.causal:
        later = g.const(np.triu(np.ones((s, s), bool), 1).reshape(1, 1, s, s), out, bool)
        scores = g.op("Where", [later, blocked, scores], out)
    if len(ins) == 2:  # the (B, 1, 1, S) padding mask, 1.0 where a key is padding
        scores = g.op("Where", [g.op("Cast", [ins[1]], out, to=9), blocked, scores], out)
    weights = g.op("Softmax", [scores], out, axis=-1)
    ctx = g.op("Transpose", [g.op("MatMul", [weights, v], out)], out, perm=[0, 2, 1, 3])
    ctx = g.op("Reshape", [ctx, g.ints([0, 0, d], out)], out)
    g.op("Add", [g.op("MatMul", [ctx, ps[6]], out), ps[7]], out, out)


# -- the kinds of imported ONNX graphs (multigpu.models.onnx_layers) ------------------------
# An ``OnnxOp`` is one ONNX op on protocol ops: its ``op`` (one of onnx_layers.OP_KINDS), static
# ``args`` and ``operands`` (("x", i) the node's i-th input, ("p", j) its j-th parameter, ("c", k)
# the constant consts[k], ("n", 0) an omitted optional input). Booleans are int64 in our graphs
# (the importer turns them so), so a condition is cast to bool where ONNX wants one.

_INT, _FLOAT = "int64", "float32"
_ELEM = {_INT: 7, _FLOAT: 1}  # TensorProto.INT64, TensorProto.FLOAT


def _elem_dtype(onnx_type: int) -> str:
    return _FLOAT if onnx_type in (1, 10, 11, 16) else _INT  # float, float16, double, bfloat16


def _operand_dtype(layer: Any, k: int, in_dtypes: Sequence[str]) -> str:
    where, i = layer.operands[k]
    if where == "x":
        return in_dtypes[i]
    if where == "c":
        return _INT if np.asarray(layer.consts[i]).dtype.kind in "biu" else _FLOAT
    return _FLOAT


def _onnx_op_dtype(layer: Any, in_dtypes: Sequence[str]) -> str:
    """The dtype of an OnnxOp's output, as the importer's run gives it."""
    if layer.op == "cast":
        return _FLOAT if layer.args[0] == "float32" else _INT  # "bool" and "int64" are int64 here
    if layer.op == "host":
        onnx_op, attrs, _ = layer.args
        if onnx_op == "Cast":
            return _elem_dtype(int(dict(attrs)["to"]))
        if onnx_op in ("Shape", "Size"):
            return _INT
        if onnx_op == "Where":  # picks between its second and third operands
            return _operand_dtype(layer, 1, in_dtypes)
        if _bool_slots(_onnx(), onnx_op, int(layer.args[2]), len(layer.operands))[1]:
            return _INT  # a bool, kept as int64
    if layer.op in ("host", "take", "reshape", "transpose", "concat", "expand"):
        return _operand_dtype(layer, 0, in_dtypes)
    return _FLOAT


def _layer_dtype(layer: Any, in_dtypes: Sequence[str]) -> str:
    if layer.kind == "onnx":
        return _onnx_op_dtype(layer, in_dtypes)
    if layer.kind == "onnx_group":
        outs: list[str] = []
        for m in layer.members:
            outs.append(_layer_dtype(m.layer, [in_dtypes[i] if w == "in" else outs[i] for w, i in m.inputs]))
        return outs[-1]
    return _FLOAT  # every spec layer computes float32


def node_dtypes(model: Model) -> dict[str, str]:
    """Each model input's and node output's dtype (``"float32"`` or ``"int64"``)."""
    out = {name: spec.dtype for name, spec in model.inputs.items()}
    for node in model.nodes:
        out[node.name] = _layer_dtype(node.layer, [out[i] for i in node.inputs])
    return out


def _batch_entries(g: _Graph, x: str, pairs: Sequence[tuple[int, int]], layer: Any, scope: str) -> str:
    """A 1-D int64 shape whose entries are ``a * batch + c``: constants, or computed from x's shape
    when the batch is symbolic (``batch_from``: x's axis ``axis`` is ``a * batch + c`` long)."""
    if all(a == 0 for a, _ in pairs) or layer.batch is not None:
        batch = 0 if layer.batch is None else layer.batch
        return g.ints([a * batch + c for a, c in pairs], scope)
    axis, a0, c0 = layer.batch_from
    dim = g.op("Gather", [g.op("Shape", [x], scope), g.ints([axis], scope)], scope, axis=0)
    batch = g.op("Div", [g.op("Sub", [dim, g.ints([c0], scope)], scope), g.ints([a0], scope)], scope)
    parts = [
        g.ints([c], scope)
        if a == 0
        else g.op("Add", [g.op("Mul", [batch, g.ints([a], scope)], scope), g.ints([c], scope)], scope)
        for a, c in pairs
    ]
    return g.op("Concat", parts, scope, axis=0)


def _bool_slots(onnx: Any, onnx_op: str, opset: int, n: int) -> tuple[set[int], bool]:
    """Which of an op's ``n`` inputs take only bools, and whether its output is only a bool (its schema says)."""
    schema = onnx.defs.get_schema(onnx_op, max_inclusive_version=opset)
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}

    def only_bool(type_str: str) -> bool:
        return allowed.get(type_str, {type_str}) == {"tensor(bool)"}

    formals = list(schema.inputs)
    slots = {k for k in range(n) if formals and only_bool(formals[min(k, len(formals) - 1)].type_str)}
    return slots, bool(schema.outputs) and only_bool(schema.outputs[0].type_str)


def _host_attrs(g: _Graph, attrs: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    out = {}
    for key, value in attrs:
        out[key] = g.onnx.numpy_helper.from_array(np.asarray(value)) if isinstance(value, np.ndarray) else value
    return out


_BINARY = {"add": "Add", "subtract": "Sub", "multiply": "Mul", "divide": "Div"}
_UNARY = {
    "relu": "Relu",
    "tanh": "Tanh",
    "sigmoid": "Sigmoid",
    "sqrt": "Sqrt",
    "erf": "Erf",
    "exp": "Exp",
    "log": "Log",
}
_REDUCE = {"reduce_mean": "ReduceMean", "reduce_sum": "ReduceSum"}


def _named(table: dict[str, str], fn: str, out: str) -> str:
    if fn not in table:
        raise UnsupportedLayerError(
            f"node {out!r}: the imported function {fn!r} has no ONNX export; those that export are {sorted(table)}"
        )
    return table[fn]


def _emit_onnx_op(g: _Graph, layer: Any, ins: list[str], out: str, ps: list[str], ss: list[str], shape: Any) -> None:
    in_dtypes = [g.dtypes[i] for i in ins]

    def arg(k: int) -> str:
        where, i = layer.operands[k]
        if where == "x":
            return ins[i]
        if where == "p":
            return ps[i]
        if where == "n":
            return ""
        const = np.asarray(layer.consts[i])
        return g.const(const, out, np.int64 if const.dtype.kind in "biu" else np.float32)

    op, args = layer.op, layer.args
    n = len(layer.operands)
    if op == "binary":
        g.op(_named(_BINARY, args[0], out), [arg(0), arg(1)], out, out)
    elif op == "scale":
        g.op("Mul", [arg(0), g.const(float(args[0]), out)], out, out)
    elif op == "unary":
        if args[0] == "gelu":
            _gelu(g, _GeluForm(bool(args[1])), [arg(0)], out, [], [], shape)
        else:
            g.op(_named(_UNARY, args[0], out), [arg(0)], out, out)
    elif op == "pow":  # as OnnxOp computes it: a root, or repeated products
        x = arg(0)
        if args[0] == 0.5:
            g.op("Sqrt", [x], out, out)
        else:
            acc = x
            for k in range(int(args[0]) - 1):
                acc = g.op("Mul", [acc, x], out, out if k == int(args[0]) - 2 else None)
    elif op == "matmul":
        g.op("MatMul", [arg(0), arg(1)], out, out)
    elif op == "dense":
        g.op("Add", [g.op("MatMul", [arg(0), arg(1)], out), arg(2)], out, out)
    elif op == "gemm":
        trans_a, trans_b, alpha, beta, has_c = args
        operands = [arg(0), arg(1), *([arg(2)] if has_c else [])]
        g.op("Gemm", operands, out, out, transA=int(trans_a), transB=int(trans_b), alpha=float(alpha), beta=float(beta))
    elif op == "softmax":
        axis, coerce = args
        if not coerce:
            g.op("Softmax", [arg(0)], out, out, axis=int(axis))
        else:  # opset < 13's Softmax: over the 2-D flattening at axis
            x = arg(0)
            flat = g.op("Softmax", [g.op("Flatten", [x], out, axis=int(axis))], out, axis=1)
            g.op("Reshape", [flat, g.op("Shape", [x], out)], out, out)
    elif op in ("layer_norm", "batch_norm_frozen"):
        if op == "batch_norm_frozen":
            g.op("BatchNormalization", [arg(k) for k in range(5)], out, out, epsilon=float(args[0]))
        else:
            rank = np.asarray(layer.values[layer.operands[1][1]]).ndim if layer.operands[1][0] == "p" else 1
            if g.opset < 17:
                raise UnsupportedLayerError(
                    f"node {out!r}: an imported LayerNormalization over {rank} axes needs opset 17 or later; "
                    "export with opset=17"
                )
            g.op("LayerNormalization", [arg(0), arg(1), arg(2)], out, out, axis=-rank, epsilon=float(args[0]))
    elif op == "reduce":
        fn, axes, keep = args
        onnx_op = _named(_REDUCE, fn, out)
        # NOTE: ReduceSum takes its axes as an input from opset 13, ReduceMean from 18.
        if onnx_op == "ReduceSum" or g.opset >= 18:
            g.op(onnx_op, [arg(0), g.ints(list(axes), out)], out, out, keepdims=int(keep))
        else:
            g.op(onnx_op, [arg(0)], out, out, axes=list(axes), keepdims=int(keep))
    elif op == "transpose":
        g.op("Transpose", [arg(0)], out, out, perm=list(args[0]))
    elif op == "reshape":
        x = arg(0)
        g.op("Reshape", [x, _batch_entries(g, x, args[0], layer, out)], out, out)
    elif op == "take":
        steps, target = args
        x = src = arg(0)
        for k, (axis, indices) in enumerate(steps):
            last = target is None and k == len(steps) - 1
            x = g.op("Gather", [x, g.ints(list(indices), out)], out, out if last else None, axis=int(axis))
        if target is not None:
            g.op("Reshape", [x, _batch_entries(g, src, target, layer, out)], out, out)
    elif op == "expand":
        g.op("Add", [arg(0), arg(1)], out, out)
    elif op == "concat":
        g.op("Concat", [arg(k) for k in range(n)], out, out, axis=int(args[0]))
    elif op == "embedding":
        g.op("Gather", [arg(1), arg(0)], out, out, axis=0)
    elif op == "where":
        value, invert = args
        cond = g.op("Cast", [arg(1)], out, to=9)
        if invert:
            cond = g.op("Not", [cond], out)
        g.op("Where", [cond, g.const(float(value), out), arg(0)], out, out)
    elif op == "cast":
        if args[0] == "bool":  # nonzero, kept as int64
            g.op("Cast", [g.op("Cast", [arg(0)], out, to=9)], out, out, to=_ELEM[_INT])
        else:
            g.op("Cast", [arg(0)], out, out, to=_ELEM[args[0]])
    elif op == "avg_pool_exclusive":
        k, stride, pad, ceil = args
        g.op(
            "AveragePool",
            [arg(0)],
            out,
            out,
            kernel_shape=[k, k],
            strides=[stride] * 2,
            pads=[pad] * 4,
            count_include_pad=0,
            ceil_mode=int(ceil),
        )
    elif op == "conv":
        stride, pad, groups, has_bias = args
        w = layer.values[layer.operands[1][1]] if layer.operands[1][0] == "p" else layer.consts[layer.operands[1][1]]
        kernel = list(np.asarray(w).shape[2:])
        operands = [arg(0), arg(1), *([arg(2)] if has_bias else [])]
        g.op(
            "Conv",
            operands,
            out,
            out,
            kernel_shape=kernel,
            strides=[stride] * len(kernel),
            pads=[pad] * 2 * len(kernel),
            group=groups,
        )
    elif op == "host":
        onnx_op, attrs, opset = args
        defs = g.onnx.defs
        then = defs.get_schema(onnx_op, max_inclusive_version=int(opset)).since_version
        now = defs.get_schema(onnx_op, max_inclusive_version=g.opset).since_version
        if then != now:
            raise UnsupportedLayerError(
                f"node {out!r}: its {onnx_op} came from opset {opset}, whose {onnx_op} differs from opset "
                f"{g.opset}'s; export with opset={opset}"
            )
        # A bool is int64 here: cast it back where the op takes only bools (Not's input, Where's
        # condition), and a bool result (Equal, Not, a Cast to bool) on to int64.
        bool_in, bool_out = _bool_slots(g.onnx, onnx_op, g.opset, n)
        operands = [g.op("Cast", [arg(k)], out, to=9) if k in bool_in else arg(k) for k in range(n)]
        extra = _host_attrs(g, attrs)
        if bool_out or (onnx_op == "Cast" and extra["to"] == 9):
            g.op("Cast", [g.op(onnx_op, operands, out, **extra)], out, out, to=_ELEM[_INT])
        else:
            g.op(onnx_op, operands, out, out, **extra)
    else:
        raise UnsupportedLayerError(f"node {out!r}: the imported op {op!r} has no ONNX export")
    g.dtypes[out] = _onnx_op_dtype(layer, in_dtypes)


class _GeluForm:
    """A stand-in GELU spec for an imported Gelu (only its form matters to ``_gelu``)."""

    def __init__(self, approximate: bool):
        self.approximate = approximate


def _emit_onnx_group(g: _Graph, layer: Any, ins: list[str], out: str, ps: list[str], ss: list[str], shape: Any) -> None:
    names: list[str] = []
    for j, m in enumerate(layer.members):
        name = out if j == len(layer.members) - 1 else f"{out}/{m.name}"
        member_ins = [ins[i] if where == "in" else names[i] for where, i in m.inputs]
        lo, hi = layer._offsets[j], layer._offsets[j + 1]
        if m.layer.kind not in EMITTERS or m.layer.kind == "batch_norm2d":
            raise UnsupportedLayerError(
                f"node {out!r}: its member {m.name!r} ({m.layer.kind}) has no ONNX export; the kinds that "
                f"export are {supported_kinds()}"
            )
        EMITTERS[m.layer.kind](g, m.layer, member_ins, name, ps[lo:hi], [], m.in_shapes[0])
        g.dtypes.setdefault(name, _layer_dtype(m.layer, [g.dtypes[i] for i in member_ins]))
        names.append(name)


EMITTERS: dict[str, Emitter] = {
    "conv2d": _conv,
    "batch_norm2d": _batch_norm,
    "relu": _unary("Relu"),
    "tanh": _unary("Tanh"),
    "sigmoid": _unary("Sigmoid"),
    "identity": _unary("Identity"),
    "dropout": _unary("Identity"),  # inference: dropout passes its input on
    "max_pool2d": _pool("MaxPool"),
    "avg_pool2d": _pool("AveragePool", count_include_pad=1),
    "global_avg_pool2d": _unary("GlobalAveragePool"),
    "flatten": _flatten,
    "dense": _dense,
    "add": _add,
    "concat": _concat,
    "embedding": _embedding,
    "position_embedding": _position,
    "token_type_embedding": _token_type,
    "layer_norm": _layer_norm,
    "gelu": _gelu,
    "attention_mask": _attention_mask,
    "multi_head_attention": _attention,
    "onnx": _emit_onnx_op,
    "onnx_group": _emit_onnx_group,
}


def supported_kinds() -> list[str]:
    """The layer kinds ``to_onnx`` writes, sorted."""
    return sorted(EMITTERS)


def _check_opset(opset: Any) -> int:
    newest = max_opset()
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= newest:
        raise OnnxExportError(
            f"opset={opset!r} cannot be written; give an opset from {MIN_OPSET} to {newest} (the installed "
            f"onnx's newest), e.g. {DEFAULT_OPSET}"
        )
    return opset


def _check_batch(batch: Any) -> int | None:
    if batch is None:
        return None
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise OnnxExportError(f"batch={batch!r} must be None (a symbolic {BATCH_DIM!r} dimension) or an integer >= 1")
    return batch


def _stage(model: Model, nodes: Sequence[str] | None) -> list[int]:
    if nodes is None:
        return list(range(len(model.nodes)))
    if isinstance(nodes, str) or not nodes:
        raise OnnxExportError(f"nodes={nodes!r} must be a non-empty list of node names (a stage), or None")
    unknown = [n for n in nodes if n not in model.index]
    if unknown:
        raise OnnxExportError(
            f"model {model.name!r} has no node(s) {unknown}; its nodes are {list(model.index)[:8]}..."
        )
    return sorted({model.index[n] for n in nodes})


def imported_batch(model: Model, batch: int | None) -> int | None:
    """``batch``, or the one batch a model imported with a fixed batch runs at (its reshapes fix it)."""
    fixed = {
        layer.batch
        for node in model.nodes
        for layer in ([m.layer for m in node.layer.members] if isinstance(node.layer, OnnxGroup) else [node.layer])
        if isinstance(layer, OnnxOp) and layer.batch is not None
    }
    if not fixed:
        return batch
    (only,) = fixed
    if batch is not None and batch != only:
        raise OnnxExportError(
            f"batch={batch}: model {model.name!r} was imported for batch {only} only (its file fixes the batch); "
            f"export with batch={only} or None, or re-import it with input_shapes for batch {batch}"
        )
    return only


def stage_io(model: Model, nodes: Sequence[str] | None = None) -> tuple[list[str], list[str]]:
    """The tensors a stage (``nodes``; None: the whole model) consumes from outside itself, in
    the order the model first consumes them (model inputs in their order first), and those it
    produces for nodes outside it or as the model's output, in node order."""
    stage = _stage(model, nodes)
    inside = {model.nodes[i].name for i in stage}
    consumed = {inp for i in stage for inp in model.nodes[i].inputs if inp not in inside}
    feeds = [n for n in model.input_names if n in consumed]
    feeds += [model.nodes[i].name for i in range(len(model.nodes)) if model.nodes[i].name in consumed]
    outs = [
        model.nodes[i].name
        for i in stage
        if model.nodes[i].name == model.output or any(c not in inside for c in model.consumers[model.nodes[i].name])
    ]
    return feeds, outs


def _value_info(onnx: Any, model: Model, name: str, batch: int | None, dtypes: dict[str, str]) -> Any:
    elem = onnx.TensorProto.INT64 if dtypes[name] == "int64" else onnx.TensorProto.FLOAT
    first: int | str = BATCH_DIM if batch is None else batch
    return onnx.helper.make_tensor_value_info(name, elem, [first, *model.shapes[name]])


def to_onnx(
    model: Model,
    params: Sequence[Any],
    path: str | os.PathLike[str] | None = None,
    state: Sequence[Any] | None = None,
    *,
    opset: int = DEFAULT_OPSET,
    batch: int | None = None,
    nodes: Sequence[str] | None = None,
) -> Any:
    """Write ``model`` with ``params`` (and its BatchNorm ``state``) as an ONNX model; return the ModelProto.

    ``path``: the ``.onnx`` file to write (None: only return the proto); the file appears
    whole or not at all. ``opset``: 13 up to the installed onnx's newest (default 17; below
    17 LayerNorm is decomposed). ``batch``: None for a symbolic first dimension ``batch``,
    or a fixed batch size. ``nodes``: export only these nodes (a stage of a plan): the graph's
    inputs are then the tensors they consume, its outputs those that leave the stage.

    Raises UnsupportedLayerError for a layer kind with no ONNX mapping, ParamsError for
    params or state that do not fit the model, OnnxExportError for a BatchNorm model without
    ``state``, a bad opset, batch or destination, and MissingDependencyError without onnx.
    """
    onnx = _onnx()
    opset, batch = _check_opset(opset), _check_batch(batch)
    if not isinstance(model, Model):
        raise OnnxExportError(f"model={model!r} is not a multigpu Model; build one with multigpu.models")
    stage = _stage(model, nodes)
    batch = imported_batch(model, batch)
    bad = sorted({model.nodes[i].layer.kind for i in stage if model.nodes[i].layer.kind not in EMITTERS})
    if bad:
        where = [model.nodes[i].name for i in stage if model.nodes[i].layer.kind in bad]
        raise UnsupportedLayerError(
            f"model {model.name!r}: layer kind(s) {bad} (node(s) {where[:4]}) have no ONNX export; "
            f"the kinds that export are {supported_kinds()}"
        )
    values = model.check_params(params)
    keys = model.param_keys()
    uses_bn = [i for i in stage if i in model._bn_number]
    if uses_bn and state is None:
        raise OnnxExportError(
            f"model {model.name!r} has BatchNorm (node {model.nodes[uses_bn[0]].name!r}): pass state= (its "
            "running statistics, e.g. model.init_state() or DataParallel.get_state()); ONNX's "
            "BatchNormalization normalizes with them"
        )
    stats = [] if state is None else model.check_state(state)  # the whole model's, checked even if unused

    dtypes = node_dtypes(model)
    g = _Graph(onnx, opset, dict(dtypes))
    initializers = []
    for i in stage:
        node = model.nodes[i]
        lo, hi = model._param_offsets[i], model._param_offsets[i + 1]
        pnames = keys[lo:hi]
        snames: list[str] = []
        if i in model._bn_number:
            k = model._bn_number[i]
            snames = [f"{node.name}.running_mean", f"{node.name}.running_var"]
            initializers += [onnx.numpy_helper.from_array(stats[2 * k + j], name=n) for j, n in enumerate(snames)]
        initializers += [onnx.numpy_helper.from_array(values[j], name=n) for j, n in zip(range(lo, hi), pnames)]
        shape = model.shapes[node.inputs[0]]  # the main input's, per example
        EMITTERS[node.layer.kind](g, node.layer, list(node.inputs), node.name, pnames, snames, shape)

    feeds, outs = stage_io(model, nodes)
    graph = onnx.helper.make_graph(
        g.nodes,
        model.name if nodes is None else f"{model.name}[{model.nodes[stage[0]].name}..{model.nodes[stage[-1]].name}]",
        [_value_info(onnx, model, n, batch, dtypes) for n in feeds],
        [_value_info(onnx, model, n, batch, dtypes) for n in outs],
        initializer=initializers,
    )
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)], producer_name="multigpu")
    # NOTE: onnx 1.17 writes IR version 10; a runtime reads any IR version up to its own.
    if path is not None:
        write_model(proto, path)
    return proto


def serialize(proto: Any, what: str) -> bytes:
    """``proto``'s bytes; OnnxExportError when it passes protobuf's 2 GB limit (which
    ``SerializeToString`` would refuse with a bare ValueError)."""
    size = proto.ByteSize()
    if size > PROTOBUF_LIMIT:
        raise OnnxExportError(
            f"{what}: the ONNX model takes {size / 2**30:.2f} GiB, over protobuf's 2 GiB limit for one file; "
            "export it in stages (export_stages, or multigpu partition --export-stages), each under the limit"
        )
    return proto.SerializeToString()


def write_model(proto: Any, path: str | os.PathLike[str]) -> Path:
    """Write ``proto`` to ``path`` whole or not at all (a temporary file renamed into place);
    OnnxExportError for a folder that does not exist or a path that is a folder."""
    target = Path(path)
    if target.is_dir():
        raise OnnxExportError(
            f"path {str(target)!r} is a folder; give a file name such as {str(target / 'model.onnx')!r}"
        )
    if not target.parent.is_dir():
        raise OnnxExportError(
            f"path {str(target)!r}: the folder {str(target.parent)!r} does not exist; create it or give another path"
        )
    data = serialize(proto, str(target))
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # as open() would make it, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
