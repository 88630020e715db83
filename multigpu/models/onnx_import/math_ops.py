"""ONNX translations of arithmetic, activations, matrix products, normalization, reductions and Where."""

from __future__ import annotations

import dataclasses
from math import prod
from typing import Any

import numpy as np

from multigpu.models.dropout import Dropout
from multigpu.models.layers import ReLU
from multigpu.models.onnx_import.builder import BuilderBase, Value, _Unsupported
from multigpu.models.onnx_numpy import numpy_dtype
from multigpu.models.transformer_layers import GELU, LayerNorm, Sigmoid, Tanh


class MathOps(BuilderBase):
    """Element-wise arithmetic, activations, Cast/Identity/Dropout, MatMul and Gemm, Softmax,
    LayerNormalization, ReduceMean/ReduceSum and Where."""

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
