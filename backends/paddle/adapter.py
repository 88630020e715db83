"""PaddlePaddle adapter: the backend protocol on Paddle's dynamic graph (eager mode).

Paddle is imported when this module is imported, which ``load()`` defers to first
use. Every op passes every argument explicitly: Paddle's defaults differ from the
protocol's conventions in several places, each marked with a ``NOTE:``. Arguments
arrive already checked by ``multigpu.contract.checked`` (shapes, dtypes, sizes, labels,
devices), so nothing here validates them again.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from multigpu.contract.bucket_signals import BucketSignals, gradient_views
from multigpu.contract.protocol import Device, pool_output_size

with warnings.catch_warnings():
    # Paddle's C++-extension helper warns "No ccache found" on every import; the
    # adapter never builds extensions, so only that one message is silenced.
    warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning)
    import paddle
    import paddle.nn.functional as F

    # The op mixins import paddle as well; they are imported here, under the same filter.
    from multigpu.backends.paddle.math_ops import MathOps
    from multigpu.backends.paddle.nn_ops import NNOps

Tensor = paddle.Tensor
_NUMPY_DTYPES: dict[Any, np.dtype] = {
    paddle.float32: np.dtype(np.float32),
    paddle.int64: np.dtype(np.int64),
    paddle.float64: np.dtype(np.float64),
    paddle.int32: np.dtype(np.int32),
}


def _same_place(a: Any, b: Any) -> bool:
    # Compare by kind and index: Place and CPUPlace/CUDAPlace are distinct classes.
    if a.is_cpu_place() and b.is_cpu_place():
        return True
    return a.is_gpu_place() and b.is_gpu_place() and a.gpu_device_id() == b.gpu_device_id()


def _move(tensor: Tensor, place: Any) -> Tensor:
    """Return ``tensor`` on ``place``; the same object when it is already there."""
    # NOTE: Tensor.cpu()/.to() return the very same tensor when it is already on that
    # place (like torch's .to), so a move alone is not a copy; copy_to clones.
    if _same_place(tensor.place, place):
        return tensor
    if place.is_cpu_place():
        return tensor.cpu()
    return tensor.cuda(place.gpu_device_id(), True)


def _torch_pool_size(out: Tensor, x: Tensor, kernel: int, stride: int, padding: int, ceil_mode: bool) -> Tensor:
    """``out`` cut to torch's output size: drop a ceil-mode window that starts in the right padding."""
    # NOTE: Paddle's ceil_mode keeps a last window that starts past the input and its left
    # padding (n=5, kernel 3, stride 3, padding 1 gives 3 windows, torch 2); the windows
    # before it are torch's, values and divisors alike.
    oh, ow = (pool_output_size(n, kernel, stride, padding, ceil_mode) for n in x.shape[2:])
    return out if tuple(out.shape[2:]) == (oh, ow) else out[:, :, :oh, :ow]


