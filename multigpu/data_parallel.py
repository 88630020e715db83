"""Data-parallel SGD, written once against the backend protocol.

One step: split the minibatch across devices, compute the summed per-example loss
and its gradients on each device, allreduce (sum) the gradients, and apply
``p -= lr / global_batch * g`` on every replica, as the textbook does.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Union

import numpy as np

from .allreduce import allreduce_grads, check_algorithm
from .devices import DeviceSpec, resolve_devices
from .errors import InputError
from .protocol import Device
from .registry import backend as get_backend
from .sequential import Sequential
from .split import shard_sizes, split_batch


def check_batch(model: Sequential, X: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(X, y)`` as float32/int64 arrays; raise InputError naming what is wrong."""
    X = np.asarray(X)
    y = np.asarray(y)
    want = model.input_shape
    if X.ndim != len(want) + 1 or tuple(X.shape[1:]) != want:
        raise InputError(f"X has shape {X.shape}; {model.name} needs (batch, {', '.join(map(str, want))})")
    if len(X) == 0:
        raise InputError("the batch is empty; pass at least one example per device")
    if not np.issubdtype(X.dtype, np.floating):
        raise InputError(f"X has dtype {X.dtype}; pass floating-point images (float32), e.g. X.astype('float32') / 255")
    if y.shape != (len(X),):
        raise InputError(f"y has shape {y.shape}; it must be ({len(X)},), one integer label per row of X")
    if not np.issubdtype(y.dtype, np.integer):
        raise InputError(f"y has dtype {y.dtype}; labels must be integers")
    classes = model.num_classes
    bad = (y < 0) | (y >= classes)
    if bad.any():
        raise InputError(f"label {int(y[bad][0])} is out of range; {model.name} has classes 0..{classes - 1}")
    if not np.isfinite(X).all():
        raise InputError("X contains NaN or infinity")
    return X.astype(np.float32, copy=False), y.astype(np.int64, copy=False)


class DataParallel:
    """Train ``model`` with synchronous data-parallel SGD on several devices of one backend.

    ``devices`` is N (GPUs when the framework sees them, else N CPU replicas with a
    warning), ``"cpu:N"``, ``"gpu:0,1"`` or a list of Device. ``params`` is a list of
    numpy arrays in model order; None draws the textbook init from ``seed``.
    """

    def __init__(self, model: Sequential, backend: Union[str, Any] = "numpy",
                 devices: DeviceSpec = 1, lr: float = 0.1,
                 params: Optional[Sequence[np.ndarray]] = None, allreduce: str = "fused",
                 seed: int = 0):
        if not isinstance(model, Sequential):
            raise TypeError(f"model must be a multigpu Sequential, got {type(model).__name__}")
        self.model = model
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        self.allreduce = check_algorithm(self.backend, allreduce)
        self.lr = lr
        self.devices: list[Device] = resolve_devices(self.backend, devices)
        host = model.init_params(seed) if params is None else model.check_params(params)
        self.replicas = [[self.backend.from_numpy(p, d) for p in host] for d in self.devices]

    @property
    def lr(self) -> float:
        """The learning rate (per global batch, as in the textbook)."""
        return self._lr

    @lr.setter
    def lr(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"lr={value!r} must be a positive finite number, e.g. 0.2")
        self._lr = float(value)

    def _loss(self, params: Sequence[Any], x: Any, y: Any) -> Any:
        b = self.backend
        return b.sum(b.softmax_cross_entropy(self.model.forward(b, params, x), y))

    def train_batch(self, X: np.ndarray, y: np.ndarray) -> float:
        """Run one SGD step on the minibatch; return its mean per-example loss.

        Raises InputError for a bad batch (shape, dtype, labels, empty, or fewer rows
        than devices).
        """
        X, y = check_batch(self.model, X, y)
        b = self.backend
        total, grads = 0.0, []
        for d, params, (xs, ys) in zip(self.devices, self.replicas, split_batch(X, y, len(self.devices))):
            value, g = b.value_and_grad(self._loss, params, b.from_numpy(xs, d), b.from_numpy(ys, d))
            total += value
            grads.append(g)
        allreduce_grads(b, grads, self.devices, self.allreduce)
        for params, g in zip(self.replicas, grads):
            b.sgd_(params, g, self.lr / len(X))
        return total / len(X)

    def get_params(self, replica: int = 0) -> list[np.ndarray]:
        """Return the parameters of one replica as numpy arrays, in model order."""
        return [self.backend.to_numpy(p) for p in self.replicas[replica]]

    def set_params(self, params: Sequence[np.ndarray]) -> None:
        """Overwrite every replica with ``params`` (numpy arrays in model order)."""
        host = self.model.check_params(params)
        self.replicas = [[self.backend.from_numpy(p, d) for p in host] for d in self.devices]

    def synchronize(self) -> None:
        """Wait until every device has finished its queued work."""
        for d in self.devices:
            self.backend.synchronize(d)

    def predict(self, X: np.ndarray, batch_size: int = 1024) -> np.ndarray:
        """Return predicted classes; each device classifies its own share of ``X``."""
        X, _ = check_batch(self.model, X, np.zeros(len(np.asarray(X)), np.int64))
        if batch_size < 1:
            raise InputError(f"batch_size={batch_size} must be >= 1")
        b, n = self.backend, len(self.devices)
        out = np.empty(len(X), np.int64)
        step = batch_size * n
        for start in range(0, len(X), step):
            chunk = X[start : start + step]
            parts = min(n, len(chunk))  # the last chunk may be smaller than the device count
            offset = start
            pending = []
            for d, params, size in zip(self.devices, self.replicas, shard_sizes(len(chunk), parts)):
                x = b.from_numpy(X[offset : offset + size], d)
                pending.append((offset, size, b.argmax(self.model.forward(b, params, x), 1)))
                offset += size
            for o, size, pred in pending:  # read back after every device has been queued
                out[o : o + size] = b.to_numpy(pred)
        return out

    def evaluate(self, X: np.ndarray, y: np.ndarray, batch_size: int = 1024) -> float:
        """Return accuracy in [0, 1], computed on all devices, each taking a share."""
        X, y = check_batch(self.model, X, y)
        return float((self.predict(X, batch_size) == y).mean())
