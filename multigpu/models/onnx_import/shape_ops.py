"""ONNX translations of the ops that move data without arithmetic: reshapes, transposes, gathers, slices, concat."""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import Any

import numpy as np

from multigpu.models.layers import Flatten
from multigpu.models.onnx_import.builder import BuilderBase, Value, _Unsupported
from multigpu.models.onnx_numpy import evaluate, reshape_target, slice_steps, split_sizes
from multigpu.models.transformer_layers import Embedding


class ShapeOps(BuilderBase):
    """Flatten, Reshape, Squeeze/Unsqueeze, Transpose, Gather, Slice, Split, Concat and Expand."""

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

    def _t_Expand(self, node: Any, where: str, attrs: dict, ins: list) -> list:
        x = ins[0]
        target = tuple(np.broadcast_shapes(x.shape, tuple(self._const(ins[1], "the shape").reshape(-1).tolist())))
        if target == x.shape:
            return [x]
        self._need_run_float(x, "the input of Expand")
        padded = (1,) * (len(target) - len(x.shape)) + x.shape
        zeros = np.zeros(tuple(1 if p == t else t for p, t in zip(padded, target)), np.float32)
        return [self._op(where, "Expand", "expand", (), [x, zeros], target, node.output[0])]
