"""The textbook's multi-device training code (chapter 12.5), transcribed for timing.

Each ``*_textbook`` function builds the chapter's ``lenet``, ``get_params``,
``allreduce``, ``split_batch``, ``d2l.sgd`` and ``train_batch`` for one framework,
as printed, and returns a ``Runner`` that trains on the given devices. Only what
cannot run here is substituted, each marked ``SUBSTITUTED`` and listed in
``SUBSTITUTIONS``:

* On CPU replicas the chapter's device list (``d2l.try_gpu(i)``) would give the same
  CPU device n times. PyTorch's ``p.to(device)`` then returns ``p`` itself, so every
  "replica" would be one tensor. The PyTorch transcription therefore copies
  (``p.to(device, copy=True)``), as ``d2l.try_gpu`` would on distinct GPUs.
  MXNet has distinct CPU contexts (``mx.cpu(i)``), and Paddle's ``to_tensor`` always
  copies, so neither needs a change.
* ``nn.parallel.scatter`` is CUDA-only; on CPU replicas ``torch.chunk`` splits the
  batch the same way. ``paddle.set_device("gpu:i")`` becomes ``"cpu"`` without GPUs.
* The chapter's PaddlePaddle ``allreduce`` rebinds list slots
  (``data[0] += ...`` is out of place for Paddle tensors, and ``data[i] = ...`` only
  changes the list), so the gradients are never summed: every replica steps with its
  own shard's gradient. ``paddle_textbook(..., fixed=True)`` writes the same sums in
  place (``add_``, ``paddle.assign``) and is the one compared with ``DataParallel``;
  ``fixed=False`` runs the chapter's code as printed.

The GPU branches (``gpus=True``: ``cuda:i``, ``nn.parallel.scatter``, ``mx.gpu(i)``,
``paddle.CUDAPlace(i)``) are the chapter's code unchanged, but NOT RUN YET: this was
written and measured on a machine without a GPU.

Every runner takes numpy batches, as ``DataParallel.train_batch`` does, and
``params()`` returns replica 0's parameters in the model's order, so a benchmark can
check that the transcription computes what ``DataParallel`` computes.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

SUBSTITUTIONS = {
    "torch": "CPU replicas: get_params copies (p.to(device, copy=True)); split_batch uses torch.chunk "
    "instead of the CUDA-only nn.parallel.scatter",
    "mxnet": "none (distinct CPU contexts mx.cpu(i)); the chapter's np/npx mode is scoped to its calls",
    "paddle": "paddle.set_device('gpu:i') -> 'cpu' without GPUs; the printed allreduce rebinds list "
    "slots and never sums, so the compared variant writes the sums in place",
}


@dataclass
class Runner:
    """One training loop: ``step(X, y)`` trains on a numpy batch, ``sync()`` waits for the
    devices, ``params()`` returns replica 0's parameters (numpy, model order)."""

    step: Callable[[np.ndarray, np.ndarray], None]
    sync: Callable[[], None]
    params: Callable[[], list[np.ndarray]]


