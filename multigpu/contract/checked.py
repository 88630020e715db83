"""The backend contract, enforced once: every protocol call is checked here, then run.

``checked(adapter)`` wraps an adapter in :class:`CheckedBackend`; the registry does
this for every backend it hands out, so the rules written in ``multigpu.contract.protocol``
hold for every adapter, a third party's included, without each adapter repeating
them. The checks read shapes, dtypes and Python arguments only (a few attribute
reads per call, no device read and no per-element pass on the step's fast path);
``benchmarks/contract_overhead.py`` measures what they cost per step.
"""

from __future__ import annotations

import inspect
import math
import threading
from collections.abc import Callable, Sequence
from math import prod
from typing import Any, NamedTuple

import numpy as np

from multigpu.checks import check_count, check_number
from multigpu.contract.protocol import Device
from multigpu.errors import AdapterError, DeviceError, InputError

Shape = tuple[int, ...]

# Integer tensors (labels, ids) whose value range is known from the host (see softmax_cross_entropy).
# Entries hold the tensor itself, so an id cannot be reused while it is listed; the
# oldest entries fall out first, and a tensor that fell out is checked by a read-back.
_TRACKED = 64


def _int(value: Any, op: str, name: str, low: int) -> int:
    if type(value) is int and value >= low:  # the common case, first: this runs on every op
        return value
    return check_count(value, f"{op} {name}", minimum=low)


def check_label_range(low: int, high: int, classes: int) -> None:
    """Raise InputError unless every label in ``low..high`` is a class of ``0..classes-1``."""
    if low < 0 or high >= classes:
        raise InputError(
            f"label {low if low < 0 else high} is out of range: {classes} classes need labels "
            f"0..{classes - 1} (no label is ignored, wrapped or clipped)"
        )


class Span(NamedTuple):
    """What the host knows of an integer tensor's values: the least and the greatest, and the values
    next to them (``next_low`` the least above ``low``, ``next_high`` the greatest below ``high``;
    both equal ``low`` when every value is the same). The neighbours let a check set aside an
    ignore index at either end of the range exactly, without reading the tensor back."""

    low: int
    high: int
    next_low: int
    next_high: int


def span_of(values: np.ndarray) -> Span:
    """The :class:`Span` of a non-empty integer array."""
    low, high = int(values.min()), int(values.max())
    if low == high:
        return Span(low, high, low, high)
    return Span(low, high, int(values[values > low].min()), int(values[values < high].max()))


def merge_spans(spans: Sequence[Span]) -> Span:
    """The :class:`Span` of the values of several tensors together (a concatenation)."""
    low, high = min(s.low for s in spans), max(s.high for s in spans)
    values = {v for s in spans for v in s}
    return Span(
        low, high, min((v for v in values if v > low), default=low), max((v for v in values if v < high), default=high)
    )


def check_index_span(span: Span, size: int, op: str, ignore_index: int | None = None) -> None:
    """Raise InputError unless every value of ``span`` is in ``0..size-1`` or equals ``ignore_index``.

    ``op`` is ``"embedding"`` (ids into a table of ``size`` rows) or a cross-entropy
    (labels of ``size`` classes); the message names the first bad value and the fix.
    """
    low, high = span.low, span.high
    if ignore_index is not None:
        if low == high == ignore_index:
            return
        if low == ignore_index:
            low = span.next_low
        if high == ignore_index:
            high = span.next_high
    if low >= 0 and high < size:
        return
    bad = low if low < 0 else high
    if op == "embedding":
        raise InputError(
            f"embedding id {bad} is out of range: a table of {size} rows takes ids 0..{size - 1}; "
            "map the token to an id of the vocabulary (or grow the table)"
        )
    ignored = f" or the ignore_index {ignore_index}" if ignore_index is not None else ""
    raise InputError(
        f"{op} label {bad} is out of range: {size} classes need labels 0..{size - 1}{ignored} "
        "(no label is wrapped or clipped); mark padding with the ignore_index"
    )


