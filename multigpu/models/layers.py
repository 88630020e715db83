"""Layer specs: a network is data. Each spec knows its shapes, cost and forward op.

Shapes are per example (C, H, W) or (F,); the batch axis is added by the caller.
FLOPs count a multiply-accumulate as two operations; ReLU one per output element;
pooling one per window element.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any, Optional, Sequence

from multigpu.errors import ModelError

Shape = tuple[int, ...]


def _pooled(size: int, kernel: int, stride: int, padding: int) -> int:
    # Floor rounding, as fixed by the protocol for every backend.
    return (size + 2 * padding - kernel) // stride + 1


def _need_chw(layer: "Layer", in_shape: Shape) -> tuple[int, int, int]:
    if len(in_shape) != 3:
        raise ModelError(
            f"{layer.kind} needs a (C, H, W) input but receives {in_shape}; "
            "put it before Flatten"
        )
    return in_shape  # type: ignore[return-value]


@dataclass(frozen=True)
class Layer:
    """Base class of layer specs."""

    name: Optional[str] = None

    kind = "layer"

    def param_shapes(self, in_shape: Shape) -> list[Shape]:
        """Return the shapes of this layer's parameters, in order."""
        return []

    def output_shape(self, in_shape: Shape) -> Shape:
        """Return the per-example output shape for a per-example input shape."""
        return in_shape

    def macs(self, in_shape: Shape) -> int:
        """Return multiply-accumulates per example."""
        return 0

    def flops(self, in_shape: Shape) -> int:
        """Return floating-point operations per example."""
        return 2 * self.macs(in_shape)

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        """Apply the layer with ``backend`` ops."""
        raise NotImplementedError


@dataclass(frozen=True)
class Conv2d(Layer):
    """2-D convolution (cross-correlation), OIHW weights, optional groups."""

    out_channels: int = 1
    kernel: int = 3
    stride: int = 1
    padding: int = 0
    groups: int = 1
    kind = "conv2d"

    def __post_init__(self) -> None:
        for field in ("out_channels", "kernel", "stride", "groups"):
            if getattr(self, field) < 1:
                raise ModelError(f"Conv2d {field}={getattr(self, field)} must be >= 1")
        if self.padding < 0:
            raise ModelError(f"Conv2d padding={self.padding} must be >= 0")
        if self.out_channels % self.groups:
            raise ModelError(
                f"Conv2d out_channels={self.out_channels} is not divisible by groups={self.groups}"
            )

    def param_shapes(self, in_shape: Shape) -> list[Shape]:
        c, _, _ = _need_chw(self, in_shape)
        if c % self.groups:
            raise ModelError(f"Conv2d input channels {c} are not divisible by groups={self.groups}")
        return [(self.out_channels, c // self.groups, self.kernel, self.kernel), (self.out_channels,)]

    def output_shape(self, in_shape: Shape) -> Shape:
        _, h, w = _need_chw(self, in_shape)
        oh = _pooled(h, self.kernel, self.stride, self.padding)
        ow = _pooled(w, self.kernel, self.stride, self.padding)
        if oh < 1 or ow < 1:
            raise ModelError(f"Conv2d kernel {self.kernel} does not fit input {in_shape}")
        return (self.out_channels, oh, ow)

    def macs(self, in_shape: Shape) -> int:
        c = in_shape[0]
        return prod(self.output_shape(in_shape)) * (c // self.groups) * self.kernel**2

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        return backend.conv2d(x, params[0], params[1], self.stride, self.padding, self.groups)


@dataclass(frozen=True)
class _Pool2d(Layer):
    kernel: int = 2
    stride: Optional[int] = None  # None: same as kernel
    padding: int = 0

    def __post_init__(self) -> None:
        if self.kernel < 1 or (self.stride is not None and self.stride < 1):
            raise ModelError(f"{self.kind} kernel and stride must be >= 1")
        if not 0 <= self.padding <= self.kernel // 2:
            raise ModelError(
                f"{self.kind} padding={self.padding} must be between 0 and kernel//2={self.kernel // 2}"
            )

    @property
    def step(self) -> int:
        return self.kernel if self.stride is None else self.stride

    def output_shape(self, in_shape: Shape) -> Shape:
        c, h, w = _need_chw(self, in_shape)
        oh = _pooled(h, self.kernel, self.step, self.padding)
        ow = _pooled(w, self.kernel, self.step, self.padding)
        if oh < 1 or ow < 1:
            raise ModelError(f"{self.kind} kernel {self.kernel} does not fit input {in_shape}")
        return (c, oh, ow)

    def flops(self, in_shape: Shape) -> int:
        return prod(self.output_shape(in_shape)) * self.kernel**2


@dataclass(frozen=True)
class AvgPool2d(_Pool2d):
    """Average pooling; padded zeros count in the divisor."""

    kind = "avg_pool2d"

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        return backend.avg_pool2d(x, self.kernel, self.step, self.padding)


@dataclass(frozen=True)
class MaxPool2d(_Pool2d):
    """Max pooling."""

    kind = "max_pool2d"

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        return backend.max_pool2d(x, self.kernel, self.step, self.padding)


@dataclass(frozen=True)
class ReLU(Layer):
    """Elementwise max(x, 0)."""

    kind = "relu"

    def flops(self, in_shape: Shape) -> int:
        return prod(in_shape)

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        return backend.relu(x)


@dataclass(frozen=True)
class Flatten(Layer):
    """Flatten every axis after the batch axis."""

    kind = "flatten"

    def output_shape(self, in_shape: Shape) -> Shape:
        return (prod(in_shape),)

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        return backend.reshape(x, (backend.shape(x)[0], -1))


@dataclass(frozen=True)
class Dense(Layer):
    """Fully connected: ``x @ W + b`` with W of shape (in, out), as in the textbook."""

    out_features: int = 1
    kind = "dense"

    def __post_init__(self) -> None:
        if self.out_features < 1:
            raise ModelError(f"Dense out_features={self.out_features} must be >= 1")

    def _in(self, in_shape: Shape) -> int:
        if len(in_shape) != 1:
            raise ModelError(f"Dense needs a flat (F,) input but receives {in_shape}; add Flatten first")
        return in_shape[0]

    def param_shapes(self, in_shape: Shape) -> list[Shape]:
        return [(self._in(in_shape), self.out_features), (self.out_features,)]

    def output_shape(self, in_shape: Shape) -> Shape:
        self._in(in_shape)
        return (self.out_features,)

    def macs(self, in_shape: Shape) -> int:
        return self._in(in_shape) * self.out_features

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        return backend.dense(x, params[0], params[1])
