"""MXNet 1.9 adapter: the backend protocol on the classic ``mx.nd`` NDArray API.

Every op is a single ``mx.nd`` call with all arguments spelled out, so that a
changed MXNet default cannot change the numbers. Gradients come from
``mx.autograd``. MXNet runs ops on an asynchronous engine: a call returns before
the work is done, and errors surface at the next blocking read (``asnumpy``,
``asscalar``, ``waitall``). Arguments arrive already checked by ``multigpu.contract.checked``
(shapes, dtypes, sizes, labels, devices), so nothing here validates them again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mxnet as mx
import numpy as np
from mxnet.ndarray import NDArray

from multigpu.backends.mxnet.math_ops import MathOps
from multigpu.backends.mxnet.nn_ops import NNOps
from multigpu.contract.bucket_signals import gradient_views
from multigpu.contract.protocol import Device, pool_output_size


def _context(device: Device) -> mx.Context:
    """Map a protocol device (checked by the contract) to an MXNet context."""
    return mx.cpu(device.index) if device.kind == "cpu" else mx.gpu(device.index)


def _on(src: NDArray, ctx: mx.Context) -> NDArray:
    """Return ``src`` itself when already on ``ctx``, else a copy there (read-only use)."""
    return src if src.context == ctx else src.copyto(ctx)


def _torch_pool_size(out: NDArray, x: NDArray, kernel: int, stride: int, padding: int, ceil_mode: bool) -> NDArray:
    """``out`` cut to torch's output size: drop a 'full' window that starts in the right padding."""
    # NOTE: MXNet's 'full' convention keeps a last window that starts past the input and its
    # left padding (n=5, kernel 3, stride 3, padding 1 gives 3 windows, torch 2); the windows
    # before it are torch's, values and divisors alike.
    oh, ow = (pool_output_size(n, kernel, stride, padding, ceil_mode) for n in x.shape[2:])
    if out.shape[2:] == (oh, ow):
        return out
    return mx.nd.slice(out, begin=(None, None, 0, 0), end=(None, None, oh, ow))


