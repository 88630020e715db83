"""ONNX translations of the convolution-network ops: Conv, BatchNormalization and the pools."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from math import prod
from typing import Any

import numpy as np

from multigpu.contract.protocol import pool_output_size
from multigpu.models.layers import AvgPool2d, BatchNorm2d, Conv2d, GlobalAvgPool2d, MaxPool2d
from multigpu.models.onnx_import.builder import BuilderBase, Value, _Unsupported


class NNOps(BuilderBase):
    """Conv, BatchNormalization, MaxPool, AveragePool and GlobalAveragePool, on the spec's own layers where they fit."""

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
