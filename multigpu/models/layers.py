"""Layer specs: a network is data. Each spec knows its shapes, cost, init and forward op.

Shapes are per example (C, H, W), (F,) or a sequence (S, F); the batch axis is added by the caller.
FLOPs count a multiply-accumulate as two operations; ReLU and an elementwise add one
per output element; pooling one per window element; BatchNorm two per element (a
scale and a shift, once its statistics are known).

Most layers take one input. ``Add`` and ``Concat`` are joins: they take two or more
(``JoinLayer``). ``BatchNorm2d`` has state besides its parameters (running mean and
variance); how it computes its statistics is up to the caller's BatchNorm mode
(``multigpu.models.batchnorm``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from math import prod
from typing import Any, ClassVar

import numpy as np

from multigpu.contract.protocol import pool_output_size
from multigpu.errors import ModelError

Shape = tuple[int, ...]

#: Init schemes: the textbook's N(0, scale^2) weights and zero biases, or He (Kaiming) init.
INIT_SCHEMES = ("textbook", "he")


def _need_chw(layer: Layer, in_shape: Shape) -> tuple[int, int, int]:
    if len(in_shape) != 3:
        raise ModelError(f"{layer.kind} needs a (C, H, W) input but receives {in_shape}; put it before Flatten")
    return in_shape


def _windowed(
    layer: Layer, in_shape: Shape, channels: int, kernel: int, stride: int, padding: int, ceil_mode: bool = False
) -> Shape:
    """The output shape of a kernel sliding over (C, H, W): floor rounding, or torch's ceil
    rounding for a ceil-mode pool (``multigpu.contract.protocol.pool_output_size``)."""
    _, h, w = _need_chw(layer, in_shape)
    # NOTE: torch takes a ceil-mode pool's kernel larger than the padded input (one window
    # hanging over); MXNet refuses it, and so does the contract, in every mode.
    if kernel > min(h, w) + 2 * padding:
        raise ModelError(
            f"{type(layer).__name__} kernel {kernel} does not fit input {in_shape} with padding {padding}; "
            "give the model a larger input"
        )
    oh, ow = (pool_output_size(size, kernel, stride, padding, ceil_mode) for size in (h, w))
    return (channels, oh, ow)


@dataclass(frozen=True)
class Layer:
    """Base class of layer specs (one input); ``name`` is keyword-only, so the other fields
    can be given by position (``Conv2d(64, 3, 1, 1)``)."""

    name: str | None = field(default=None, kw_only=True)

    kind = "layer"

    def param_shapes(self, in_shape: Shape) -> list[Shape]:
        """Return the shapes of this layer's parameters, in order."""
        return []

    def state_shapes(self, in_shape: Shape) -> list[Shape]:
        """Return the shapes of this layer's state (values that are not parameters), in order."""
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

    def init_params(self, rng: np.random.Generator, in_shape: Shape, scheme: str, scale: float) -> list[np.ndarray]:
        """Return float32 initial parameters (none by default)."""
        return []

    def init_state(self, in_shape: Shape) -> list[np.ndarray]:
        """Return the float32 initial state (none by default)."""
        return []

    def param_labels(self, in_shape: Shape) -> list[str]:
        """Return the name of each parameter within the node (``weight``, ``bias``), in order."""
        return [str(j) for j in range(len(self.param_shapes(in_shape)))]

    #: Labels of 2-D parameters that torch stores transposed ((out, in) against our (in, out)).
    torch_transposed: ClassVar[tuple[str, ...]] = ()

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        """Apply the layer with ``backend`` ops."""
        raise NotImplementedError


@dataclass(frozen=True)
class ContextLayer(Layer):
    """A layer that may take extra inputs after its main one (an attention mask) and reads the
    run's context (``multigpu.models.context``: training or inference, dropout seeds, the
    replica's device). Its parameters are shaped by the main input; ``min_inputs`` ..
    ``max_inputs`` inputs are accepted.
    """

    min_inputs = 1
    max_inputs = 1

    def check_inputs(self, in_shapes: Sequence[Shape]) -> None:
        """Raise ModelError when the extra inputs' shapes do not fit the main one (none by default)."""

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        raise ModelError(
            f"{type(self).__name__} {self.name!r} reads the run's context: run it through Model.run, "
            "Model.apply or Model.forward"
        )

    def call(self, backend: Any, params: Sequence[Any], xs: Sequence[Any], node: Any) -> Any:
        """Apply the layer to its inputs ``xs`` (the main one first) with ``backend`` ops;
        ``node`` is the ``NodeCall`` of this node on this replica."""
        raise NotImplementedError