class PaddleBackend(MathOps, NNOps):
    """The backend protocol implemented with PaddlePaddle (dynamic graph only).

    The transformer and ONNX ops live in the mixins: ``math_ops.MathOps`` (products, layout,
    elementwise math, reductions, slicing) and ``nn_ops.NNOps`` (layer norm, embedding, masks,
    dropout, sequence loss).
    """

    name = "paddle"
    tensor_type = paddle.Tensor

    def __init__(self) -> None:
        if not paddle.in_dynamic_mode():
            # value_and_grad and the in-place math rely on eager execution.
            paddle.disable_static()
        self._gpus: int | None = None  # device_count() is asked once, on first use

    # -- devices ---------------------------------------------------------
    def gpu_count(self) -> int:
        """Return the number of CUDA devices Paddle can use (0 on a CPU-only build)."""
        if self._gpus is None:
            try:
                cuda = paddle.is_compiled_with_cuda()
                self._gpus = int(paddle.device.cuda.device_count()) if cuda else 0
            except Exception:  # a broken driver means no usable GPU, not a crash
                self._gpus = 0
        return self._gpus

    def synchronize(self, device: Device) -> None:
        """Wait for queued work on ``device``; a no-op on CPU."""
        if self._place(device).is_gpu_place():
            paddle.device.cuda.synchronize(device.index)

    def _place(self, device: Device) -> Any:
        # NOTE: several "cpu" devices all map to the one CPUPlace; replicas stay apart
        # only because from_numpy and copy_to always allocate new buffers. The contract
        # has checked the GPU index (a CUDAPlace past the count logs a C++ error first).
        return paddle.CPUPlace() if device.kind == "cpu" else paddle.CUDAPlace(device.index)

    # -- tensors ---------------------------------------------------------
    def from_numpy(self, array: np.ndarray, device: Device) -> Tensor:
        """Return a new tensor on ``device`` (the array is float32 or int64, C-contiguous)."""
        # to_tensor copies host memory into a Paddle allocation (checked by the tests).
        return paddle.to_tensor(array, place=self._place(device), stop_gradient=True)

    def to_numpy(self, tensor: Tensor) -> np.ndarray:
        """Return a numpy copy of ``tensor``."""
        # Tensor.numpy() copies out of Paddle's allocation (checked by the tests).
        return tensor.numpy()

    def copy_to(self, tensor: Tensor, device: Device) -> Tensor:
        """Return a new buffer on ``device`` with the values of ``tensor`` (differentiable)."""
        place = self._place(device)
        if _same_place(tensor.place, place):
            return tensor.clone()  # differentiable, and a fresh buffer
        # NOTE: Tensor.cuda()/.cpu() make a new leaf (the graph stops there); _CopyTo copies
        # the gradient back, as torch's .to does.
        return _CopyTo.apply(tensor, place)

    def shape(self, tensor: Tensor) -> tuple[int, ...]:
        """Return the shape of ``tensor`` as a tuple of ints."""
        return tuple(tensor.shape)  # a list of Python ints in eager mode

    def dtype(self, tensor: Tensor) -> np.dtype:
        """Return the numpy dtype of ``tensor``."""
        return _NUMPY_DTYPES[tensor.dtype]

    # -- ops (differentiable inside value_and_grad) ----------------------
    def conv2d(self, x: Tensor, w: Tensor, b: Tensor | None, stride: int, padding: int, groups: int) -> Tensor:
        """NCHW cross-correlation with OIHW weights, bias (or None), zero padding and groups."""
        return F.conv2d(x, w, b, stride=stride, padding=padding, dilation=1, groups=groups, data_format="NCHW")

    def avg_pool2d(self, x: Tensor, kernel: int, stride: int, padding: int, ceil_mode: bool) -> Tensor:
        """Average pooling; padded zeros count in the divisor (a ceil-mode overhang does not)."""
        # NOTE: Paddle defaults to exclusive=True (padding left out of the divisor);
        # the protocol counts it, so exclusive=False. In ceil mode Paddle's non-exclusive
        # divisor cuts a window at the end of the padding, as torch's does.
        out = F.avg_pool2d(
            x,
            kernel_size=kernel,
            stride=stride,
            padding=padding,
            ceil_mode=ceil_mode,
            exclusive=False,
            divisor_override=None,
            data_format="NCHW",
        )
        return _torch_pool_size(out, x, kernel, stride, padding, ceil_mode)

    def max_pool2d(self, x: Tensor, kernel: int, stride: int, padding: int, ceil_mode: bool) -> Tensor:
        """Max pooling (padding is -inf, so it never wins); floor or ceil output size."""
        out = F.max_pool2d(
            x,
            kernel_size=kernel,
            stride=stride,
            padding=padding,
            return_mask=False,
            ceil_mode=ceil_mode,
            data_format="NCHW",
        )
        return _torch_pool_size(out, x, kernel, stride, padding, ceil_mode)

    def relu(self, x: Tensor) -> Tensor:
        """Return max(x, 0)."""
        return F.relu(x)

    def global_avg_pool2d(self, x: Tensor) -> Tensor:
        """Mean over each (H, W) plane, as (B, C, 1, 1)."""
        return F.adaptive_avg_pool2d(x, output_size=1, data_format="NCHW")

    def batch_norm(self, x: Tensor, gamma: Tensor, beta: Tensor, mean: Tensor, var: Tensor, eps: float) -> Tensor:
        """Normalize with the given statistics (no gradient into them)."""
        # NOTE: training=False normalizes with the tensors given as running statistics and
        # leaves them as they are; momentum is unused then.
        return F.batch_norm(
            x,
            mean,
            var,
            gamma,
            beta,
            training=False,
            momentum=0.9,
            epsilon=eps,
            data_format="NCHW",
            use_global_stats=True,
        )

    def batch_norm_train(
        self, x: Tensor, gamma: Tensor, beta: Tensor, eps: float, stats: Tensor | None = None, count: int | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Batch statistics (fused kernel), or the table's parts combined; also return mean, unbiased var."""
        if stats is None or count is None:  # the contract passes both or neither
            n = x.shape[0] * x.shape[2] * x.shape[3]
            # NOTE: Paddle's momentum weighs the OLD running value and its running variance is the
            # biased one. momentum=0 on fresh buffers leaves exactly the batch mean and biased
            # variance in them; the core's convention (torch's) wants the unbiased one.
            mean, var = paddle.zeros_like(gamma), paddle.zeros_like(gamma)
            y = F.batch_norm(
                x,
                mean,
                var,
                gamma,
                beta,
                training=True,
                momentum=0.0,
                epsilon=eps,
                data_format="NCHW",
                use_global_stats=False,
            )
            return y, mean, var * (n / (n - 1))
        # The parallel formula (torch's batch_norm_gather_stats_with_counts), in autograd's ops.
        ns, means, m2s = stats[:, 0], stats[:, 1], stats[:, 2]
        mean = means[0] + paddle.sum(ns * (means - means[0]), axis=0) / count  # small offsets, not large means
        spread = means - mean
        biased = (paddle.sum(m2s, axis=0) + paddle.sum(ns * spread * spread, axis=0)) / count
        scale = gamma * paddle.rsqrt(biased + eps)
        y = (x - mean.reshape([1, -1, 1, 1])) * scale.reshape([1, -1, 1, 1]) + beta.reshape([1, -1, 1, 1])
        return y, mean.detach(), (biased * (count / (count - 1))).detach()

    def batch_norm_stats(self, x: Tensor, part: int = 0, parts: int = 1) -> Tensor:
        """Per-channel count, mean and centred sum of squares in row ``part`` of a (parts, 3, C) table."""
        # Sums about one of each channel's own values (shifted data) stay small, so the centred sum
        # of squares loses little to cancellation, in about the passes of the plain sums.
        n = x.shape[0] * x.shape[2] * x.shape[3]
        shift = x[0, :, 0, 0].detach()
        d = x - shift.reshape([1, -1, 1, 1])
        s1, s2 = paddle.sum(d, axis=[0, 2, 3]), paddle.sum(d * d, axis=[0, 2, 3])
        mean = shift + s1 / n
        m2 = paddle.clip(s2 - s1 * s1 / n, min=0.0)  # rounding may dip below 0 on a constant channel
        counts = paddle.full_like(mean, n)  # filled on x's place: no host copy
        row = paddle.stack([counts, mean, m2]).unsqueeze(0)
        zero = paddle.zeros_like(row)  # on x's place, outside the graph
        before, after = ([zero.expand([k, 3, x.shape[1]])] if k else [] for k in (part, parts - 1 - part))
        return paddle.concat(before + [row] + after, axis=0) if parts > 1 else row

    def add(self, x: Tensor, y: Tensor) -> Tensor:
        """Return ``x + y`` with numpy's broadcasting (autograd sums a broadcast operand's gradient back)."""
        return paddle.add(x, y)

    def concat_channels(self, xs: Sequence[Tensor]) -> Tensor:
        """Join along the channel axis (differentiable)."""
        return paddle.concat(list(xs), axis=1)

    def group_sum(self, x: Tensor, group: Any) -> Tensor:
        """Sum over the group's ranks; the gradient is summed the same way."""
        return _GroupSum.apply(x, group)

    def dense(self, x: Tensor, w: Tensor, b: Tensor) -> Tensor:
        """Return ``x @ w + b`` over the last axis: x (..., I), w (I, O), b (O,)."""
        # paddle.matmul treats x's leading axes as a batch, so a (B, S, I) sequence needs no reshape.
        return paddle.matmul(x, w, transpose_x=False, transpose_y=False) + b

    def reshape(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        """Return ``x`` reshaped (``-1`` allowed once)."""
        return paddle.reshape(x, [int(s) for s in shape])

    def softmax_cross_entropy(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Return the per-example loss -log softmax(logits)[label], shape (B,)."""
        # NOTE: ignore_index=-100 gives label -100 a loss of 0; the contract refuses it first.
        loss = F.cross_entropy(
            logits,
            labels,
            weight=None,
            ignore_index=-100,
            reduction="none",
            soft_label=False,
            axis=-1,
            use_softmax=True,
            label_smoothing=0.0,
        )
        # NOTE: older Paddle returns (B, 1) with reduction="none"; the protocol wants (B,).
        return paddle.reshape(loss, [-1])

    def sum(self, x: Tensor) -> Tensor:
        """Return the sum of all elements as a 0-d tensor."""
        return paddle.sum(x, axis=None, keepdim=False)

    def argmax(self, x: Tensor, axis: int) -> Tensor:
        """Return the int64 index of the maximum along ``axis``."""
        return paddle.argmax(x, axis=axis, keepdim=False, dtype="int64")

    # -- math for the algorithms (outside autograd) ----------------------
    # NOTE: the textbook's allreduce "returns" results by rebinding list slots
    # (data[i] = data[0]), which leaves every replica aliasing one buffer and never
    # touches the tensors the caller holds. These write through dst's storage instead.
    @paddle.no_grad()
    def add_(self, dst: Tensor, src: Tensor) -> None:
        """In place ``dst += src``; ``src`` is first moved to ``dst``'s place."""
        dst.add_(_move(src, dst.place))

    @paddle.no_grad()
    def assign_(self, dst: Tensor, src: Tensor) -> None:
        """In place ``dst[...] = src``; ``src`` is first moved to ``dst``'s place."""
        # NOTE: assign(output=dst) resizes dst to src's shape; the contract passes equal shapes.
        paddle.assign(_move(src, dst.place), output=dst)

    @paddle.no_grad()
    def split(self, x: Tensor, sizes: Sequence[int]) -> list[Tensor]:
        """Split along axis 0 into new tensors (copies) of the given lengths."""
        # Clone: with stride kernels enabled, split may return views of x.
        return list(map(paddle.clone, paddle.split(x, list(sizes), axis=0)))

    @paddle.no_grad()
    def concat(self, xs: Sequence[Tensor]) -> Tensor:
        """Concatenate along axis 0 into a new tensor on the place of ``xs[0]``."""
        return paddle.concat([_move(x, xs[0].place) for x in xs], axis=0)

    @paddle.no_grad()
    def flatten(self, xs: Sequence[Tensor]) -> Tensor:
        """Return a new 1-D tensor of every tensor raveled, on the place of ``xs[0]``."""
        return paddle.concat([paddle.reshape(_move(x, xs[0].place), [-1]) for x in xs], axis=0)

    def unflatten(self, flat: Tensor, shapes: Sequence[Sequence[int]]) -> list[Tensor]:
        """Return views of consecutive slices of ``flat`` (they share its storage)."""
        # NOTE: paddle.split copies; basic slicing returns a strided view in Paddle 3.
        out, start = [], 0
        for shape in shapes:
            size = int(np.prod(shape, dtype=np.int64))
            out.append(paddle.reshape(flat[start : start + size], [int(d) for d in shape]))
            start += size
        return out

    @paddle.no_grad()
    def native_allreduce(self, tensors: list[Tensor]) -> None:
        """In place: every tensor ends holding the sum of all (Paddle's add_n kernel)."""
        if not tensors:
            return
        total = paddle.add_n([_move(t, tensors[0].place) for t in tensors])
        for t in tensors:
            paddle.assign(_move(total, t.place), output=t)

    # -- gradients and update -------------------------------------------
    def value_and_grad(
        self,
        fn: Callable[..., Any],
        params: Sequence[Tensor],
        *inputs: Any,
        aux: bool = False,
        out: Tensor | None = None,
        buckets: Sequence[tuple[int, int]] | None = None,
        on_bucket: Callable[[int], None] | None = None,
    ) -> Any:
        """Evaluate ``fn(params, *inputs)`` (a scalar); return [grads raveled..., value] in one buffer
        (and the aux outputs raveled in a second one with ``aux=True``); with ``buckets`` each bucket is
        signalled from Paddle's tensor hooks while backward runs."""
        # NOTE: Paddle accumulates into .grad on backward(). Fresh detached leaves start
        # with no .grad, so backward() fills theirs and never the caller's params; it
        # costs about 2% less CPU than paddle.grad on the same graph.
        leaves: list[Tensor] = []
        for p in params:
            leaf = p.detach()  # shares storage, no copy; own autograd state
            leaf.stop_gradient = False
            leaves.append(leaf)
        # NOTE: under the caller's paddle.no_grad() the forward records no graph, and
        # the zero-fill below would turn every missing gradient into a silent zero.
        outputs: list[Tensor] = []
        hooks = (
            _BucketHooks(self, leaves, out, buckets, on_bucket)
            if buckets is not None and out is not None and on_bucket is not None
            else None
        )
        with paddle.enable_grad():
            value = fn(leaves, *inputs)
            if aux:
                value, outputs = value
            if hooks is not None:
                hooks.value(value)
            value.backward()
        if hooks is not None:
            hooks.rest()
            if not aux:
                return out
            place = hooks.views[-1].place  # out may be one buffer per bucket
            return out, paddle.concat([paddle.reshape(_move(o.detach(), place), [-1]) for o in outputs])
        grads = [leaf.grad for leaf in leaves]
        # A parameter the loss does not use has zero gradient, not None.
        fresh = [paddle.zeros_like(p) if g is None else g.detach() for p, g in zip(leaves, grads)]
        # NOTE: .numpy() would wait for the device; the value stays in the buffer.
        with paddle.no_grad():
            pieces = [*(paddle.reshape(g, [-1]) for g in fresh), paddle.reshape(value.detach(), [1])]
            if out is None:
                flat = paddle.concat(pieces, axis=0)
            else:  # NOTE: paddle.concat has no out=; copy_ into views of out writes through to it
                flat = out
                for view, piece in zip(self.unflatten(out, [tuple(q.shape) for q in pieces]), pieces):
                    view.copy_(piece, False)  # type: ignore[call-arg]  # Paddle's stub lacks `blocking`
            if not aux:
                return flat
            return flat, paddle.concat([paddle.reshape(_move(o.detach(), flat.place), [-1]) for o in outputs])

    @paddle.no_grad()
    def sgd_(self, params: Sequence[Tensor], grads: Sequence[Tensor], lr: float) -> None:
        """In place ``p -= lr * g`` for every pair."""
        for p, g in zip(params, grads):
            _sgd_pass(p, _move(g, p.place), lr)

    # -- whole-buffer math (outside autograd) -----------------------------
    @paddle.no_grad()
    def scale_(self, y: Tensor, a: float) -> None:
        """In place ``y *= a``."""
        y.scale_(a)

    @paddle.no_grad()
    def axpby_(self, y: Tensor, a: float, x: Tensor, b: float) -> None:
        """In place ``y = a * y + b * x``."""
        if a != 1.0:
            y.scale_(a)
        _sgd_pass(y, _move(x, y.place), -b)

    @paddle.no_grad()
    def addcmul_(self, y: Tensor, a: float, x1: Tensor, x2: Tensor, b: float) -> None:
        """In place ``y = a * y + b * x1 * x2``."""
        if a != 1.0:
            y.scale_(a)
        y.add_(paddle.multiply(_move(x1, y.place), _move(x2, y.place)).scale_(b))

    @paddle.no_grad()
    def addcdiv_sqrt_(self, y: Tensor, x1: Tensor, x2: Tensor, value: float, divisor: float, eps: float) -> None:
        """In place ``y += value * x1 / (sqrt(x2) / divisor + eps)``."""
        denom = (
            paddle.sqrt(_move(x2, y.place))
            .divide_(paddle.full([], divisor, y.dtype))
            .add_(paddle.full([], eps, y.dtype))
        )
        y.add_(paddle.divide(_move(x1, y.place), denom).scale_(value))


def _sgd_pass(y: Tensor, x: Tensor, rate: float) -> None:
    """In place ``y -= rate * x`` in one pass.

    NOTE: Paddle's add_ and subtract_ take no factor, and ``x * rate`` is a temporary of
    x's size (on a ResNet-18's 11.7M parameters about 8x slower than this); Paddle's own
    sgd_ kernel, which its SGD optimizer runs, does it in one pass.
    """
    rate_t = paddle.to_tensor(np.array([rate], np.float32), place=y.place, stop_gradient=True)
    paddle._C_ops.sgd_(y, rate_t, x, None, False)  # type: ignore[arg-type]  # the stub requires master_param


class _CopyTo(paddle.autograd.PyLayer):
    """A copy to another place inside autograd: the gradient is copied back."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, place: Any) -> Tensor:
        ctx.source = x.place
        return _move(x.detach(), place).clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return _move(grad, ctx.source).clone()


class _GroupSum(paddle.autograd.PyLayer):
    """A sum over a process group inside autograd: backward sums the gradient the same way.

    NOTE: PyLayer's backward returns one gradient per tensor input; the group is no tensor.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        return _summed_in_place(x.detach().clone(), group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return _summed_in_place(grad.detach().clone(), ctx.group)


def _summed_in_place(copy: Tensor, group: Any) -> Tensor:
    group.allreduce_(copy)
    return copy


class _BucketHooks:
    """Copies each leaf's gradient into its view of ``out`` from a Paddle tensor hook and signals
    a bucket once all of its gradients are there."""

    def __init__(
        self,
        backend: PaddleBackend,
        leaves: Sequence[Tensor],
        out: Tensor,
        buckets: Sequence[tuple[int, int]],
        on_bucket: Callable[[int], None],
    ):
        self.views = gradient_views(backend, out, [tuple(p.shape) for p in leaves], buckets)
        self.signals = BucketSignals(buckets, on_bucket)
        for i, leaf in enumerate(leaves):
            # NOTE: Paddle's eager engine sums every contribution to a leaf before it runs the
            # leaf's accumulation node, whose hooks see that sum once (paddle.DataParallel hooks
            # the same node). A hook cannot make Paddle accumulate into our buffer, so the
            # gradient is copied into its slice here and Paddle's own .grad is dropped with
            # the leaf.
            leaf.register_hook(partial(self._arrived, i))

    def _arrived(self, i: int, grad: Tensor) -> None:
        with paddle.no_grad():
            self.views[i].copy_(paddle.reshape(grad, self.views[i].shape), False)
        self.signals.done(i)

    def value(self, value: Tensor) -> None:
        with paddle.no_grad():
            self.views[-1].copy_(paddle.reshape(value.detach(), [1]), False)

    def rest(self) -> None:
        """Parameters fn did not use: gradient zero, and their buckets signalled."""
        with paddle.no_grad():
            for i in self.signals.pending():
                self.views[i].zero_()
        self.signals.rest()