def torch_textbook(init: Sequence[np.ndarray], num_devices: int, lr: float, gpus: bool) -> Runner:
    """The chapter's PyTorch code on ``num_devices`` GPUs (``gpus``) or CPU replicas."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    def lenet(X, params):
        h1_conv = F.conv2d(input=X, weight=params[0], bias=params[1])
        h1_activation = F.relu(h1_conv)
        h1 = F.avg_pool2d(input=h1_activation, kernel_size=(2, 2), stride=(2, 2))
        h2_conv = F.conv2d(input=h1, weight=params[2], bias=params[3])
        h2_activation = F.relu(h2_conv)
        h2 = F.avg_pool2d(input=h2_activation, kernel_size=(2, 2), stride=(2, 2))
        h2 = h2.reshape(h2.shape[0], -1)
        h3_linear = torch.mm(h2, params[4]) + params[5]
        h3 = F.relu(h3_linear)
        y_hat = torch.mm(h3, params[6]) + params[7]
        return y_hat

    loss = nn.CrossEntropyLoss(reduction="none")

    def get_params(params, device):
        new_params = [p.to(device, copy=True) for p in params]  # SUBSTITUTED: copy=True (CPU replicas alias)
        for p in new_params:
            p.requires_grad_()
        return new_params

    def allreduce(data):
        for i in range(1, len(data)):
            data[0][:] += data[i].to(data[0].device)
        for i in range(1, len(data)):
            data[i][:] = data[0].to(data[i].device)

    def split_batch(X, y, devices):
        assert X.shape[0] == y.shape[0]
        if gpus:
            return (nn.parallel.scatter(X, devices), nn.parallel.scatter(y, devices))
        # SUBSTITUTED: nn.parallel.scatter is CUDA-only.
        return (
            [x.to(d) for x, d in zip(torch.chunk(X, len(devices)), devices)],
            [t.to(d) for t, d in zip(torch.chunk(y, len(devices)), devices)],
        )

    def sgd(params, lr, batch_size):  # d2l.sgd
        with torch.no_grad():
            for param in params:
                param -= lr * param.grad / batch_size
                param.grad.zero_()

    def train_batch(X, y, device_params, devices, lr):
        X_shards, y_shards = split_batch(X, y, devices)
        ls = [
            loss(lenet(X_shard, device_W), y_shard).sum()
            for X_shard, y_shard, device_W in zip(X_shards, y_shards, device_params)
        ]
        for loss_i in ls:
            loss_i.backward()
        with torch.no_grad():
            for i in range(len(device_params[0])):
                allreduce([device_params[c][i].grad for c in range(len(devices))])
        for param in device_params:
            sgd(param, lr, X.shape[0])

    devices = [torch.device(f"cuda:{i}") if gpus else torch.device("cpu") for i in range(num_devices)]
    params = [torch.tensor(p) for p in init]
    device_params = [get_params(params, d) for d in devices]

    def sync() -> None:
        if gpus:
            torch.cuda.synchronize()

    return Runner(
        step=lambda X, y: train_batch(torch.from_numpy(X), torch.from_numpy(y), device_params, devices, lr),
        sync=sync,
        params=lambda: [p.detach().cpu().numpy().copy() for p in device_params[0]],
    )


def mxnet_textbook(init: Sequence[np.ndarray], num_devices: int, lr: float, gpus: bool) -> Runner:
    """The chapter's MXNet code (np/npx interface) on GPUs or CPU contexts ``mx.cpu(i)``."""
    import mxnet as mx
    from mxnet import autograd, gluon, npx
    from mxnet import np as mnp

    def np_mode() -> Any:
        # The chapter calls npx.set_np() once for the process; scoping it keeps the
        # classic-NDArray code that runs beside it (DataParallel's adapter) as it is.
        class Scope:
            def __enter__(self) -> None:
                self.shape = mx.util.np_shape(True)
                self.array = mx.util.np_array(True)
                self.shape.__enter__()
                self.array.__enter__()

            def __exit__(self, *exc: Any) -> None:
                self.array.__exit__(*exc)
                self.shape.__exit__(*exc)

        return Scope()

    def lenet(X, params):
        h1_conv = npx.convolution(data=X, weight=params[0], bias=params[1], kernel=(3, 3), num_filter=20)
        h1_activation = npx.relu(h1_conv)
        h1 = npx.pooling(data=h1_activation, pool_type="avg", kernel=(2, 2), stride=(2, 2))
        h2_conv = npx.convolution(data=h1, weight=params[2], bias=params[3], kernel=(5, 5), num_filter=50)
        h2_activation = npx.relu(h2_conv)
        h2 = npx.pooling(data=h2_activation, pool_type="avg", kernel=(2, 2), stride=(2, 2))
        h2 = h2.reshape(h2.shape[0], -1)
        h3_linear = mnp.dot(h2, params[4]) + params[5]
        h3 = npx.relu(h3_linear)
        y_hat = mnp.dot(h3, params[6]) + params[7]
        return y_hat

    loss = gluon.loss.SoftmaxCrossEntropyLoss()

    def get_params(params, device):
        new_params = [p.copyto(device) for p in params]
        for p in new_params:
            p.attach_grad()
        return new_params

    def allreduce(data):
        for i in range(1, len(data)):
            data[0][:] += data[i].copyto(data[0].ctx)
        for i in range(1, len(data)):
            data[0].copyto(data[i])

    def split_batch(X, y, devices):
        assert X.shape[0] == y.shape[0]
        return (gluon.utils.split_and_load(X, devices), gluon.utils.split_and_load(y, devices))

    def sgd(params, lr, batch_size):  # d2l.sgd
        for param in params:
            param[:] = param - lr * param.grad / batch_size

    def train_batch(X, y, device_params, devices, lr):
        X_shards, y_shards = split_batch(X, y, devices)
        with autograd.record():
            ls = [
                loss(lenet(X_shard, device_W), y_shard)
                for X_shard, y_shard, device_W in zip(X_shards, y_shards, device_params)
            ]
        for loss_i in ls:
            loss_i.backward()
        for i in range(len(device_params[0])):
            allreduce([device_params[c][i].grad for c in range(len(devices))])
        for param in device_params:
            sgd(param, lr, X.shape[0])

    devices = [mx.gpu(i) if gpus else mx.cpu(i) for i in range(num_devices)]
    with np_mode():
        params = [mnp.array(p) for p in init]
        device_params = [get_params(params, d) for d in devices]

    def step(X: np.ndarray, y: np.ndarray) -> None:
        with np_mode():
            train_batch(X, y, device_params, devices, lr)

    def params_out() -> list[np.ndarray]:
        with np_mode():
            return [p.asnumpy() for p in device_params[0]]

    return Runner(step=step, sync=mx.nd.waitall, params=params_out)


