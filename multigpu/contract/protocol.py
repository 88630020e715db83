"""The backend protocol: everything the core needs from a framework, and the contract.

An adapter implements these methods for one framework. ``T`` is the adapter's
tensor type and is opaque to the core: the core only passes tensors back to the
adapter that made them. Conventions fixed by the core, not by any framework:

* every op receives every argument explicitly (no framework default is relied on);
* ``avg_pool2d`` counts padded zeros in the divisor (``count_include_pad=True``)
  and every pooling takes ``ceil_mode`` explicitly: floor rounding of the output size,
  or torch's ceil rounding (``pool_output_size``);
* ``softmax_cross_entropy`` returns the per-example loss, never a mean;
* ``copy_to`` and ``from_numpy`` always return a new buffer, even when the tensor is
  already on that device (CPU replicas must never alias each other); inside
  ``value_and_grad`` ``copy_to`` is differentiable (its gradient is copied back);
* ``value_and_grad`` returns the gradients and the value together in one fresh flat
  buffer (or in the caller's ``out``); nothing accumulates between calls, and nothing is read back to the host,
  so queuing work on one device never waits for another (the core reads the loss
  once per step, after the update, and sums gradients as one buffer);
* ``unflatten`` returns views: they share the flat buffer's storage;
* **BatchNorm follows torch.** ``batch_norm_train`` normalizes with the batch mean and
  the *biased* batch variance and returns, beside the output, the batch mean and the
  *unbiased* variance (what torch's ``running_var`` follows). The adapters never keep
  or update running statistics: the core does, ``r <- (1 - m) r + m * batch`` with
  ``m = 0.1`` weighing the new batch (torch's ``momentum``; Paddle's and MXNet's 0.9 is
  the weight of the old value, and MXNet updates its own in backward);
* the in-place math (``scale_``, ``axpby_``, ``addcmul_``, ``addcdiv_sqrt_``, ``sgd_``)
  works on whole buffers, so an optimizer is a handful of calls per replica over
  flat parameter, gradient and state buffers, never one call per parameter.

The contract (what every backend does with bad input)
------------------------------------------------------
Every backend obtained from ``multigpu.backend(name)`` is wrapped by
``multigpu.contract.checked.CheckedBackend``, which checks each call below *before* the
adapter runs, so the same bad call raises the same exception on every backend
(the conformance suite, ``tests/test_contract.py``, proves it for every installed
adapter and for a third-party one). The checks look at shapes, dtypes, sizes and
Python arguments only: no value is read back from a device and no per-element
pass runs on the step's fast path. The one exception is the range of labels and
ids, which ``from_numpy`` records on the host (see ``softmax_cross_entropy``).

* **Tensors.** Only two dtypes exist: float32 (``from_numpy`` of any floating
  array) and int64 (of any integer array). Boolean, complex, string or object
  arrays raise ``InputError``; so does any argument that is not a tensor of this
  backend (a numpy array passed where a tensor is expected, say).
* **Devices.** A device that is not a ``Device``, has an unknown kind, a negative
  index, or names a GPU the framework does not see raises ``DeviceError``.
* **Shapes.** Ops check ranks and the dimensions that must agree and raise
  ``InputError`` naming both shapes. Only the differentiable elementwise ops
  (``add``, ``subtract``, ``multiply``, ``divide``), ``matmul``'s leading axes and
  ``masked_fill``'s mask broadcast, by numpy's rule; the in-place math never does
  (``assign_`` of a (1,) source into a (3,) destination is an error, never a fill or
  a resize).
* **Axes** may be negative (numpy's rule) and must lie in ``-ndim..ndim-1``;
  ``reduce_sum``/``reduce_mean`` take each axis once; a ``transpose`` perm holds each
  axis once; ``take`` indices are ints in range.
* **Ids and labels.** Embedding ids must lie in ``0..V-1``; cross-entropy labels in
  ``0..C-1`` or equal ``cross_entropy``'s ``ignore_index``. ``from_numpy`` records the
  span of every integer array it makes (the least and greatest values and those next
  to them) on the host, and ``reshape``, ``copy_to``, ``split`` and ``concat`` pass it on,
  so the check reads no device; other integer tensors are read back once.
* **Empty tensors.** ``from_numpy``, ``to_numpy``, ``copy_to``, ``shape`` and
  ``unflatten`` accept tensors with zero elements; ``add_``, ``assign_``, ``sgd_``
  and the whole-buffer math (``scale_``, ``axpby_``, ...) do nothing to them; ``flatten``/``concat`` skip them and raise
  ``InputError`` when nothing is left; every differentiable op and ``split``
  raises ``InputError`` on them.
* **Integer arguments** (stride, padding, groups, kernel, axis, sizes) must be
  Python or numpy integers (not bool) in the documented range, else ``InputError``.
* **Grad mode.** ``value_and_grad`` returns real gradients whatever the caller's
  own grad mode is (inside ``torch.no_grad()``, ``paddle.no_grad()`` or
  ``mxnet.autograd.pause()``); the other methods never record a graph.
* **BatchNorm in training mode** needs at least two values per channel (``N*H*W >= 2``,
  or ``count >= 2`` with given stats): with one the batch variance is undefined (torch
  raises "Expected more than 1 value per channel"); the contract raises InputError.
* **Adapters may rely on the checks**: they only ever receive float32/int64
  C-contiguous arrays in ``from_numpy``, fully resolved positive shapes in
  ``reshape``, distinct ``dst``/``src`` in ``assign_``, and non-empty tensors where
  the list above says so. The transformer and ONNX ops receive normalized
  arguments: each axis a non-negative Python int (``reduce_*`` axes a sorted tuple),
  a perm and ``take``'s indices as tuples of non-negative ints, ``approximate`` a
  bool, ``ignore_index`` an int, and the scalars (``factor``, ``eps``, ``value``,
  ``rate``) Python floats; ids and labels are already known to be in range. An
  adapter result that breaks the contract (a ``value_and_grad`` buffer of the wrong
  length) raises ``AdapterError``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

T = TypeVar("T")


@dataclass(frozen=True)
class Device:
    """A logical device: ``kind`` is ``"cpu"`` or ``"gpu"``; ``index`` numbers it.

    Several ``cpu`` devices are CPU replicas: distinct parameter copies that share
    the host processor.
    """

    kind: str
    index: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.index}"


def pool_output_size(size: int, kernel: int, stride: int, padding: int, ceil_mode: bool) -> int:
    """The number of pooling windows along an axis of ``size``, as torch counts them.

    Floor mode counts the windows that fit in the padded axis. Ceil mode adds a last
    partial window when the stride leaves a remainder, but only if it starts inside the
    input or the left padding (torch's rule); Paddle's ``ceil_mode`` and MXNet's
    ``'full'`` convention lack that condition, so their adapters drop the extra window.
    """
    span = size + 2 * padding - kernel
    if not ceil_mode:
        return span // stride + 1
    out = -(-span // stride) + 1
    return out - 1 if (out - 1) * stride >= size + padding else out


@runtime_checkable
class Backend(Protocol[T]):
    """The tensor/device protocol that every framework adapter implements.

    Each method's docstring states its contract: what it returns, and which
    exception a bad call raises (the same on every backend).
    """

    name: str
    #: The framework's tensor class; any other argument where a tensor is expected
    #: raises InputError.
    tensor_type: type

    # -- devices ---------------------------------------------------------
    def gpu_count(self) -> int:
        """Return how many GPUs this framework can use on this machine (0 without CUDA)."""

    def synchronize(self, device: Device) -> None:
        """Block until all queued work on ``device`` has finished.

        A bad device raises DeviceError.
        """

    # -- tensors ---------------------------------------------------------
    def from_numpy(self, array: np.ndarray, device: Device) -> T:
        """Return a new tensor on ``device`` holding a copy of ``array``.

        Floating arrays become float32 and integer arrays int64 (values beyond
        float32's range become +-inf: this method does not scan values, the trainer's
        batch check does). Bool, complex, string and object arrays raise InputError;
        a bad device raises DeviceError. The array may be empty.
        """

    def to_numpy(self, tensor: T) -> np.ndarray:
        """Return a numpy copy of ``tensor`` (a float32 or int64 array); waits for the device."""

    def copy_to(self, tensor: T, device: Device) -> T:
        """Return a new buffer on ``device`` with the values of ``tensor``.

        A bad device raises DeviceError. Inside ``value_and_grad`` the copy is
        differentiable (a partitioned forward may hop devices).
        """

    def shape(self, tensor: T) -> tuple[int, ...]:
        """Return the shape of ``tensor`` as a tuple of Python ints."""

    def dtype(self, tensor: T) -> np.dtype:
        """Return the numpy dtype matching ``tensor``'s dtype (float32 or int64)."""

    # -- ops (differentiable inside value_and_grad) ----------------------
    # Every op raises InputError for an empty input, a non-float32 input (argmax also
    # takes int64), or ranks and dimensions that do not agree, naming the shapes.
    def conv2d(self, x: T, w: T, b: T | None, stride: int, padding: int, groups: int) -> T:
        """NCHW cross-correlation with OIHW weights, bias, zero padding and groups.

        Needs x (B, C, H, W), w (O, C/groups, kH, kW), b (O,) or None (no bias), O
        divisible by groups, stride >= 1, padding >= 0, groups >= 1, and a kernel no
        larger than the padded input; otherwise InputError.
        """

    def avg_pool2d(self, x: T, kernel: int, stride: int, padding: int, ceil_mode: bool) -> T:
        """Average pooling; padded zeros count in the divisor; floor or ceil output size.

        ``ceil_mode`` rounds the output size up as torch does (``pool_output_size``): a
        last window may hang over the right padding. Its divisor is torch's: the padded
        zeros it covers count, the overhang beyond the padding does not (a 3x3 window
        with one row past the padding divides by 6).

        Needs x (B, C, H, W), kernel >= 1, stride >= 1, 0 <= padding <= kernel // 2,
        a kernel no larger than the padded input and ``ceil_mode`` a bool; otherwise
        InputError. (torch takes a ceil-mode kernel larger than the padded input, MXNet
        does not: the contract refuses it in both modes.)
        """

    def max_pool2d(self, x: T, kernel: int, stride: int, padding: int, ceil_mode: bool) -> T:
        """Max pooling over windows; padding (and a ceil-mode overhang) never wins.

        Same argument rules and output size as ``avg_pool2d``.
        """

    def relu(self, x: T) -> T:
        """Return max(x, 0) (the gradient at 0 is 0).

        NaN stays NaN on the NumPy reference and torch; the fast kernels of Paddle
        and MXNet (``Activation``, which MKL-DNN runs) return 0. The contract does
        not force it: a NaN guard costs a pass over every activation (about 4% of a
        Paddle LeNet step), and MXNet's NaN-keeping ``relu`` kernel made its step
        12-22% slower than Gluon's. Training instead checks
        the loss at every step and the parameters at every epoch's end.
        """

    def global_avg_pool2d(self, x: T) -> T:
        """Return the mean over each (H, W) plane: (B, C, H, W) -> (B, C, 1, 1)."""

    def batch_norm(self, x: T, gamma: T, beta: T, mean: T, var: T, eps: float) -> T:
        """Inference-mode BatchNorm: ``(x - mean) / sqrt(var + eps) * gamma + beta`` per channel.

        Needs x (B, C, H, W) and gamma, beta, mean, var of shape (C,), and a finite
        ``eps > 0``; else InputError. ``mean`` and ``var`` (the running statistics) are
        constants here: no gradient flows into them.
        """

    def batch_norm_train(
        self, x: T, gamma: T, beta: T, eps: float, stats: T | None = None, count: int | None = None
    ) -> tuple[T, T, T]:
        """Training-mode BatchNorm with batch statistics; return ``(y, mean, var)``.

        Without ``stats`` the statistics are x's own, over (N, H, W). With ``stats``, the
        (K, 3, C) table of the K parts of a larger batch that x is part of (row k: part
        k's per-channel count, mean and centred sum of squares ``M2``, see
        ``batch_norm_stats``), and ``count`` (that batch's N*H*W, the sum of the table's
        counts), they are the larger batch's: synchronized BatchNorm. The parts are
        combined with the parallel formula (Chan et al., as torch's SyncBatchNorm does):
        ``mean = sum(n_k * mean_k) / count`` and ``M2 = sum(M2_k) + sum(n_k * (mean_k -
        mean)**2)``. No difference of large sums is taken, so a channel whose mean is far
        above its spread (mean/std 1000 in float32) keeps its variance. ``y`` normalizes
        with the biased variance ``M2 / count`` and is differentiable in x, gamma, beta and
        the table's means and M2s (its counts are constants); ``mean`` and ``var`` (the
        *unbiased* variance, as torch's running_var takes it) are detached results for the
        core to update running statistics with. Needs at least two values per channel,
        the shapes of ``batch_norm``, stats of shape (K, 3, C) and ``count >= 2`` exactly
        when stats are given; else InputError.
        """

    def batch_norm_stats(self, x: T, part: int = 0, parts: int = 1) -> T:
        """Return the (parts, 3, C) table holding x's statistics in row ``part`` and zeros elsewhere.

        Row ``part`` holds, per channel of x (B, C, H, W), the count of values ``B*H*W``,
        their mean and their centred sum of squares ``M2 = sum((x - mean)**2)`` over
        (N, H, W), computed stably from x alone (two passes, or sums about one of each
        channel's own values; never the sum of squares minus the squared sum). The zero rows make
        the exchange a sum: adding the tables of every part (``add`` on one device,
        ``group_sum`` across processes) gathers every part's row into the table that
        ``batch_norm_train`` takes; a row left zero counts for nothing. Differentiable in
        x through the means and M2s. Needs ``0 <= part < parts``, else InputError.
        """

    def add(self, x: T, y: T) -> T:
        """Return ``x + y`` elementwise with numpy's broadcasting (a residual join, a bias).

        Shapes that do not broadcast raise InputError naming both. The gradient of an
        operand that was broadcast is summed back to its own shape.
        """

    def concat_channels(self, xs: Sequence[T]) -> T:
        """Concatenate (B, C_i, H, W) tensors along the channel axis (a branch join).

        Needs at least one tensor, all 4-D with equal B, H and W, else InputError.
        """

    def group_sum(self, x: T, group: Any) -> T:
        """Return a new tensor holding the sum of ``x`` over every rank of ``group``.

        ``group`` is a process group (``multigpu.parallel.process_group``) of this
        backend and ``x`` a non-empty 1-D float tensor on its device; else InputError.
        Differentiable: the gradient of every rank's ``x`` is the group sum of the
        output's gradient (a custom autograd function in each framework). Every rank
        must call it at the same point, as any collective.
        """

    def dense(self, x: T, w: T, b: T) -> T:
        """Return ``x @ w + b`` over the last axis: x (..., I), w (I, O), b (O,) -> (..., O).

        x has rank 2 or more (a batch of vectors, or of sequences of them); anything
        else raises InputError.
        """

    def reshape(self, x: T, shape: Sequence[int]) -> T:
        """Return ``x`` reshaped; ``-1`` is allowed once and every other dim is >= 1.

        A target whose size differs from x's raises InputError; 0 never means "copy
        this dimension" (MXNet's convention) and is refused.
        """

    def softmax_cross_entropy(self, logits: T, labels: T) -> T:
        """Return the per-example loss -log softmax(logits)[label], shape (B,).

        Needs float logits (B, C) and int64 labels (B,) with every label in
        0..C-1; anything else raises InputError: no label is wrapped (numpy's -1),
        clipped (MXNet's pick) or ignored (the -100 of torch's and Paddle's
        ``ignore_index``). The range of labels made by ``from_numpy`` (or copied or
        split from such) is recorded on the host, so the check needs no device read;
        for other labels (an argmax, say) it reads them back once.
        """

    def sum(self, x: T) -> T:
        """Return the sum of all elements as a 0-d or 1-element tensor."""

    def argmax(self, x: T, axis: int) -> T:
        """Return the int64 index of the maximum along ``axis`` (-ndim <= axis < ndim)."""

    # -- transformer and ONNX ops (differentiable inside value_and_grad) --
    # One op set serves the transformer layers and the ONNX importer. Axes may be
    # negative (numpy's rule); shapes broadcast as numpy's do wherever a docstring says
    # "broadcasting". Every op refuses empty and non-float32 inputs (``embedding``'s and
    # ``cross_entropy``'s integer arguments aside) with InputError, as the ops above.
    def matmul(self, x: T, y: T) -> T:
        """Return the matrix product ``x @ y`` over the last two axes, broadcasting the leading ones.

        Both have rank 2 or more and ``x.shape[-1] == y.shape[-2]`` (numpy's matmul
        without its 1-D special cases); else InputError.
        """

    def transpose(self, x: T, perm: Sequence[int]) -> T:
        """Return ``x`` with its axes permuted: output axis i is input axis ``perm[i]``.

        ``perm`` is a permutation of ``range(x.ndim)``; else InputError.
        """

    def subtract(self, x: T, y: T) -> T:
        """Return ``x - y`` elementwise with broadcasting (see ``add``)."""

    def multiply(self, x: T, y: T) -> T:
        """Return ``x * y`` elementwise with broadcasting (see ``add``)."""

    def divide(self, x: T, y: T) -> T:
        """Return ``x / y`` elementwise with broadcasting (see ``add``); a zero divisor gives inf or NaN."""

    def scale(self, x: T, factor: float) -> T:
        """Return ``x * factor`` for a finite Python float (differentiable; ``scale_`` is the in-place one)."""

    def tanh(self, x: T) -> T:
        """Return the hyperbolic tangent of x elementwise."""

    def sigmoid(self, x: T) -> T:
        """Return ``1 / (1 + exp(-x))`` elementwise."""

    def gelu(self, x: T, approximate: bool) -> T:
        """Return GELU of x: exact ``x * Phi(x)`` (erf), or the tanh form when ``approximate``.

        ``approximate`` is a bool (torch's ``approximate="tanh"``, Paddle's
        ``approximate=True``, MXNet's ``gelu_tanh``/``gelu_erf``); nothing else is taken.
        """

    def erf(self, x: T) -> T:
        """Return the error function of x elementwise (ONNX's Erf; GELU's exact form)."""

    def sqrt(self, x: T) -> T:
        """Return the square root of x elementwise (NaN below zero, as numpy)."""

    def softmax(self, x: T, axis: int) -> T:
        """Return the softmax of x along ``axis``, computed stably (the maximum subtracted first)."""

    def layer_norm(self, x: T, gamma: T, beta: T, eps: float) -> T:
        """Normalize over x's trailing axes, the shape of ``gamma``: ``(x - mean) / sqrt(var + eps) * gamma + beta``.

        The variance is the biased one (as torch, Paddle, MXNet and ONNX take it).
        ``gamma`` and ``beta`` have equal shapes matching x's last axes, and ``eps`` is a
        finite float > 0; else InputError.
        """

    def embedding(self, ids: T, table: T) -> T:
        """Return ``table[ids]``: int64 ids of any shape and a (V, D) table give ``ids.shape + (D,)``.

        The gradient into ``table`` adds the rows of repeated ids. Float ids, or an id
        outside 0..V-1, raise InputError (the range of ids made by ``from_numpy`` is
        recorded on the host, as labels are).
        """

    def reduce_sum(self, x: T, axes: Sequence[int], keepdims: bool) -> T:
        """Return the sum of x over ``axes`` (distinct, in range, at least one); kept as 1s when ``keepdims``.

        ``keepdims`` is a bool; anything else raises InputError.
        """

    def reduce_mean(self, x: T, axes: Sequence[int], keepdims: bool) -> T:
        """Return the mean of x over ``axes``; the same rules as ``reduce_sum``."""

    def masked_fill(self, x: T, mask: T, value: float) -> T:
        """Return x with ``value`` wherever ``mask`` is nonzero (attention masks, causal and padding).

        ``mask`` is a float32 or int64 tensor of 0s and 1s that broadcasts to x's shape
        and is a constant (no gradient flows into it); the gradient of x is zero where
        the mask is set. ``value`` is a Python float and may be ``-inf`` (NaN is refused).
        A mask that does not broadcast to x's shape (or would grow it) raises InputError.
        """

    def dropout(self, x: T, keep: T, rate: float) -> T:
        """Return ``x * keep / (1 - rate)``: inverted dropout with a mask the core drew.

        ``keep`` is a float32 tensor of 0s and 1s of x's shape, drawn by
        ``multigpu.models.dropout_mask`` from a counter-based seed, so every backend
        drops the same units; no framework RNG is used. ``0 <= rate < 1``; else InputError.
        """

    def cross_entropy(self, logits: T, labels: T, ignore_index: int) -> T:
        """Return the per-position loss ``-log softmax(logits)[..., label]`` over the last axis.

        logits (..., C) of rank 2 or more and int64 labels of shape logits.shape[:-1] give a loss of the
        labels' shape; where a label equals ``ignore_index`` (padding) the loss is 0 and
        no gradient flows. Every other label must be in 0..C-1; else InputError, as
        ``softmax_cross_entropy``. The core sums the losses and divides by the number of
        counted positions.
        """

    def take(self, x: T, indices: Sequence[int], axis: int) -> T:
        """Return the slices of x at the given constant ``indices`` along ``axis`` (ONNX's Gather, Slice, Split).

        ``indices`` is a non-empty sequence of Python ints, each in ``-n..n-1`` for the
        axis' length n; the result keeps the axis with ``len(indices)`` entries. The
        gradient adds back into the taken positions (repeats add).
        """

    def concatenate(self, xs: Sequence[T], axis: int) -> T:
        """Concatenate tensors along ``axis`` (differentiable; ``concat`` is the algorithms' axis-0 one).

        Needs at least one tensor, equal ranks, and equal sizes on every other axis;
        else InputError.
        """

    # -- math for the algorithms (outside autograd) ----------------------
    def add_(self, dst: T, src: T) -> None:
        """In place ``dst += src``; ``src`` may live on another device.

        Shapes and dtypes must be equal (no broadcasting), else InputError.
        """

    def assign_(self, dst: T, src: T) -> None:
        """In place ``dst[...] = src``; ``src`` may live on another device.

        Shapes and dtypes must be equal, else InputError; ``dst`` keeps its buffer
        and shape (it is never resized). ``assign_(t, t)`` does nothing.
        """

    def split(self, x: T, sizes: Sequence[int]) -> list[T]:
        """Split along axis 0 into new tensors of the given lengths.

        Every size must be an integer >= 1 and the sizes must add up to x's first
        dimension, else InputError.
        """

    def concat(self, xs: Sequence[T]) -> T:
        """Concatenate along axis 0 into a new tensor on the device of ``xs[0]``.

        Needs at least one non-empty tensor, equal trailing shapes and equal dtypes,
        else InputError.
        """

    def flatten(self, xs: Sequence[T]) -> T:
        """Return a new 1-D buffer on the device of ``xs[0]``: every tensor raveled, in order.

        Needs at least one non-empty tensor and equal dtypes, else InputError.
        """

    def unflatten(self, flat: T, shapes: Sequence[Sequence[int]]) -> list[T]:
        """Return views of consecutive slices of the 1-D ``flat``, reshaped to ``shapes``.

        The sizes of ``shapes`` must add up to the length of ``flat`` (else
        InputError). The views share ``flat``'s storage: an in-place write to
        ``flat`` shows through.
        """

    # -- gradients and update -------------------------------------------
    def value_and_grad(
        self,
        fn: Callable[..., T],
        params: Sequence[T],
        *inputs: Any,
        aux: bool = False,
        out: T | None = None,
        buckets: Sequence[tuple[int, int]] | None = None,
        on_bucket: Callable[[int], None] | None = None,
    ) -> Any:
        """Evaluate ``fn(params, *inputs)`` (a scalar) and its gradients w.r.t. ``params``.

        With ``out`` (a 1-D float32 buffer of the result's length on the device of
        ``params[0]``) the result is written into it and ``out`` itself is returned: a
        caller that keeps one gradient buffer per device saves allocating (and the
        operating system mapping) a new one each step. Without it the buffer is new.

        With ``aux=True`` ``fn`` returns ``(value, outputs)``, ``outputs`` a list of float
        tensors computed along the way (BatchNorm's batch statistics) that are not
        differentiated; the call then returns ``(flat, aux_flat)``, ``aux_flat`` a new 1-D
        buffer on the device of ``params[0]`` holding every output raveled, in order.

        Returns one new 1-D buffer on the device of ``params[0]``: every gradient
        raveled, in ``params`` order, then the value (one element). A parameter that
        ``fn`` does not use has gradient zero. ``unflatten(result, [*shapes, (1,)])``
        gives per-parameter views. Nothing is read back to the host, so no device is
        waited for while the others are still being queued. Gradients never
        accumulate between calls and the caller's ``params`` gain no gradient state.

        With ``buckets`` (and ``out``, and ``on_bucket``) the gradients are signalled while
        backward runs: ``buckets[k] = (first, stop)`` covers parameters ``first .. stop - 1``,
        bucket 0 the last ones (``buckets[0][1] == len(params)``, ``buckets[-1][0] == 0``),
        so bucket k is one slice of ``out`` (bucket 0's includes the value). The adapter
        calls ``on_bucket(k)`` once per bucket, as soon as every gradient of bucket k (and
        for bucket 0 the value) is in ``out``, in whatever order its framework finishes
        them, and all of them before it returns; the callback may start work that reads
        that slice (a collective) and must not touch the rest of ``out``. An adapter that
        cannot tell earlier signals them when backward is queued, in bucket order.
        With ``buckets``, ``out`` may also be a list of one 1-D float32 buffer per bucket:
        ``out[k]`` holds bucket k's gradients raveled in ``params`` order (``out[0]`` the
        value after them), each gradient a view of its bucket's buffer, and the call
        returns that list (with ``aux=True``, ``(out, aux_flat)``). Separate buffers let an
        engine that orders work by buffer (MXNet's: one variable per NDArray and all its
        slices) start a bucket's sum after that bucket's gradients, not after the whole
        backward. ``multigpu.contract.bucket_signals.gradient_views`` cuts either form of
        ``out`` into per-gradient views.

        The caller's grad mode does not matter: under ``torch.no_grad()``,
        ``paddle.no_grad()`` or ``mxnet.autograd.pause()`` the gradients are the
        same as outside. An empty ``params``, a parameter that is not float32, or an
        ``fn`` whose result is not a one-element float tensor raises InputError; an
        exception raised by ``fn`` itself passes through unchanged.
        """

    def sgd_(self, params: Sequence[T], grads: Sequence[T], lr: float) -> None:
        """In place ``p -= lr * g`` for every pair; grads may live on other devices.

        Needs as many grads as params, equal shapes pairwise, float32 tensors and a
        finite real ``lr``, else InputError.
        """

    # -- whole-buffer math for optimizers and running statistics ---------
    # Each works in place on ``y`` (float32, any shape); the other tensors have y's shape
    # and may live on other devices; the scalars are finite reals. Else InputError.
    def scale_(self, y: T, a: float) -> None:
        """In place ``y *= a``."""

    def axpby_(self, y: T, a: float, x: T, b: float) -> None:
        """In place ``y = a * y + b * x``."""

    def addcmul_(self, y: T, a: float, x1: T, x2: T, b: float) -> None:
        """In place ``y = a * y + b * x1 * x2``."""

    def addcdiv_sqrt_(self, y: T, x1: T, x2: T, value: float, divisor: float, eps: float) -> None:
        """In place ``y += value * x1 / (sqrt(x2) / divisor + eps)`` (Adam's step; ``x2 >= 0``)."""
