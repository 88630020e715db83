"""NumPy reference adapter: every op's forward plus a hand-written backward.

Tensors are ``Var`` nodes. Ops called inside ``value_and_grad`` record a backward
closure; ``value_and_grad`` walks them in reverse topological order. The results
define what "correct" means for the framework adapters. Ops keep the input dtype,
so the tests check these backward rules in float64 against finite differences
(``from_numpy`` itself gives float32).
It is the strictest adapter: besides the contract (``multigpu.contract.checked``), it checks
every label and id on every call and that an op's operands share one logical device, so a
core bug that mixes CPU replicas fails on the oracle although the frameworks run it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from multigpu.backends.numpy.math_ops import MathOps
from multigpu.backends.numpy.nn_ops import NNOps
from multigpu.backends.numpy.var import Var
from multigpu.contract.bucket_signals import BucketSignals, gradient_views
from multigpu.contract.checked import check_label_range
from multigpu.contract.protocol import Device, pool_output_size


def _windows(xp: np.ndarray, k: int, s: int, oh: int, ow: int) -> np.ndarray:
    """View of shape (B, C, k, k, OH, OW) over a padded NCHW array (no copy)."""
    b, c, _, _ = xp.shape
    sb, sc, sh, sw = xp.strides
    return as_strided(xp, (b, c, k, k, oh, ow), (sb, sc, sh, sw, sh * s, sw * s), writeable=False)


def _scatter_windows(dcols: np.ndarray, shape: tuple[int, ...], k: int, s: int) -> np.ndarray:
    """Adjoint of ``_windows``: add (B, C, k, k, OH, OW) window grads into an array of ``shape``."""
    out = np.zeros(shape, dcols.dtype)
    oh, ow = dcols.shape[4:]
    for i in range(k):
        for j in range(k):
            out[:, :, i : i + s * oh : s, j : j + s * ow : s] += dcols[:, :, i, j]
    return out


def _out_size(n: int, k: int, s: int, p: int) -> int:
    return (n + 2 * p - k) // s + 1


def _pad(x: np.ndarray, p: int, value: float = 0.0) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=value) if p else x


def _pool_pad(x: np.ndarray, k: int, s: int, p: int, ceil_mode: bool, value: float) -> tuple[np.ndarray, int, int]:
    """``x`` padded for pooling and the output size: ``p`` on the left and top, and on the
    right and bottom as much as the last window needs (more than ``p`` in ceil mode)."""
    oh, ow = (pool_output_size(n, k, s, p, ceil_mode) for n in x.shape[2:])
    extra = [max(p, (o - 1) * s + k - n - p) for n, o in zip(x.shape[2:], (oh, ow))]
    if not (p or extra[0] or extra[1]):
        return x, oh, ow
    return np.pad(x, ((0, 0), (0, 0), (p, extra[0]), (p, extra[1])), constant_values=value), oh, ow


def _window_lengths(n: int, k: int, s: int, p: int, out: int) -> np.ndarray:
    """Each window's length along an axis of ``n`` padded by ``p``, cut at the right padding's end."""
    starts = np.arange(out) * s
    return np.minimum(starts + k, n + 2 * p) - starts


def _unpad_to(x: np.ndarray, p: int, shape: tuple[int, ...]) -> np.ndarray:
    """The input's part of a padded array (the adjoint of ``_pool_pad``)."""
    return x[:, :, p : p + shape[2], p : p + shape[3]]


def _per_channel(v: np.ndarray) -> np.ndarray:
    """A (C,) vector shaped to broadcast over NCHW."""
    return v.reshape(1, -1, 1, 1)


def _channel_mean(x: np.ndarray) -> np.ndarray:
    """The per-channel mean of NCHW x over (N, H, W), corrected by the mean of the offsets from a first one.

    numpy sums the outer axes one after another in x's dtype; in float32 that alone is off by
    about 1e-4 of the spread when the mean is 1000 times the spread. The offsets are small,
    so their mean adds back what the first pass lost.
    """
    rough = x.mean(axis=(0, 2, 3), dtype=x.dtype)
    return rough + (x - _per_channel(rough)).mean(axis=(0, 2, 3), dtype=x.dtype)


def _unpad(x: np.ndarray, p: int) -> np.ndarray:
    return x[:, :, p : x.shape[2] - p, p : x.shape[3] - p] if p else x