def paddle_textbook(init: Sequence[np.ndarray], num_devices: int, lr: float, gpus: bool, fixed: bool = True) -> Runner:
    """The chapter's PaddlePaddle code; ``fixed`` makes its allreduce write in place."""
    warnings.filterwarnings("ignore")  # as the chapter does: to_tensor(Tensor) warns on every call
    import paddle
    from paddle import nn
    from paddle.nn import functional as F

    def lenet(X, params):
        h1_conv = F.conv2d(x=X, weight=params[0], bias=params[1])
        h1_activation = F.relu(h1_conv)
        h1 = F.avg_pool2d(x=h1_activation, kernel_size=(2, 2), stride=(2, 2))
        h2_conv = F.conv2d(x=h1, weight=params[2], bias=params[3])
        h2_activation = F.relu(h2_conv)
        h2 = F.avg_pool2d(x=h2_activation, kernel_size=(2, 2), stride=(2, 2))
        h2 = h2.reshape([h2.shape[0], -1])
        h3_linear = paddle.mm(h2, params[4]) + params[5]
        h3 = F.relu(h3_linear)
        y_hat = paddle.mm(h3, params[6]) + params[7]
        return y_hat

    loss = nn.CrossEntropyLoss(reduction="none")

    def set_device(i: int) -> None:
        paddle.set_device(f"gpu:{i}" if gpus else "cpu")  # SUBSTITUTED: "cpu" without GPUs

    def get_params(params, device):
        new_params = [paddle.to_tensor(p, place=device) for p in params]
        for p in new_params:
            p.stop_gradient = False
        return new_params

    def allreduce_as_printed(data):
        set_device(0)
        for i in range(1, len(data)):
            data[0] += paddle.to_tensor(data[i], place=data[0].place)
        for i in range(1, len(data)):
            data[i] = paddle.to_tensor(data[0], place=data[i].place)

    def allreduce_in_place(data):  # SUBSTITUTED (fixed=True): the same sums, written in place
        set_device(0)
        for i in range(1, len(data)):
            data[0].add_(paddle.to_tensor(data[i], place=data[0].place))
        for i in range(1, len(data)):
            paddle.assign(paddle.to_tensor(data[0], place=data[i].place), output=data[i])

    allreduce = allreduce_in_place if fixed else allreduce_as_printed

    def paddlescatter(XY, devices):
        xy = XY.shape[0] // len(devices)
        return [paddle.to_tensor(XY[i * xy : (i + 1) * xy], place=device) for i, device in enumerate(devices)]

    def split_batch(X, y, devices):
        assert X.shape[0] == y.shape[0]
        return (paddlescatter(X, devices), paddlescatter(y, devices))

    def sgd(params, lr, batch_size):  # d2l.sgd
        with paddle.no_grad():
            for i, param in enumerate(params):
                param -= lr * params[i].grad / batch_size
                params[i].set_value(param)
                params[i].clear_gradient()

    def train_batch(X, y, device_params, devices, lr):
        X_shards, y_shards = split_batch(X, y, devices)
        for i, (X_shard, y_shard, device_W) in enumerate(zip(X_shards, y_shards, device_params)):
            set_device(i)
            y_shard = paddle.squeeze(y_shard)
            loss_i = loss(lenet(X_shard, device_W), y_shard).sum()
            loss_i.backward()
        with paddle.no_grad():
            for i in range(len(device_params[0])):
                allreduce([device_params[c][i].grad for c in range(len(devices))])
        for i in range(len(device_params)):
            set_device(i)
            param = device_params[i]
            sgd(param, lr, X.shape[0])

    devices = [paddle.CUDAPlace(i) if gpus else paddle.CPUPlace() for i in range(num_devices)]
    params = [paddle.to_tensor(p) for p in init]
    device_params = [get_params(params, d) for d in devices]

    def sync() -> None:
        if gpus:
            paddle.device.cuda.synchronize()

    return Runner(
        step=lambda X, y: train_batch(X, y, device_params, devices, lr),
        sync=sync,
        params=lambda: [p.numpy() for p in device_params[0]],
    )


TEXTBOOK = {"torch": torch_textbook, "mxnet": mxnet_textbook, "paddle": paddle_textbook}