@dataclass(frozen=True)
class JoinLayer(Layer):
    """A layer that joins two or more inputs (the end of branches)."""

    def join_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        """Return the output shape for the inputs' shapes; raise ModelError when they do not join."""
        raise NotImplementedError

    def join_flops(self, in_shapes: Sequence[Shape]) -> int:
        """Return floating-point operations per example."""
        return 0

    def join(self, backend: Any, xs: Sequence[Any]) -> Any:
        """Join the inputs with ``backend`` ops."""
        raise NotImplementedError


def _weights(rng: np.random.Generator, shape: Shape, std: float) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


@dataclass(frozen=True)
class Conv2d(Layer):
    """2-D convolution (cross-correlation), OIHW weights, optional groups and bias."""

    out_channels: int = 1
    kernel: int = 3
    stride: int = 1
    padding: int = 0
    groups: int = 1
    bias: bool = True
    kind = "conv2d"

    def __post_init__(self) -> None:
        for attr in ("out_channels", "kernel", "stride", "groups"):
            if getattr(self, attr) < 1:
                raise ModelError(f"Conv2d {attr}={getattr(self, attr)} must be >= 1")
        if self.padding < 0:
            raise ModelError(f"Conv2d padding={self.padding} must be >= 0")
        if self.out_channels % self.groups:
            raise ModelError(f"Conv2d out_channels={self.out_channels} is not divisible by groups={self.groups}")

    def param_shapes(self, in_shape: Shape) -> list[Shape]:
        c, _, _ = _need_chw(self, in_shape)
        if c % self.groups:
            raise ModelError(f"Conv2d input channels {c} are not divisible by groups={self.groups}")
        weight = (self.out_channels, c // self.groups, self.kernel, self.kernel)
        return [weight, (self.out_channels,)] if self.bias else [weight]

    def output_shape(self, in_shape: Shape) -> Shape:
        return _windowed(self, in_shape, self.out_channels, self.kernel, self.stride, self.padding)

    def param_labels(self, in_shape: Shape) -> list[str]:
        return ["weight", "bias"][: len(self.param_shapes(in_shape))]

    def macs(self, in_shape: Shape) -> int:
        c = in_shape[0]
        return prod(self.output_shape(in_shape)) * (c // self.groups) * self.kernel**2

    def init_params(self, rng: np.random.Generator, in_shape: Shape, scheme: str, scale: float) -> list[np.ndarray]:
        shapes = self.param_shapes(in_shape)
        # He init with fan_out, as torchvision's ResNets: std = sqrt(2 / (O * k * k)).
        std = scale if scheme == "textbook" else math.sqrt(2.0 / (self.out_channels * self.kernel**2))
        return [_weights(rng, shapes[0], std), *(np.zeros(s, np.float32) for s in shapes[1:])]

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        b = params[1] if self.bias else None
        return backend.conv2d(x, params[0], b, self.stride, self.padding, self.groups)


@dataclass(frozen=True)
class _Pool2d(Layer):
    kernel: int = 2
    stride: int | None = None  # None: same as kernel
    padding: int = 0
    ceil_mode: bool = False

    def __post_init__(self) -> None:
        if self.kernel < 1 or (self.stride is not None and self.stride < 1):
            raise ModelError(f"{self.kind} kernel and stride must be >= 1")
        if not 0 <= self.padding <= self.kernel // 2:
            raise ModelError(f"{self.kind} padding={self.padding} must be between 0 and kernel//2={self.kernel // 2}")
        if type(self.ceil_mode) is not bool:
            raise ModelError(f"{self.kind} ceil_mode={self.ceil_mode!r} must be True or False")

    @property
    def step(self) -> int:
        return self.kernel if self.stride is None else self.stride

    def output_shape(self, in_shape: Shape) -> Shape:
        c = _need_chw(self, in_shape)[0]
        return _windowed(self, in_shape, c, self.kernel, self.step, self.padding, self.ceil_mode)

    def flops(self, in_shape: Shape) -> int:
        # A ceil-mode window over the edge counts in full, as one that fits does.
        return prod(self.output_shape(in_shape)) * self.kernel**2


@dataclass(frozen=True)
class AvgPool2d(_Pool2d):
    """Average pooling; padded zeros count in the divisor. With ``ceil_mode`` the output size
    rounds up as torch's does, and a last window that hangs over the padding divides by the
    cells it covers inside the input and the padding (torch's ``count_include_pad=True``)."""

    kind = "avg_pool2d"

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        return backend.avg_pool2d(x, self.kernel, self.step, self.padding, self.ceil_mode)


@dataclass(frozen=True)
class MaxPool2d(_Pool2d):
    """Max pooling (padding never wins); ``ceil_mode`` rounds the output size up as torch's
    ``MaxPool2d(ceil_mode=True)``: a last window may start inside the input or the left
    padding and hang over the edge."""

    kind = "max_pool2d"

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        return backend.max_pool2d(x, self.kernel, self.step, self.padding, self.ceil_mode)


@dataclass(frozen=True)
class GlobalAvgPool2d(Layer):
    """The mean of each channel's plane: (C, H, W) -> (C, 1, 1), as torch's AdaptiveAvgPool2d(1)."""

    kind = "global_avg_pool2d"

    def output_shape(self, in_shape: Shape) -> Shape:
        return (_need_chw(self, in_shape)[0], 1, 1)

    def flops(self, in_shape: Shape) -> int:
        return prod(in_shape)

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        return backend.global_avg_pool2d(x)


@dataclass(frozen=True)
class BatchNorm2d(Layer):
    """Batch normalization over (N, H, W) per channel: parameters gamma and beta, state the
    running mean and variance.

    ``momentum`` is torch's: the weight of the new batch in the running statistics
    (``r <- (1 - momentum) r + momentum * batch``, the unbiased batch variance for the
    variance). Training uses batch statistics, inference the running ones; which
    statistics a training step uses (per device or synchronized) is the caller's choice.
    """

    eps: float = 1e-5
    momentum: float = 0.1
    kind = "batch_norm2d"

    def __post_init__(self) -> None:
        if not (isinstance(self.eps, (int, float)) and math.isfinite(self.eps) and self.eps > 0):
            raise ModelError(f"BatchNorm2d eps={self.eps!r} must be a finite number > 0, e.g. 1e-5")
        if not (isinstance(self.momentum, (int, float)) and 0 < self.momentum <= 1):
            raise ModelError(
                f"BatchNorm2d momentum={self.momentum!r} must be in (0, 1] (the new batch's "
                "weight, torch's convention), e.g. 0.1"
            )

    def param_shapes(self, in_shape: Shape) -> list[Shape]:
        c = _need_chw(self, in_shape)[0]
        return [(c,), (c,)]

    def state_shapes(self, in_shape: Shape) -> list[Shape]:
        return self.param_shapes(in_shape)

    def param_labels(self, in_shape: Shape) -> list[str]:
        return ["weight", "bias"]  # gamma, beta under torch's names

    def flops(self, in_shape: Shape) -> int:
        return 2 * prod(in_shape)

    def init_params(self, rng: np.random.Generator, in_shape: Shape, scheme: str, scale: float) -> list[np.ndarray]:
        c = _need_chw(self, in_shape)[0]
        return [np.ones(c, np.float32), np.zeros(c, np.float32)]  # gamma = 1, beta = 0 in every scheme

    def init_state(self, in_shape: Shape) -> list[np.ndarray]:
        c = _need_chw(self, in_shape)[0]
        return [np.zeros(c, np.float32), np.ones(c, np.float32)]  # running mean 0, running variance 1

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        raise ModelError(
            f"BatchNorm2d {self.name!r} needs statistics: run the model through Model.run or "
            "Model.apply with a BatchNorm mode (running statistics for inference)"
        )


@dataclass(frozen=True)
class ReLU(Layer):
    """Elementwise max(x, 0)."""

    kind = "relu"

    def flops(self, in_shape: Shape) -> int:
        return prod(in_shape)

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        return backend.relu(x)


@dataclass(frozen=True)
class Identity(Layer):
    """Passes its input on: a branch that does nothing (DenseNet's ``concat(x, f(x))``, an
    identity shortcut). It adds no node to a model."""

    kind = "identity"

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        return x


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
    """Fully connected over the last axis: ``x @ W + b`` with W of shape (in, out), as in the
    textbook (torch's Linear stores the transpose). The input is a vector (F,) or a sequence
    of them (S, F), e.g. a transformer's hidden states; the output keeps the leading axes."""

    out_features: int = 1
    kind = "dense"
    torch_transposed = ("weight",)

    def __post_init__(self) -> None:
        if self.out_features < 1:
            raise ModelError(f"Dense out_features={self.out_features} must be >= 1")

    def _in(self, in_shape: Shape) -> int:
        if len(in_shape) not in (1, 2):
            raise ModelError(
                f"Dense needs a flat (F,) input but receives {in_shape}; add Flatten first "
                "(a sequence (S, F) is taken too)"
            )
        return in_shape[-1]

    def param_shapes(self, in_shape: Shape) -> list[Shape]:
        return [(self._in(in_shape), self.out_features), (self.out_features,)]

    def param_labels(self, in_shape: Shape) -> list[str]:
        return ["weight", "bias"]

    def output_shape(self, in_shape: Shape) -> Shape:
        self._in(in_shape)
        return (*in_shape[:-1], self.out_features)

    def macs(self, in_shape: Shape) -> int:
        return prod(in_shape[:-1]) * self._in(in_shape) * self.out_features

    def init_params(self, rng: np.random.Generator, in_shape: Shape, scheme: str, scale: float) -> list[np.ndarray]:
        w, b = self.param_shapes(in_shape)
        if scheme == "textbook":
            return [_weights(rng, w, scale), np.zeros(b, np.float32)]
        # torch's nn.Linear default (what torchvision's ResNets keep): U(-1/sqrt(in), 1/sqrt(in)).
        bound = 1.0 / math.sqrt(w[0])
        return [rng.uniform(-bound, bound, w).astype(np.float32), rng.uniform(-bound, bound, b).astype(np.float32)]

    def forward(self, backend: Any, params: Sequence[Any], x: Any) -> Any:
        return backend.dense(x, params[0], params[1])


@dataclass(frozen=True)
class Add(JoinLayer):
    """Elementwise sum of its inputs (a residual join); every input has the same shape."""

    kind = "add"

    def join_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        if any(s != in_shapes[0] for s in in_shapes):
            raise ModelError(
                f"adds inputs of shapes {list(in_shapes)}; they must be equal (give the shortcut a "
                "1x1 convolution with the main path's stride and channels)"
            )
        return in_shapes[0]

    def join_flops(self, in_shapes: Sequence[Shape]) -> int:
        return (len(in_shapes) - 1) * prod(in_shapes[0])

    def join(self, backend: Any, xs: Sequence[Any]) -> Any:
        out = xs[0]
        for x in xs[1:]:
            out = backend.add(out, x)
        return out


@dataclass(frozen=True)
class Concat(JoinLayer):
    """Concatenation along the channel axis (an Inception or DenseNet join); equal H and W."""

    kind = "concat"

    def join_shape(self, in_shapes: Sequence[Shape]) -> Shape:
        if any(len(s) != 3 for s in in_shapes) or any(s[1:] != in_shapes[0][1:] for s in in_shapes):
            raise ModelError(
                f"concatenates inputs of shapes {list(in_shapes)} along channels; they need (C, H, W) "
                "with equal H and W (pad or stride the branches alike)"
            )
        return (sum(s[0] for s in in_shapes), *in_shapes[0][1:])

    def join(self, backend: Any, xs: Sequence[Any]) -> Any:
        return backend.concat_channels(list(xs))
