"""PyTorch adapter for the multigpu backend protocol (see ``multigpu.contract.protocol``).

Thin on purpose: every op passes every argument explicitly, and each place where
PyTorch's own behaviour differs from the protocol convention carries a ``NOTE:``.
Arguments arrive already checked by ``multigpu.contract.checked`` (shapes, dtypes, sizes,
labels, devices), so nothing here validates them again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from multigpu.backends.torch.math_ops import MathOps
from multigpu.backends.torch.nn_ops import NNOps
from multigpu.contract.bucket_signals import BucketSignals, gradient_views
from multigpu.contract.protocol import Device

Tensor = torch.Tensor
_NUMPY_DTYPES: dict[torch.dtype, np.dtype] = {
    torch.float32: np.dtype(np.float32),
    torch.int64: np.dtype(np.int64),
    torch.float64: np.dtype(np.float64),
    torch.int32: np.dtype(np.int32),
}


class TorchBackend(MathOps, NNOps):
    """The ``Backend`` protocol implemented with PyTorch tensors and autograd.

    The transformer and ONNX ops live in the mixins: ``math_ops.MathOps`` (products, layout,
    elementwise math, reductions, slicing) and ``nn_ops.NNOps`` (layer norm, embedding, masks,
    dropout, sequence loss).
    """

    name = "torch"
    tensor_type = torch.Tensor

    # -- devices ---------------------------------------------------------
    def torch_device(self, device: Device) -> torch.device:
        """Return the ``torch.device`` for a logical ``Device`` (checked by the contract)."""
        # Every CPU replica maps to the one host device; replicas stay apart
        # because copy_to/from_numpy always allocate a new buffer.
        return torch.device("cpu") if device.kind == "cpu" else torch.device("cuda", device.index)

    def gpu_count(self) -> int:
        """Return how many CUDA GPUs torch can use here."""
        return torch.cuda.device_count()

    def synchronize(self, device: Device) -> None:
        """Block until queued work on ``device`` is done (a no-op on CPU)."""
        dev = self.torch_device(device)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    # -- tensors ---------------------------------------------------------
    def from_numpy(self, array: np.ndarray, device: Device) -> Tensor:
        """Return a new tensor on ``device`` (the array is float32 or int64, C-contiguous)."""
        # NOTE: torch.from_numpy/as_tensor would share numpy memory; torch.tensor always
        # copies, so two replicas made from one array never alias it or each other.
        return torch.tensor(array, device=self.torch_device(device))

    def to_numpy(self, tensor: Tensor) -> np.ndarray:
        """Return a numpy copy of ``tensor``."""
        # NOTE: on CPU .cpu() is a no-op and .numpy() shares storage, so copy explicitly.
        return tensor.detach().cpu().numpy().copy()

    def copy_to(self, tensor: Tensor, device: Device) -> Tensor:
        """Return a new buffer on ``device`` with the values of ``tensor``."""
        # NOTE: Tensor.to(dev) returns the SAME tensor when already on dev, which would
        # alias CPU replicas; copy=True forces a fresh buffer. It stays differentiable
        # so a partitioned forward can hop devices inside value_and_grad.
        return tensor.to(self.torch_device(device), copy=True)

    def shape(self, tensor: Tensor) -> tuple[int, ...]:
        """Return the shape of ``tensor`` as a tuple of ints."""
        return tuple(tensor.shape)  # torch.Size holds Python ints

    def dtype(self, tensor: Tensor) -> np.dtype:
        """Return the numpy dtype of ``tensor``."""
        return _NUMPY_DTYPES[tensor.dtype]

    # -- ops (differentiable inside value_and_grad) ----------------------
    def conv2d(self, x: Tensor, w: Tensor, b: Tensor | None, stride: int, padding: int, groups: int) -> Tensor:
        """NCHW cross-correlation with OIHW weights, bias (or None), zero padding and groups."""
        return F.conv2d(x, w, b, stride=stride, padding=padding, dilation=1, groups=groups)

    def avg_pool2d(self, x: Tensor, kernel: int, stride: int, padding: int, ceil_mode: bool) -> Tensor:
        """Average pooling; padded zeros count in the divisor (a ceil-mode overhang does not)."""
        # NOTE: count_include_pad is passed although it equals torch's default today, and
        # stride is always given (torch's None means "= kernel"). The protocol's ceil mode
        # is torch's, divisor included.
        return F.avg_pool2d(
            x,
            kernel_size=kernel,
            stride=stride,
            padding=padding,
            ceil_mode=ceil_mode,
            count_include_pad=True,
            divisor_override=None,
        )

    def max_pool2d(self, x: Tensor, kernel: int, stride: int, padding: int, ceil_mode: bool) -> Tensor:
        """Max pooling; padding never wins; floor or ceil output size."""
        # NOTE: torch pads max pooling with -inf, so a padded cell never wins.
        return F.max_pool2d(
            x,
            kernel_size=kernel,
            stride=stride,
            padding=padding,
            dilation=1,
            ceil_mode=ceil_mode,
            return_indices=False,
        )

    def relu(self, x: Tensor) -> Tensor:
        """Return max(x, 0)."""
        return torch.relu(x)

    def global_avg_pool2d(self, x: Tensor) -> Tensor:
        """Mean over each (H, W) plane, as (B, C, 1, 1)."""
        return F.adaptive_avg_pool2d(x, (1, 1))

    def batch_norm(self, x: Tensor, gamma: Tensor, beta: Tensor, mean: Tensor, var: Tensor, eps: float) -> Tensor:
        """Normalize with the given statistics (no gradient into them)."""
        # NOTE: training=False normalizes with the tensors passed as running statistics and
        # leaves them untouched; momentum is unused then, and passed so no default counts.
        return F.batch_norm(x, mean, var, gamma, beta, training=False, momentum=0.0, eps=eps)

    def batch_norm_train(
        self, x: Tensor, gamma: Tensor, beta: Tensor, eps: float, stats: Tensor | None = None, count: int | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Batch statistics (fused kernel), or the table's parts combined; also return mean, unbiased var."""
        if stats is None or count is None:  # the contract passes both or neither
            # NOTE: torch keeps running statistics itself. Fresh zero buffers with momentum=1.0
            # receive exactly this batch's mean and unbiased variance (torch's own convention), which
            # the core then folds into its running statistics; torch's buffers are never kept.
            mean, var = torch.zeros_like(gamma), torch.zeros_like(gamma)
            y = F.batch_norm(x, mean, var, gamma, beta, training=True, momentum=1.0, eps=eps)
            return y, mean, var
        # The parallel formula (torch's batch_norm_gather_stats_with_counts), in autograd's ops.
        ns, means, m2s = stats[:, 0], stats[:, 1], stats[:, 2]
        mean = means[0] + (ns * (means - means[0])).sum(dim=0) / count  # small offsets, not large means
        spread = means - mean
        biased = (m2s.sum(dim=0) + (ns * spread * spread).sum(dim=0)) / count
        scale = gamma * torch.rsqrt(biased + eps)
        y = (x - mean.view(1, -1, 1, 1)) * scale.view(1, -1, 1, 1) + beta.view(1, -1, 1, 1)
        return y, mean.detach(), (biased * (count / (count - 1))).detach()

    def batch_norm_stats(self, x: Tensor, part: int = 0, parts: int = 1) -> Tensor:
        """Per-channel count, mean and centred sum of squares in row ``part`` of a (parts, 3, C) table."""
        # Sums about one of each channel's own values (shifted data) stay small, so the centred sum
        # of squares loses little to cancellation, in about the passes of the plain sums. (Two
        # passes cost 2.5 times as much here; torch's CPU mean over (0, 2, 3) alone is off by 1e-4
        # of the spread at mean/std 1000, the mean of the small offsets is not.)
        n = x.shape[0] * x.shape[2] * x.shape[3]
        shift = x[0, :, 0, 0].detach()
        d = x - shift.view(1, -1, 1, 1)
        s1, s2 = d.sum(dim=(0, 2, 3)), (d * d).sum(dim=(0, 2, 3))
        mean = shift + s1 / n
        m2 = torch.clamp(s2 - s1 * s1 / n, min=0.0)  # rounding may dip below 0 on a constant channel
        counts = torch.full_like(mean, n)  # filled on the device: no host copy
        row = torch.stack([counts, mean, m2]).unsqueeze(0)
        return F.pad(row, (0, 0, 0, 0, part, parts - 1 - part))  # zero rows for the other parts

    def add(self, x: Tensor, y: Tensor) -> Tensor:
        """Return ``x + y`` with numpy's broadcasting (autograd sums a broadcast operand's gradient back)."""
        # NOTE: torch.add takes a multiplier of y (alpha); it is passed as 1 so no default counts.
        return torch.add(x, y, alpha=1)

    def concat_channels(self, xs: Sequence[Tensor]) -> Tensor:
        """Join along the channel axis (differentiable)."""
        return torch.cat(list(xs), dim=1)

    def group_sum(self, x: Tensor, group: Any) -> Tensor:
        """Sum over the group's ranks; the gradient is summed the same way."""
        return _GroupSum.apply(x, group)

    def dense(self, x: Tensor, w: Tensor, b: Tensor) -> Tensor:
        """Return ``x @ w + b`` over the last axis: x (..., I), w (I, O), b (O,)."""
        # NOTE: torch.nn.Linear stores (out, in) and computes x @ W.T; the protocol uses (in, out).
        # torch.matmul treats x's leading axes as a batch, so a (B, S, I) sequence needs no reshape.
        return torch.matmul(x, w) + b

    def reshape(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        """Return ``x`` reshaped (``-1`` allowed once); may be a view."""
        return torch.reshape(x, tuple(int(s) for s in shape))

    def softmax_cross_entropy(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Return the per-example loss -log softmax(logits)[label], shape (B,)."""
        # NOTE: F.cross_entropy defaults to reduction='mean' and silently skips
        # label -100 (ignore_index); log_softmax + gather has neither default.
        logp = F.log_softmax(logits, dim=1)
        return -logp.gather(1, labels.reshape(-1, 1)).reshape(-1)

    def sum(self, x: Tensor) -> Tensor:
        """Return the sum of all elements as a 0-d tensor."""
        return torch.sum(x)

    def argmax(self, x: Tensor, axis: int) -> Tensor:
        """Return the int64 index of the maximum along ``axis``."""
        return torch.argmax(x, dim=axis, keepdim=False)

    # -- math for the algorithms (outside autograd) ----------------------
    @torch.no_grad()
    def add_(self, dst: Tensor, src: Tensor) -> None:
        """In place ``dst += src``; ``src`` may live on another device."""
        # A same-device .to() aliases src, which is harmless here: src is only read.
        dst.add_(src.to(dst.device))

    @torch.no_grad()
    def assign_(self, dst: Tensor, src: Tensor) -> None:
        """In place ``dst[...] = src``; ``src`` may live on another device."""
        dst.copy_(src)

    @torch.no_grad()
    def split(self, x: Tensor, sizes: Sequence[int]) -> list[Tensor]:
        """Split along axis 0 into new tensors of the given lengths."""
        # NOTE: torch.split returns views of x; clone so each part owns its buffer.
        return [part.clone() for part in torch.split(x, list(sizes), dim=0)]

    @torch.no_grad()
    def concat(self, xs: Sequence[Tensor]) -> Tensor:
        """Concatenate along axis 0 into a new tensor on the device of ``xs[0]``."""
        # torch.cat always allocates, even for a single input.
        return torch.cat([x.to(xs[0].device) for x in xs], dim=0)

    @torch.no_grad()
    def flatten(self, xs: Sequence[Tensor]) -> Tensor:
        """Return a new 1-D tensor of every tensor raveled, on the device of ``xs[0]``."""
        return torch.cat([x.reshape(-1).to(xs[0].device) for x in xs])

    def unflatten(self, flat: Tensor, shapes: Sequence[Sequence[int]]) -> list[Tensor]:
        """Return views of consecutive slices of ``flat`` (they share its storage)."""
        sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
        return [part.view(tuple(int(d) for d in s)) for part, s in zip(torch.split(flat, sizes), shapes)]

    @torch.no_grad()
    def native_allreduce(self, tensors: Sequence[Tensor]) -> None:
        """In place SUM allreduce: every tensor in ``tensors`` receives the sum of all."""
        if not tensors:
            return
        if len(tensors) > 1 and all(t.device.type == "cuda" for t in tensors):
            from torch.cuda import comm  # a submodule that `import torch` does not bind

            total = comm.reduce_add(list(tensors), destination=tensors[0].device.index)
        else:
            dev = tensors[0].device
            total = torch.stack([t.to(dev) for t in tensors]).sum(dim=0)
        # copy_ reads total before writing, so aliasing tensors[0] (len 1) is safe.
        for t in tensors:
            t.copy_(total)

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
        (and the aux outputs raveled in a second one with ``aux=True``)."""
        if buckets is not None and out is not None and on_bucket is not None:
            return self._bucketed(fn, params, inputs, aux, out, buckets, on_bucket)
        # NOTE: torch accumulates into .grad across backward() calls. Fresh leaves
        # (detach() shares storage, cheap; params are not mutated in the forward)
        # plus torch.autograd.grad return new tensors and touch no .grad field.
        leaves = [p.detach().requires_grad_(True) for p in params]
        with torch.enable_grad():
            value, outputs = _forward(fn, leaves, inputs, aux)
            grads: tuple[Tensor | None, ...]
            if value.requires_grad:
                grads = torch.autograd.grad(value, leaves, allow_unused=True)
            else:
                grads = (None,) * len(leaves)
        # An unused parameter has gradient zero, not None, so the core never special-cases it.
        fresh = [torch.zeros_like(p) if g is None else g for p, g in zip(leaves, grads)]
        # NOTE: float(value) would wait for the device; the value stays in the buffer. A new buffer of
        # a ResNet-18's size costs about 6x the copy itself here (the kernel maps its pages afresh).
        with torch.no_grad():
            pieces = [*(g.reshape(-1) for g in fresh), value.detach().reshape(1).to(fresh[0].dtype)]
            flat = torch.cat(pieces) if out is None else torch.cat(pieces, out=out)
            if not aux:
                return flat
            return flat, torch.cat([o.detach().reshape(-1).to(flat.device) for o in outputs])

    def _bucketed(
        self,
        fn: Callable[..., Any],
        params: Sequence[Tensor],
        inputs: Sequence[Any],
        aux: bool,
        out: Tensor,
        buckets: Sequence[tuple[int, int]],
        on_bucket: Callable[[int], None],
    ) -> Any:
        """value_and_grad with each gradient accumulated into its view of ``out`` and buckets signalled
        from torch's post-accumulate-grad hooks, while backward still runs."""
        leaves = [p.detach().requires_grad_(True) for p in params]
        views = gradient_views(self, out, [tuple(p.shape) for p in leaves], buckets)
        signals = BucketSignals(buckets, on_bucket)
        with torch.no_grad():
            for buffer in out if isinstance(out, (list, tuple)) else [out]:
                buffer.zero_()
        for i, (leaf, view) in enumerate(zip(leaves, views)):
            # NOTE: DDP's gradient_as_bucket_view: with .grad already set, torch's AccumulateGrad adds
            # the gradient into it in place, so backward writes straight into the bucket's slice.
            leaf.grad = view
            leaf.register_post_accumulate_grad_hook(lambda _leaf, i=i: signals.done(i))
        with torch.enable_grad():
            value, outputs = _forward(fn, leaves, inputs, aux)
            with torch.no_grad():
                views[-1].copy_(value.detach().reshape(1))  # the value is known before backward
            if value.requires_grad:
                torch.autograd.backward(value, inputs=leaves)
        signals.rest()  # NOTE: a parameter fn does not use gets no hook call; its slice is still zero
        if not aux:
            return out
        with torch.no_grad():
            return out, torch.cat([o.detach().reshape(-1).to(views[-1].device) for o in outputs])

    @torch.no_grad()
    def sgd_(self, params: Sequence[Tensor], grads: Sequence[Tensor], lr: float) -> None:
        """In place ``p -= lr * g`` for every pair."""
        for p, g in zip(params, grads):
            p.sub_(g.to(p.device), alpha=float(lr))

    # -- whole-buffer math (outside autograd) -----------------------------
    @torch.no_grad()
    def scale_(self, y: Tensor, a: float) -> None:
        """In place ``y *= a``."""
        y.mul_(a)

    @torch.no_grad()
    def axpby_(self, y: Tensor, a: float, x: Tensor, b: float) -> None:
        """In place ``y = a * y + b * x``."""
        if a != 1.0:
            y.mul_(a)
        y.add_(x.to(y.device), alpha=b)

    @torch.no_grad()
    def addcmul_(self, y: Tensor, a: float, x1: Tensor, x2: Tensor, b: float) -> None:
        """In place ``y = a * y + b * x1 * x2``."""
        if a != 1.0:
            y.mul_(a)
        y.addcmul_(x1.to(y.device), x2.to(y.device), value=b)

    @torch.no_grad()
    def addcdiv_sqrt_(self, y: Tensor, x1: Tensor, x2: Tensor, value: float, divisor: float, eps: float) -> None:
        """In place ``y += value * x1 / (sqrt(x2) / divisor + eps)``."""
        # The order of torch.optim.AdamW's own step: sqrt, divide, add eps, then addcdiv.
        denom = x2.to(y.device).sqrt().div_(divisor).add_(eps)
        y.addcdiv_(x1.to(y.device), denom, value=value)


def _forward(
    fn: Callable[..., Any], leaves: Sequence[Tensor], inputs: Sequence[Any], aux: bool
) -> tuple[Tensor, list[Tensor]]:
    """``fn``'s value as a 0-d tensor and its aux outputs (none without ``aux``)."""
    value = fn(leaves, *inputs)
    outputs: list[Tensor] = []
    if aux:
        value, outputs = value
    return value.reshape(()), outputs


def _summed(t: Tensor, group: Any) -> Tensor:
    """A copy of ``t`` summed over the ranks of ``group`` (autograd may hand over a buffer it reuses)."""
    out = t.detach().clone()
    group.allreduce_(out)
    return out


class _GroupSum(torch.autograd.Function):
    """A sum over a process group inside autograd: backward sums the gradient the same way."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        return _summed(x, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return _summed(grad, ctx.group), None  # no gradient for the group