class CheckedBackend:
    """An adapter behind the contract: bad calls raise the same exception on every backend.

    Attributes the protocol does not name (``torch_device``, say) pass through to
    the adapter, which is ``self.adapter``.
    """

    def __init__(self, adapter: Any):
        self.adapter = adapter
        self.name: str = adapter.name
        self.tensor_type: type = adapter.tensor_type
        self._gpus: int | None = None
        self._ranges: dict[int, tuple[Any, Span]] = {}
        self._lock = threading.Lock()
        if hasattr(adapter, "native_allreduce"):  # optional; hasattr() stays honest without it
            self.native_allreduce = self._native_allreduce

    def __getattr__(self, attr: str) -> Any:
        if attr == "adapter" or attr.startswith("__"):  # unpickling, copy: never recurse
            raise AttributeError(attr)
        return getattr(self.adapter, attr)

    def __reduce__(self) -> tuple[Any, ...]:
        return (checked, (self.adapter,))

    def __repr__(self) -> str:
        return f"CheckedBackend({self.adapter!r})"

    # -- argument checks ---------------------------------------------------
    def _shape(self, t: Any, what: str) -> Shape:
        if not isinstance(t, self.tensor_type):
            raise InputError(
                f"{what} must be a {self.name} tensor ({self.tensor_type.__name__}), "
                f"got {type(t).__name__}; make one with from_numpy"
            )
        return self.adapter.shape(t)

    def _float(self, t: Any, what: str) -> Shape:
        if not isinstance(t, self.tensor_type):  # inlined _shape: this runs ~40 times a step
            self._shape(t, what)
        if self.adapter.dtype(t).kind != "f":
            raise InputError(f"{what} has dtype {self.adapter.dtype(t)}; this needs a float32 tensor")
        return self.adapter.shape(t)

    def _input(self, t: Any, op: str, ndim: int | None = None) -> Shape:
        """A float, non-empty operand of ``op`` (of rank ``ndim`` when given)."""
        if not isinstance(t, self.tensor_type) or self.adapter.dtype(t).kind != "f":
            self._float(t, f"{op} input")  # raises, naming the problem
        shape = self.adapter.shape(t)
        if ndim is not None and len(shape) != ndim:
            raise InputError(f"{op} needs a {ndim}-D input, got shape {shape}")
        if 0 in shape:
            raise InputError(f"{op} got an empty tensor of shape {shape}; it needs at least one element")
        return shape

    def _device(self, device: Any) -> None:
        if (
            not isinstance(device, Device)
            or device.kind not in ("cpu", "gpu")
            or isinstance(device.index, bool)
            or not isinstance(device.index, int)
            or device.index < 0
        ):
            raise DeviceError(f"{device!r} is not a device; use Device('cpu', i) or Device('gpu', i), i >= 0")
        if device.kind == "gpu":
            if self._gpus is None:
                self._gpus = int(self.adapter.gpu_count())
            if device.index >= self._gpus:
                raise DeviceError(
                    f"device {device} does not exist: {self.name} sees {self._gpus} GPU(s); "
                    "use a smaller index or CPU devices"
                )

    def _same(self, dst: Any, src: Any, op: str) -> Shape:
        a, b = self._shape(dst, f"{op} dst"), self._shape(src, f"{op} src")
        if a != b:
            raise InputError(f"{op} needs equal shapes, got dst {a} and src {b}; nothing broadcasts")
        da, db = self.adapter.dtype(dst), self.adapter.dtype(src)
        if da != db:
            raise InputError(f"{op} needs equal dtypes, got dst {da} and src {db}")
        if da.kind != "f":
            self._forget_ranges()  # an integer tensor (or a view of one) changes
        return a

    # -- label ranges --------------------------------------------------------
    def _remember(self, t: Any, span: Span) -> None:
        with self._lock:
            self._ranges[id(t)] = (t, span)
            while len(self._ranges) > _TRACKED:
                del self._ranges[next(iter(self._ranges))]

    def _range_of(self, t: Any) -> Span | None:
        entry = self._ranges.get(id(t))
        return entry[1] if entry is not None and entry[0] is t else None

    def _span(self, t: Any) -> Span:
        """The span of an integer tensor: recorded on the host, else read back once (a device wait)."""
        known = self._range_of(t)
        return known if known is not None else span_of(self.adapter.to_numpy(t))

    def _pass_range(self, src: Any, dst: Any) -> None:
        known = self._range_of(src)
        if known is not None:
            self._remember(dst, known)

    def _forget_ranges(self) -> None:
        with self._lock:
            self._ranges.clear()

    # -- devices ---------------------------------------------------------------
    def gpu_count(self) -> int:
        """Return how many GPUs the framework can use."""
        return self.adapter.gpu_count()

    def synchronize(self, device: Device) -> None:
        """Wait for ``device``; DeviceError for a bad device."""
        self._device(device)
        self.adapter.synchronize(device)

    # -- tensors ---------------------------------------------------------------
    def from_numpy(self, array: Any, device: Device) -> Any:
        """A new float32/int64 tensor on ``device``; InputError for other dtypes."""
        self._device(device)
        a = np.asarray(array)
        kind = a.dtype.kind
        if kind == "f":
            return self.adapter.from_numpy(a.astype(np.float32, order="C", copy=False), device)
        if kind not in "iu":
            raise InputError(
                f"from_numpy takes floating or integer arrays, got dtype {a.dtype}; "
                "cast it first, e.g. mask.astype('float32') or flags.astype('int64')"
            )
        a = a.astype(np.int64, order="C", copy=False)
        t = self.adapter.from_numpy(a, device)
        if a.size:  # labels or ids: their range is known here, on the host, without a device read later
            self._remember(t, span_of(a))
        return t

    def to_numpy(self, tensor: Any) -> np.ndarray:
        """A numpy copy of ``tensor``."""
        self._shape(tensor, "to_numpy tensor")
        return self.adapter.to_numpy(tensor)

    def copy_to(self, tensor: Any, device: Device) -> Any:
        """A new buffer on ``device``."""
        shape = self._shape(tensor, "copy_to tensor")
        self._device(device)
        if 0 in shape:  # NOTE: MXNet's legacy NDArray cannot copy an empty array
            return self.adapter.from_numpy(np.zeros(shape, self.adapter.dtype(tensor)), device)
        out = self.adapter.copy_to(tensor, device)
        self._pass_range(tensor, out)
        return out

    def shape(self, tensor: Any) -> Shape:
        """The shape of ``tensor``."""
        return self._shape(tensor, "shape tensor")

    def dtype(self, tensor: Any) -> np.dtype:
        """The numpy dtype of ``tensor``."""
        self._shape(tensor, "dtype tensor")
        return self.adapter.dtype(tensor)

    # -- ops -------------------------------------------------------------------
    def conv2d(self, x: Any, w: Any, b: Any | None, stride: int, padding: int, groups: int) -> Any:
        """Checked NCHW convolution; ``b=None`` is a convolution without bias."""
        xs, ws = self._input(x, "conv2d", 4), self._float(w, "conv2d w")
        bs = ws[:1] if b is None else self._float(b, "conv2d b")
        stride, padding = _int(stride, "conv2d", "stride", 1), _int(padding, "conv2d", "padding", 0)
        groups = _int(groups, "conv2d", "groups", 1)
        if len(ws) != 4 or bs != ws[:1] or 0 in ws or ws[0] % groups or xs[1] != ws[1] * groups:
            raise InputError(
                f"conv2d needs x (B, C, H, W), w (O, C/groups, kH, kW) and b (O,) or None with O "
                f"divisible by groups; got x {xs}, w {ws}, b {bs}, groups={groups}"
            )
        if xs[2] + 2 * padding < ws[2] or xs[3] + 2 * padding < ws[3]:
            raise InputError(
                f"conv2d kernel {ws[2:]} is larger than the padded input {(xs[2] + 2 * padding, xs[3] + 2 * padding)}"
            )
        return self.adapter.conv2d(x, w, b, stride, padding, groups)

    def _pool(self, op: str, x: Any, kernel: int, stride: int, padding: int, ceil_mode: bool) -> None:
        xs = self._input(x, op, 4)
        if type(ceil_mode) is not bool:
            raise InputError(
                f"{op} ceil_mode={ceil_mode!r} must be True (round the output size up, torch's rule) "
                "or False (round it down)"
            )
        kernel, stride = _int(kernel, op, "kernel", 1), _int(stride, op, "stride", 1)
        if _int(padding, op, "padding", 0) > kernel // 2:
            raise InputError(f"{op} padding={padding} is more than half the kernel {kernel}; use at most {kernel // 2}")
        if min(xs[2], xs[3]) + 2 * padding < kernel:
            raise InputError(
                f"{op} kernel {kernel} is larger than the padded input {(xs[2] + 2 * padding, xs[3] + 2 * padding)}"
            )

    def avg_pool2d(self, x: Any, kernel: int, stride: int, padding: int, ceil_mode: bool) -> Any:
        """Checked average pooling."""
        self._pool("avg_pool2d", x, kernel, stride, padding, ceil_mode)
        return self.adapter.avg_pool2d(x, kernel, stride, padding, ceil_mode)

    def max_pool2d(self, x: Any, kernel: int, stride: int, padding: int, ceil_mode: bool) -> Any:
        """Checked max pooling."""
        self._pool("max_pool2d", x, kernel, stride, padding, ceil_mode)
        return self.adapter.max_pool2d(x, kernel, stride, padding, ceil_mode)

    def relu(self, x: Any) -> Any:
        """Checked max(x, 0)."""
        self._input(x, "relu")
        return self.adapter.relu(x)

    def global_avg_pool2d(self, x: Any) -> Any:
        """Checked mean over each (H, W) plane."""
        self._input(x, "global_avg_pool2d", 4)
        return self.adapter.global_avg_pool2d(x)

    def _channels(self, op: str, x: Any, vectors: dict[str, Any], eps: Any) -> Shape:
        """x (B, C, H, W) and per-channel (C,) float vectors; a finite eps > 0."""
        xs = self._input(x, op, 4)
        for what, v in vectors.items():
            vs = self._float(v, f"{op} {what}")
            if vs != xs[1:2]:
                raise InputError(f"{op} needs {what} of shape ({xs[1]},) for x {xs} (one value per channel), got {vs}")
        check_number(eps, f"{op} eps", minimum=0.0, strict=True, example=1e-5)
        return xs

    def batch_norm(self, x: Any, gamma: Any, beta: Any, mean: Any, var: Any, eps: float) -> Any:
        """Checked inference-mode BatchNorm with given statistics."""
        self._channels("batch_norm", x, {"gamma": gamma, "beta": beta, "mean": mean, "var": var}, eps)
        return self.adapter.batch_norm(x, gamma, beta, mean, var, float(eps))

    def batch_norm_train(
        self, x: Any, gamma: Any, beta: Any, eps: float, stats: Any | None = None, count: int | None = None
    ) -> tuple[Any, Any, Any]:
        """Checked training-mode BatchNorm: x's own statistics, or those of the given parts' table."""
        xs = self._channels("batch_norm_train", x, {"gamma": gamma, "beta": beta}, eps)
        if stats is None:
            if count is not None:
                raise InputError("batch_norm_train count is only given with stats; pass both or neither")
            values = xs[0] * xs[2] * xs[3]
        else:
            ss = self._float(stats, "batch_norm_train stats")
            if len(ss) != 3 or ss[1:] != (3, xs[1]) or ss[0] < 1:
                raise InputError(
                    f"batch_norm_train needs stats of shape (parts, 3, {xs[1]}) (per part: the per-channel "
                    f"count, mean and centred sum of squares, see batch_norm_stats) for x {xs}, got {ss}"
                )
            if count is None:
                raise InputError("batch_norm_train with stats needs count, the N*H*W of all the parts together")
            values = _int(count, "batch_norm_train", "count", 1)
        if values < 2:
            raise InputError(
                f"batch_norm_train sees {values} value per channel (x {xs}); the batch variance "
                "of one value is undefined: give every BatchNorm at least 2 values per channel "
                "(a larger batch per device, or synchronized statistics)"
            )
        return self.adapter.batch_norm_train(x, gamma, beta, float(eps), stats, None if stats is None else values)

    def batch_norm_stats(self, x: Any, part: int = 0, parts: int = 1) -> Any:
        """Checked per-channel count, mean and centred sum of squares, in row ``part`` of ``parts``."""
        self._input(x, "batch_norm_stats", 4)
        parts = _int(parts, "batch_norm_stats", "parts", 1)
        part = _int(part, "batch_norm_stats", "part", 0)
        if part >= parts:
            raise InputError(f"batch_norm_stats part={part} is not a row of a table of {parts}: use 0..{parts - 1}")
        return self.adapter.batch_norm_stats(x, part, parts)

    def concat_channels(self, xs: Sequence[Any]) -> Any:
        """Checked differentiable concatenation along the channel axis."""
        if not isinstance(xs, (list, tuple)) or not xs:
            raise InputError(f"concat_channels needs a non-empty list of tensors, got {xs!r:.60}")
        shapes = [self._input(t, "concat_channels", 4) for t in xs]
        if any((s[0], s[2], s[3]) != (shapes[0][0], shapes[0][2], shapes[0][3]) for s in shapes):
            raise InputError(f"concat_channels needs equal batch, height and width, got {shapes}")
        return self.adapter.concat_channels(list(xs))

    def group_sum(self, x: Any, group: Any) -> Any:
        """Checked differentiable sum over the ranks of ``group``."""
        xs = self._input(x, "group_sum", 1)
        if not callable(getattr(group, "allreduce_", None)):
            raise InputError(
                f"group_sum needs a process group (with allreduce_), got {type(group).__name__}; "
                "e.g. multigpu.distributed.rank.init_process_group()"
            )
        out = self.adapter.group_sum(x, group)
        if self.adapter.shape(out) != xs:
            raise AdapterError(f"{self.name} adapter's group_sum returned shape {self.adapter.shape(out)} for {xs}")
        return out

    def dense(self, x: Any, w: Any, b: Any) -> Any:
        """Checked ``x @ w + b`` over x's last axis."""
        xs, ws, bs = self._input(x, "dense"), self._float(w, "dense w"), self._float(b, "dense b")
        if len(xs) < 2 or len(ws) != 2 or xs[-1] != ws[0] or bs != ws[1:]:
            raise InputError(
                f"dense needs x (..., I) of rank 2 or more, w (I, O) and b (O,); got x {xs}, w {ws}, b {bs}"
            )
        return self.adapter.dense(x, w, b)

    def reshape(self, x: Any, shape: Sequence[int]) -> Any:
        """Checked reshape; the adapter receives fully resolved dims."""
        xs = self._shape(x, "reshape input")
        size = prod(xs)
        if not size:
            raise InputError(f"reshape got an empty tensor of shape {xs}")
        if not isinstance(shape, (list, tuple, np.ndarray)):
            raise InputError(f"reshape target must be a tuple of dims, got {shape!r}")
        dims = [_int(d, "reshape", "dim", -1) for d in shape]
        if dims.count(-1) > 1 or 0 in dims:
            raise InputError(f"reshape target {tuple(dims)} may hold -1 once and every other dim must be >= 1")
        known = prod(d for d in dims if d != -1)
        if -1 in dims and size % known == 0:
            dims[dims.index(-1)] = size // known
        if prod(dims) != size or -1 in dims:
            raise InputError(f"cannot reshape {xs} ({size} elements) to {tuple(shape)}")
        out = self.adapter.reshape(x, tuple(dims))
        self._pass_range(x, out)
        return out

    def softmax_cross_entropy(self, logits: Any, labels: Any) -> Any:
        """Checked per-example loss; every label must be in 0..C-1."""
        ls, ys = self._input(logits, "softmax_cross_entropy", 2), self._shape(labels, "labels")
        if ys != ls[:1]:
            raise InputError(f"softmax_cross_entropy needs labels of shape {ls[:1]} for logits {ls}, got {ys}")
        if self.adapter.dtype(labels).kind not in "iu":
            raise InputError(f"labels have dtype {self.adapter.dtype(labels)}; they must be integers")
        known = self._span(labels)  # not made by from_numpy here: read back once (a device wait)
        check_label_range(known.low, known.high, ls[1])
        return self.adapter.softmax_cross_entropy(logits, labels)

    def sum(self, x: Any) -> Any:
        """Checked sum of all elements."""
        self._input(x, "sum")
        return self.adapter.sum(x)

    def argmax(self, x: Any, axis: int) -> Any:
        """Checked index of the maximum along ``axis``."""
        xs = self._shape(x, "argmax input")
        if 0 in xs:
            raise InputError(f"argmax got an empty tensor of shape {xs}")
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -len(xs) <= axis < len(xs):
            raise InputError(f"argmax axis={axis!r} is out of range for shape {xs}")
        return self.adapter.argmax(x, int(axis))

    # -- transformer and ONNX ops ------------------------------------------------
    # The adapters receive normalized arguments: axes and indices as non-negative Python
    # ints (axes sorted, in a tuple), a perm as a tuple, floats as Python floats.
    def _axis(self, axis: Any, ndim: int, op: str, what: str = "axis") -> int:
        """``axis`` as a non-negative int, for a tensor of rank ``ndim`` (numpy's negative axes allowed)."""
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise InputError(
                f"{op} {what}={axis!r} must be an int in {-ndim}..{ndim - 1} (numpy's negative axes count)"
            )
        if not -ndim <= axis < ndim:
            raise InputError(
                f"{op} {what}={axis!r} is out of range for a {ndim}-D tensor; use an int in {-ndim}..{ndim - 1}"
            )
        return int(axis) % ndim

    @staticmethod
    def _broadcast_shape(a: Shape, b: Shape) -> tuple[Shape, int]:
        """``(shape, 0)``: what ``a`` and ``b`` broadcast to (numpy's rule); ``((), i)`` when axis -i clashes."""
        out = []
        for i in range(1, max(len(a), len(b)) + 1):
            m, n = a[-i] if i <= len(a) else 1, b[-i] if i <= len(b) else 1
            if m != n and 1 not in (m, n):
                return (), i
            out.append(n if m == 1 else m)
        return tuple(reversed(out)), 0

    def _broadcast(self, op: str, a: Shape, b: Shape) -> Shape:
        """The shape ``a`` and ``b`` broadcast to, else InputError naming both."""
        shape, clash = self._broadcast_shape(a, b)
        if clash:
            raise InputError(
                f"{op} cannot broadcast shapes {a} and {b}: axis -{clash} has {a[-clash]} against {b[-clash]}; "
                "trailing dimensions must be equal or 1 (reshape one operand, e.g. to add a size-1 axis)"
            )
        return shape

    def _elementwise(self, op: str, x: Any, y: Any) -> None:
        self._broadcast(op, self._input(x, op), self._input(y, op))

    def matmul(self, x: Any, y: Any) -> Any:
        """Checked batched ``x @ y``: ranks >= 2, inner sizes equal, leading axes broadcast."""
        xs, ys = self._input(x, "matmul"), self._input(y, "matmul")
        if len(xs) < 2 or len(ys) < 2 or xs[-1] != ys[-2]:
            raise InputError(
                f"matmul needs x (..., M, K) and y (..., K, N), both of rank 2 or more, got x {xs} and y {ys}; "
                "reshape a vector to (1, K) or (K, 1)"
            )
        if self._broadcast_shape(xs[:-2], ys[:-2])[1]:
            raise InputError(
                f"matmul cannot broadcast the leading axes of x {xs} and y {ys}: {xs[:-2]} against {ys[:-2]}; "
                "they must be equal or 1, as numpy's"
            )
        return self.adapter.matmul(x, y)

    def transpose(self, x: Any, perm: Sequence[int]) -> Any:
        """Checked axis permutation: ``perm`` holds each of 0..ndim-1 once."""
        xs = self._input(x, "transpose")
        ok = isinstance(perm, (list, tuple, np.ndarray)) and all(
            isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in perm
        )
        if not ok or sorted(int(p) for p in perm) != list(range(len(xs))):
            raise InputError(
                f"transpose perm={perm!r:.60} is not a permutation of the {len(xs)} axes of {xs}; "
                f"give each of 0..{len(xs) - 1} once, e.g. {tuple(reversed(range(len(xs))))}"
            )
        return self.adapter.transpose(x, tuple(int(p) for p in perm))

    def add(self, x: Any, y: Any) -> Any:
        """Checked differentiable ``x + y`` with numpy's broadcasting."""
        self._elementwise("add", x, y)
        return self.adapter.add(x, y)

    def subtract(self, x: Any, y: Any) -> Any:
        """Checked ``x - y`` with broadcasting."""
        self._elementwise("subtract", x, y)
        return self.adapter.subtract(x, y)

    def multiply(self, x: Any, y: Any) -> Any:
        """Checked ``x * y`` with broadcasting."""
        self._elementwise("multiply", x, y)
        return self.adapter.multiply(x, y)

    def divide(self, x: Any, y: Any) -> Any:
        """Checked ``x / y`` with broadcasting."""
        self._elementwise("divide", x, y)
        return self.adapter.divide(x, y)

    def scale(self, x: Any, factor: float) -> Any:
        """Checked ``x * factor`` for a finite real factor."""
        self._input(x, "scale")
        return self.adapter.scale(x, check_number(factor, "scale factor", example=0.125))

    def tanh(self, x: Any) -> Any:
        """Checked tanh."""
        self._input(x, "tanh")
        return self.adapter.tanh(x)

    def sigmoid(self, x: Any) -> Any:
        """Checked sigmoid."""
        self._input(x, "sigmoid")
        return self.adapter.sigmoid(x)

    def gelu(self, x: Any, approximate: bool) -> Any:
        """Checked GELU; ``approximate`` is a bool (True: the tanh form)."""
        self._input(x, "gelu")
        if type(approximate) is not bool:
            raise InputError(
                f"gelu approximate={approximate!r} must be True (the tanh form) or False (exact, with erf); "
                "strings such as 'tanh' or 'none' are not taken"
            )
        return self.adapter.gelu(x, approximate)

    def erf(self, x: Any) -> Any:
        """Checked error function."""
        self._input(x, "erf")
        return self.adapter.erf(x)

    def sqrt(self, x: Any) -> Any:
        """Checked square root."""
        self._input(x, "sqrt")
        return self.adapter.sqrt(x)

    def softmax(self, x: Any, axis: int) -> Any:
        """Checked stable softmax along ``axis``."""
        xs = self._input(x, "softmax")
        return self.adapter.softmax(x, self._axis(axis, len(xs), "softmax"))

    def layer_norm(self, x: Any, gamma: Any, beta: Any, eps: float) -> Any:
        """Checked layer norm over x's trailing axes, the shape of gamma."""
        xs = self._input(x, "layer_norm")
        gs, bs = self._float(gamma, "layer_norm gamma"), self._float(beta, "layer_norm beta")
        if gs != bs or not gs or 0 in gs or len(gs) > len(xs) or xs[len(xs) - len(gs) :] != gs:
            raise InputError(
                f"layer_norm needs gamma and beta of one shape equal to x's last axes, got x {xs}, "
                f"gamma {gs}, beta {bs}; to normalize over the last axis pass gamma and beta of shape {xs[-1:]}"
            )
        return self.adapter.layer_norm(
            x, gamma, beta, check_number(eps, "layer_norm eps", minimum=0.0, strict=True, example=1e-5)
        )

    def embedding(self, ids: Any, table: Any) -> Any:
        """Checked ``table[ids]``: int64 ids in 0..V-1 and a (V, D) table."""
        ids_shape = self._shape(ids, "embedding ids")
        if self.adapter.dtype(ids).kind not in "iu":
            raise InputError(
                f"embedding ids have dtype {self.adapter.dtype(ids)}; token ids must be integers: "
                "from_numpy(ids.astype('int64'))"
            )
        if 0 in ids_shape:
            raise InputError(f"embedding got empty ids of shape {ids_shape}; it needs at least one id")
        ts = self._input(table, "embedding")
        if len(ts) != 2:
            raise InputError(f"embedding needs a (V, D) table, got shape {ts}")
        check_index_span(self._span(ids), ts[0], "embedding")
        return self.adapter.embedding(ids, table)

    def _reduce(self, op: str, x: Any, axes: Any, keepdims: Any) -> tuple[int, ...]:
        xs = self._input(x, op)
        if not isinstance(axes, (list, tuple, np.ndarray)) or not len(axes):
            raise InputError(f"{op} axes={axes!r:.60} must be a non-empty list of axes of {xs}, e.g. [-1]")
        norm = [self._axis(a, len(xs), op, "axis") for a in axes]
        if len(set(norm)) != len(norm):
            raise InputError(f"{op} axes={list(axes)} name an axis of {xs} twice; give each axis once")
        if type(keepdims) is not bool:
            raise InputError(f"{op} keepdims={keepdims!r} must be True or False")
        return tuple(sorted(norm))

    def reduce_sum(self, x: Any, axes: Sequence[int], keepdims: bool) -> Any:
        """Checked sum over ``axes``."""
        return self.adapter.reduce_sum(x, self._reduce("reduce_sum", x, axes, keepdims), keepdims)

    def reduce_mean(self, x: Any, axes: Sequence[int], keepdims: bool) -> Any:
        """Checked mean over ``axes``."""
        return self.adapter.reduce_mean(x, self._reduce("reduce_mean", x, axes, keepdims), keepdims)

    def masked_fill(self, x: Any, mask: Any, value: float) -> Any:
        """Checked fill of x with ``value`` where ``mask`` (broadcast to x's shape) is nonzero."""
        xs, ms = self._input(x, "masked_fill"), self._shape(mask, "masked_fill mask")
        if self.adapter.dtype(mask) not in (np.dtype(np.float32), np.dtype(np.int64)):
            raise InputError(f"masked_fill mask has dtype {self.adapter.dtype(mask)}; it must be float32 or int64")
        if self._broadcast_shape(xs, ms)[0] != xs:
            raise InputError(
                f"masked_fill mask of shape {ms} does not broadcast to x's shape {xs}; a padding mask of "
                f"ids (B, T) for scores (B, H, T, T) is reshaped to (B, 1, 1, T) first"
            )
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or math.isnan(value):
            raise InputError(f"masked_fill value={value!r} must be a float (-inf allowed, NaN not), e.g. -1e9 or -inf")
        return self.adapter.masked_fill(x, mask, float(value))

    def dropout(self, x: Any, keep: Any, rate: float) -> Any:
        """Checked inverted dropout with a given keep mask of x's shape."""
        xs, ks = self._input(x, "dropout"), self._float(keep, "dropout keep")
        if ks != xs:
            raise InputError(
                f"dropout keep mask has shape {ks} for x {xs}; draw it for x's shape with multigpu.models.dropout_mask"
            )
        if isinstance(rate, bool) or not isinstance(rate, (int, float, np.integer, np.floating)) or not 0 <= rate < 1:
            raise InputError(
                f"dropout rate={rate!r} must be a number in [0, 1), e.g. 0.1; rate 1 would drop everything"
            )
        return self.adapter.dropout(x, keep, float(rate))

    def cross_entropy(self, logits: Any, labels: Any, ignore_index: int) -> Any:
        """Checked per-position loss over the last axis; labels in 0..C-1 or equal to ``ignore_index``."""
        ls, ys = self._input(logits, "cross_entropy"), self._shape(labels, "cross_entropy labels")
        if len(ls) < 2 or ys != ls[:-1]:
            raise InputError(
                f"cross_entropy needs logits (..., C) of rank 2 or more and labels of shape logits.shape[:-1], "
                f"got logits {ls} and labels {ys}"
            )
        if self.adapter.dtype(labels).kind not in "iu":
            raise InputError(f"cross_entropy labels have dtype {self.adapter.dtype(labels)}; they must be int64")
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer)):
            raise InputError(f"cross_entropy ignore_index={ignore_index!r} must be an int, e.g. -100")
        check_index_span(self._span(labels), ls[-1], "cross_entropy", int(ignore_index))
        return self.adapter.cross_entropy(logits, labels, int(ignore_index))

    def take(self, x: Any, indices: Sequence[int], axis: int) -> Any:
        """Checked gather of constant ``indices`` along ``axis``."""
        xs = self._input(x, "take")
        ax = self._axis(axis, len(xs), "take")
        n = xs[ax]
        ok = isinstance(indices, (list, tuple, np.ndarray)) and len(indices) > 0
        if ok and not all(
            isinstance(i, (int, np.integer)) and not isinstance(i, bool) and -n <= i < n for i in indices
        ):
            ok = False
        if not ok:
            raise InputError(
                f"take indices={indices!r:.60} must be a non-empty list of ints in {-n}..{n - 1} "
                f"(axis {ax} of {xs} has {n} entries)"
            )
        return self.adapter.take(x, tuple(int(i) % n for i in indices), ax)

    def concatenate(self, xs: Sequence[Any], axis: int) -> Any:
        """Checked differentiable concatenation along ``axis``."""
        if not isinstance(xs, (list, tuple)) or not xs:
            raise InputError(f"concatenate needs a non-empty list of tensors, got {xs!r:.60}")
        shapes = [self._input(t, "concatenate") for t in xs]
        ax = self._axis(axis, len(shapes[0]), "concatenate")
        if any(
            len(s) != len(shapes[0]) or s[:ax] + s[ax + 1 :] != shapes[0][:ax] + shapes[0][ax + 1 :] for s in shapes
        ):
            raise InputError(
                f"concatenate along axis {ax} needs tensors of one rank with equal sizes on every other "
                f"axis, got {shapes}"
            )
        return self.adapter.concatenate(list(xs), ax)

    # -- math for the algorithms -----------------------------------------------
    def add_(self, dst: Any, src: Any) -> None:
        """Checked in-place ``dst += src``."""
        if 0 not in self._same(dst, src, "add_"):
            self.adapter.add_(dst, src)

    def assign_(self, dst: Any, src: Any) -> None:
        """Checked in-place copy; dst keeps its shape and buffer."""
        shape = self._same(dst, src, "assign_")
        if src is not dst and 0 not in shape:
            self.adapter.assign_(dst, src)

    def split(self, x: Any, sizes: Sequence[int]) -> list[Any]:
        """Checked split into copies along axis 0."""
        xs = self._shape(x, "split input")
        if not isinstance(sizes, (list, tuple, np.ndarray)) or not len(sizes):
            raise InputError(f"split sizes must be a non-empty list of integers, got {sizes!r}")
        parts = [_int(s, "split", "size", 1) for s in sizes]
        if not xs or sum(parts) != xs[0]:
            raise InputError(
                f"split sizes {parts} add up to {sum(parts)}, but the tensor has "
                f"{xs[0] if xs else 'no'} rows (shape {xs}); they must match"
            )
        out = self.adapter.split(x, parts)
        for part in out:
            self._pass_range(x, part)
        return out

    def _parts(self, xs: Sequence[Any], op: str) -> tuple[list[Any], list[Shape]]:
        """The non-empty tensors of ``xs``, and the shapes of all; equal dtypes required."""
        if not isinstance(xs, (list, tuple)) or not xs:
            raise InputError(f"{op} needs a non-empty list of tensors, got {xs!r:.60}")
        shapes = [self._shape(t, f"{op} input") for t in xs]
        dtypes = {self.adapter.dtype(t) for t in xs}
        if len(dtypes) > 1:
            raise InputError(f"{op} needs tensors of one dtype, got {sorted(map(str, dtypes))}")
        # NOTE: MXNet's legacy NDArray cannot concatenate an empty part, so none is passed.
        kept = [t for t, s in zip(xs, shapes) if 0 not in s]
        if not kept:
            raise InputError(f"{op} got only empty tensors {shapes}; it needs at least one element")
        return kept, shapes

    def concat(self, xs: Sequence[Any]) -> Any:
        """Checked concatenation along axis 0."""
        parts, shapes = self._parts(xs, "concat")
        if any(len(s) == 0 or s[1:] != shapes[0][1:] for s in shapes):
            raise InputError(f"concat needs tensors of rank >= 1 with equal trailing shapes, got {shapes}")
        ranges = [self._range_of(t) for t in xs]
        out = self.adapter.concat(parts)
        if all(r is not None for r in ranges):
            self._remember(out, merge_spans(ranges))  # type: ignore[arg-type]
        return out

    def flatten(self, xs: Sequence[Any]) -> Any:
        """Checked flattening into one new 1-D buffer."""
        return self.adapter.flatten(self._parts(xs, "flatten")[0])

    def unflatten(self, flat: Any, shapes: Sequence[Sequence[int]]) -> list[Any]:
        """Checked views of consecutive slices of ``flat``."""
        fs = self._shape(flat, "unflatten flat")
        if len(fs) != 1:
            raise InputError(f"unflatten needs a 1-D flat buffer, got shape {fs}")
        sequences = (list, tuple, np.ndarray)
        if not isinstance(shapes, (list, tuple)) or not all(isinstance(s, sequences) for s in shapes):
            raise InputError(f"unflatten needs a list of shapes (tuples), got {shapes!r:.80}")
        wanted = [tuple(s) for s in shapes]
        if not all(type(d) is int and d >= 0 for s in wanted for d in s):  # else numpy ints, or bad dims
            wanted = [tuple(_int(d, "unflatten", "dim", 0) for d in s) for s in wanted]
        total = sum(prod(s) for s in wanted)
        if total != fs[0]:
            raise InputError(f"unflatten shapes {wanted} hold {total} elements, but the buffer has {fs[0]}")
        return self.adapter.unflatten(flat, wanted)

    def _native_allreduce(self, tensors: Sequence[Any]) -> None:
        """Checked native SUM allreduce: equal shapes and dtypes."""
        shapes = {self._shape(t, "native_allreduce tensor") for t in tensors}
        if len(shapes) > 1 or len({self.adapter.dtype(t) for t in tensors}) > 1:
            raise InputError(f"native_allreduce needs tensors of one shape and dtype, got shapes {shapes}")
        if tensors and 0 not in next(iter(shapes)):
            self.adapter.native_allreduce(tensors)

    # -- gradients and update ----------------------------------------------------
    def value_and_grad(
        self,
        fn: Callable[..., Any],
        params: Sequence[Any],
        *inputs: Any,
        aux: bool = False,
        out: Any = None,
        buckets: Sequence[tuple[int, int]] | None = None,
        on_bucket: Callable[[int], None] | None = None,
    ) -> Any:
        """Checked ``[grads..., value]`` in one flat buffer, ``out`` when given (and ``aux_flat`` with ``aux=True``);
        with ``buckets``, ``on_bucket(k)`` once per bucket, before the call returns, and ``out`` may be one
        buffer per bucket."""
        if not callable(fn):
            raise InputError(f"value_and_grad needs a callable fn, got {fn!r:.60}")
        if not isinstance(params, (list, tuple)) or not params:
            raise InputError("value_and_grad needs at least one parameter (its result lives on params[0]'s device)")
        if not isinstance(aux, bool):
            raise InputError(f"value_and_grad aux={aux!r} must be True or False")
        sizes = [prod(self._float(p, "value_and_grad param")) for p in params]
        size = sum(sizes)
        per_bucket = isinstance(out, (list, tuple))
        if per_bucket and buckets is None:
            raise InputError(
                f"value_and_grad got out= as a list of {len(out)} buffers without buckets=; a list "
                "holds one buffer per bucket (pass buckets= and on_bucket=), else pass one buffer"
            )
        if out is not None and not per_bucket and self._float(out, "value_and_grad out") != (size + 1,):
            raise InputError(
                f"value_and_grad out has shape {self.adapter.shape(out)}; it must be ({size + 1},): "
                "every gradient, then the value"
            )
        extra: dict[str, Any] = {} if out is None else {"out": out}
        signalled: list[int] = []
        if buckets is not None or on_bucket is not None:
            layout = _check_buckets(buckets, on_bucket, len(params), out)
            if per_bucket:
                self._check_bucket_buffers(out, layout, sizes)

            def signal(k: int) -> None:
                if type(k) is not int or not 0 <= k < len(layout) or k in signalled:
                    raise AdapterError(
                        f"{self.name} adapter's value_and_grad signalled bucket {k!r} after "
                        f"{signalled}; the contract says each of 0..{len(layout) - 1} once"
                    )
                signalled.append(k)
                assert on_bucket is not None
                on_bucket(k)

            if self._signals_buckets():
                extra.update(buckets=layout, on_bucket=signal)
            elif per_bucket:
                del extra["out"]  # an adapter written before buckets fills one new buffer: copied below
        aux_size = [0]

        def check_value(out: Any) -> Any:
            if (
                not isinstance(out, self.tensor_type)
                or prod(self.adapter.shape(out)) != 1
                or self.adapter.dtype(out).kind != "f"
            ):
                what = f"shape {self.adapter.shape(out)}" if isinstance(out, self.tensor_type) else type(out).__name__
                raise InputError(
                    f"value_and_grad needs fn to return a one-element float tensor "
                    f"(the loss), got {what}; reduce it with sum"
                )
            return out

        def scalar_fn(leaves: Sequence[Any], *args: Any) -> Any:
            return check_value(fn(leaves, *args))

        def aux_fn(leaves: Sequence[Any], *args: Any) -> Any:
            out = fn(leaves, *args)
            if not isinstance(out, tuple) or len(out) != 2 or not isinstance(out[1], (list, tuple)):
                raise InputError(
                    f"value_and_grad(aux=True) needs fn to return (value, [tensors...]), got {type(out).__name__}"
                )
            value, outputs = out
            aux_size[0] = sum(prod(self._float(t, "value_and_grad aux output")) for t in outputs)
            if not outputs or not aux_size[0]:
                raise InputError(
                    "value_and_grad(aux=True) got no aux outputs; return at least one non-empty "
                    "tensor or call it with aux=False"
                )
            return check_value(value), list(outputs)

        if aux:
            flat, aux_flat = self.adapter.value_and_grad(aux_fn, params, *inputs, aux=True, **extra)
        else:
            flat = self.adapter.value_and_grad(scalar_fn, params, *inputs, **extra)
        if per_bucket and "out" not in extra:
            flat = self._copy_into_buckets(flat, out, layout, sizes)
        if out is not None and flat is not out:
            raise AdapterError(
                f"{self.name} adapter's value_and_grad(out=...) returned another buffer; the "
                "contract says it writes into out and returns it"
            )
        if buckets is not None and "on_bucket" not in extra:
            for k in range(len(buckets)):  # an adapter without bucket signals: every bucket is ready now
                signal(k)
        if buckets is not None and len(signalled) != len(buckets):
            raise AdapterError(
                f"{self.name} adapter's value_and_grad returned having signalled buckets "
                f"{sorted(signalled)} of {len(buckets)}; the contract says every bucket, once"
            )
        if not per_bucket:
            got = self._shape(flat, "value_and_grad result")
            if got != (size + 1,):
                raise AdapterError(
                    f"{self.name} adapter's value_and_grad returned shape {got}; "
                    f"the contract says ({size + 1},): every gradient, then the value"
                )
        if not aux:
            return flat
        got = self._shape(aux_flat, "value_and_grad aux result")
        if got != (aux_size[0],):
            raise AdapterError(
                f"{self.name} adapter's value_and_grad returned aux of shape {got}; "
                f"the contract says ({aux_size[0]},): every aux output raveled"
            )
        return flat, aux_flat

    def _check_bucket_buffers(
        self, out: Sequence[Any], layout: Sequence[tuple[int, int]], sizes: Sequence[int]
    ) -> None:
        """Raise InputError unless ``out`` holds one buffer per bucket, each of its bucket's length."""
        want = [sum(sizes[a:b]) + (1 if k == 0 else 0) for k, (a, b) in enumerate(layout)]
        if len(out) != len(layout):
            raise InputError(
                f"value_and_grad got {len(out)} out= buffers for {len(layout)} buckets; pass one per "
                f"bucket, of {want} floats"
            )
        for k, (t, n) in enumerate(zip(out, want)):
            if self._float(t, f"value_and_grad out[{k}]") != (n,):
                raise InputError(
                    f"value_and_grad out[{k}] has shape {self.adapter.shape(t)}; it must be ({n},): "
                    f"bucket {k}'s gradients{', then the value' if k == 0 else ''} (all: {want})"
                )

    def _copy_into_buckets(
        self, flat: Any, out: Sequence[Any], layout: Sequence[tuple[int, int]], sizes: Sequence[int]
    ) -> Sequence[Any]:
        """Copy an adapter's one ``[grads..., value]`` buffer into the caller's bucket buffers; return them."""
        got = self._shape(flat, "value_and_grad result")
        if got != (sum(sizes) + 1,):
            raise AdapterError(
                f"{self.name} adapter's value_and_grad returned shape {got}; "
                f"the contract says ({sum(sizes) + 1},): every gradient, then the value"
            )
        offsets = [sum(sizes[:a]) for a, _ in layout]
        stops = [sum(sizes[:b]) + (1 if k == 0 else 0) for k, (_, b) in enumerate(layout)]
        pieces = self.adapter.unflatten(flat, [(b - a,) for a, b in zip(reversed(offsets), reversed(stops))])
        for t, piece in zip(out, reversed(pieces)):
            self.adapter.assign_(t, piece)
        return out

    def _signals_buckets(self) -> bool:
        """True if the adapter's value_and_grad takes ``buckets``/``on_bucket`` (a third-party adapter
        written before them does not; its buckets are signalled when it returns)."""
        known = getattr(self, "_bucket_signals", None)
        if known is None:
            params = inspect.signature(self.adapter.value_and_grad).parameters
            known = "on_bucket" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
            self._bucket_signals = known
        return known

    def sgd_(self, params: Sequence[Any], grads: Sequence[Any], lr: float) -> None:
        """Checked in-place ``p -= lr * g``."""
        if len(params) != len(grads):
            raise InputError(f"sgd_ got {len(params)} params but {len(grads)} grads; pass one grad per param")
        check_number(lr, "sgd_ lr")
        empty = False
        for p, g in zip(params, grads):
            ps, gs = self._float(p, "sgd_ param"), self._float(g, "sgd_ grad")
            if ps != gs:
                raise InputError(f"sgd_ got a param of shape {ps} with a grad of shape {gs}")
            empty = empty or 0 in ps
        if empty:
            pairs = [(p, g) for p, g in zip(params, grads) if 0 not in self.adapter.shape(p)]
            params, grads = [p for p, _ in pairs], [g for _, g in pairs]
        self.adapter.sgd_(params, grads, float(lr))

    # -- whole-buffer math --------------------------------------------------------
    def _math(self, op: str, y: Any, xs: Sequence[Any], scalars: dict[str, Any]) -> bool:
        """Check the operands of an in-place whole-buffer op; False when there is nothing to do."""
        ys = self._float(y, f"{op} y")
        for i, x in enumerate(xs):
            shape = self._float(x, f"{op} x{i + 1 if len(xs) > 1 else ''}")
            if shape != ys:
                raise InputError(f"{op} needs equal shapes, got y {ys} and {shape}; nothing broadcasts")
        for name, value in scalars.items():
            if type(value) is not float or not math.isfinite(value):  # a plain finite float passes at once
                check_number(value, f"{op} {name}")
        return 0 not in ys

    def scale_(self, y: Any, a: float) -> None:
        """Checked in-place ``y *= a``."""
        if self._math("scale_", y, (), {"a": a}):
            self.adapter.scale_(y, float(a))

    def axpby_(self, y: Any, a: float, x: Any, b: float) -> None:
        """Checked in-place ``y = a * y + b * x``."""
        if self._math("axpby_", y, (x,), {"a": a, "b": b}):
            self.adapter.axpby_(y, float(a), x, float(b))

    def addcmul_(self, y: Any, a: float, x1: Any, x2: Any, b: float) -> None:
        """Checked in-place ``y = a * y + b * x1 * x2``."""
        if self._math("addcmul_", y, (x1, x2), {"a": a, "b": b}):
            self.adapter.addcmul_(y, float(a), x1, x2, float(b))

    def addcdiv_sqrt_(self, y: Any, x1: Any, x2: Any, value: float, divisor: float, eps: float) -> None:
        """Checked in-place ``y += value * x1 / (sqrt(x2) / divisor + eps)``."""
        if self._math("addcdiv_sqrt_", y, (x1, x2), {"value": value, "divisor": divisor, "eps": eps}):
            if not float(divisor) > 0 or not float(eps) >= 0:
                raise InputError(f"addcdiv_sqrt_ needs divisor > 0 and eps >= 0, got divisor={divisor!r}, eps={eps!r}")
            self.adapter.addcdiv_sqrt_(y, x1, x2, float(value), float(divisor), float(eps))


