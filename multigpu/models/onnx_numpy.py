"""NumPy evaluation of ONNX ops on constants: how shape subgraphs and weight-only subgraphs fold.

``evaluate(op, attrs, inputs, opset)`` returns the outputs of one ONNX node whose inputs are
all known at import (constants, initializers, shapes). Each function follows the ONNX
operator spec for the opsets the importer takes (``importer.OPSETS``); where an attribute
became an input (``axes`` in opset 13 and 18) both forms are read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import erf
from typing import Any

import numpy as np

from multigpu.errors import OnnxError

INT_MAX = np.iinfo(np.int64).max


def _axes(attrs: dict[str, Any], inputs: Sequence[Any], position: int) -> list[int] | None:
    """``axes`` from the attribute (older opsets) or from input ``position`` (newer)."""
    if "axes" in attrs:
        return [int(a) for a in attrs["axes"]]
    if len(inputs) > position and inputs[position] is not None:
        return [int(a) for a in np.asarray(inputs[position]).reshape(-1)]
    return None


def slice_steps(
    shape: Sequence[int], starts: Sequence[int], ends: Sequence[int], axes: Sequence[int] | None, steps: Any
) -> list[tuple[int, list[int]]]:
    """``(axis, indices)`` per sliced axis of a Slice on ``shape`` (ONNX's clamping rules)."""
    rank = len(shape)
    axes = list(range(len(starts))) if axes is None else [a % rank for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    out = []
    for axis, start, end, step in zip(axes, starts, ends, steps):
        n = shape[axis]
        out.append((axis, list(range(n))[slice(*_clamp(int(start), int(end), step, n))]))
    return out


def _clamp(start: int, end: int, step: int, n: int) -> tuple[int | None, int | None, int]:
    # ONNX clamps to [0, n] for positive steps and [-1, n-1] for negative ones; python slices
    # agree once the huge sentinels (INT_MAX, -INT_MAX) are mapped to None.
    if start >= n:
        start = n if step > 0 else n - 1
    elif start < -n:
        start = 0 if step > 0 else -n - 1
    stop: int | None  # None: to the end (a python slice's sentinel)
    if step > 0:
        stop = None if end >= n else (0 if end < -n else end)
    else:
        stop = None if end < -n else (n if end >= n else end)
    if step < 0 and start == -n - 1:
        return (0, 0, step)
    return (start, stop, step)


def _slice(attrs: dict[str, Any], inputs: Sequence[Any], opset: int) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    if opset < 10:
        starts, ends, axes, steps = attrs["starts"], attrs["ends"], attrs.get("axes"), None
    else:
        starts, ends = inputs[1], inputs[2]
        axes = None if len(inputs) < 4 or inputs[3] is None else inputs[3]
        steps = None if len(inputs) < 5 or inputs[4] is None else inputs[4]
    index: list[slice | np.ndarray] = [slice(None)] * x.ndim
    for axis, indices in slice_steps(x.shape, list(starts), list(ends), None if axes is None else list(axes), steps):
        index[axis] = np.asarray(indices, dtype=np.int64)
        x = x[tuple(index)]
        index[axis] = slice(None)
    return [x]


def split_sizes(attrs: dict[str, Any], inputs: Sequence[Any], length: int, outputs: int) -> list[int]:
    """The lengths of a Split's parts along its axis."""
    split = attrs.get("split")
    if split is None and len(inputs) > 1 and inputs[1] is not None:
        split = [int(s) for s in np.asarray(inputs[1]).reshape(-1)]
    if split is not None:
        return [int(s) for s in split]
    parts = int(attrs.get("num_outputs", outputs))
    size = -(-length // parts)  # the last part may be smaller (opset 18)
    return [min(size, length - k * size) for k in range(parts)]


def _split(attrs: dict[str, Any], inputs: Sequence[Any], n_out: int) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    axis = int(attrs.get("axis", 0)) % x.ndim
    sizes = split_sizes(attrs, inputs, x.shape[axis], n_out)
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


def reshape_target(shape: Sequence[int], target: Sequence[int], allowzero: int = 0) -> tuple[int, ...]:
    """The resolved shape of a Reshape of ``shape`` to ``target`` (0 copies a dim unless allowzero; -1 infers)."""
    out = [shape[i] if (t == 0 and not allowzero) else int(t) for i, t in enumerate(target)]
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        out[out.index(-1)] = int(np.prod(shape)) // known if known else 0
    return tuple(out)


def _reduce(fn: Callable[..., np.ndarray], attrs: dict[str, Any], inputs: Sequence[Any], opset: int) -> np.ndarray:
    x = np.asarray(inputs[0])
    axes = _axes(attrs, inputs, 1)
    keep = bool(attrs.get("keepdims", 1))
    if axes is None or not axes:
        if attrs.get("noop_with_empty_axes", 0) and axes is not None:
            return x
        axes = list(range(x.ndim))
    return fn(x, axis=tuple(a % max(x.ndim, 1) for a in axes), keepdims=keep).astype(x.dtype)


def _unsqueeze(attrs: dict[str, Any], inputs: Sequence[Any]) -> np.ndarray:
    x = np.asarray(inputs[0])
    axes = _axes(attrs, inputs, 1) or []
    rank = x.ndim + len(axes)
    for a in sorted(a % rank for a in axes):
        x = np.expand_dims(x, a)
    return x


def _squeeze(attrs: dict[str, Any], inputs: Sequence[Any]) -> np.ndarray:
    x = np.asarray(inputs[0])
    axes = _axes(attrs, inputs, 1)
    if axes is None:
        return np.squeeze(x)
    return np.squeeze(x, axis=tuple(a % x.ndim for a in axes))


def _gemm(attrs: dict[str, Any], inputs: Sequence[Any]) -> np.ndarray:
    a, b = np.asarray(inputs[0]), np.asarray(inputs[1])
    a = a.T if attrs.get("transA", 0) else a
    b = b.T if attrs.get("transB", 0) else b
    out = float(attrs.get("alpha", 1.0)) * (a @ b)
    if len(inputs) > 2 and inputs[2] is not None:
        out = out + float(attrs.get("beta", 1.0)) * np.asarray(inputs[2])
    return out.astype(a.dtype)


def _softmax(attrs: dict[str, Any], inputs: Sequence[Any], opset: int) -> np.ndarray:
    x = np.asarray(inputs[0])
    axis = int(attrs.get("axis", -1 if opset >= 13 else 1)) % x.ndim
    if opset < 13:
        flat = x.reshape(int(np.prod(x.shape[:axis])), -1)
        e = np.exp(flat - flat.max(axis=1, keepdims=True))
        return (e / e.sum(axis=1, keepdims=True)).reshape(x.shape)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _layer_norm(attrs: dict[str, Any], inputs: Sequence[Any]) -> np.ndarray:
    x = np.asarray(inputs[0])
    axis = int(attrs.get("axis", -1)) % x.ndim
    axes = tuple(range(axis, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + float(attrs.get("epsilon", 1e-5))) * inputs[1]
    return (y + inputs[2] if len(inputs) > 2 and inputs[2] is not None else y).astype(x.dtype)


def _gather(attrs: dict[str, Any], inputs: Sequence[Any]) -> np.ndarray:
    x, idx = np.asarray(inputs[0]), np.asarray(inputs[1])
    axis = int(attrs.get("axis", 0)) % x.ndim
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    return np.take(x, idx, axis=axis)


_ONNX_DTYPES = {
    1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64, 9: np.bool_,
    10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64,
}  # fmt: skip


def numpy_dtype(onnx_type: int) -> Any:
    """The numpy dtype of an ONNX ``TensorProto`` element type; OnnxError for strings and exotic types."""
    if onnx_type not in _ONNX_DTYPES:
        raise OnnxError(f"ONNX element type {onnx_type} (strings, complex, bfloat16, 8-bit floats) is not supported")
    return _ONNX_DTYPES[onnx_type]


def _cast(attrs: dict[str, Any], inputs: Sequence[Any]) -> np.ndarray:
    return np.asarray(inputs[0]).astype(numpy_dtype(int(attrs["to"])))


def _constant_of_shape(attrs: dict[str, Any], inputs: Sequence[Any]) -> np.ndarray:
    value = attrs.get("value")
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    return np.full(tuple(int(d) for d in np.asarray(inputs[0]).reshape(-1)), fill[0], dtype=fill.dtype)


def _where(inputs: Sequence[Any]) -> np.ndarray:
    x, y = np.asarray(inputs[1]), np.asarray(inputs[2])
    return np.where(np.asarray(inputs[0]).astype(bool), x, y).astype(np.result_type(x, y))


def _pool(op: str, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
    kernel = [int(k) for k in attrs["kernel_shape"]]
    strides = [int(s) for s in attrs.get("strides", [1] * len(kernel))]
    pads = [int(p) for p in attrs.get("pads", [0] * 2 * len(kernel))]
    (kh, kw), (sh, sw), (ph, pw) = kernel, strides, pads[:2]
    fill = -np.inf if op == "MaxPool" else 0.0
    padded = np.pad(x, ((0, 0), (0, 0), (ph, pads[2]), (pw, pads[3])), constant_values=fill)
    ones = np.pad(np.ones(x.shape[2:]), ((ph, pads[2]), (pw, pads[3])))
    oh, ow = (padded.shape[2] - kh) // sh + 1, (padded.shape[3] - kw) // sw + 1
    out = np.empty((*x.shape[:2], oh, ow), x.dtype)
    for i in range(oh):
        for j in range(ow):
            win = padded[:, :, i * sh : i * sh + kh, j * sw : j * sw + kw]
            if op == "MaxPool":
                out[:, :, i, j] = win.max(axis=(2, 3))
            elif attrs.get("count_include_pad", 0):
                out[:, :, i, j] = win.mean(axis=(2, 3))
            else:
                out[:, :, i, j] = win.sum(axis=(2, 3)) / ones[i * sh : i * sh + kh, j * sw : j * sw + kw].sum()
    return out


def _conv(attrs: dict[str, Any], inputs: Sequence[Any]) -> np.ndarray:
    x, w = np.asarray(inputs[0]), np.asarray(inputs[1])
    strides = [int(s) for s in attrs.get("strides", [1, 1])]
    pads = [int(p) for p in attrs.get("pads", [0, 0, 0, 0])]
    groups = int(attrs.get("group", 1))
    x = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    o, cg, kh, kw = w.shape
    oh, ow = (x.shape[2] - kh) // strides[0] + 1, (x.shape[3] - kw) // strides[1] + 1
    out = np.zeros((x.shape[0], o, oh, ow), np.float64)
    og = o // groups
    for g in range(groups):
        xs = x[:, g * cg : (g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i : i + strides[0] * oh : strides[0], j : j + strides[1] * ow : strides[1]]
                out[:, g * og : (g + 1) * og] += np.einsum("bchw,oc->bohw", patch, w[g * og : (g + 1) * og, :, i, j])
    if len(inputs) > 2 and inputs[2] is not None:
        out += np.asarray(inputs[2])[None, :, None, None]
    return out.astype(x.dtype)


def _batch_norm(attrs: dict[str, Any], inputs: Sequence[Any]) -> np.ndarray:
    x, scale, bias, mean, var = (np.asarray(v) for v in inputs[:5])
    shape = (1, -1) + (1,) * (x.ndim - 2)
    eps = float(attrs.get("epsilon", 1e-5))
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * scale.reshape(shape) + bias.reshape(shape)
    return y.astype(x.dtype)


def _gelu(attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
    if attrs.get("approximate", "none") == "tanh":
        return (0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))).astype(x.dtype)
    return (0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))).astype(x.dtype)


def _range(inputs: Sequence[Any]) -> np.ndarray:
    # start, limit and delta as 0-d arrays: arange keeps their dtype (ONNX's), not Python's float.
    bounds: tuple[Any, ...] = tuple(np.asarray(v).reshape(()) for v in inputs)
    return np.arange(*bounds, dtype=np.result_type(*bounds))


def _flatten(attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
    axis = int(attrs.get("axis", 1))
    axis = axis + x.ndim if axis < 0 else axis  # Flatten's axis lies in -r..r
    return x.reshape(int(np.prod(x.shape[:axis])), -1)


def _clip(attrs: dict[str, Any], inputs: Sequence[Any], opset: int) -> np.ndarray:
    x = np.asarray(inputs[0])
    if opset < 11:
        lo, hi = attrs.get("min"), attrs.get("max")
    else:
        lo = inputs[1] if len(inputs) > 1 else None
        hi = inputs[2] if len(inputs) > 2 else None
    return np.clip(x, lo, hi).astype(x.dtype) if lo is not None or hi is not None else x


def _binary(fn: Callable[[Any, Any], Any]) -> Callable[[dict[str, Any], Sequence[Any], int], list[np.ndarray]]:
    def run(attrs: dict[str, Any], inputs: Sequence[Any], opset: int) -> list[np.ndarray]:
        a, b = np.asarray(inputs[0]), np.asarray(inputs[1])
        out = np.asarray(fn(a, b))
        return [out.astype(np.result_type(a, b)) if out.dtype != bool else out]

    return run


def _unary(fn: Callable[[np.ndarray], Any]) -> Callable[[dict[str, Any], Sequence[Any], int], list[np.ndarray]]:
    def run(attrs: dict[str, Any], inputs: Sequence[Any], opset: int) -> list[np.ndarray]:
        x = np.asarray(inputs[0])
        out = np.asarray(fn(x))
        return [out.astype(x.dtype) if out.dtype != bool else out]

    return run


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(np.result_type(a, b), np.integer):
        return np.trunc(a / b).astype(np.result_type(a, b))  # ONNX's integer Div truncates
    return a / b


def _mod(attrs: dict[str, Any], inputs: Sequence[Any], opset: int) -> list[np.ndarray]:
    a, b = np.asarray(inputs[0]), np.asarray(inputs[1])
    return [np.fmod(a, b) if attrs.get("fmod", 0) else np.mod(a, b)]


_TABLE: dict[str, Callable[[dict[str, Any], Sequence[Any], int], list[np.ndarray]]] = {
    "Add": _binary(np.add),
    "Sub": _binary(np.subtract),
    "Mul": _binary(np.multiply),
    "Div": _binary(_int_div),
    "Pow": _binary(np.power),
    "Mod": _mod,
    "Equal": _binary(np.equal),
    "Less": _binary(np.less),
    "LessOrEqual": _binary(np.less_equal),
    "Greater": _binary(np.greater),
    "GreaterOrEqual": _binary(np.greater_equal),
    "And": _binary(np.logical_and),
    "Or": _binary(np.logical_or),
    "Max": lambda a, i, o: [np.maximum.reduce([np.asarray(v) for v in i])],
    "Min": lambda a, i, o: [np.minimum.reduce([np.asarray(v) for v in i])],
    "Not": _unary(np.logical_not),
    "Neg": _unary(np.negative),
    "Abs": _unary(np.abs),
    "Floor": _unary(np.floor),
    "Ceil": _unary(np.ceil),
    "Sqrt": _unary(np.sqrt),
    "Reciprocal": _unary(lambda x: 1 / x),
    "Exp": _unary(np.exp),
    "Log": _unary(np.log),
    "Relu": _unary(lambda x: np.maximum(x, 0)),
    "Tanh": _unary(np.tanh),
    "Sigmoid": _unary(lambda x: 1 / (1 + np.exp(-x))),
    "Erf": _unary(np.vectorize(erf, otypes=[np.float64])),
    "IsNaN": _unary(np.isnan),
    "Identity": lambda a, i, o: [np.asarray(i[0])],
    "Dropout": lambda a, i, o: [np.asarray(i[0])],
    "Cast": lambda a, i, o: [_cast(a, i)],
    "CastLike": lambda a, i, o: [np.asarray(i[0]).astype(np.asarray(i[1]).dtype)],
    "Shape": lambda a, i, o: [np.asarray(np.asarray(i[0]).shape[slice(a.get("start", 0), a.get("end"))], np.int64)],
    "Size": lambda a, i, o: [np.asarray(np.asarray(i[0]).size, np.int64)],
    "Reshape": lambda a, i, o: [
        np.asarray(i[0]).reshape(reshape_target(np.shape(i[0]), list(np.asarray(i[1])), a.get("allowzero", 0)))
    ],
    "Flatten": lambda a, i, o: [_flatten(a, np.asarray(i[0]))],
    "Transpose": lambda a, i, o: [np.transpose(np.asarray(i[0]), a.get("perm"))],
    "Unsqueeze": lambda a, i, o: [_unsqueeze(a, i)],
    "Squeeze": lambda a, i, o: [_squeeze(a, i)],
    "Concat": lambda a, i, o: [np.concatenate([np.asarray(v) for v in i], axis=int(a["axis"]))],
    "Gather": lambda a, i, o: [_gather(a, i)],
    "GatherElements": lambda a, i, o: [
        np.take_along_axis(np.asarray(i[0]), np.asarray(i[1]), axis=int(a.get("axis", 0)))
    ],
    "Slice": _slice,
    "Expand": lambda a, i, o: [np.asarray(i[0]) * np.ones(tuple(np.asarray(i[1])), np.asarray(i[0]).dtype)],
    "Tile": lambda a, i, o: [np.tile(np.asarray(i[0]), tuple(np.asarray(i[1])))],
    "ConstantOfShape": lambda a, i, o: [_constant_of_shape(a, i)],
    "Range": lambda a, i, o: [_range(i)],
    "Where": lambda a, i, o: [_where(i)],
    "ReduceMean": lambda a, i, o: [_reduce(np.mean, a, i, o)],
    "ReduceSum": lambda a, i, o: [_reduce(np.sum, a, i, o)],
    "ReduceProd": lambda a, i, o: [_reduce(np.prod, a, i, o)],
    "ReduceMax": lambda a, i, o: [_reduce(np.max, a, i, o)],
    "ReduceMin": lambda a, i, o: [_reduce(np.min, a, i, o)],
    "MatMul": lambda a, i, o: [np.matmul(np.asarray(i[0]), np.asarray(i[1]))],
    "Gemm": lambda a, i, o: [_gemm(a, i)],
    "Softmax": lambda a, i, o: [_softmax(a, i, o)],
    "LayerNormalization": lambda a, i, o: [_layer_norm(a, i)],
    "Gelu": lambda a, i, o: [_gelu(a, np.asarray(i[0]))],
    "BatchNormalization": lambda a, i, o: [_batch_norm(a, i)],
    "Conv": lambda a, i, o: [_conv(a, i)],
    "MaxPool": lambda a, i, o: [_pool("MaxPool", a, np.asarray(i[0]))],
    "AveragePool": lambda a, i, o: [_pool("AveragePool", a, np.asarray(i[0]))],
    "GlobalAveragePool": lambda a, i, o: [np.asarray(i[0]).mean(axis=(2, 3), keepdims=True)],
    "Clip": lambda a, i, o: [_clip(a, i, o)],
    "Trilu": lambda a, i, o: [
        (np.triu if a.get("upper", 1) else np.tril)(np.asarray(i[0]), int(np.asarray(i[1])) if len(i) > 1 else 0)
    ],
}


def evaluate(op: str, attrs: dict[str, Any], inputs: Sequence[Any], opset: int, outputs: int = 1) -> list[np.ndarray]:
    """Return the outputs of ONNX op ``op`` on known ``inputs`` (numpy arrays; None for an absent optional one)."""
    if op == "Split":
        return _split(attrs, inputs, outputs)
    return [np.asarray(v) for v in _TABLE[op](attrs, inputs, opset)]


#: The ops that fold on constants (a shape subgraph, a weight-only subgraph).
FOLDABLE = frozenset(_TABLE) | {"Split"}
