"""Each framework's own ResNet-18 and training step, written the way its users write them.

What ``resnet_step`` prices ours against, and what the tests check ours against:

* ``torch_resnet18``: torchvision's layout as a plain ``nn.Module`` (torchvision does
  not import against the CPU torch here), trained with ``optim.SGD``;
* ``paddle_resnet18``: ``paddle.vision.models.resnet18`` with ``paddle.optimizer.Momentum``;
* ``gluon_resnet18``: the Gluon model zoo's ``resnet18_v1`` with a ``gluon.Trainer`` (sgd),
  hybridized or not.

Every builder loads the same numpy start (``multigpu.models.resnet18``'s parameter and
state order, which is torchvision's) and computes the same step: the mean cross-entropy
of the batch, SGD with momentum and weight decay, BatchNorm with batch statistics and
torch's running-statistics convention where the framework allows it (see each NOTE).
``params()`` and ``state()`` return the parameters and running statistics in our order,
so a benchmark can check that a loop computes what ``DataParallel`` computes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from multigpu.benchmarks.textbook import Runner


class ResNetRunner(Runner):
    """A Runner that also returns the BatchNorm running statistics in our order."""

    def __init__(self, step: Any, sync: Any, params: Any, state: Any):
        super().__init__(step, sync, params)
        self.state = state


def _fc_in_torch_layout(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Our (in, out) dense weight is torch's and Paddle's (out, in) transposed (Paddle's is ours)."""
    out = [np.asarray(a) for a in arrays]
    out[-2] = out[-2].T.copy()
    return out


def torch_module(num_classes: int = 1000, in_channels: int = 3) -> Any:
    """torchvision's ``resnet18`` as a plain ``nn.Module`` (BasicBlock, the same names and order)."""
    import torch
    from torch import nn

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            widths, cin = (64, 128, 256, 512), 64
            for i, w in enumerate(widths):
                stride = 1 if i == 0 else 2
                setattr(self, f"layer{i + 1}", nn.Sequential(BasicBlock(cin, w, stride), BasicBlock(w, w, 1)))
                cin = w
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512, num_classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            for i in range(1, 5):  # layer1..layer4, named as torchvision's for the state dict
                x = getattr(self, f"layer{i}")(x)
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return ResNet18()


def torch_resnet18(
    init: Sequence[np.ndarray],
    state: Sequence[np.ndarray],
    lr: float,
    momentum: float,
    weight_decay: float,
    num_classes: int = 1000,
) -> ResNetRunner:
    """torchvision's ResNet-18 (an nn.Module), ``CrossEntropyLoss`` and ``optim.SGD``; one CPU device."""
    import torch

    net = torch_module(num_classes, int(init[0].shape[1]))
    with torch.no_grad():
        for p, a in zip(net.parameters(), _fc_in_torch_layout(init)):
            p.copy_(torch.from_numpy(a))
        stats = [b for name, b in net.named_buffers() if not name.endswith("num_batches_tracked")]
        for b, a in zip(stats, state):
            b.copy_(torch.from_numpy(np.asarray(a)))
    net.train()
    loss_fn = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)

    def step(X: np.ndarray, y: np.ndarray) -> None:
        loss = loss_fn(net(torch.from_numpy(X)), torch.from_numpy(y))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def params() -> list[np.ndarray]:
        return _fc_in_torch_layout([p.detach().numpy().copy() for p in net.parameters()])

    def running() -> list[np.ndarray]:
        return [b.numpy().copy() for name, b in net.named_buffers() if not name.endswith("num_batches_tracked")]

    return ResNetRunner(step, lambda: None, params, running)


