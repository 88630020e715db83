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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from math import prod
from typing import Any, Literal, NoReturn, cast

import numpy as np

from multigpu.contract.protocol import pool_output_size
from multigpu.errors import OnnxError, UnsupportedOnnxError
from multigpu.models.dropout import Dropout
from multigpu.models.layers import AvgPool2d, BatchNorm2d, Conv2d, Flatten, GlobalAvgPool2d, Layer, MaxPool2d, ReLU
from multigpu.models.node import Input, Node
from multigpu.models.onnx_import.load import load_model, need_onnx, opset_version
from multigpu.models.onnx_layers import GroupMember, OnnxGroup, OnnxOp
from multigpu.models.onnx_numpy import FOLDABLE, evaluate, numpy_dtype, reshape_target, slice_steps, split_sizes
from multigpu.models.transformer_layers import GELU, Embedding, LayerNorm, Sigmoid, Tanh

#: The ops that may compute on model inputs (at run time); the rest of ``FOLDABLE`` folds on constants only.
RUNTIME_OPS = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Pow", "MatMul", "Gemm", "Conv", "BatchNormalization", "Relu", "MaxPool",
        "AveragePool", "GlobalAveragePool", "Flatten", "Concat", "Softmax", "LayerNormalization", "ReduceMean",
        "ReduceSum", "Sqrt", "Erf", "Gelu", "Tanh", "Sigmoid", "Gather", "Slice", "Split", "Reshape",
        "Transpose", "Squeeze", "Unsqueeze", "Dropout", "Where", "Cast", "Identity", "Expand", "Shape", "Size",
        "Constant",
        "Reciprocal",
        "Neg",
        "CastLike",
        "Clip",
    }
)  # fmt: skip
#: Ops that run on the device even on integer tensors (the rest of an integer subgraph runs in NumPy).
_DEVICE_INT_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Dropout", "Shape", "Size"})
#: Every op the importer takes (at run time or on constants).
SUPPORTED_OPS = tuple(sorted(RUNTIME_OPS | FOLDABLE | {"Constant"}))


@dataclass
class Value:
    """One ONNX value during the import: its kind (``const``, ``param``, ``run``), full shape and dtype;
    ``array`` for a constant or parameter, ``node`` (our node or model input) for a run-time value."""

    name: str
    kind: str
    shape: tuple[int, ...]
    dtype: Any
    array: np.ndarray | None = None
    node: str | None = None
    label: str = ""  # a parameter's name: its initializer's, also where an op of it was folded

    def __post_init__(self) -> None:
        self.label = self.label or self.name


def _array(v: Value | np.ndarray) -> np.ndarray | None:
    """A constant operand's array: a Value's, or the array itself."""
    return v.array if isinstance(v, Value) else v


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [s.decode() for s in v]
        if a.type == a.TENSOR:
            from onnx import numpy_helper

            v = numpy_helper.to_array(v)
        out[a.name] = v
    return out


@dataclass
class _Pass:
    """What one fold at one set of input shapes produced."""

    nodes: list[Node] = field(default_factory=list)
    values: dict[str, Value] = field(default_factory=dict)
    params: dict[str, list[np.ndarray]] = field(default_factory=dict)  # our node -> its parameter values
    names: dict[str, list[str]] = field(default_factory=dict)  # our node -> the ONNX names of its parameters
    state: dict[str, list[np.ndarray]] = field(default_factory=dict)
    scopes: dict[str, str] = field(default_factory=dict)  # our node -> the ONNX node name it came from
    shape_args: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)


class _Unsupported(Exception):
    """Internal: an unsupported feature of the node being translated (the builder adds where)."""


