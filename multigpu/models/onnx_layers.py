"""Layer kinds for imported ONNX graphs: one ONNX op on protocol ops (``OnnxOp``) and a group of them (``OnnxGroup``).

``multigpu.models.onnx_import.from_onnx`` turns each ONNX node that computes on a model
input into a node of a ``Model``. Where one of the spec's own layers expresses the node
(Conv, BatchNormalization, Relu, the pools, Flatten, LayerNormalization, Gelu, Dropout, an
embedding Gather) it uses that layer, so the cost model prices it as a built-in one. Every
other node becomes an ``OnnxOp``: the op's name, its static arguments (folded for the
import's shapes), and its operands, each a runtime input of the node, one of its parameters,
or a constant. ``OnnxGroup`` runs several such nodes as one (an exporter's name scope,
a transformer layer), so a coarse graph has fewer, bigger placeable units.

Constants are numpy arrays made into tensors on the replica's device when a run first needs
them (``NodeCall.constant``): run an imported model with ``RunContext(devices=[device])``.

Shapes are per example, as every layer's: the batch axis (axis 0 of the ONNX tensors) is
left out. A reshape target whose leading entry follows the batch is stored as linear in it
(``a * batch + c`` per entry), so the model runs at any batch when its file allowed that;
``batch`` is the one batch a model imported with a fixed batch runs at (``in_full`` the
full shape of the first operand there); otherwise ``batch_from`` says which axis of the first
operand tells the batch (``(axis, a, c)``: that axis is ``a * batch + c`` long; torch's attention
works with the batch on axis 1). A host op's ``batch_consts`` rebuild the constants that follow
the batch: ``(k, "linear", pairs)`` a shape vector, ``(k, "rows", (row0, delta))`` one row per example.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from math import prod
from typing import Any

import numpy as np

from multigpu.errors import InputError, ModelError
from multigpu.models.context import NodeCall
from multigpu.models.layers import ContextLayer, JoinLayer, Layer, Shape
from multigpu.models.onnx_numpy import evaluate

#: The ops an ``OnnxOp`` runs, each on protocol ops.
OP_KINDS = (
    "binary",
    "scale",
    "unary",
    "matmul",
    "dense",
    "gemm",
    "softmax",
    "layer_norm",
    "reduce",
    "transpose",
    "reshape",
    "take",
    "concat",
    "embedding",
    "where",
    "cast",
    "pow",
    "avg_pool_exclusive",
    "conv",
    "expand",
    "batch_norm_frozen",
    "host",
    "clip",
)


def _shape_at(target: Sequence[tuple[int, int]], batch: int) -> tuple[int, ...]:
    """A full shape whose entries are ``a * batch + c``."""
    return tuple(a * batch + c for a, c in target)


@dataclass(frozen=True, eq=False)
class OnnxOp(ContextLayer):
    """One ONNX op on protocol ops; ``op`` is one of ``OP_KINDS`` and ``args`` its static arguments.

    ``operands`` lists, in the op's order, where each operand comes from: ``("x", i)`` the
    node's i-th input, ``("p", j)`` its j-th parameter, ``("c", k)`` constant ``consts[k]``.
    ``values`` are the parameters' imported values, named ``labels`` (the ONNX names);
    ``out_shape`` is the per-example output shape, ``flop_count`` the FLOPs per example.
    """

    op: str = "unary"
    onnx_op: str = ""
    args: tuple = ()
    operands: tuple[tuple[str, int], ...] = ()
    consts: tuple[np.ndarray, ...] = ()
    values: tuple[np.ndarray, ...] = ()
    labels: tuple[str, ...] = ()
    out_shape: Shape = ()
    flop_count: int = 0
    batch: int | None = None
    in_full: tuple[int, ...] = ()
    batch_from: tuple[int, int, int] | None = None
    batch_consts: tuple[tuple[int, str, Any], ...] = ()
    kind = "onnx"
    min_inputs = 1
    max_inputs = 64

    def __post_init__(self) -> None:
        if self.op not in OP_KINDS:
            raise ModelError(f"OnnxOp op={self.op!r} is unknown; use one of {list(OP_KINDS)}")

    # -- the spec ---------------------------------------------------------------
    def param_shapes(self, in_shape: Shape) -> list[Shape]:
        return [tuple(v.shape) for v in self.values]

    def param_labels(self, in_shape: Shape) -> list[str]:
        return list(self.labels)

    def output_shape(self, in_shape: Shape) -> Shape:
        return self.out_shape

    def flops(self, in_shape: Shape) -> int:
        return self.flop_count

    def macs(self, in_shape: Shape) -> int:
        return self.flop_count // 2 if self.op in ("matmul", "dense", "gemm", "conv") else 0

    def init_params(self, rng: np.random.Generator, in_shape: Shape, scheme: str, scale: float) -> list[np.ndarray]:
        """The imported values: an imported op's parameters start where the file left them."""
        return [np.array(v, np.float32) for v in self.values]

    # -- running ----------------------------------------------------------------
    def _operand(self, backend: Any, params: Sequence[Any], xs: Sequence[Any], node: NodeCall, k: int) -> Any:
        where, i = self.operands[k]
        if where == "n":
            return None
        if where == "x":
            return xs[i]
        if where == "p":
            return params[i]
        return node.constant(backend, f"onnx:{self.name}:{i}", lambda: self.consts[i], f"ONNX node {self.name!r}")

    def _check_batch(self, backend: Any, x: Any) -> int:
        shape = tuple(backend.shape(x))
        if self.batch is not None and shape != self.in_full:
            raise InputError(
                f"ONNX node {self.name!r} was imported for inputs of batch {self.batch}, where it receives "
                f"{self.in_full}, but receives {shape}: the model runs at that batch only (its file fixes the "
                "batch, or a value's axis 0 is not the batch); re-import with input_shapes for your batch"
            )
        if self.batch is not None:
            return self.batch
        if self.batch_from is None:
            return 0  # the targets do not depend on the batch
        axis, a, c = self.batch_from  # the first operand's axis ``axis`` is a * batch + c long
        return (shape[axis] - c) // a

    def call(self, backend: Any, params: Sequence[Any], xs: Sequence[Any], node: Any) -> Any:
        def arg(k: int) -> Any:
            return self._operand(backend, params, xs, node, k)

        return getattr(self, f"_run_{self.op}")(backend, arg, xs, node)

    def _run_binary(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        return getattr(b, self.args[0])(arg(0), arg(1))

    def _run_scale(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        return b.scale(arg(0), float(self.args[0]))

    def _run_unary(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        fn = self.args[0]
        if fn == "gelu":
            return b.gelu(arg(0), bool(self.args[1]))
        return getattr(b, fn)(arg(0))

    def _run_pow(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        x, exponent = arg(0), self.args[0]
        if exponent == 0.5:
            return b.sqrt(x)
        out = x
        for _ in range(int(exponent) - 1):
            out = b.multiply(out, x)
        return out

    def _run_matmul(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        return b.matmul(arg(0), arg(1))

    def _run_dense(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        return b.dense(arg(0), arg(1), arg(2))

    def _run_gemm(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        trans_a, trans_b, alpha, beta, has_c = self.args
        x, y = arg(0), arg(1)
        if trans_a:
            x = b.transpose(x, (1, 0))
        if trans_b:
            y = b.transpose(y, (1, 0))
        out = b.matmul(x, y)
        if alpha != 1.0:
            out = b.scale(out, float(alpha))
        if has_c:
            c = arg(2) if beta == 1.0 else b.scale(arg(2), float(beta))
            out = b.add(out, c)
        return out

    def _run_softmax(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        axis, coerce = self.args
        x = arg(0)
        if not coerce:
            return b.softmax(x, axis)
        # NOTE: ONNX's Softmax before opset 13 flattens x to 2-D at ``axis`` and normalizes the rows.
        shape = b.shape(x)
        flat = b.reshape(x, (prod(shape[:axis]), prod(shape[axis:])))
        return b.reshape(b.softmax(flat, 1), shape)

    def _run_layer_norm(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        return b.layer_norm(arg(0), arg(1), arg(2), float(self.args[0]))

    def _run_batch_norm_frozen(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        return b.batch_norm(arg(0), arg(1), arg(2), arg(3), arg(4), float(self.args[0]))

    def _run_reduce(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        fn, axes, keepdims = self.args
        return getattr(b, fn)(arg(0), axes, keepdims)

    def _run_transpose(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        return b.transpose(arg(0), self.args[0])

    def _run_reshape(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        x = arg(0)
        return b.reshape(x, _shape_at(self.args[0], self._check_batch(b, x)))

    def _run_expand(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        self._check_batch(b, arg(0))
        return b.add(arg(0), arg(1))  # arg(1): zeros shaped to broadcast x to the target

    def _run_take(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        steps, target = self.args
        x = arg(0)
        batch = self._check_batch(b, x)
        for axis, indices in steps:
            x = b.take(x, list(indices), axis)
        if target is not None:
            x = b.reshape(x, _shape_at(target, batch))
        return x

    def _run_concat(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        return b.concatenate([arg(k) for k in range(len(self.operands))], self.args[0])

    def _run_embedding(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        return b.embedding(arg(0), arg(1))

    def _run_where(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        value, invert = self.args
        x, mask = arg(0), arg(1)
        if invert:  # a runtime condition that picks x where set: fill where it is not
            mask = self._host(b, mask, node, lambda m: (m == 0).astype(np.int64))
        return b.masked_fill(x, mask, float(value))

    def _run_cast(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        to = self.args[0]
        if to == "bool":
            return self._host(b, arg(0), node, lambda v: (v != 0).astype(np.int64))
        return self._host(b, arg(0), node, lambda v: v.astype(to))

    def _host(self, b: Any, x: Any, node: Any, fn: Any) -> Any:
        # NOTE: the protocol has no dtype conversion on the device (only float32 and int64 exist,
        # and the ops refuse int64); a cast of a runtime tensor (an attention mask) goes through
        # the host. Integer tensors carry no gradient, so nothing is lost.
        return b.from_numpy(np.ascontiguousarray(fn(b.to_numpy(x))), node.device(f"ONNX Cast {self.name!r}"))

    def _run_clip(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        # min(max(x, lo), hi) = lo + relu(x - lo) - relu(x - hi) for lo < hi, from relu and the arithmetic ops
        lo, hi = self.args
        x = arg(0)

        def shifted(v: Any, c: float, key: str) -> Any:
            if c == 0.0:
                return v
            const = node.constant(
                b, f"onnx:{self.name}:{key}", lambda: np.full(1, -c, np.float32), f"ONNX Clip {self.name!r}"
            )
            return b.add(v, const)

        y = x
        if lo is not None:
            y = shifted(b.relu(shifted(x, lo, "lo")), -lo, "back")  # max(x, lo)
        if hi is not None:
            y = b.subtract(y, b.relu(shifted(y, hi, "hi")))  # min(y, hi)
        return y

    def _run_host(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        # An op on integer and boolean tensors only (attention-mask logic from the ids and the mask):
        # it carries no gradient, and the protocol computes on float32 alone, so NumPy runs it.
        onnx_op, attrs, opset = self.args
        consts = list(self.consts)
        if self.batch_consts:  # constants that follow the batch (an index per example, a target shape)
            batch = self._check_batch(b, arg(0))
            for k, how, data in self.batch_consts:
                if how == "linear":
                    consts[k] = np.array([a * batch + c for a, c in data], np.int64)
                else:  # "rows": row r is row0 + r * delta
                    row0, delta = data
                    steps = np.arange(batch).reshape(-1, *([1] * row0.ndim))
                    consts[k] = (row0[None] + steps * delta[None]).astype(row0.dtype)
        vals = [
            None if where == "n" else (b.to_numpy(xs[i]) if where == "x" else consts[i]) for where, i in self.operands
        ]
        out = np.asarray(evaluate(onnx_op, dict(attrs), vals, opset)[0])
        out = out.astype(np.int64) if out.dtype.kind in "biu" else out.astype(np.float32)
        return b.from_numpy(np.ascontiguousarray(out), node.device(f"ONNX node {self.name!r} ({onnx_op})"))

    def _run_avg_pool_exclusive(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        kernel, stride, padding, ceil_mode = self.args
        return b.multiply(b.avg_pool2d(arg(0), kernel, stride, padding, ceil_mode), arg(1))

    def _run_conv(self, b: Any, arg: Any, xs: Sequence[Any], node: Any) -> Any:
        stride, padding, groups, has_bias = self.args
        return b.conv2d(arg(0), arg(1), arg(2) if has_bias else None, stride, padding, groups)


@dataclass(frozen=True)
class GroupMember:
    """One node inside an ``OnnxGroup``: its layer and where each of its inputs comes from
    (``("in", i)``: the group's i-th input; ``("at", j)``: member j's output)."""

    name: str
    layer: Layer
    inputs: tuple[tuple[str, int], ...]
    in_shapes: tuple[Shape, ...]


@dataclass(frozen=True, eq=False)
class OnnxGroup(ContextLayer):
    """Several imported nodes run as one placeable unit (an exporter's name scope): a transformer
    layer, a residual block. ``members`` run in order; the last one's output is the group's."""

    members: tuple[GroupMember, ...] = ()
    out_shape: Shape = ()
    kind = "onnx_group"
    min_inputs = 1
    max_inputs = 256
    _offsets: tuple[int, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if not self.members:
            raise ModelError(f"OnnxGroup {self.name!r} has no members")
        counts = [len(m.layer.param_shapes(m.in_shapes[0])) for m in self.members]
        object.__setattr__(self, "_offsets", tuple(int(o) for o in np.cumsum([0, *counts])))

    @property
    def member_names(self) -> list[str]:
        """The names of the nodes this group runs, in order."""
        return [m.name for m in self.members]

    def param_shapes(self, in_shape: Shape) -> list[Shape]:
        return [s for m in self.members for s in m.layer.param_shapes(m.in_shapes[0])]

    def param_labels(self, in_shape: Shape) -> list[str]:
        return [f"{m.name}.{label}" for m in self.members for label in m.layer.param_labels(m.in_shapes[0])]

    def output_shape(self, in_shape: Shape) -> Shape:
        return self.out_shape

    def flops(self, in_shape: Shape) -> int:
        return sum(
            m.layer.join_flops(list(m.in_shapes)) if isinstance(m.layer, JoinLayer) else m.layer.flops(m.in_shapes[0])
            for m in self.members
        )

    def macs(self, in_shape: Shape) -> int:
        return sum(0 if isinstance(m.layer, JoinLayer) else m.layer.macs(m.in_shapes[0]) for m in self.members)

    def init_params(self, rng: np.random.Generator, in_shape: Shape, scheme: str, scale: float) -> list[np.ndarray]:
        return [p for m in self.members for p in m.layer.init_params(rng, m.in_shapes[0], scheme, scale)]

    def call(self, backend: Any, params: Sequence[Any], xs: Sequence[Any], node: Any) -> Any:
        outs: list[Any] = []
        for j, m in enumerate(self.members):
            ins = [xs[i] if where == "in" else outs[i] for where, i in m.inputs]
            p = params[self._offsets[j] : self._offsets[j + 1]]
            layer = m.layer
            if isinstance(layer, ContextLayer):
                # each member draws its own dropout masks: a node number of its own within the group
                sub = NodeCall(node.context, node.node * 4096 + j + 1, node.replica)
                outs.append(layer.call(backend, p, ins, sub))
            elif isinstance(layer, JoinLayer):
                outs.append(layer.join(backend, ins))
            else:
                outs.append(layer.forward(backend, p, ins[0]))
        return outs[-1]
