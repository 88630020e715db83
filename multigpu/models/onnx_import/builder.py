"""The walk of one fold of an ONNX graph (``BuilderBase``): its values, the bookkeeping of the nodes it makes
and the helpers the op translations share. The translations are in ``math_ops``, ``nn_ops`` and ``shape_ops``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from math import prod
from typing import Any, NoReturn, cast

import numpy as np

from multigpu.errors import OnnxError, UnsupportedOnnxError
from multigpu.models.layers import Layer
from multigpu.models.node import Node
from multigpu.models.onnx_layers import OnnxOp
from multigpu.models.onnx_numpy import FOLDABLE, evaluate

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


class BuilderBase:
    """One fold of an ONNX graph at given full input shapes: the walk and its bookkeeping.

    Each run-time op has a ``_t_<Op>`` method in one of the mixins; ``importer._Builder`` joins them.
    """

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