class NumpyBackend(MathOps, NNOps):
    """The reference implementation of the backend protocol, on the CPU only.

    The transformer and ONNX ops live in one mixin per domain (``math_ops``, ``nn_ops``).
    """

    name = "numpy"
    tensor_type = Var

    # -- devices ---------------------------------------------------------
    def gpu_count(self) -> int:
        """NumPy sees no GPU."""
        return 0

    def synchronize(self, device: Device) -> None:
        """NumPy is synchronous; nothing to wait for."""

    # -- tensors ---------------------------------------------------------
    def from_numpy(self, array: np.ndarray, device: Device) -> Var:
        """New Var holding a copy of ``array`` (float32 or int64)."""
        return Var(np.array(array, copy=True), device)

    def to_numpy(self, tensor: Var) -> np.ndarray:
        """A numpy copy of the Var's data."""
        return np.array(tensor.data, copy=True)

    def copy_to(self, tensor: Var, device: Device) -> Var:
        """A new buffer on ``device``; inside value_and_grad its gradient is copied back."""
        return Var(tensor.data.copy(), device, (tensor,), lambda g: (g,))

    def shape(self, tensor: Var) -> tuple[int, ...]:
        """The Var's shape."""
        return tensor.data.shape

    def dtype(self, tensor: Var) -> np.dtype:
        """The Var's numpy dtype."""
        return tensor.data.dtype

    # -- differentiable ops ---------------------------------------------
    def conv2d(self, x: Var, w: Var, b: Var | None, stride: int, padding: int, groups: int) -> Var:
        """Grouped cross-correlation by strided windows and tensordot; ``b=None``: no bias."""
        xd, wd = x.data, w.data
        bsz, c, h, wid = xd.shape
        o, cg, k, _ = wd.shape
        og = o // groups
        oh, ow = _out_size(h, k, stride, padding), _out_size(wid, k, stride, padding)
        xp = _pad(xd, padding)
        cols = _windows(xp, k, stride, oh, ow)
        out = np.empty((bsz, o, oh, ow), xd.dtype)
        for g in range(groups):
            part = np.tensordot(
                cols[:, g * cg : (g + 1) * cg], wd[g * og : (g + 1) * og], axes=([1, 2, 3], [1, 2, 3])
            )  # (B, OH, OW, Og)
            out[:, g * og : (g + 1) * og] = part.transpose(0, 3, 1, 2)
        if b is not None:
            out += b.data[None, :, None, None]

        def backward(gout: np.ndarray) -> tuple[np.ndarray, ...]:
            dw = np.empty_like(wd)
            dcols = np.empty((bsz, c, k, k, oh, ow), xd.dtype)
            for g in range(groups):
                go = gout[:, g * og : (g + 1) * og]
                dw[g * og : (g + 1) * og] = np.tensordot(
                    go, cols[:, g * cg : (g + 1) * cg], axes=([0, 2, 3], [0, 4, 5])
                )
                dc = np.tensordot(go, wd[g * og : (g + 1) * og], axes=([1], [0]))  # (B,OH,OW,Cg,k,k)
                dcols[:, g * cg : (g + 1) * cg] = dc.transpose(0, 3, 4, 5, 1, 2)
            dx = _unpad(_scatter_windows(dcols, xp.shape, k, stride), padding)
            return (dx, dw) if b is None else (dx, dw, gout.sum(axis=(0, 2, 3)))

        return self._node(out, (x, w) if b is None else (x, w, b), backward)

    def avg_pool2d(self, x: Var, kernel: int, stride: int, padding: int, ceil_mode: bool) -> Var:
        """Average over k*k windows, padded zeros included in the divisor; in ceil mode a
        last window's overhang beyond the padding is not (torch's divisor)."""
        xd = x.data
        xp, oh, ow = _pool_pad(xd, kernel, stride, padding, ceil_mode, 0.0)
        divisor = np.outer(
            *(_window_lengths(n, kernel, stride, padding, o) for n, o in zip(xd.shape[2:], (oh, ow)))
        ).astype(xd.dtype)
        out = _windows(xp, kernel, stride, oh, ow).sum(axis=(2, 3), dtype=xd.dtype) / divisor

        def backward(gout: np.ndarray) -> tuple[np.ndarray]:
            dcols = np.broadcast_to(
                (gout / divisor)[:, :, None, None], gout.shape[:2] + (kernel, kernel) + gout.shape[2:]
            )
            return (_unpad_to(_scatter_windows(dcols, xp.shape, kernel, stride), padding, xd.shape),)

        return self._node(out.astype(xd.dtype), (x,), backward)

    def max_pool2d(self, x: Var, kernel: int, stride: int, padding: int, ceil_mode: bool) -> Var:
        """Max over k*k windows; padding (and a ceil-mode overhang) is -inf so it never wins."""
        xd = x.data
        xp, oh, ow = _pool_pad(xd, kernel, stride, padding, ceil_mode, -np.inf)
        cols = _windows(xp, kernel, stride, oh, ow)
        flat = cols.transpose(0, 1, 4, 5, 2, 3).reshape(xd.shape[0], xd.shape[1], oh, ow, kernel * kernel)
        arg = flat.argmax(axis=-1)
        out = np.take_along_axis(flat, arg[..., None], axis=-1)[..., 0]

        def backward(gout: np.ndarray) -> tuple[np.ndarray]:
            onehot = (np.arange(kernel * kernel) == arg[..., None]) * gout[..., None]
            dcols = onehot.reshape(gout.shape + (kernel, kernel)).transpose(0, 1, 4, 5, 2, 3)
            return (_unpad_to(_scatter_windows(dcols.astype(gout.dtype), xp.shape, kernel, stride), padding, xd.shape),)

        return self._node(out.astype(xd.dtype), (x,), backward)

    def global_avg_pool2d(self, x: Var) -> Var:
        """Mean over each (H, W) plane, kept as (B, C, 1, 1)."""
        shape, area = x.data.shape, x.data.shape[2] * x.data.shape[3]
        out = x.data.mean(axis=(2, 3), keepdims=True, dtype=x.data.dtype)
        return self._node(out, (x,), lambda g: (np.broadcast_to(g / g.dtype.type(area), shape).copy(),))

    def batch_norm(self, x: Var, gamma: Var, beta: Var, mean: Var, var: Var, eps: float) -> Var:
        """Normalize with the given statistics (constants: they get no gradient)."""
        t = x.data.dtype.type
        inv = t(1) / np.sqrt(var.data + t(eps))
        xhat = (x.data - _per_channel(mean.data)) * _per_channel(inv)
        out = xhat * _per_channel(gamma.data) + _per_channel(beta.data)

        def backward(g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, None, None]:
            return (
                g * _per_channel(gamma.data * inv),
                (g * xhat).sum(axis=(0, 2, 3)),
                g.sum(axis=(0, 2, 3)),
                None,
                None,
            )

        return self._node(out, (x, gamma, beta, mean, var), backward)

    def batch_norm_train(
        self, x: Var, gamma: Var, beta: Var, eps: float, stats: Var | None = None, count: int | None = None
    ) -> tuple[Var, Var, Var]:
        """Batch statistics of x (two-pass), or the table's parts combined by the parallel formula; backward by hand."""
        xd = x.data
        t = xd.dtype.type
        own = stats is None or count is None  # the contract passes both or neither
        if stats is None or count is None:
            n = xd.shape[0] * xd.shape[2] * xd.shape[3]
            mean = _channel_mean(xd)
            var = ((xd - _per_channel(mean)) ** 2).mean(axis=(0, 2, 3), dtype=xd.dtype)
        else:
            n = count
            ns, means, m2s = stats.data[:, 0], stats.data[:, 1], stats.data[:, 2]  # (K, C) each
            mean = means[0] + (ns * (means - means[0])).sum(axis=0) / t(n)  # small offsets, not large means
            spread = means - mean  # each part's mean about the whole's: small, so no cancellation
            var = (m2s.sum(axis=0) + (ns * spread * spread).sum(axis=0)) / t(n)
        inv = t(1) / np.sqrt(var + t(eps))
        centered = xd - _per_channel(mean)
        xhat = centered * _per_channel(inv)
        out = xhat * _per_channel(gamma.data) + _per_channel(beta.data)

        def backward(g: np.ndarray) -> tuple[np.ndarray | None, ...]:
            dgamma, dbeta = (g * xhat).sum(axis=(0, 2, 3)), g.sum(axis=(0, 2, 3))
            dxhat = g * _per_channel(gamma.data)
            if own:  # mean and variance are x's own: the classic closed form
                dx = _per_channel(inv / t(n)) * (
                    t(n) * dxhat
                    - _per_channel(dxhat.sum(axis=(0, 2, 3)))
                    - xhat * _per_channel((dxhat * xhat).sum(axis=(0, 2, 3)))
                )
                return dx, dgamma, dbeta
            # x enters directly; mean and M2 come from the table (whose op passes the rest to x).
            # M2 depends on the mean through sum(n_k * (mean_k - mean)**2), whose derivative
            # -2 * sum(n_k * (mean_k - mean)) is 0: the mean's gradient is y's alone.
            dm2 = (dxhat * centered).sum(axis=(0, 2, 3)) * t(-0.5) * inv**3 / t(n)
            dmean = -(dxhat * _per_channel(inv)).sum(axis=(0, 2, 3))
            dmeans = ns * (dmean / t(n)) + t(2) * ns * spread * dm2
            dtable = np.stack([np.zeros_like(dmeans), dmeans, np.broadcast_to(dm2, dmeans.shape)], axis=1)
            return dxhat * _per_channel(inv), dgamma, dbeta, dtable  # the counts are constants

        parents = (x, gamma, beta) if stats is None or count is None else (x, gamma, beta, stats)
        unbiased = var * t(n / (n - 1))
        return self._node(out, parents, backward), Var(mean, x.device), Var(unbiased.astype(xd.dtype), x.device)

    def batch_norm_stats(self, x: Var, part: int = 0, parts: int = 1) -> Var:
        """Per-channel count, mean and centred sum of squares (two-pass) in row ``part`` of a (parts, 3, C) table."""
        xd = x.data
        t = xd.dtype.type
        n = xd.shape[0] * xd.shape[2] * xd.shape[3]
        mean = _channel_mean(xd)
        centered = xd - _per_channel(mean)
        out = np.zeros((parts, 3, xd.shape[1]), xd.dtype)
        out[part, 0], out[part, 1], out[part, 2] = t(n), mean, (centered * centered).sum(axis=(0, 2, 3))

        def backward(g: np.ndarray) -> tuple[np.ndarray]:
            # The count is a constant; d M2 / d mean = -2 * sum(x - mean) = 0, so M2's gradient
            # reaches x through x - mean alone and the mean's is spread evenly.
            return (_per_channel(g[part, 1] / t(n)) + t(2) * centered * _per_channel(g[part, 2]),)

        return self._node(out, (x,), backward)

    def concat_channels(self, xs: Sequence[Var]) -> Var:
        """Join along axis 1; the gradient is split back."""
        bounds = np.cumsum([0, *(v.data.shape[1] for v in xs)])
        return self._node(
            np.concatenate([v.data for v in xs], axis=1),
            tuple(xs),
            lambda g: tuple(g[:, a:b] for a, b in zip(bounds[:-1], bounds[1:])),
        )

    def group_sum(self, x: Var, group: Any) -> Var:
        """Sum over the group's ranks; backward sums the gradient the same way."""

        def summed(data: np.ndarray) -> np.ndarray:
            out = Var(data.copy(), x.device)
            group.allreduce_(out)
            return out.data

        return self._node(summed(x.data), (x,), lambda g: (summed(g),))

    def relu(self, x: Var) -> Var:
        """max(x, 0), NaN staying NaN; the gradient at 0 is 0, as in every framework."""
        mask = x.data > 0
        return self._node(np.maximum(x.data, x.data.dtype.type(0)), (x,), lambda g: (g * mask,))

    def dense(self, x: Var, w: Var, b: Var) -> Var:
        """x @ w + b over the last axis of x (..., I)."""
        xd, wd = x.data, w.data
        out = xd @ wd + b.data

        def backward(g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            rows, grows = xd.reshape(-1, wd.shape[0]), g.reshape(-1, wd.shape[1])
            return g @ wd.T, rows.T @ grows, grows.sum(axis=0)

        return self._node(out, (x, w, b), backward)

    def reshape(self, x: Var, shape: Sequence[int]) -> Var:
        """Reshape; the gradient is reshaped back."""
        old = x.data.shape
        return self._node(x.data.reshape(tuple(shape)), (x,), lambda g: (g.reshape(old),))

    def softmax_cross_entropy(self, logits: Var, labels: Var) -> Var:
        """Per-example -log softmax(logits)[label], computed with a stable log-sum-exp."""
        z = logits.data - logits.data.max(axis=1, keepdims=True)
        lse = np.log(np.exp(z).sum(axis=1, keepdims=True))
        logp = z - lse
        idx = labels.data
        check_label_range(int(idx.min(initial=0)), int(idx.max(initial=0)), z.shape[1])
        rows = np.arange(z.shape[0])
        out = -logp[rows, idx]

        def backward(g: np.ndarray) -> tuple[np.ndarray, None]:
            d = np.exp(logp)
            d[rows, idx] -= 1
            return d * g[:, None], None

        return self._node(out.astype(logits.data.dtype), (logits, labels), backward)

    def sum(self, x: Var) -> Var:
        """Sum of all elements (0-d)."""
        shape = x.data.shape
        return self._node(
            np.asarray(x.data.sum(dtype=x.data.dtype)),
            (x,),
            lambda g: (np.broadcast_to(g, shape).astype(x.data.dtype),),
        )

    def argmax(self, x: Var, axis: int) -> Var:
        """Index of the maximum along ``axis`` (not differentiable)."""
        return Var(x.data.argmax(axis=axis), x.device)

    # -- math for the algorithms ----------------------------------------
    def add_(self, dst: Var, src: Var) -> None:
        """dst += src in place."""
        dst.data += src.data

    def assign_(self, dst: Var, src: Var) -> None:
        """dst[...] = src in place."""
        dst.data[...] = src.data

    def split(self, x: Var, sizes: Sequence[int]) -> list[Var]:
        """Copies of consecutive row blocks."""
        bounds = np.cumsum([0, *sizes])
        return [Var(x.data[a:b].copy(), x.device) for a, b in zip(bounds[:-1], bounds[1:])]

    def concat(self, xs: Sequence[Var]) -> Var:
        """A new array joining ``xs`` along axis 0."""
        return Var(np.concatenate([v.data for v in xs], axis=0), xs[0].device)

    def flatten(self, xs: Sequence[Var]) -> Var:
        """A new 1-D array of every Var raveled, in order."""
        return Var(np.concatenate([v.data.reshape(-1) for v in xs]), xs[0].device)

    def unflatten(self, flat: Var, shapes: Sequence[Sequence[int]]) -> list[Var]:
        """Views of consecutive slices of ``flat`` (they share its memory)."""
        out, start = [], 0
        for shape in shapes:
            size = int(np.prod(shape, dtype=np.int64))
            out.append(Var(flat.data[start : start + size].reshape(tuple(shape)), flat.device))
            start += size
        return out

    # -- gradients and update -------------------------------------------
    def value_and_grad(
        self,
        fn: Callable[..., Any],
        params: Sequence[Var],
        *inputs: Any,
        aux: bool = False,
        out: Var | None = None,
        buckets: Sequence[tuple[int, int]] | None = None,
        on_bucket: Callable[[int], None] | None = None,
    ) -> Any:
        """Evaluate ``fn`` and backpropagate through the recorded closures (signalling each bucket
        once its last gradient is final)."""
        leaves = [Var(p.data, p.device) for p in params]
        value = fn(leaves, *inputs)
        outputs: list[Var] = []
        if aux:
            value, outputs = value
        order: list[Var] = []
        seen: set[int] = set()
        stack: list[tuple[Var, bool]] = [(value, False)]
        while stack:  # iterative post-order DFS: deep graphs must not hit the recursion limit
            node, done = stack.pop()
            if done:
                order.append(node)
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.append((node, True))
            stack.extend((p, False) for p in node.parents if id(p) not in seen)
        grads: dict[int, np.ndarray] = {id(value): np.ones_like(value.data)}
        first = leaves[0]  # the contract guarantees at least one parameter
        ready = (
            None
            if buckets is None or out is None or on_bucket is None  # the contract passes all three or none
            else _Buckets(self, leaves, order, out, buckets, on_bucket)
        )
        if ready is not None:
            ready.value(value)
        for step, node in enumerate(reversed(order)):
            g = grads.pop(id(node), None)
            if g is None or node.backward is None:
                if g is not None:
                    grads[id(node)] = g  # a leaf keeps its gradient
            else:
                for parent, pg in zip(node.parents, node.backward(g)):
                    if pg is None:
                        continue
                    key = id(parent)
                    grads[key] = grads[key] + pg if key in grads else pg
            if ready is not None:
                ready.after(step, grads)
        if ready is not None:
            ready.rest(grads)
            flat = out
        else:
            parts = [
                np.asarray(grads.get(id(leaf), np.zeros_like(leaf.data)), leaf.data.dtype).reshape(-1)
                for leaf in leaves
            ]
            pieces = [*parts, np.asarray(value.data, first.data.dtype).reshape(1)]
            flat = Var(np.concatenate(pieces), first.device) if out is None else out
            if out is not None:
                np.concatenate(pieces, out=out.data)
        if not aux:
            return flat
        return flat, Var(np.concatenate([o.data.reshape(-1) for o in outputs]).astype(first.data.dtype), first.device)

    def sgd_(self, params: Sequence[Var], grads: Sequence[Var], lr: float) -> None:
        """p -= lr * g in place."""
        for p, g in zip(params, grads):
            p.data -= p.data.dtype.type(lr) * g.data

    # -- whole-buffer math ----------------------------------------------
    def scale_(self, y: Var, a: float) -> None:
        """y *= a in place."""
        y.data *= y.data.dtype.type(a)

    def axpby_(self, y: Var, a: float, x: Var, b: float) -> None:
        """y = a * y + b * x in place."""
        t = y.data.dtype.type
        y.data[...] = t(a) * y.data + t(b) * x.data

    def addcmul_(self, y: Var, a: float, x1: Var, x2: Var, b: float) -> None:
        """y = a * y + b * x1 * x2 in place."""
        t = y.data.dtype.type
        y.data[...] = t(a) * y.data + t(b) * x1.data * x2.data

    def addcdiv_sqrt_(self, y: Var, x1: Var, x2: Var, value: float, divisor: float, eps: float) -> None:
        """y += value * x1 / (sqrt(x2) / divisor + eps) in place."""
        t = y.data.dtype.type
        y.data += t(value) * x1.data / (np.sqrt(x2.data) / t(divisor) + t(eps))


class _Buckets:
    """Writes each leaf's gradient into its view of ``out`` once final, and signals full buckets.

    A leaf's gradient is final after the last node that consumes it has run backward
    (the walk is in reverse topological order), so a bucket is signalled as soon as
    that holds for all of its parameters: the reference signals as early as it can.
    """

    def __init__(
        self,
        adapter: NumpyBackend,
        leaves: Sequence[Var],
        order: Sequence[Var],
        out: Var | Sequence[Var],
        buckets: Sequence[tuple[int, int]],
        on_bucket: Callable[[int], None],
    ):
        self.leaves = leaves
        self.views = [
            v.data.reshape(-1) for v in gradient_views(adapter, out, [lf.data.shape for lf in leaves], buckets)
        ]
        self.signals = BucketSignals(buckets, on_bucket)
        where = {id(lf): i for i, lf in enumerate(leaves)}
        last_use = [len(order) - 1] * len(leaves)  # unused leaves: at the end
        used = [False] * len(leaves)
        for step, node in enumerate(reversed(order)):
            for p in node.parents:
                i = where.get(id(p))
                if i is not None:
                    last_use[i] = step if not used[i] else max(last_use[i], step)
                    used[i] = True
        self.final_at: dict[int, list[int]] = {}
        for i, step in enumerate(last_use):
            self.final_at.setdefault(step, []).append(i)

    def value(self, value: Var) -> None:
        """The value is known before backward (bucket 0 waits for its parameters only)."""
        self.views[-1][...] = value.data.reshape(1)

    def after(self, step: int, grads: dict[int, np.ndarray]) -> None:
        """Backward step ``step`` has run: write the gradients it made final."""
        for i in self.final_at.get(step, []):
            self._write(i, grads)

    def _write(self, i: int, grads: dict[int, np.ndarray]) -> None:
        g = grads.get(id(self.leaves[i]))
        self.views[i][...] = 0.0 if g is None else g.reshape(-1)
        self.signals.done(i)

    def rest(self, grads: dict[int, np.ndarray]) -> None:
        """Parameters fn does not use: gradient zero."""
        for i in self.signals.pending():
            self._write(i, grads)