class MXNetBackend(MathOps, NNOps):
    """Backend protocol implemented with MXNet NDArrays and ``mx.autograd``.

    The transformer and ONNX op set (and the broadcasting ``add``) come from the ``math_ops`` and
    ``nn_ops`` mixins.
    """

    name = "mxnet"
    tensor_type = mx.nd.NDArray

    def __init__(self) -> None:
        self._token: NDArray | None = None  # the last group sum's token inside value_and_grad

    # -- devices ---------------------------------------------------------
    def gpu_count(self) -> int:
        """Return the number of GPUs MXNet sees (0 on a CPU-only build)."""
        try:
            return int(mx.context.num_gpus())
        except Exception:  # a CPU-only build or a broken driver both mean "no GPU"
            return 0

    def synchronize(self, device: Device) -> None:
        """Block until every queued MXNet op has finished."""
        # NOTE: the async engine has no per-context wait; waitall() drains all of them.
        mx.nd.waitall()

    # -- tensors ---------------------------------------------------------
    def from_numpy(self, array: np.ndarray, device: Device) -> NDArray:
        """Return a new NDArray on ``device`` (the array is float32 or int64)."""
        # NOTE: mx.nd.array defaults to float32 whatever the input; pass the dtype so int64
        # labels keep full width (pick() accepts them). It always allocates a new buffer.
        return mx.nd.array(array, ctx=_context(device), dtype=array.dtype)

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
        return tensor.shape  # already a tuple of Python ints

    def dtype(self, tensor: NDArray) -> np.dtype:
        """Return the numpy dtype of ``tensor``."""
        return np.dtype(tensor.dtype)

    # -- ops (differentiable inside value_and_grad) ----------------------
    def conv2d(self, x: NDArray, w: NDArray, b: NDArray | None, stride: int, padding: int, groups: int) -> NDArray:
        """NCHW cross-correlation with OIHW weights, bias (or None), zero padding and groups."""
        out_channels, _, kh, kw = w.shape
        # NOTE: outside training mode MKL-DNN reorders a convolution's weight into its own layout IN
        # PLACE, to cache it for inference; on a weight that is a view of a flat buffer (the core's
        # replicas hold their parameters that way) that later aborts MXNet ("shandle.size >=
        # md.get_size()"). Training mode computes the same output and leaves the weight as it is.
        with mx.autograd.train_mode():
            return mx.nd.Convolution(
                data=x,
                weight=w,
                bias=b,
                kernel=(kh, kw),
                stride=(stride, stride),
                dilate=(1, 1),
                pad=(padding, padding),
                num_filter=out_channels,
                num_group=groups,
                no_bias=b is None,
                layout="NCHW",
            )

    def avg_pool2d(self, x: NDArray, kernel: int, stride: int, padding: int, ceil_mode: bool) -> NDArray:
        """Average pooling; padded zeros count in the divisor (a ceil-mode overhang does not)."""
        # NOTE: MXNet's 'valid' convention is floor rounding ('full' is ceil), and
        # count_include_pad=True counts the padding as the protocol does; in 'full' mode
        # the divisor is cut at the end of the padding, as torch's is.
        out = mx.nd.Pooling(
            data=x,
            kernel=(kernel, kernel),
            pool_type="avg",
            stride=(stride, stride),
            pad=(padding, padding),
            pooling_convention="full" if ceil_mode else "valid",
            count_include_pad=True,
            global_pool=False,
            layout="NCHW",
        )
        return _torch_pool_size(out, x, kernel, stride, padding, ceil_mode)

    def max_pool2d(self, x: NDArray, kernel: int, stride: int, padding: int, ceil_mode: bool) -> NDArray:
        """Max pooling over windows; padding never wins; floor or ceil output size."""
        # NOTE: 'valid' means floor here, 'full' ceil; MXNet pads max pooling with -inf, not zeros.
        out = mx.nd.Pooling(
            data=x,
            kernel=(kernel, kernel),
            pool_type="max",
            stride=(stride, stride),
            pad=(padding, padding),
            pooling_convention="full" if ceil_mode else "valid",
            global_pool=False,
            layout="NCHW",
        )
        return _torch_pool_size(out, x, kernel, stride, padding, ceil_mode)

    def relu(self, x: NDArray) -> NDArray:
        """Return max(x, 0)."""
        # NOTE: mx.nd.relu is a generic element-wise kernel; Activation(act_type="relu") runs
        # MKL-DNN's, about 4x faster forward and backward on LeNet's activations (benchmarks/step).
        return mx.nd.Activation(x, act_type="relu")

    def global_avg_pool2d(self, x: NDArray) -> NDArray:
        """Mean over each (H, W) plane, as (B, C, 1, 1)."""
        return mx.nd.Pooling(data=x, kernel=(1, 1), pool_type="avg", global_pool=True, layout="NCHW")

    def batch_norm(self, x: NDArray, gamma: NDArray, beta: NDArray, mean: NDArray, var: NDArray, eps: float) -> NDArray:
        """Normalize with the given statistics (no gradient into them)."""
        # NOTE: use_global_stats=True normalizes with the arrays given as moving statistics in
        # training mode too; fix_gamma defaults to True in MXNet (gamma ignored), so False is passed.
        return mx.nd.BatchNorm(
            x,
            gamma,
            beta,
            mean,
            var,
            eps=eps,
            momentum=0.9,
            fix_gamma=False,
            use_global_stats=True,
            output_mean_var=False,
            axis=1,
            cudnn_off=False,
        )

    def batch_norm_train(
        self,
        x: NDArray,
        gamma: NDArray,
        beta: NDArray,
        eps: float,
        stats: NDArray | None = None,
        count: int | None = None,
    ) -> tuple[NDArray, ...]:
        """Batch statistics (fused kernel), or the table's parts combined; also return mean, unbiased var."""
        if stats is None or count is None:  # the contract passes both or neither
            n = x.shape[0] * x.shape[2] * x.shape[3]
            # NOTE: MXNet updates its moving statistics in backward (into the throw-away buffers
            # passed here) and uses batch statistics only in training mode, so that mode is forced.
            # output_mean_var returns the batch mean and the INVERSE standard deviation
            # 1/sqrt(var + eps) (not the variance): the biased variance is recovered from it.
            with mx.autograd.train_mode():
                y, mean, invstd = mx.nd.BatchNorm(
                    x,
                    gamma,
                    beta,
                    mx.nd.zeros_like(gamma),
                    mx.nd.ones_like(gamma),
                    eps=eps,
                    momentum=0.9,
                    fix_gamma=False,
                    use_global_stats=False,
                    output_mean_var=True,
                    axis=1,
                    cudnn_off=False,
                )
            var = (mx.nd.reciprocal(mx.nd.square(invstd.detach())) - eps) * (n / (n - 1))
            return y, mean.detach(), var
        # The parallel formula (torch's batch_norm_gather_stats_with_counts), in autograd's ops.
        ns, means, m2s = mx.nd.split(stats, num_outputs=3, axis=1, squeeze_axis=True)
        ns, means, m2s = (a.reshape((-1, a.shape[-1])) for a in (ns, means, m2s))  # (K, C) also when K = 1
        first = mx.nd.slice_axis(means, axis=0, begin=0, end=1)  # (1, C)
        offsets = mx.nd.broadcast_sub(means, first)
        mean = first.reshape((-1,)) + mx.nd.sum(ns * offsets, axis=0) / count  # small offsets, not large means
        spread = mx.nd.broadcast_sub(means, mean.reshape((1, -1)))
        biased = (mx.nd.sum(m2s, axis=0) + mx.nd.sum(ns * spread * spread, axis=0)) / count
        scale = gamma * mx.nd.rsqrt(biased + eps)
        y = mx.nd.broadcast_add(
            mx.nd.broadcast_mul(mx.nd.broadcast_sub(x, mean.reshape((1, -1, 1, 1))), scale.reshape((1, -1, 1, 1))),
            beta.reshape((1, -1, 1, 1)),
        )
        return y, mean.detach(), (biased * (count / (count - 1))).detach()

    def batch_norm_stats(self, x: NDArray, part: int = 0, parts: int = 1) -> NDArray:
        """Per-channel count, mean and centred sum of squares in row ``part`` of a (parts, 3, C) table."""
        # Sums about one of each channel's own values (shifted data) stay small, so the centred sum
        # of squares loses little to cancellation, in about the passes of the plain sums.
        n = x.shape[0] * x.shape[2] * x.shape[3]
        shift = mx.nd.slice(x, begin=(0, None, 0, 0), end=(1, None, 1, 1)).detach()  # (1, C, 1, 1)
        d = mx.nd.broadcast_sub(x, shift)
        s1, s2 = mx.nd.sum(d, axis=(0, 2, 3)), mx.nd.sum(mx.nd.square(d), axis=(0, 2, 3))
        mean = shift.reshape((-1,)) + s1 / n
        m2 = mx.nd.relu(s2 - s1 * s1 / n)  # rounding may dip below 0 on a constant channel
        counts = mx.nd.full(mean.shape, n, ctx=x.context, dtype=x.dtype)
        row = mx.nd.stack(counts, mean, m2, axis=0).expand_dims(0)
        before, after = (
            [mx.nd.zeros((k, 3, x.shape[1]), ctx=x.context, dtype=x.dtype)] if k else []
            for k in (part, parts - 1 - part)
        )
        return mx.nd.concat(*before, row, *after, dim=0) if parts > 1 else row

    def concat_channels(self, xs: Sequence[NDArray]) -> NDArray:
        """Join along the channel axis (differentiable)."""
        return mx.nd.concat(*xs, dim=1)

    def group_sum(self, x: NDArray, group: Any) -> NDArray:
        """Sum over the group's ranks; the gradient is summed the same way."""
        if not mx.autograd.is_recording():
            out = x.copy()
            group.allreduce_(out)
            return out
        # NOTE: MXNet runs a custom Function's backward later, on its engine's threads, and
        # independent ones at the same time; collectives must come in one order on every rank.
        # A token threads every group sum of a forward, so each backward waits for the one of
        # the sum after it: they run one at a time, in reverse order, on every rank.
        token = self._token if self._token is not None else mx.nd.zeros((1,), ctx=x.context)
        out, self._token = _GroupSum(group)(x, token)
        return out

    def dense(self, x: NDArray, w: NDArray, b: NDArray) -> NDArray:
        """Return ``x @ w + b`` over the last axis: x (..., in), w (in, out), b (out,) -> (..., out)."""
        # NOTE: FullyConnected wants (out, in), hence the transpose; it is still about twice as
        # fast forward and backward as dot + broadcast_add (one MKL-DNN op, bias fused), see
        # benchmarks/step. flatten=False keeps x's leading axes ((B, T, in) -> (B, T, out)); True
        # would flatten everything after the first axis into the input.
        return mx.nd.FullyConnected(
            data=x, weight=mx.nd.transpose(w), bias=b, num_hidden=int(w.shape[1]), no_bias=False, flatten=False
        )

    def reshape(self, x: NDArray, shape: Sequence[int]) -> NDArray:
        """Return ``x`` reshaped to ``shape`` (fully resolved by the contract: no -1, no 0)."""
        # NOTE: MXNet's reshape gives 0, -2, -3 and -4 special meanings (0 copies an
        # input dim); the contract resolves -1 and refuses 0, so only plain dims arrive.
        return mx.nd.reshape(x, shape=tuple(shape), reverse=False)

    def softmax_cross_entropy(self, logits: NDArray, labels: NDArray) -> NDArray:
        """Return the per-example loss -log softmax(logits)[label], shape (B,)."""
        # NOTE: gluon.loss.SoftmaxCrossEntropyLoss averages over non-batch axes and
        # applies sample weights; log_softmax + pick keeps the per-example sum exact.
        # NOTE: temperature=None, not 1.0: an explicit 1.0 takes a kernel 10-20x slower on CPU.
        logp = mx.nd.log_softmax(logits, axis=1, temperature=None)
        # NOTE: pick's 'clip' mode would clamp a bad label to a class; the contract
        # refuses out-of-range labels before this runs.
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
        # The contract never passes src is dst (MXNet would warn and skip a self-copy).
        src.copyto(dst)  # copyto(NDArray) writes into dst, across contexts too

    def split(self, x: NDArray, sizes: Sequence[int]) -> list[NDArray]:
        """Split along axis 0 into new NDArrays of the given lengths."""
        # NOTE: x[a:b] is a view sharing x's memory; slice_axis allocates a copy. The
        # contract refuses empty parts: legacy NDArrays read a 0 dim as "unknown".
        out, start = [], 0
        for size in sizes:
            out.append(mx.nd.slice_axis(x, axis=0, begin=start, end=start + size))
            start += size
        return out

    def concat(self, xs: Sequence[NDArray]) -> NDArray:
        """Concatenate along axis 0 into a new NDArray on the context of ``xs[0]``."""
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
    def value_and_grad(
        self,
        fn: Callable[..., Any],
        params: Sequence[NDArray],
        *inputs: Any,
        aux: bool = False,
        out: NDArray | Sequence[NDArray] | None = None,
        buckets: Sequence[tuple[int, int]] | None = None,
        on_bucket: Callable[[int], None] | None = None,
    ) -> Any:
        """Evaluate ``fn(params, *inputs)`` (a scalar); return [grads raveled..., value] in one buffer, or in
        the bucket buffers ``out`` (and the aux outputs raveled in a second one with ``aux=True``)."""
        shapes = [p.shape for p in params]
        size = sum(p.size for p in params)
        # NOTE: zero-filling the buffer took about a tenth of a ResNet-18 step here; backward writes
        # every used parameter's gradient in full, so only the unused ones are zeroed below.
        flat = mx.nd.empty((size + 1,), ctx=params[0].context, dtype=np.float32) if out is None else out
        buffers: list[NDArray] = list(flat) if isinstance(flat, (list, tuple)) else [flat]
        # NOTE: detach() is a new handle on the same memory, so the caller's arrays get no
        # grad buffer. mark_variables points each gradient at a view of its buffer, and
        # grad_req='write' makes backward write there directly (no copy, no accumulation).
        leaves = [p.detach() for p in params]
        *views, value_view = gradient_views(self, flat, shapes, buckets)
        mx.autograd.mark_variables(leaves, views, grad_reqs="write")
        # NOTE: record() turns recording on even inside the caller's autograd.pause().
        outputs: list[NDArray] = []
        self._token = None
        with mx.autograd.record(train_mode=True):
            value = fn(leaves, *inputs)
            if aux:
                value, outputs = value
            token, self._token = self._token, None
            if token is not None:  # the chain's end joins the value, so backward walks the chain
                value = value + mx.nd.sum(token) * 0.0
        try:
            value.backward(out_grad=None, retain_graph=False, train_mode=True)
        except mx.base.MXNetError as exc:
            # NOTE: MXNet refuses to differentiate a value that uses no parameter; every
            # gradient is then zero.
            if "not in a computational graph" not in str(exc):
                raise
        for leaf, view in zip(leaves, views):
            if not leaf._fresh_grad:  # a host-side flag that backward set: no device wait
                view[:] = 0.0
        # NOTE: asscalar() would block on the async engine; the value is written on-device.
        value.reshape((1,)).copyto(value_view)
        if token is not None:
            # NOTE: the group sums' backward still runs on the engine's threads; the caller's next
            # collective must not start before the last of them has finished.
            for buffer in buffers:
                buffer.wait_to_read()
        if buckets is not None and on_bucket is not None:
            # NOTE: MXNet has no gradient hooks. Backward above is only queued on the engine, so the
            # buckets are signalled now, in bucket order, and the engine orders what each signal starts
            # (a push, given a priority by the group as Gluon's Trainer does) after the writes to the
            # arrays it reads. The engine tracks one variable per NDArray and its slices: in one buffer a
            # push of bucket 0 would wait for the whole backward; with one buffer per bucket (out as a
            # list) it waits only for the backward ops that write its own gradients, as Gluon's per-
            # parameter gradients do, and the sum overlaps the rest of backward.
            for k in range(len(buckets)):
                on_bucket(k)
        if not aux:
            return flat
        ctx = buffers[0].context
        return flat, mx.nd.concat(*[_on(o.detach(), ctx).reshape((-1,)) for o in outputs], dim=0)

    def sgd_(self, params: Sequence[NDArray], grads: Sequence[NDArray], lr: float) -> None:
        """In place ``p -= lr * g`` for every pair."""
        for p, g in zip(params, grads, strict=True):
            mx.nd.sgd_update(
                weight=p,
                grad=_on(g, p.context),
                lr=float(lr),
                wd=0.0,
                rescale_grad=1.0,
                clip_gradient=-1.0,
                lazy_update=False,
                out=p,
            )

    # -- whole-buffer math (outside autograd) -----------------------------
    def scale_(self, y: NDArray, a: float) -> None:
        """In place ``y *= a``."""
        y *= a

    def axpby_(self, y: NDArray, a: float, x: NDArray, b: float) -> None:
        """In place ``y = a * y + b * x``."""
        # NOTE: MXNet has no axpby kernel; y *= a; y += b * x would take three passes and a temporary
        # of y's size. sgd_update computes (1 - lr * wd) * w - lr * rescale_grad * g in one pass,
        # which is a * y + b * x with lr = 1, wd = 1 - a and rescale_grad = -b.
        mx.nd.sgd_update(
            weight=y,
            grad=_on(x, y.context),
            lr=1.0,
            wd=1.0 - a,
            rescale_grad=-b,
            clip_gradient=-1.0,
            lazy_update=False,
            out=y,
        )

    def addcmul_(self, y: NDArray, a: float, x1: NDArray, x2: NDArray, b: float) -> None:
        """In place ``y = a * y + b * x1 * x2``."""
        if a != 1.0:
            y *= a
        y += _on(x1, y.context) * _on(x2, y.context) * b

    def addcdiv_sqrt_(self, y: NDArray, x1: NDArray, x2: NDArray, value: float, divisor: float, eps: float) -> None:
        """In place ``y += value * x1 / (sqrt(x2) / divisor + eps)``."""
        y += _on(x1, y.context) / (mx.nd.sqrt(_on(x2, y.context)) / divisor + eps) * value

    # -- optional fast path ----------------------------------------------
    # NOTE: no native_allreduce. A local kvstore push/pull is MXNet's collective, but in a
    # process that has also loaded torch or paddle it aborted with SIGFPE inside MXNet's
    # engine (seen with `multigpu check --allreduce native --backends mxnet,torch`), so
    # MXNet uses the core's naive, ring and fused algorithms only.


class _GroupSum(mx.autograd.Function):
    """A sum over a process group inside autograd: backward sums the gradient the same way.

    The second input and output are the token that orders the backward calls (see group_sum).
    """

    def __init__(self, group: Any):
        super().__init__()
        self.group = group

    def forward(self, x: NDArray, token: NDArray) -> tuple[NDArray, NDArray]:
        out = x.copy()
        self.group.allreduce_(out)
        return out, token.copy()

    def backward(self, grad: NDArray, token_grad: NDArray) -> tuple[NDArray, NDArray]:
        out = grad.copy()
        self.group.allreduce_(out)
        return out, token_grad.copy()
