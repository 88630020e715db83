"""The backend protocol: everything the core needs from a framework, and the contract.

An adapter implements these methods for one framework. ``T`` is the adapter's
tensor type and is opaque to the core: the core only passes tensors back to the
adapter that made them. Conventions fixed by the core, not by any framework:

* every op receives every argument explicitly (no framework default is relied on);
* ``avg_pool2d`` counts padded zeros in the divisor (``count_include_pad=True``)
  and every pooling uses floor rounding of the output size;
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
pass runs on the step's fast path. The one exception is the label range, which
``from_numpy`` records on the host (see ``softmax_cross_entropy``).

* **Tensors.** Only two dtypes exist: float32 (``from_numpy`` of any floating
  array) and int64 (of any integer array). Boolean, complex, string or object
  arrays raise ``InputError``; so does any argument that is not a tensor of this
  backend (a numpy array passed where a tensor is expected, say).
* **Devices.** A device that is not a ``Device``, has an unknown kind, a negative
  index, or names a GPU the framework does not see raises ``DeviceError``.
* **Shapes.** Ops check ranks and the dimensions that must agree and raise
  ``InputError`` naming both shapes; nothing broadcasts (``assign_`` of a (1,)
  source into a (3,) destination is an error, never a fill or a resize).
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
  the list above says so. An adapter result that breaks the contract (a
  ``value_and_grad`` buffer of the wrong length) raises ``AdapterError``.
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

    def avg_pool2d(self, x: T, kernel: int, stride: int, padding: int) -> T:
        """Average pooling; padded zeros count in the divisor; floor output size.

        Needs x (B, C, H, W), kernel >= 1, stride >= 1, 0 <= padding <= kernel // 2
        and a kernel no larger than the padded input; otherwise InputError.
        """

    def max_pool2d(self, x: T, kernel: int, stride: int, padding: int) -> T:
        """Max pooling over windows; padding never wins; floor output size.

        Same argument rules as ``avg_pool2d``.
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
        """Return ``x + y`` elementwise (a residual join); equal shapes, else InputError."""

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
        """Return ``x @ w + b``; needs x (B, I), w (I, O), b (O,), else InputError."""

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
