"""Each framework's own training loop for the textbook's LeNet, written the usual way.

What a user would write without multigpu, to price the abstraction against:

* ``torch_autograd``: the LeNet function, autograd, ``torch.optim.SGD`` (one device);
* ``torch_nn_data_parallel``: an ``nn.Module`` under ``nn.DataParallel`` (GPUs only);
* ``mxnet_autograd``: the LeNet function on ``mx.nd``, ``attach_grad``, ``autograd``,
  ``sgd_update`` (one device);
* ``mxnet_gluon``: ``gluon.nn`` layers, ``split_and_load`` and a ``gluon.Trainer``
  (SGD) on the same devices, MXNet's own multi-device loop;
* ``paddle_dygraph``: ``paddle.nn`` layers, ``loss.backward()``, ``optimizer.step()``,
  ``clear_grad()`` (one device).

All take the same numpy start (the model's parameter order and layout: conv OIHW,
dense (in, out)) and compute what ``DataParallel`` computes: the per-example loss
summed over the batch, SGD with ``lr / batch``. ``params()`` returns the parameters in
that layout, so a benchmark can check each loop against ``DataParallel``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from multigpu.benchmarks.textbook import Runner


def torch_autograd(init: Sequence[np.ndarray], lr: float, batch: int, gpu: bool) -> Runner:
    """LeNet as a function of its tensors; autograd; ``torch.optim.SGD``; one device."""
    import torch
    import torch.nn.functional as F

    dev = torch.device("cuda:0" if gpu else "cpu")
    params = [torch.tensor(p, device=dev, requires_grad=True) for p in init]
    opt = torch.optim.SGD(params, lr=lr / batch)

    def lenet(X: torch.Tensor) -> torch.Tensor:
        W1, b1, W2, b2, W3, b3, W4, b4 = params
        h = F.avg_pool2d(F.relu(F.conv2d(X, W1, b1)), 2, 2)
        h = F.avg_pool2d(F.relu(F.conv2d(h, W2, b2)), 2, 2)
        h = F.relu(h.reshape(h.shape[0], -1) @ W3 + b3)
        return h @ W4 + b4

    def step(X: np.ndarray, y: np.ndarray) -> None:
        X_, y_ = torch.from_numpy(X).to(dev), torch.from_numpy(y).to(dev)
        loss = F.cross_entropy(lenet(X_), y_, reduction="sum")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def sync() -> None:
        if gpu:
            torch.cuda.synchronize()

    return Runner(step, sync, lambda: [p.detach().cpu().numpy().copy() for p in params])


def torch_nn_data_parallel(init: Sequence[np.ndarray], lr: float, batch: int, num_gpus: int) -> Runner:
    """An ``nn.Module`` LeNet under ``nn.DataParallel`` on ``num_gpus`` GPUs (needs CUDA).

    NOT RUN YET: written on a machine without a GPU; ``step`` uses it only where torch sees GPUs.
    """
    import torch
    import torch.nn.functional as F
    from torch import nn

    class LeNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p = nn.ParameterList([nn.Parameter(torch.tensor(p)) for p in init])

        def forward(self, X: torch.Tensor) -> torch.Tensor:
            W1, b1, W2, b2, W3, b3, W4, b4 = self.p
            h = F.avg_pool2d(F.relu(F.conv2d(X, W1, b1)), 2, 2)
            h = F.avg_pool2d(F.relu(F.conv2d(h, W2, b2)), 2, 2)
            h = F.relu(h.reshape(h.shape[0], -1) @ W3 + b3)
            return h @ W4 + b4

    model = LeNet().to("cuda:0")
    net = nn.DataParallel(model, device_ids=list(range(num_gpus)))
    opt = torch.optim.SGD(model.parameters(), lr=lr / batch)

    def step(X: np.ndarray, y: np.ndarray) -> None:
        out = net(torch.from_numpy(X).to("cuda:0", non_blocking=True))
        loss = F.cross_entropy(out, torch.from_numpy(y).to("cuda:0"), reduction="sum")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return Runner(step, torch.cuda.synchronize, lambda: [p.detach().cpu().numpy().copy() for p in model.p])


def mxnet_autograd(init: Sequence[np.ndarray], lr: float, batch: int, gpu: bool) -> Runner:
    """LeNet as a function of its NDArrays; ``attach_grad``; autograd; ``sgd_update``; one device."""
    import mxnet as mx
    from mxnet import autograd, nd

    ctx = mx.gpu(0) if gpu else mx.cpu(0)
    params = [nd.array(p, ctx=ctx) for p in init]
    for p in params:
        p.attach_grad()

    def lenet(X: nd.NDArray) -> nd.NDArray:
        W1, b1, W2, b2, W3, b3, W4, b4 = params
        h = nd.Convolution(X, W1, b1, kernel=(3, 3), num_filter=20)
        h = nd.Pooling(nd.relu(h), kernel=(2, 2), stride=(2, 2), pool_type="avg")
        h = nd.Convolution(h, W2, b2, kernel=(5, 5), num_filter=50)
        h = nd.Pooling(nd.relu(h), kernel=(2, 2), stride=(2, 2), pool_type="avg")
        h = nd.relu(nd.dot(h.reshape((h.shape[0], -1)), W3) + b3)
        return nd.dot(h, W4) + b4

    def step(X: np.ndarray, y: np.ndarray) -> None:
        X_, y_ = nd.array(X, ctx=ctx), nd.array(y, ctx=ctx)
        with autograd.record():
            loss = nd.softmax_cross_entropy(lenet(X_), y_)  # summed over the batch
        loss.backward()
        for p in params:
            nd.sgd_update(p, p.grad, lr=lr / batch, out=p)

    return Runner(step, mx.nd.waitall, lambda: [p.asnumpy() for p in params])


def mxnet_gluon(init: Sequence[np.ndarray], lr: float, batch: int, num_devices: int, gpu: bool) -> Runner:
    """``gluon.nn`` LeNet, ``split_and_load`` and a ``gluon.Trainer`` on ``num_devices`` devices."""
    import mxnet as mx
    from mxnet import autograd, gluon
    from mxnet.gluon import nn

    ctxs = [mx.gpu(i) if gpu else mx.cpu(i) for i in range(num_devices)]
    net = nn.Sequential()
    net.add(
        nn.Conv2D(20, kernel_size=3, activation="relu"),
        nn.AvgPool2D(pool_size=2, strides=2),
        nn.Conv2D(50, kernel_size=5, activation="relu"),
        nn.AvgPool2D(pool_size=2, strides=2),
        nn.Dense(128, activation="relu"),
        nn.Dense(10),
    )
    net.initialize(ctx=ctxs)
    net(mx.nd.zeros((1, 1, 28, 28), ctx=ctxs[0]))  # shapes are inferred on the first call
    dense = {4, 6}  # gluon Dense stores (out, in)
    for i, p in enumerate(net.collect_params().values()):
        p.set_data(mx.nd.array(init[i].T if i in dense else init[i]))
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": lr})

    def step(X: np.ndarray, y: np.ndarray) -> None:
        xs = gluon.utils.split_and_load(X, ctxs)
        ys = gluon.utils.split_and_load(y, ctxs)
        with autograd.record():
            losses = [loss_fn(net(x), t) for x, t in zip(xs, ys)]
        for loss in losses:
            loss.backward()
        trainer.step(batch)  # rescales by 1/batch: SGD on the summed loss, as DataParallel

    def params() -> list[np.ndarray]:
        out = [p.data(ctxs[0]).asnumpy() for p in net.collect_params().values()]
        return [a.T if i in dense else a for i, a in enumerate(out)]

    return Runner(step, mx.nd.waitall, params)


def paddle_dygraph(init: Sequence[np.ndarray], lr: float, batch: int, gpu: bool) -> Runner:
    """``paddle.nn`` LeNet; ``loss.backward()``, ``optimizer.step()``, ``clear_grad()``; one device."""
    import paddle
    from paddle import nn

    paddle.set_device("gpu:0" if gpu else "cpu")
    net = nn.Sequential(
        nn.Conv2D(1, 20, 3),
        nn.ReLU(),
        nn.AvgPool2D(2, 2),
        nn.Conv2D(20, 50, 5),
        nn.ReLU(),
        nn.AvgPool2D(2, 2),
        nn.Flatten(),
        nn.Linear(800, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )
    for p, a in zip(net.parameters(), init):  # paddle Linear stores (in, out), as the model does
        p.set_value(a)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    opt = paddle.optimizer.SGD(learning_rate=lr / batch, parameters=net.parameters())

    def step(X: np.ndarray, y: np.ndarray) -> None:
        loss = loss_fn(net(paddle.to_tensor(X)), paddle.to_tensor(y))
        loss.backward()
        opt.step()
        opt.clear_grad()

    def sync() -> None:
        if gpu:
            paddle.device.cuda.synchronize()

    return Runner(step, sync, lambda: [p.numpy() for p in net.parameters()])