def checked(backend: Any) -> CheckedBackend:
    """Return ``backend`` behind the contract (itself when it already is)."""
    return backend if isinstance(backend, CheckedBackend) else CheckedBackend(backend)


def unchecked(backend: Any) -> Any:
    """Return the adapter behind ``backend`` (for measuring what the checks cost)."""
    return backend.adapter if isinstance(backend, CheckedBackend) else backend


def _check_buckets(buckets: Any, on_bucket: Any, count: int, out: Any) -> list[tuple[int, int]]:
    """Return ``buckets`` as a list of (first, stop) pairs if they cut ``count`` parameters into runs
    from the last backwards; raise InputError otherwise (or without ``on_bucket`` and ``out``)."""
    if buckets is None or on_bucket is None or not callable(on_bucket):
        raise InputError(
            f"value_and_grad buckets={buckets!r:.60} and on_bucket={on_bucket!r:.60} go together: "
            "pass the layout and a callable that takes a bucket number, or neither"
        )
    if out is None:
        raise InputError(
            "value_and_grad(buckets=...) needs out=, the buffer whose slices the buckets are (or one buffer per bucket)"
        )
    example = f"e.g. [({count // 2}, {count}), (0, {count // 2})]"

    def whole(v: Any) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

    try:
        pairs = (
            [(int(a), int(b)) for a, b in buckets if whole(a) and whole(b)]
            if not isinstance(buckets, (str, bytes))
            else None
        )
        if pairs is not None and len(pairs) != len(buckets):
            pairs = None
    except (TypeError, ValueError):
        pairs = None
    stop = count
    for a, b in pairs or []:
        if b != stop or not 0 <= a < b:
            pairs = None
            break
        stop = a
    if not pairs or stop != 0:
        raise InputError(
            f"value_and_grad buckets={buckets!r:.80} must cut the {count} parameters into "
            f"(first, stop) runs from the last parameter backwards, {example}"
        )
    return pairs
