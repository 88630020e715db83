"""MXNet 1.9 adapter: the backend protocol on the classic ``mx.nd`` NDArray API.

Every op is a single ``mx.nd`` call with all arguments spelled out, so that a
changed MXNet default cannot change the numbers. Gradients come from
``mx.autograd``. MXNet runs ops on an asynchronous engine: a call returns before
the work is done, and errors surface at the next blocking read (``asnumpy``,
``asscalar``, ``waitall``).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import mxnet as mx
import numpy as np

from multigpu.errors import DeviceError, InputError
from multigpu.protocol import Device

NDArray = mx.nd.NDArray


def _context(device: Device) -> mx.Context:
    """Map a protocol device to an MXNet context; raise DeviceError otherwise."""
    if not isinstance(device, Device):
        raise DeviceError(f"expected a multigpu Device, got {device!r}; use Device('cpu', 0)")
    if device.index < 0:
        raise DeviceError(f"device index {device.index} is negative; use an index >= 0")
    if device.kind == "cpu":
        return mx.cpu(device.index)
    if device.kind == "gpu":
        return mx.gpu(device.index)
    raise DeviceError(f"device kind {device.kind!r} is unknown to MXNet; use 'cpu' or 'gpu'")


def _on(src: NDArray, ctx: mx.Context) -> NDArray:
    """Return ``src`` itself when already on ``ctx``, else a copy there (read-only use)."""
    return src if src.context == ctx else src.copyto(ctx)


class MXNetBackend:
    """Backend protocol implemented with MXNet NDArrays and ``mx.autograd``."""

    name = "mxnet"

    # -- devices ---------------------------------------------------------
    def gpu_count(self) -> int:
        """Return the number of GPUs MXNet sees (0 on a CPU-only build)."""
        try:
            return int(mx.context.num_gpus())
        except Exception:  # a CPU-only build or a broken driver both mean "no GPU"
            return 0

    def synchronize(self, device: Device) -> None:
        """Block until every queued MXNet op has finished."""
        _context(device)  # validate the device even though the wait is global
        # NOTE: the async engine has no per-context wait; waitall() drains all of them.
        mx.nd.waitall()

    # -- tensors ---------------------------------------------------------
    def from_numpy(self, array: np.ndarray, device: Device) -> NDArray:
        """Return a new NDArray on ``device``: floats as float32, integers/bools as int64."""
        array = np.asarray(array)
        if np.issubdtype(array.dtype, np.floating):
            dtype: Any = np.float32
        elif np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_:
            dtype = np.int64  # pick() accepts int64 indices, so labels keep full width
        else:
            raise InputError(f"cannot convert a {array.dtype} array; pass floats or integers")
        # mx.nd.array always allocates, so the result never aliases ``array``.
        return mx.nd.array(array.astype(dtype, copy=False), ctx=_context(device), dtype=dtype)

    def to_numpy(self, tensor: NDArray) -> np.ndarray:
        """Return a numpy copy of ``tensor`` (blocks until it is computed)."""
        return tensor.asnumpy()

    def copy_to(self, tensor: NDArray, device: Device) -> NDArray:
        """Return a new buffer on ``device`` with the values of ``tensor``."""
        # NOTE: as_in_context() returns the same array when the context matches, which
        # would alias CPU replicas; copyto(Context) always allocates a fresh buffer.
        return tensor.copyto(_context(device))

    def shape(self, tensor: NDArray) -> tuple[int, ...]:
        """Return the shape of ``tensor`` as a tuple of ints."""
        return tuple(int(s) for s in tensor.shape)

    # -- ops (differentiable inside value_and_grad) ----------------------
    def conv2d(self, x: NDArray, w: NDArray, b: NDArray, stride: int, padding: int,
               groups: int) -> NDArray:
        """NCHW cross-correlation with OIHW weights, bias, zero padding and groups."""
        out_channels, _, kh, kw = w.shape
        return mx.nd.Convolution(
            data=x, weight=w, bias=b, kernel=(kh, kw), stride=(stride, stride),
            dilate=(1, 1), pad=(padding, padding), num_filter=out_channels,
            num_group=groups, no_bias=False, layout="NCHW",
        )

    def avg_pool2d(self, x: NDArray, kernel: int, stride: int, padding: int) -> NDArray:
        """Average pooling; padded zeros count in the divisor; floor output size."""
        # NOTE: MXNet's 'valid' convention is floor rounding ('full' is ceil), and
        # count_include_pad=True matches the protocol's divisor of kernel*kernel.
        return mx.nd.Pooling(
            data=x, kernel=(kernel, kernel), pool_type="avg", stride=(stride, stride),
            pad=(padding, padding), pooling_convention="valid", count_include_pad=True,
            global_pool=False, layout="NCHW",
        )

    def max_pool2d(self, x: NDArray, kernel: int, stride: int, padding: int) -> NDArray:
        """Max pooling over windows; padding never wins; floor output size."""
        # NOTE: 'valid' means floor here; MXNet pads max pooling with -inf, not zeros.
        return mx.nd.Pooling(
            data=x, kernel=(kernel, kernel), pool_type="max", stride=(stride, stride),
            pad=(padding, padding), pooling_convention="valid", global_pool=False,
            layout="NCHW",
        )

    def relu(self, x: NDArray) -> NDArray:
        """Return max(x, 0)."""
        # NOTE: mx.nd.relu is a generic element-wise kernel; Activation(act_type="relu") runs
        # MKL-DNN's, about 4x faster forward and backward on LeNet's activations (benchmarks/step).
        return mx.nd.Activation(x, act_type="relu")

    def dense(self, x: NDArray, w: NDArray, b: NDArray) -> NDArray:
        """Return ``x @ w + b`` with ``w`` of shape (in, out)."""
        # NOTE: FullyConnected wants (out, in), hence the transpose; it is still about twice as
        # fast forward and backward as dot + broadcast_add (one MKL-DNN op, bias fused), see
        # benchmarks/step. flatten=False: x is already (batch, in).
        return mx.nd.FullyConnected(data=x, weight=mx.nd.transpose(w), bias=b, num_hidden=int(w.shape[1]),
                                    no_bias=False, flatten=False)

    def reshape(self, x: NDArray, shape: Sequence[int]) -> NDArray:
        """Return ``x`` reshaped (``-1`` allowed once)."""
        dims = [int(s) for s in shape]
        if dims.count(-1) > 1 or any(d < -1 for d in dims):
            raise InputError(f"reshape target {tuple(dims)} may hold -1 once and no other negatives")
        total = int(np.prod(x.shape))
        known = int(np.prod([d for d in dims if d != -1]))
        if -1 in dims:
            if known == 0 or total % known:
                raise InputError(f"cannot reshape {x.shape} to {tuple(dims)}")
            dims[dims.index(-1)] = total // known
        elif known != total:
            raise InputError(f"cannot reshape {x.shape} to {tuple(dims)}")
        # NOTE: MXNet's reshape gives 0, -2, -3 and -4 special meanings (0 copies an
        # input dim), so pass fully resolved positive dims only.
        return mx.nd.reshape(x, shape=tuple(dims), reverse=False)

    def softmax_cross_entropy(self, logits: NDArray, labels: NDArray) -> NDArray:
        """Return the per-example loss -log softmax(logits)[label], shape (B,)."""
        # NOTE: gluon.loss.SoftmaxCrossEntropyLoss averages over non-batch axes and
        # applies sample weights; log_softmax + pick keeps the per-example sum exact.
        logp = mx.nd.log_softmax(logits, axis=1, temperature=1.0)
        # pick's 'clip' mode silently clamps bad labels; the core validates labels.
        picked = mx.nd.pick(logp, labels, axis=1, keepdims=False, mode="clip")
        return mx.nd.negative(picked)

    def sum(self, x: NDArray) -> NDArray:
        """Return the sum of all elements as a 1-element NDArray."""
        return mx.nd.sum(x, axis=None, keepdims=False, exclude=False)

    def argmax(self, x: NDArray, axis: int) -> NDArray:
        """Return the int64 index of the maximum along ``axis``."""
        # NOTE: mx.nd.argmax returns float32 indices; cast so they compare with labels.
        return mx.nd.argmax(x, axis=axis, keepdims=False).astype(np.int64, copy=True)

    # -- math for the algorithms (outside autograd) ----------------------
    def add_(self, dst: NDArray, src: NDArray) -> None:
        """In place ``dst += src``; ``src`` may live on another context."""
        mx.nd.elemwise_add(dst, _on(src, dst.context), out=dst)

    def assign_(self, dst: NDArray, src: NDArray) -> None:
        """In place ``dst[...] = src``; ``src`` may live on another context."""
        if src is dst:  # MXNet warns and skips a self-copy; it is a no-op anyway
            return
        if tuple(src.shape) != tuple(dst.shape):
            raise InputError(f"assign_ needs equal shapes, got {dst.shape} and {src.shape}")
        src.copyto(dst)  # copyto(NDArray) writes into dst, across contexts too

    def split(self, x: NDArray, sizes: Sequence[int]) -> list[NDArray]:
        """Split along axis 0 into new NDArrays of the given lengths."""
        if any(int(s) < 1 for s in sizes) or sum(int(s) for s in sizes) != x.shape[0]:
            raise InputError(f"split sizes {list(sizes)} must be >= 1 and sum to {x.shape[0]}")
        # NOTE: x[a:b] is a view sharing x's memory; slice_axis allocates a copy. Empty
        # parts are refused because legacy NDArrays read a 0 dim as "unknown".
        out, start = [], 0
        for size in sizes:
            out.append(mx.nd.slice_axis(x, axis=0, begin=start, end=start + int(size)))
            start += int(size)
        return out

    def concat(self, xs: Sequence[NDArray]) -> NDArray:
        """Concatenate along axis 0 into a new NDArray on the context of ``xs[0]``."""
        if not xs:
            raise InputError("concat needs at least one array")
        ctx = xs[0].context
        return mx.nd.concat(*[_on(x, ctx) for x in xs], dim=0)

    def flatten(self, xs: Sequence[NDArray]) -> NDArray:
        """Return a new 1-D NDArray of every array raveled, on the context of ``xs[0]``."""
        ctx = xs[0].context
        # NOTE: the NDArray.reshape method is a view and skips an engine op per tensor.
        return mx.nd.concat(*[_on(x, ctx).reshape((-1,)) for x in xs], dim=0)

    def unflatten(self, flat: NDArray, shapes: Sequence[Sequence[int]]) -> list[NDArray]:
        """Return views of consecutive slices of ``flat`` (they share its memory)."""
        # NOTE: basic slicing along axis 0 and NDArray.reshape are views in MXNet;
        # slice_axis would copy.
        out, start = [], 0
        for shape in shapes:
            size = int(np.prod(shape, dtype=np.int64))
            out.append(flat[start : start + size].reshape(tuple(int(d) for d in shape) or (1,)))
            start += size
        return out

    # -- gradients and update -------------------------------------------
    def value_and_grad(self, fn: Callable[..., NDArray], params: Sequence[NDArray],
                       *inputs: Any) -> NDArray:
        """Evaluate ``fn(params, *inputs)`` (a scalar); return [grads raveled..., value] in one buffer."""
        shapes = [tuple(p.shape) for p in params]
        sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
        ctx = params[0].context if params else mx.cpu()
        flat = mx.nd.zeros((sum(sizes) + 1,), ctx=ctx, dtype=np.float32)
        # NOTE: detach() is a new handle on the same memory, so the caller's arrays get no
        # grad buffer. mark_variables points each gradient at a view of ``flat``, and
        # grad_req='write' makes backward write there directly (no copy, no accumulation);
        # an unused parameter keeps the zeros.
        leaves = [p.detach() for p in params]
        mx.autograd.mark_variables(leaves, self.unflatten(flat, shapes), grad_reqs="write")
        with mx.autograd.record(train_mode=True):
            value = fn(leaves, *inputs)
        if value.size != 1:
            raise InputError(f"value_and_grad needs a scalar loss, got shape {value.shape}")
        value.backward(out_grad=None, retain_graph=False, train_mode=True)
        # NOTE: asscalar() would block on the async engine; the value is written on-device.
        value.reshape((1,)).copyto(flat[sum(sizes):])
        return flat

    def sgd_(self, params: Sequence[NDArray], grads: Sequence[NDArray], lr: float) -> None:
        """In place ``p -= lr * g`` for every pair."""
        for p, g in zip(params, grads, strict=True):
            mx.nd.sgd_update(
                weight=p, grad=_on(g, p.context), lr=float(lr), wd=0.0,
                rescale_grad=1.0, clip_gradient=-1.0, lazy_update=False, out=p,
            )

    # -- optional fast path ----------------------------------------------
    # NOTE: no native_allreduce. A local kvstore push/pull is MXNet's collective, but in a
    # process that has also loaded torch or paddle it aborted with SIGFPE inside MXNet's
    # engine (seen with `multigpu check --allreduce native --backends mxnet,torch`), so
    # MXNet uses the core's naive, ring and fused algorithms only.