def paddle_resnet18(
    init: Sequence[np.ndarray],
    state: Sequence[np.ndarray],
    lr: float,
    momentum: float,
    weight_decay: float,
    num_classes: int = 1000,
) -> ResNetRunner:
    """``paddle.vision.models.resnet18`` with ``paddle.optimizer.Momentum`` (L2 weight decay); one CPU device.

    NOTE: Paddle's BatchNorm weighs the old running value with its momentum (0.9 for
    torch's 0.1) and folds in the biased variance: its running variance differs from
    torch's by the factor n/(n-1) on the new batch, so only the parameters are compared.
    """
    import paddle
    from paddle.vision.models import resnet18

    paddle.set_device("cpu")
    net = resnet18(num_classes=num_classes)
    trained = [p for p in net.parameters() if p.trainable]  # BatchNorm's statistics are parameters in Paddle
    for p, a in zip(trained, init):  # paddle's Linear stores (in, out), as ours
        p.set_value(np.asarray(a))
    bns = [layer for layer in net.sublayers() if isinstance(layer, paddle.nn.BatchNorm2D)]
    for k, bn in enumerate(bns):
        bn._mean.set_value(np.asarray(state[2 * k]))
        bn._variance.set_value(np.asarray(state[2 * k + 1]))
    net.train()
    loss_fn = paddle.nn.CrossEntropyLoss()
    opt = paddle.optimizer.Momentum(
        learning_rate=lr, momentum=momentum, parameters=trained, weight_decay=paddle.regularizer.L2Decay(weight_decay)
    )

    def step(X: np.ndarray, y: np.ndarray) -> None:
        loss = loss_fn(net(paddle.to_tensor(X)), paddle.to_tensor(y))
        loss.backward()
        opt.step()
        opt.clear_grad()

    def running() -> list[np.ndarray]:
        return [a for bn in bns for a in (bn._mean.numpy(), bn._variance.numpy())]

    return ResNetRunner(step, lambda: None, lambda: [p.numpy() for p in trained], running)


def gluon_resnet18(
    init: Sequence[np.ndarray],
    state: Sequence[np.ndarray],
    lr: float,
    momentum: float,
    weight_decay: float,
    hybridize: bool,
    num_classes: int = 1000,
) -> ResNetRunner:
    """The Gluon zoo's ``resnet18_v1`` with a ``gluon.Trainer`` (sgd with momentum and wd); one CPU context.

    NOTE: Gluon's BatchNorm weighs the old value with its momentum and folds in the biased
    variance (in backward); only the parameters are compared. Its parameters are listed
    per BatchNorm as gamma, beta, running mean, running var, which is mapped to ours.
    """
    import mxnet as mx
    from mxnet import autograd, gluon
    from mxnet.gluon.model_zoo import vision

    ctx = mx.cpu(0)
    net = vision.resnet18_v1(classes=num_classes)
    net.initialize(ctx=ctx)
    net(mx.nd.zeros((1, *init[0].shape[1:2], 8, 8), ctx=ctx))  # shapes are inferred on the first call
    all_params = list(net.collect_params().values())
    trained = [p for p in all_params if p.grad_req != "null"]
    running = [p for p in all_params if p.grad_req == "null"]
    arrays = list(init)
    arrays[-2] = arrays[-2].T  # Gluon's Dense stores (out, in)
    for p, a in zip(trained, arrays):
        p.set_data(mx.nd.array(a, ctx=ctx))
    for p, a in zip(running, state):
        p.set_data(mx.nd.array(a, ctx=ctx))
    if hybridize:
        net.hybridize(static_alloc=True, static_shape=True)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(
        net.collect_params(), "sgd", {"learning_rate": lr, "momentum": momentum, "wd": weight_decay}
    )

    def step(X: np.ndarray, y: np.ndarray) -> None:
        x, t = mx.nd.array(X, ctx=ctx), mx.nd.array(y, ctx=ctx)
        with autograd.record():
            loss = loss_fn(net(x), t)
        loss.backward()
        trainer.step(len(X))  # rescales by 1/batch: the mean loss's gradient

    def params() -> list[np.ndarray]:
        out = [p.data(ctx).asnumpy() for p in trained]
        out[-2] = out[-2].T
        return out

    return ResNetRunner(step, mx.nd.waitall, params, lambda: [p.data(ctx).asnumpy() for p in running])
