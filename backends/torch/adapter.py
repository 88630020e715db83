"""PyTorch adapter for the multigpu backend protocol (see ``multigpu.contract.protocol``).

Thin on purpose: every op passes every argument explicitly, and each place where
PyTorch's own behaviour differs from the protocol convention carries a ``NOTE:``.
Arguments arrive already checked by ``multigpu.contract.checked`` (shapes, dtypes, sizes,
labels, devices), so nothing here validates them again.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from multigpu.contract.protocol import Device

Tensor = torch.Tensor
_NUMPY_DTYPES = {torch.float32: np.dtype(np.float32), torch.int64: np.dtype(np.int64),
                 torch.float64: np.dtype(np.float64), torch.int32: np.dtype(np.int32)}


class TorchBackend:
    """The ``Backend`` protocol implemented with PyTorch tensors and autograd."""

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
    def conv2d(self, x: Tensor, w: Tensor, b: Tensor, stride: int, padding: int, groups: int) -> Tensor:
        """NCHW cross-correlation with OIHW weights, bias, zero padding and groups."""
        return F.conv2d(x, w, b, stride=stride, padding=padding, dilation=1, groups=groups)

    def avg_pool2d(self, x: Tensor, kernel: int, stride: int, padding: int) -> Tensor:
        """Average pooling; padded zeros count in the divisor; floor output size."""
        # NOTE: count_include_pad and ceil_mode are passed although they equal torch's
        # defaults today, and stride is always given (torch's None means "= kernel").
        return F.avg_pool2d(x, kernel_size=kernel, stride=stride, padding=padding,
                            ceil_mode=False, count_include_pad=True, divisor_override=None)

    def max_pool2d(self, x: Tensor, kernel: int, stride: int, padding: int) -> Tensor:
        """Max pooling; padding never wins; floor output size."""
        # NOTE: torch pads max pooling with -inf, so a padded cell never wins.
        return F.max_pool2d(x, kernel_size=kernel, stride=stride, padding=padding,
                            dilation=1, ceil_mode=False, return_indices=False)

    def relu(self, x: Tensor) -> Tensor:
        """Return max(x, 0)."""
        return torch.relu(x)

    def dense(self, x: Tensor, w: Tensor, b: Tensor) -> Tensor:
        """Return ``x @ w + b`` with ``w`` of shape (in, out)."""
        # NOTE: torch.nn.Linear stores (out, in) and computes x @ W.T; the protocol uses (in, out).
        return x @ w + b

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
    def add_(self, dst: Tensor, src: Tensor) -> None:
        """In place ``dst += src``; ``src`` may live on another device."""
        with torch.no_grad():
            # A same-device .to() aliases src, which is harmless here: src is only read.
            dst.add_(src.to(dst.device))

    def assign_(self, dst: Tensor, src: Tensor) -> None:
        """In place ``dst[...] = src``; ``src`` may live on another device."""
        with torch.no_grad():
            dst.copy_(src)

    def split(self, x: Tensor, sizes: Sequence[int]) -> list[Tensor]:
        """Split along axis 0 into new tensors of the given lengths."""
        with torch.no_grad():
            # NOTE: torch.split returns views of x; clone so each part owns its buffer.
            return [part.clone() for part in torch.split(x, list(sizes), dim=0)]

    def concat(self, xs: Sequence[Tensor]) -> Tensor:
        """Concatenate along axis 0 into a new tensor on the device of ``xs[0]``."""
        dev = xs[0].device
        with torch.no_grad():
            # torch.cat always allocates, even for a single input.
            return torch.cat([x.to(dev) for x in xs], dim=0)

    def flatten(self, xs: Sequence[Tensor]) -> Tensor:
        """Return a new 1-D tensor of every tensor raveled, on the device of ``xs[0]``."""
        dev = xs[0].device
        with torch.no_grad():
            return torch.cat([x.reshape(-1).to(dev) for x in xs])

    def unflatten(self, flat: Tensor, shapes: Sequence[Sequence[int]]) -> list[Tensor]:
        """Return views of consecutive slices of ``flat`` (they share its storage)."""
        sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
        return [part.view(tuple(int(d) for d in s)) for part, s in zip(torch.split(flat, sizes), shapes)]

    def native_allreduce(self, tensors: Sequence[Tensor]) -> None:
        """In place SUM allreduce: every tensor in ``tensors`` receives the sum of all."""
        if not tensors:
            return
        with torch.no_grad():
            if len(tensors) > 1 and all(t.device.type == "cuda" for t in tensors):
                total = torch.cuda.comm.reduce_add(list(tensors), destination=tensors[0].device.index)
            else:
                dev = tensors[0].device
                total = torch.stack([t.to(dev) for t in tensors]).sum(dim=0)
            # copy_ reads total before writing, so aliasing tensors[0] (len 1) is safe.
            for t in tensors:
                t.copy_(total)

    # -- gradients and update -------------------------------------------
    def value_and_grad(
        self, fn: Callable[..., Tensor], params: Sequence[Tensor], *inputs: Any
    ) -> Tensor:
        """Evaluate ``fn(params, *inputs)`` (a scalar); return [grads raveled..., value] in one buffer."""
        # NOTE: torch accumulates into .grad across backward() calls. Fresh leaves
        # (detach() shares storage, cheap; params are not mutated in the forward)
        # plus torch.autograd.grad return new tensors and touch no .grad field.
        leaves = [p.detach().requires_grad_(True) for p in params]
        with torch.enable_grad():
            out = fn(leaves, *inputs).reshape(())
            if out.requires_grad:
                grads = torch.autograd.grad(out, leaves, allow_unused=True)
            else:
                grads = (None,) * len(leaves)
        # An unused parameter has gradient zero, not None, so the core never special-cases it.
        fresh = [torch.zeros_like(p) if g is None else g for p, g in zip(leaves, grads)]
        # NOTE: float(out) would wait for the device; the value stays in the buffer.
        with torch.no_grad():
            return torch.cat([*(g.reshape(-1) for g in fresh), out.detach().reshape(1).to(fresh[0].dtype)])

    def sgd_(self, params: Sequence[Tensor], grads: Sequence[Tensor], lr: float) -> None:
        """In place ``p -= lr * g`` for every pair."""
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(g.to(p.device), alpha=float(lr))
