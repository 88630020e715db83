"""The backend protocol: everything the core needs from a framework.

An adapter implements these methods for one framework. ``T`` is the adapter's
tensor type and is opaque to the core: the core only passes tensors back to the
adapter that made them. Conventions fixed by the core, not by any framework:

* every op receives every argument explicitly (no framework default is relied on);
* ``avg_pool2d`` counts padded zeros in the divisor (``count_include_pad=True``)
  and every pooling uses floor rounding of the output size;
* ``softmax_cross_entropy`` returns the per-example loss, never a mean;
* ``copy_to`` and ``from_numpy`` always return a new buffer, even when the tensor is
  already on that device (CPU replicas must never alias each other);
* ``value_and_grad`` returns the gradients and the value together in one fresh flat
  buffer; nothing accumulates between calls, and nothing is read back to the host,
  so queuing work on one device never waits for another (the core reads the loss
  once per step, after the update, and sums gradients as one buffer);
* ``unflatten`` returns views: they share the flat buffer's storage.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, TypeVar, runtime_checkable

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
    """The tensor/device protocol that every framework adapter implements."""

    name: str

    # -- devices ---------------------------------------------------------
    def gpu_count(self) -> int:
        """Return how many GPUs this framework can use on this machine."""

    def synchronize(self, device: Device) -> None:
        """Block until all queued work on ``device`` has finished."""

    # -- tensors ---------------------------------------------------------
    def from_numpy(self, array: np.ndarray, device: Device) -> T:
        """Return a new tensor on ``device`` holding a copy of ``array``."""

    def to_numpy(self, tensor: T) -> np.ndarray:
        """Return a numpy copy of ``tensor``."""

    def copy_to(self, tensor: T, device: Device) -> T:
        """Return a new buffer on ``device`` with the values of ``tensor``."""

    def shape(self, tensor: T) -> tuple[int, ...]:
        """Return the shape of ``tensor``."""

    # -- ops (differentiable inside value_and_grad) ----------------------
    def conv2d(self, x: T, w: T, b: T, stride: int, padding: int, groups: int) -> T:
        """NCHW cross-correlation with OIHW weights, bias, zero padding and groups."""

    def avg_pool2d(self, x: T, kernel: int, stride: int, padding: int) -> T:
        """Average pooling; padded zeros count in the divisor; floor output size."""

    def max_pool2d(self, x: T, kernel: int, stride: int, padding: int) -> T:
        """Max pooling over windows; padding never wins; floor output size."""

    def relu(self, x: T) -> T:
        """Return max(x, 0)."""

    def dense(self, x: T, w: T, b: T) -> T:
        """Return ``x @ w + b`` with ``w`` of shape (in, out)."""

    def reshape(self, x: T, shape: Sequence[int]) -> T:
        """Return ``x`` reshaped (``-1`` allowed once)."""

    def softmax_cross_entropy(self, logits: T, labels: T) -> T:
        """Return the per-example loss -log softmax(logits)[label], shape (B,)."""

    def sum(self, x: T) -> T:
        """Return the sum of all elements as a 0-d or 1-element tensor."""

    def argmax(self, x: T, axis: int) -> T:
        """Return the index of the maximum along ``axis``."""

    # -- math for the algorithms (outside autograd) ----------------------
    def add_(self, dst: T, src: T) -> None:
        """In place ``dst += src``; ``src`` may live on another device."""

    def assign_(self, dst: T, src: T) -> None:
        """In place ``dst[...] = src``; ``src`` may live on another device."""

    def split(self, x: T, sizes: Sequence[int]) -> list[T]:
        """Split along axis 0 into new tensors of the given lengths (each >= 1)."""

    def concat(self, xs: Sequence[T]) -> T:
        """Concatenate along axis 0 into a new tensor on the device of ``xs[0]``."""

    def flatten(self, xs: Sequence[T]) -> T:
        """Return a new 1-D buffer on the device of ``xs[0]``: every tensor raveled, in order."""

    def unflatten(self, flat: T, shapes: Sequence[Sequence[int]]) -> list[T]:
        """Return views of consecutive slices of the 1-D ``flat``, reshaped to ``shapes``.

        The sizes of ``shapes`` must add up to the length of ``flat``.
        The views share ``flat``'s storage: an in-place write to ``flat`` shows through.
        """

    # -- gradients and update -------------------------------------------
    def value_and_grad(
        self, fn: Callable[..., T], params: Sequence[T], *inputs: Any
    ) -> T:
        """Evaluate ``fn(params, *inputs)`` (a scalar) and its gradients w.r.t. ``params``.

        Returns one new 1-D buffer on the device of ``params[0]``: every gradient
        raveled, in ``params`` order, then the value (one element). A parameter that
        ``fn`` does not use has gradient zero. ``unflatten(result, [*shapes, (1,)])``
        gives per-parameter views. Nothing is read back to the host, so no device is
        waited for while the others are still being queued.
        """

    def sgd_(self, params: Sequence[T], grads: Sequence[T], lr: float) -> None:
        """In place ``p -= lr * g`` for every pair."""