class _Builder:
    """One fold of an ONNX graph at given full input shapes."""

    def __init__(self, proto: Any, opset: int, shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, Any]):
        self.proto, self.opset = proto, opset
        self.out = _Pass()
        self.taken: set[str] = set(shapes)
        for name, shape in shapes.items():
            self.out.values[name] = Value(name, "run", tuple(shape), dtypes[name], node=name)

    # -- bookkeeping ---------------------------------------------------------------
    def _fresh(self, name: str) -> str:
        base, k = name or "node", 1
        while name in self.taken or not name:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name

    def _add(
        self,
        onnx_name: str,
        layer_of: Callable[[str], Layer],
        runs: Sequence[Value],
        out_shape: tuple[int, ...],
        dtype: Any,
        out_name: str,
        params: Sequence[np.ndarray] = (),
        param_names: Sequence[str] = (),
        state: Sequence[np.ndarray] = (),
        shape_args: Sequence[tuple[int, ...]] = (),
    ) -> Value:
        name = self._fresh(onnx_name or out_name)
        # cast: a run-time Value always names the node (or model input) that computes it
        inputs = tuple(dict.fromkeys(cast(str, v.node) for v in runs))
        self.out.nodes.append(Node(name, layer_of(name), inputs))
        self.out.params[name] = [np.ascontiguousarray(p, np.float32) for p in params]
        self.out.names[name] = list(param_names)
        if state:
            self.out.state[name] = [np.ascontiguousarray(s, np.float32) for s in state]
        self.out.scopes[name] = onnx_name
        self.out.shape_args[name] = [tuple(int(d) for d in s) for s in shape_args]
        return Value(out_name, "run", tuple(int(d) for d in out_shape), dtype, node=name)

    def _op(
        self,
        onnx_name: str,
        onnx_op: str,
        op: str,
        args: tuple,
        operands: Sequence[Value | np.ndarray | np.generic | None],
        out_shape: tuple[int, ...],
        out_name: str,
        dtype: Any = np.float32,
        flops: int | None = None,
        shape_args: Sequence[tuple[int, ...]] = (),
    ) -> Value:
        """An ``OnnxOp`` node; each operand a run-time Value, a parameter Value, or a constant array."""
        runs: list[Value] = []
        refs: list[tuple[str, int]] = []
        consts: list[np.ndarray] = []
        values: list[np.ndarray] = []
        labels: list[str] = []
        for v in operands:
            if v is None:
                refs.append(("n", 0))
            elif isinstance(v, Value) and v.kind == "run":
                nodes = list(dict.fromkeys(r.node for r in runs))
                if v.node not in nodes:
                    runs.append(v)
                    nodes.append(v.node)
                refs.append(("x", nodes.index(v.node)))
            elif isinstance(v, Value) and v.kind == "param":
                refs.append(("p", len(values)))
                values.append(np.ascontiguousarray(v.array, np.float32))
                labels.append(v.label)
            else:
                arr = np.asarray(v.array if isinstance(v, Value) else v)
                arr = arr.astype(np.int64) if arr.dtype.kind in "biu" else arr.astype(np.float32)
                refs.append(("c", len(consts)))
                consts.append(np.ascontiguousarray(arr))
        count = prod(out_shape[1:]) if flops is None else flops

        def make(name: str) -> Layer:
            return OnnxOp(
                op=op,
                onnx_op=onnx_op,
                args=args,
                operands=tuple(refs),
                consts=tuple(consts),
                values=tuple(values),
                labels=tuple(labels),
                out_shape=tuple(out_shape[1:]),
                flop_count=int(count),
                in_full=tuple(operands[0].shape) if isinstance(operands[0], Value) else (),
                name=name,
            )

        return self._add(onnx_name, make, runs, out_shape, dtype, out_name, values, labels, shape_args=shape_args)

    # -- the walk --------------------------------------------------------------------
    def run(self) -> _Pass:
        graph = self.proto.graph
        from onnx import numpy_helper

        for t in graph.initializer:
            arr = numpy_helper.to_array(t)
            kind = "param" if arr.dtype.kind == "f" else "const"
            self.out.values[t.name] = Value(t.name, kind, tuple(arr.shape), arr.dtype, array=arr)
        for node in graph.node:
            self._node(node)
        return self.out

    def _node(self, node: Any) -> None:
        op, where = node.op_type, node.name or (node.output[0] if node.output else "?")
        if node.domain not in ("", "ai.onnx"):
            self._unsupported(node, f"its domain {node.domain!r} is not the default ONNX domain")
        if op not in SUPPORTED_OPS:
            self._unsupported(node, "the op is not supported")
        ins: list[Value | None] = []
        for name in node.input:
            if not name:
                ins.append(None)
                continue
            if name not in self.out.values:
                raise OnnxError(
                    f"ONNX node {where!r} ({op}) consumes {name!r}, which no earlier node, input or initializer "
                    "makes; the graph is not in topological order or is broken (onnx.checker.check_model tells)"
                )
            ins.append(self.out.values[name])
        for v in ins:
            if v is not None and v.kind == "unused":
                self._unsupported(node, f"it consumes {v.name!r}, an output of {v.node} that is not computed")
        attrs = _attrs(node)
        if op == "Constant":
            self._set(node.output[0], self._constant(attrs, node))
            return
        if op in ("Shape", "Size"):
            assert ins[0] is not None  # their one input is required (onnx.checker)
            arr = evaluate(op, attrs, [np.empty(ins[0].shape, np.float32)], self.opset)[0]
            self._set(node.output[0], arr)
            return
        present = [v for v in ins if v is not None]
        if all(v.kind != "run" for v in present):
            if op not in FOLDABLE:
                self._unsupported(node, "the op cannot fold on constants")
            outs = evaluate(op, attrs, [None if v is None else v.array for v in ins], self.opset, len(node.output))
            sources = [v.label for v in present if v.kind == "param"]
            for name, arr in zip(node.output, outs):
                if name:
                    self._set(name, arr, "param" if sources and arr.dtype.kind == "f" else "const")
                    if len(sources) == 1:  # a transposed or sliced weight keeps its weight's name
                        self.out.values[name].label = sources[0]
            return
        if any(v.kind == "isnan" for v in present) and op != "Where":
            self._unsupported(node, "it consumes an IsNaN of a run-time tensor (only Where(IsNaN(x), 0, x) is taken)")
        first = ins[0]
        assert first is not None  # every supported op's first input is required (onnx.checker)
        if op == "IsNaN" and np.dtype(first.dtype).kind == "f":
            self.out.values[node.output[0]] = dataclasses.replace(first, name=node.output[0], kind="isnan")
            return
        runs = [v for v in present if v.kind == "run"]
        if (
            op in FOLDABLE
            and op not in _DEVICE_INT_OPS
            and all(np.dtype(v.dtype).kind in "biu" for v in runs)
            and not (op == "Gather" and first.kind != "run")
        ):
            self._host(node, where, attrs, ins)
            return
        if op not in RUNTIME_OPS:
            self._unsupported(node, "the op runs on constants only (shape arithmetic), not on a float tensor")
        try:
            made: list[Value | None] = getattr(self, f"_t_{op}")(node, where, attrs, ins)
        except _Unsupported as exc:
            self._unsupported(node, str(exc))
        for k, name in enumerate(node.output):
            if not name:
                continue
            made_k = made[k] if k < len(made) else None
            if made_k is not None:
                self.out.values[name] = dataclasses.replace(made_k, name=name)
            else:
                self.out.values[name] = Value(name, "unused", (), None, node=f"{where} (output {name!r})")

    def _host(self, node: Any, where: str, attrs: dict[str, Any], ins: list[Value | None]) -> None:
        """A node on integer or boolean run-time tensors (mask logic): NumPy runs it at run time."""
        if len([o for o in node.output if o]) != 1:
            self._unsupported(node, "an op on integer tensors with several outputs")
        probe = [None if v is None else (np.zeros(v.shape, v.dtype) if v.kind == "run" else v.array) for v in ins]
        try:
            out = np.asarray(evaluate(node.op_type, attrs, probe, self.opset)[0])
        except Exception as exc:
            shapes = [() if p is None else np.shape(p) for p in probe]  # np.shape(None) is ()
            self._unsupported(node, f"it does not evaluate on integer tensors of shapes {shapes} ({exc})")
        dtype = np.dtype(np.float32) if out.dtype.kind == "f" else np.dtype(np.int64)
        value = self._op(where, node.op_type, "host", (node.op_type, tuple(sorted(attrs.items())), self.opset), ins,
                         out.shape, node.output[0], dtype=dtype, flops=0)  # fmt: skip
        self.out.values[node.output[0]] = value

    def _set(self, name: str, arr: np.ndarray, kind: str = "const") -> None:
        arr = np.asarray(arr)
        self.out.values[name] = Value(name, kind, tuple(arr.shape), arr.dtype, array=arr)

    def _constant(self, attrs: dict[str, Any], node: Any) -> np.ndarray:
        for key in ("value", "value_float", "value_int", "value_floats", "value_ints"):
            if key in attrs:
                v = attrs[key]
                return np.asarray(v, np.float32 if "float" in key else (np.int64 if "int" in key else None))
        self._unsupported(node, f"a Constant with the attributes {sorted(attrs)} (sparse or string constants)")
        raise AssertionError  # unreachable

    def _unsupported(self, node: Any, why: str) -> NoReturn:
        where = node.name or (node.output[0] if node.output else "?")
        exc = UnsupportedOnnxError(
            f"ONNX node {where!r} (op {node.op_type}, opset {self.opset}) cannot be imported: {why}. "
            f"Supported ops: {', '.join(SUPPORTED_OPS)} (run-time ops: {', '.join(sorted(RUNTIME_OPS))})"
        )
        exc.op, exc.node, exc.opset = node.op_type, where, self.opset
        raise exc

    # -- helpers for the translations ------------------------------------------------
    @staticmethod
    def _need_run_float(v: Value, what: str) -> None:
        if np.dtype(v.dtype).kind != "f":
            raise _Unsupported(f"{what} is an integer tensor computed at run time; only float tensors compute")

    @staticmethod
    def _const(v: Value | None, what: str) -> np.ndarray:
        if v is None:
            raise _Unsupported(f"{what} is missing")
        if v.kind == "run":
            raise _Unsupported(f"{what} is computed at run time; it must be a constant for the given input shapes")
        return np.asarray(v.array)

    @staticmethod
    def _weight(v: Value | None, what: str) -> np.ndarray:
        if v is None or v.kind == "run":
            raise _Unsupported(f"{what} is computed at run time; it must be an initializer (a weight)")
        return np.asarray(v.array, np.float32)

    @staticmethod
    def _axis(axis: int, rank: int) -> int:
        if not -rank <= axis < rank:
            raise _Unsupported(f"axis {axis} is outside a rank-{rank} tensor")
        return axis % rank

    def _std(
        self,
        where: str,
        layer: Callable[[str], Layer],
        x: Value,
        out_shape: tuple[int, ...],
        out: str,
        params: Sequence[Value | None] = (),
        state: Sequence[np.ndarray] = (),
    ) -> Value:
        """A node of one of the spec's own layers."""
        arrays = [np.asarray(p.array, np.float32) for p in params if p is not None]
        names = [p.label for p in params if p is not None]
        return self._add(where, layer, [x], out_shape, x.dtype, out, arrays, names, state)

    # -- translations: one method per run-time op; each returns the node's output values ---
    def _elementwise(self, node: Any, where: str, fn: str, a: Value, b: Value) -> Value:
        shape = tuple(np.broadcast_shapes(a.shape, b.shape))
        for v in (a, b):
            if v.kind == "run":
                self._need_run_float(v, f"an operand of {node.op_type}")
        ops: list[Value | np.ndarray] = []
        for v in (a, b):
            # one-element weights in arithmetic (a folded scale) are constants, not parameters
            ops.append(v.array if v.kind == "param" and v.array is not None and v.array.size == 1 else v)
        if fn in ("multiply", "divide"):
            scalar = [k for k, v in enumerate(ops) if not isinstance(v, Value) or v.kind == "const"]
            scalar = [k for k in scalar if np.asarray(_array(ops[k])).size == 1]
            if scalar and (fn == "multiply" or scalar[0] == 1):
                k = scalar[0]
                c = float(np.asarray(_array(ops[k])).reshape(-1)[0])
                x = ops[1 - k]
                if isinstance(x, Value) and x.kind == "run" and x.shape == shape:
                    return self._op(where, node.op_type, "scale", (c if fn == "multiply" else 1.0 / c,), [x], shape,
                                    node.output[0])  # fmt: skip
        return self._op(where, node.op_type, "binary", (fn,), ops, shape, node.output[0])

    def _t_Add(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        return [self._elementwise(node, where, "add", ins[0], ins[1])]

    def _t_Sub(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        return [self._elementwise(node, where, "subtract", ins[0], ins[1])]

    def _t_Mul(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        return [self._elementwise(node, where, "multiply", ins[0], ins[1])]

    def _t_Div(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        return [self._elementwise(node, where, "divide", ins[0], ins[1])]

    def _t_Pow(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x = ins[0]
        if x.kind != "run":
            raise _Unsupported("a Pow whose exponent is computed at run time")
        e = self._const(ins[1], "the exponent")
        if e.size != 1 or float(e.reshape(-1)[0]) not in (0.5, 1.0, 2.0, 3.0):
            raise _Unsupported(f"the exponent {e.reshape(-1)[:4].tolist()} (take 0.5, 1, 2 or 3)")
        exp = float(e.reshape(-1)[0])
        if exp == 1.0:
            return [x]
        return [self._op(where, "Pow", "pow", (exp,), [x], x.shape, node.output[0], flops=prod(x.shape[1:]) * 2)]

    def _unary(self, node: Any, where: str, ins: list, fn: str, *extra: Any) -> list:
        x = ins[0]
        self._need_run_float(x, f"the input of {node.op_type}")
        return [self._op(where, node.op_type, "unary", (fn, *extra), [x], x.shape, node.output[0])]

    def _t_CastLike(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x, like = ins
        to = np.dtype(like.dtype)
        if np.dtype(x.dtype).kind != to.kind:
            raise _Unsupported(f"a CastLike of a run-time {np.dtype(x.dtype)} tensor to {to}")
        return [x]

    def _t_Clip(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x = ins[0]
        self._need_run_float(x, "the input of Clip")
        if self.opset < 11:
            lo, hi = attrs.get("min"), attrs.get("max")
        else:
            lo = None if len(ins) < 2 or ins[1] is None else float(self._const(ins[1], "min").reshape(-1)[0])
            hi = None if len(ins) < 3 or ins[2] is None else float(self._const(ins[2], "max").reshape(-1)[0])
        if lo is not None and hi is not None and lo >= hi:
            raise _Unsupported(f"min={lo} >= max={hi}")
        args = (None if lo is None else float(lo), None if hi is None else float(hi))
        return [self._op(where, "Clip", "clip", args, [x], x.shape, node.output[0], flops=4 * prod(x.shape[1:]))]

    def _t_Reciprocal(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x = ins[0]
        self._need_run_float(x, "the input of Reciprocal")
        return [self._op(where, "Reciprocal", "binary", ("divide",), [np.float32(1.0), x], x.shape, node.output[0])]

    def _t_Neg(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x = ins[0]
        self._need_run_float(x, "the input of Neg")
        return [self._op(where, "Neg", "scale", (-1.0,), [x], x.shape, node.output[0])]

    def _t_Sqrt(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        return self._unary(node, where, ins, "sqrt")

    def _t_Erf(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        return self._unary(node, where, ins, "erf")

    def _t_Relu(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x = ins[0]
        self._need_run_float(x, "the input of Relu")
        return [self._std(where, lambda n: ReLU(name=n), x, x.shape, node.output[0])]

    def _t_Tanh(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        self._need_run_float(ins[0], "the input of Tanh")
        return [self._std(where, lambda n: Tanh(name=n), ins[0], ins[0].shape, node.output[0])]

    def _t_Sigmoid(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        self._need_run_float(ins[0], "the input of Sigmoid")
        return [self._std(where, lambda n: Sigmoid(name=n), ins[0], ins[0].shape, node.output[0])]

    def _t_Gelu(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        approx = attrs.get("approximate", "none")
        if approx not in ("none", "tanh"):
            raise _Unsupported(f"approximate={approx!r}")
        self._need_run_float(ins[0], "the input of Gelu")
        return [self._std(where, lambda n: GELU(approx == "tanh", name=n), ins[0], ins[0].shape, node.output[0])]

    def _t_Identity(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        return [ins[0]]

    def _t_Dropout(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x = ins[0]
        ratio = attrs.get("ratio", 0.5)
        if len(ins) > 1 and ins[1] is not None:
            ratio = float(self._const(ins[1], "the ratio").reshape(-1)[0])
        if len(node.output) > 1 and node.output[1]:
            return [self._std(where, lambda n: Dropout(float(ratio), name=n), x, x.shape, node.output[0]), None]
        return [self._std(where, lambda n: Dropout(float(ratio), name=n), x, x.shape, node.output[0])]

    def _t_Cast(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x, to = ins[0], np.dtype(numpy_dtype(int(attrs["to"])))
        src = np.dtype(x.dtype)
        if to.kind == src.kind or (to.kind in "iu" and src.kind in "iu"):
            return [dataclasses.replace(x, dtype=to if to.kind != "b" else np.int64)]
        target = "bool" if to.kind == "b" else ("float32" if to.kind == "f" else "int64")
        out = self._op(where, "Cast", "cast", (target,), [x], x.shape, node.output[0], dtype=to)
        return [out]

    def _t_MatMul(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        a, b = ins
        if len(a.shape) < 2 or len(b.shape) < 2:
            raise _Unsupported(f"a MatMul of a rank-{len(a.shape)} by a rank-{len(b.shape)} tensor (need rank >= 2)")
        if a.shape[-1] != b.shape[-2]:
            raise _Unsupported(f"shapes {a.shape} and {b.shape} do not multiply")
        shape = (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
        flops = 2 * prod(shape[1:]) * a.shape[-1]
        return [self._op(where, "MatMul", "matmul", (), [a, b], tuple(shape), node.output[0], flops=flops)]

    def _t_Gemm(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        a, b = ins[0], ins[1]
        c = ins[2] if len(ins) > 2 else None
        ta, tb = int(attrs.get("transA", 0)), int(attrs.get("transB", 0))
        alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
        m = a.shape[1] if ta else a.shape[0]
        k = a.shape[0] if ta else a.shape[1]
        n = b.shape[0] if tb else b.shape[1]
        shape = (m, n)
        flops = 2 * n * k  # per example: one row of A
        if a.kind == "run" and not ta and b.kind == "param" and alpha == 1.0 and beta == 1.0:
            w = b.array.T if tb else b.array
            if c is None:
                bias: Any = np.zeros(n, np.float32)
            elif c.kind != "run" and np.asarray(c.array).size == n:
                bias = Value(
                    c.name, "param", (n,), np.float32, np.asarray(c.array, np.float32).reshape(n), label=c.label
                )
            else:
                bias = None
            if bias is not None:
                weight = Value(b.name, "param", w.shape, np.float32, np.ascontiguousarray(w), label=b.label)
                return [self._op(where, "Gemm", "dense", (), [a, weight, bias], shape, node.output[0], flops=flops)]
        ops = [a, b] + ([c] if c is not None else [])
        args = (ta, tb, alpha, beta, c is not None)
        return [self._op(where, "Gemm", "gemm", args, ops, shape, node.output[0], flops=flops)]

    def _conv_geometry(self, attrs: dict, x: Value, kernel: Sequence[int], what: str) -> tuple[int, int]:
        """(stride, padding) of a 2-D window op with equal strides and symmetric, equal pads."""
        if len(x.shape) != 4:
            raise _Unsupported(f"a {what} on a rank-{len(x.shape)} input (2-D, NCHW, only)")
        if any(int(d) != 1 for d in attrs.get("dilations", [1, 1])):
            raise _Unsupported(f"dilations={list(attrs['dilations'])} (only 1 is supported)")
        strides = [int(s) for s in attrs.get("strides", [1, 1])]
        pads = [int(p) for p in attrs.get("pads", [0, 0, 0, 0])]
        auto = attrs.get("auto_pad", "NOTSET")
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            halves: list[tuple[int, int]] = []  # (before, after) per axis
            for size, k, s in zip(x.shape[2:], kernel, strides):
                total = max((-(-size // s) - 1) * s + k - size, 0)
                halves.append((total // 2, total - total // 2))
            pads = [halves[0][0], halves[1][0], halves[0][1], halves[1][1]]
            if auto == "SAME_LOWER":
                pads = [pads[2], pads[3], pads[0], pads[1]]
        elif auto == "VALID":
            pads = [0, 0, 0, 0]
        if strides[0] != strides[1]:
            raise _Unsupported(f"strides={strides} (the same stride on both axes only)")
        if len(set(pads)) != 1:
            raise _Unsupported(f"pads={pads} (symmetric pads, the same on both axes, only)")
        return strides[0], pads[0]

    def _t_Conv(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x = ins[0]
        w = self._weight(ins[1], "the Conv weight")
        b = ins[2] if len(ins) > 2 else None
        o, cg, kh, kw = w.shape
        stride, pad = self._conv_geometry(attrs, x, (kh, kw), "Conv")
        groups = int(attrs.get("group", 1))
        oh, ow = (x.shape[2] + 2 * pad - kh) // stride + 1, (x.shape[3] + 2 * pad - kw) // stride + 1
        shape = (x.shape[0], o, oh, ow)
        wv = dataclasses.replace(ins[1], kind="param", array=w)
        bv = None if b is None else dataclasses.replace(b, kind="param", array=self._weight(b, "the Conv bias"))
        if kh == kw:
            layer = lambda n: Conv2d(o, kh, stride, pad, groups, bv is not None, name=n)  # noqa: E731
            return [self._std(where, layer, x, shape, node.output[0], [wv, bv])]
        flops = 2 * prod(shape[1:]) * cg * kh * kw
        ops = [x, wv] + ([bv] if bv is not None else [])
        return [self._op(where, "Conv", "conv", (stride, pad, groups, bv is not None), ops, shape, node.output[0],
                         flops=flops)]  # fmt: skip

    def _t_BatchNormalization(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x = ins[0]
        if len(x.shape) != 4:
            raise _Unsupported(f"a BatchNormalization of a rank-{len(x.shape)} input (NCHW only)")
        if int(attrs.get("training_mode", 0)):
            raise _Unsupported("training_mode=1 (export in eval mode with training=TrainingMode.PRESERVE)")
        scale = dataclasses.replace(ins[1], kind="param", array=self._weight(ins[1], "the scale"))
        bias = dataclasses.replace(ins[2], kind="param", array=self._weight(ins[2], "the bias"))
        state = [self._weight(ins[3], "the running mean"), self._weight(ins[4], "the running variance")]
        eps, momentum = float(attrs.get("epsilon", 1e-5)), float(attrs.get("momentum", 0.9))
        # NOTE: ONNX's momentum weighs the old running value (Paddle's and MXNet's convention); ours is torch's.
        layer = lambda n: BatchNorm2d(eps, min(max(1.0 - momentum, 1e-6), 1.0), name=n)  # noqa: E731
        out = self._std(where, layer, x, x.shape, node.output[0], [scale, bias], state)
        return [out] + [None] * (len(node.output) - 1)

    def _pool(self, node: Any, where: str, attrs: dict, ins: list) -> tuple[Value, int, int, int, bool, tuple]:
        x = ins[0]
        kernel = [int(k) for k in attrs["kernel_shape"]]
        if len(kernel) != 2 or kernel[0] != kernel[1]:
            raise _Unsupported(f"kernel_shape={kernel} (square 2-D windows only)")
        stride, pad = self._conv_geometry(attrs, x, kernel, node.op_type)
        k = kernel[0]
        if pad > k // 2:
            raise _Unsupported(f"pads of {pad} with a kernel of {k} (at most kernel // 2)")
        ceil = bool(int(attrs.get("ceil_mode", 0)))
        sizes = [pool_output_size(s, k, stride, pad, ceil) for s in x.shape[2:]]
        if ceil:
            # NOTE: ONNX's ceil rule keeps a last window that starts in the right padding;
            # torch's (ours) drops it. Where the two differ the file's output size is refused.
            onnx_sizes = [-(-(s + 2 * pad - k) // stride) + 1 for s in x.shape[2:]]
            if onnx_sizes != sizes:
                raise _Unsupported(f"ceil_mode=1 where a window starts in the right padding ({onnx_sizes} windows)")
        if len(node.output) > 1 and node.output[1]:
            raise _Unsupported("MaxPool's Indices output")
        return x, k, stride, pad, ceil, (x.shape[0], x.shape[1], *sizes)

    def _t_MaxPool(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x, k, stride, pad, ceil, shape = self._pool(node, where, attrs, ins)
        layer = lambda n: MaxPool2d(k, stride, pad, ceil_mode=ceil, name=n)  # noqa: E731
        return [self._std(where, layer, x, shape, node.output[0])]

    def _t_AveragePool(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x, k, stride, pad, ceil, shape = self._pool(node, where, attrs, ins)
        include_pad = bool(int(attrs.get("count_include_pad", 0)))
        if include_pad or (pad == 0 and not ceil):
            layer = lambda n: AvgPool2d(k, stride, pad, ceil_mode=ceil, name=n)  # noqa: E731
            return [self._std(where, layer, x, shape, node.output[0])]
        # count_include_pad=0: the average over the real values only. avg_pool2d divides by the cells
        # a window covers in the input and its padding (not a ceil window's overhang), so rescale by
        # that divisor over the count of real cells (numpy's slices stop at the ends, as windows do).
        real = np.pad(np.ones(x.shape[2:]), pad, constant_values=0.0)
        padded = np.ones(real.shape)
        windows = [(i * stride, j * stride) for i in range(shape[2]) for j in range(shape[3])]
        count = np.array([real[i : i + k, j : j + k].sum() for i, j in windows]).reshape(shape[2:])
        divisor = np.array([padded[i : i + k, j : j + k].sum() for i, j in windows]).reshape(shape[2:])
        factor = (divisor / count).astype(np.float32)[None, None]
        return [self._op(where, "AveragePool", "avg_pool_exclusive", (k, stride, pad, ceil), [x, factor], shape,
                         node.output[0], flops=prod(shape[1:]) * (k * k + 1))]  # fmt: skip

    def _t_GlobalAveragePool(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x = ins[0]
        if len(x.shape) != 4:
            raise _Unsupported(f"a GlobalAveragePool of a rank-{len(x.shape)} input (NCHW only)")
        return [self._std(where, lambda n: GlobalAvgPool2d(name=n), x, (*x.shape[:2], 1, 1), node.output[0])]

    def _reshape(self, node: Any, where: str, x: Value, shape: Sequence[int], out: str | None = None) -> Value:
        shape = tuple(int(d) for d in shape)
        if prod(shape) != prod(x.shape):
            raise _Unsupported(f"a reshape of {x.shape} to {shape}")
        if shape == x.shape:
            return x
        return self._op(where, node.op_type, "reshape", (tuple((0, d) for d in shape),), [x], shape,
                        out or node.output[0], dtype=x.dtype, flops=0, shape_args=[shape])  # fmt: skip

    def _t_Flatten(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x = ins[0]
        axis = int(attrs.get("axis", 1))
        axis = axis + len(x.shape) if axis < 0 else axis  # Flatten's axis lies in -r..r
        if not 0 <= axis <= len(x.shape):
            raise _Unsupported(f"axis {attrs.get('axis')} is outside -{len(x.shape)}..{len(x.shape)}")
        shape = (prod(x.shape[:axis]), prod(x.shape[axis:]))
        if axis == 1 and len(x.shape) > 1:
            return [self._std(where, lambda n: Flatten(name=n), x, shape, node.output[0])]
        return [self._reshape(node, where, x, shape)]

    def _t_Reshape(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x = ins[0]
        target = self._const(ins[1], "the target shape").reshape(-1).tolist()
        return [self._reshape(node, where, x, reshape_target(x.shape, target, int(attrs.get("allowzero", 0))))]

    def _t_Squeeze(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x = ins[0]
        folded = evaluate("Squeeze", attrs, [np.empty(x.shape, np.int8), *[self._const(v, "axes") for v in ins[1:]]],
                          self.opset)[0]  # fmt: skip
        return [self._reshape(node, where, x, folded.shape)]

    def _t_Unsqueeze(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x = ins[0]
        axes = [self._const(v, "axes") for v in ins[1:]]
        folded = evaluate("Unsqueeze", attrs, [np.empty(x.shape, np.int8), *axes], self.opset)[0]
        return [self._reshape(node, where, x, folded.shape)]

    def _t_Transpose(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x = ins[0]
        perm = tuple(int(p) for p in attrs.get("perm", range(len(x.shape))[::-1]))
        self._need_run_float(x, "the input of Transpose")
        shape = tuple(x.shape[p] for p in perm)
        return [self._op(where, "Transpose", "transpose", (perm,), [x], shape, node.output[0], flops=0)]

    def _t_Softmax(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x = ins[0]
        rank = len(x.shape)
        axis = self._axis(int(attrs.get("axis", -1 if self.opset >= 13 else 1)), rank)
        coerce = self.opset < 13 and axis != rank - 1
        flops = 5 * prod(x.shape[1:])
        return [self._op(where, "Softmax", "softmax", (axis, coerce), [x], x.shape, node.output[0], flops=flops)]

    def _t_LayerNormalization(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x = ins[0]
        rank = len(x.shape)
        axis = self._axis(int(attrs.get("axis", -1)), rank)
        eps = float(attrs.get("epsilon", 1e-5))
        norm = x.shape[axis:]
        stats: list[Value | None] = []
        if any(o for o in node.output[1:]):  # Mean and InvStdDev, from protocol ops
            axes = tuple(range(axis, rank))
            kept = tuple(1 if i >= axis else d for i, d in enumerate(x.shape))
            mean = self._op(where + ":mean", node.op_type, "reduce", ("reduce_mean", axes, True), [x], kept,
                            node.output[1] or where + ":mean")  # fmt: skip
            centered = self._op(where + ":centered", node.op_type, "binary", ("subtract",), [x, mean], x.shape,
                                where + ":centered")  # fmt: skip
            square = self._op(where + ":square", node.op_type, "pow", (2.0,), [centered], x.shape, where + ":square")
            var = self._op(where + ":var", node.op_type, "reduce", ("reduce_mean", axes, True), [square], kept,
                           where + ":var")  # fmt: skip
            shifted = self._op(where + ":shifted", node.op_type, "binary", ("add",), [var, np.float32(eps)], kept,
                               where + ":shifted")  # fmt: skip
            std = self._op(where + ":std", node.op_type, "unary", ("sqrt",), [shifted], kept, where + ":std")
            inv_name = node.output[2] if len(node.output) > 2 and node.output[2] else where + ":inv_std"
            inv = self._op(where + ":inv_std", node.op_type, "binary", ("divide",), [np.float32(1.0), std], kept,
                           inv_name)  # fmt: skip
            stats = [mean, inv]
        gamma = dataclasses.replace(ins[1], kind="param", array=self._weight(ins[1], "the scale"))
        if len(ins) > 2 and ins[2] is not None:
            beta = dataclasses.replace(ins[2], kind="param", array=self._weight(ins[2], "the bias"))
        else:
            beta = Value(f"{where}.bias", "param", norm, np.float32, array=np.zeros(norm, np.float32))
        for v in (gamma, beta):
            if tuple(v.array.shape) != tuple(norm):
                v.array = np.broadcast_to(v.array, norm).copy()
        if axis == rank - 1:
            y = self._std(where, lambda n: LayerNorm(eps, name=n), x, x.shape, node.output[0], [gamma, beta])
            return [y, *stats]
        flops = 8 * prod(x.shape[1:])
        return [self._op(where, node.op_type, "layer_norm", (eps,), [x, gamma, beta], x.shape, node.output[0],
                         flops=flops), *stats]  # fmt: skip

    def _reduce(self, node: Any, where: str, attrs: dict, ins: list, fn: str) -> list:
        x = ins[0]
        rank = len(x.shape)
        axes = attrs.get("axes")
        if axes is None and len(ins) > 1 and ins[1] is not None:
            axes = self._const(ins[1], "axes").reshape(-1).tolist()
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(rank))
        axes = tuple(sorted({self._axis(int(a), rank) for a in axes}))
        keep = bool(attrs.get("keepdims", 1))
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if keep else tuple(
            d for i, d in enumerate(x.shape) if i not in axes)  # fmt: skip
        return [self._op(where, node.op_type, "reduce", (fn, axes, keep), [x], shape, node.output[0],
                         flops=prod(x.shape[1:]))]  # fmt: skip

    def _t_ReduceMean(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        return self._reduce(node, where, attrs, ins, "reduce_mean")

    def _t_ReduceSum(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        return self._reduce(node, where, attrs, ins, "reduce_sum")

    def _take(self, node: Any, where: str, x: Value, steps: list, shape: tuple, out: str) -> Value:
        if any(not idx for _, idx in steps):
            raise _Unsupported(f"an empty selection from {x.shape}")
        steps = [(a, tuple(int(i) for i in idx)) for a, idx in steps if list(idx) != list(range(x.shape[a]))]
        taken = list(x.shape)
        for a, idx in steps:
            taken[a] = len(idx)
        target = None if tuple(taken) == tuple(shape) else tuple((0, d) for d in shape)
        if not steps:
            return x if target is None else self._reshape(node, where, x, shape, out)
        return self._op(where, node.op_type, "take", (tuple(steps), target), [x], tuple(shape), out, dtype=x.dtype,
                        flops=0, shape_args=[tuple(shape)] if target else [])  # fmt: skip

    def _t_Gather(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        data, idx = ins
        axis = self._axis(int(attrs.get("axis", 0)), len(data.shape))
        if data.kind == "run" and idx.kind == "run":
            raise _Unsupported("a Gather of run-time data at run-time indices")
        if data.kind != "run":
            if data.kind != "param" or axis != 0 or len(data.shape) != 2:
                raise _Unsupported("a Gather of run-time indices from anything but a 2-D float table on axis 0")
            if np.dtype(idx.dtype).kind not in "iu":
                raise _Unsupported("float indices")
            shape = (*idx.shape, data.shape[1])
            if len(idx.shape) == 2:
                layer = lambda n: Embedding(data.shape[0], data.shape[1], name=n)  # noqa: E731
                return [self._add(where, layer, [idx], shape, np.float32, node.output[0], [data.array], [data.label])]
            return [self._op(where, "Gather", "embedding", (), [idx, data], shape, node.output[0])]
        indices = np.asarray(idx.array).astype(np.int64)
        n = data.shape[axis]
        if ((indices < -n) | (indices >= n)).any():
            raise _Unsupported(f"indices {indices.reshape(-1)[:6].tolist()} outside 0..{n - 1}")
        flat = [int(i) % n for i in indices.reshape(-1)]
        shape = (*data.shape[:axis], *indices.shape, *data.shape[axis + 1 :])
        return [self._take(node, where, data, [(axis, flat)], shape, node.output[0])]

    def _t_Slice(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x = ins[0]
        if self.opset < 10:
            starts, ends, axes, steps = attrs["starts"], attrs["ends"], attrs.get("axes"), None
        else:
            starts = self._const(ins[1], "starts").reshape(-1).tolist()
            ends = self._const(ins[2], "ends").reshape(-1).tolist()
            axes = None if len(ins) < 4 or ins[3] is None else self._const(ins[3], "axes").reshape(-1).tolist()
            steps = None if len(ins) < 5 or ins[4] is None else self._const(ins[4], "steps").reshape(-1).tolist()
        picks = slice_steps(x.shape, starts, ends, axes, steps)
        shape = list(x.shape)
        for a, idx in picks:
            shape[a] = len(idx)
        return [self._take(node, where, x, picks, tuple(shape), node.output[0])]

    def _t_Split(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x = ins[0]
        axis = self._axis(int(attrs.get("axis", 0)), len(x.shape))
        extra = [None if v is None else self._const(v, "split") for v in ins[1:]]
        sizes = split_sizes(attrs, [None, *extra], x.shape[axis], len(node.output))
        outs, start = [], 0
        for k, (size, name) in enumerate(zip(sizes, node.output)):
            shape = tuple(size if i == axis else d for i, d in enumerate(x.shape))
            outs.append(self._take(node, f"{where}:{k}", x, [(axis, list(range(start, start + size)))], shape, name))
            start += size
        return outs

    def _t_Concat(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        rank = len(ins[0].shape)
        axis = self._axis(int(attrs["axis"]), rank)
        parts = [v for v in ins if v is not None and v.shape[axis] > 0]
        for v in parts:
            if v.kind == "run":
                self._need_run_float(v, "a Concat input")
        shape = list(parts[0].shape)
        shape[axis] = sum(v.shape[axis] for v in parts)
        return [self._op(where, "Concat", "concat", (axis,), parts, tuple(shape), node.output[0], flops=0)]

    def _t_Where(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        cond, a, b = ins
        shape = tuple(np.broadcast_shapes(cond.shape, a.shape, b.shape))
        if cond.kind == "isnan":
            # torch's safe softmax: Where(IsNaN(y), 0, y). Softmax of finite scores is never NaN: take y.
            zero = a.kind != "run" and np.asarray(a.array).size == 1 and float(np.asarray(a.array).reshape(-1)[0]) == 0
            if zero and b.kind == "run" and b.node == cond.node and b.shape == shape:
                return [b]
            raise _Unsupported("a Where on IsNaN other than Where(IsNaN(x), 0, x)")

        def scalar(v: Value) -> float | None:
            if v.kind != "run" and np.asarray(v.array).size == 1:
                return float(np.asarray(v.array).reshape(-1)[0])
            return None

        if b.kind == "run" and scalar(a) is not None:  # fill a where cond is set
            x, value, invert = b, scalar(a), False
        elif a.kind == "run" and scalar(b) is not None:  # fill b where cond is not set
            x, value, invert = a, scalar(b), True
        else:
            raise _Unsupported("a Where that does not pick between a run-time tensor and a scalar constant (a mask)")
        if x.shape != shape:
            raise _Unsupported(f"a mask of shape {cond.shape} that grows the tensor {x.shape}")
        self._need_run_float(x, "the tensor a Where masks")
        if cond.kind == "run":
            return [self._op(where, "Where", "where", (value, invert), [x, cond], shape, node.output[0])]
        mask = np.asarray(cond.array).astype(bool)
        mask = (~mask if invert else mask).astype(np.int64)
        return [self._op(where, "Where", "where", (value, False), [x, mask], shape, node.output[0])]

    def _t_Expand(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x = ins[0]
        target = tuple(np.broadcast_shapes(x.shape, tuple(self._const(ins[1], "the shape").reshape(-1).tolist())))
        if target == x.shape:
            return [x]
        self._need_run_float(x, "the input of Expand")
        padded = (1,) * (len(target) - len(x.shape)) + x.shape
        zeros = np.zeros(tuple(1 if p == t else t for p, t in zip(padded, target)), np.float32)
        return [self._op(where, "Expand", "expand", (), [x, zeros], target, node.output[0])]


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
