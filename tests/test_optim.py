"""The optimizers: one core definition on every backend, equal to each framework's own for 5 steps.

The core's rules are torch.optim's. Each framework's own optimizer gets the same start
and the same gradient every step (as the gradient of ``sum(p * g)``); where a framework
defines the rule differently the test feeds it what makes the two the same, as the
NOTEs say.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import BACKENDS, FRAMEWORKS

import multigpu
from multigpu.errors import InputError
from multigpu.optim import SGD, AdamW, make_optimizer

CPU = multigpu.Device("cpu", 0)
STEPS, LR, SIZE = 5, 0.05, 40

SGD_CASES = {
    "plain": SGD(),
    "momentum, weight decay": SGD(momentum=0.9, weight_decay=5e-4),
    "nesterov": SGD(momentum=0.9, weight_decay=1e-2, nesterov=True),
    "dampening": SGD(momentum=0.8, dampening=0.3),
}
ADAMW = AdamW(betas=(0.85, 0.99), eps=1e-6, weight_decay=0.05)


def _problem():
    rng = np.random.default_rng(0)
    return rng.standard_normal(SIZE).astype(np.float32), rng.standard_normal((STEPS, SIZE)).astype(np.float32)


def ours(backend: str, opt, scale: float = 1.0) -> np.ndarray:
    """Our optimizer on ``backend``; the gradient is ``scale * g``, given as ``g`` (the summed loss's)."""
    be = multigpu.backend(backend)
    p0, grads = _problem()
    p = be.from_numpy(p0, CPU)
    state = [be.from_numpy(np.zeros(SIZE, np.float32), CPU) for _ in range(opt.buffers)]
    for t, g in enumerate(grads, 1):
        opt.update(be, p, be.from_numpy(g / scale, CPU), state, LR, scale, t)
    return be.to_numpy(p)


def torch_own(opt) -> np.ndarray:
    import torch

    p0, grads = _problem()
    p = torch.tensor(p0, requires_grad=True)
    if isinstance(opt, AdamW):
        o = torch.optim.AdamW([p], lr=LR, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay)
    else:
        o = torch.optim.SGD(
            [p],
            lr=LR,
            momentum=opt.momentum,
            dampening=opt.dampening,
            weight_decay=opt.weight_decay,
            nesterov=opt.nesterov,
        )
    for g in grads:
        o.zero_grad()
        (p * torch.from_numpy(g)).sum().backward()
        o.step()
    return p.detach().numpy()


def paddle_own(opt) -> np.ndarray:
    import paddle

    p0, grads = _problem()
    p = paddle.create_parameter([SIZE], "float32", default_initializer=paddle.nn.initializer.Assign(p0))
    if isinstance(opt, AdamW):
        o = paddle.optimizer.AdamW(
            learning_rate=LR,
            beta1=opt.betas[0],
            beta2=opt.betas[1],
            epsilon=opt.eps,
            parameters=[p],
            weight_decay=opt.weight_decay,
        )
    else:
        # NOTE: Paddle's Momentum is velocity = mu * velocity + g (from zero, so its first step is torch's
        # buf = g), with L2Decay added to g first: torch's rule, without dampening.
        o = paddle.optimizer.Momentum(
            learning_rate=LR,
            momentum=opt.momentum,
            parameters=[p],
            use_nesterov=opt.nesterov,
            weight_decay=paddle.regularizer.L2Decay(opt.weight_decay),
        )
    for g in grads:
        (p * paddle.to_tensor(g)).sum().backward()
        o.step()
        o.clear_grad()
    return p.numpy()


def mxnet_own(opt) -> np.ndarray:
    import mxnet as mx

    p0, grads = _problem()
    w = mx.nd.array(p0)
    if isinstance(opt, AdamW):
        m, v = mx.nd.zeros(SIZE), mx.nd.zeros(SIZE)
        b1, b2 = opt.betas
        for t, g in enumerate(grads, 1):
            # NOTE: MXNet's adamw_update has no bias correction and applies w -= eta * (lr * m / (sqrt(v) +
            # eps) + wd * w). torch's step equals it with eta = lr, lr = sqrt(1 - b2^t) / (1 - b1^t) and eps
            # scaled by sqrt(1 - b2^t), set every step.
            c1, c2 = 1 - b1**t, math.sqrt(1 - b2**t)
            mx.nd.contrib.adamw_update(
                w,
                mx.nd.array(g),
                m,
                v,
                rescale_grad=1.0,
                lr=c2 / c1,
                beta1=b1,
                beta2=b2,
                epsilon=opt.eps * c2,
                wd=opt.weight_decay,
                eta=LR,
                out=w,
            )
        return w.asnumpy()
    # NOTE: MXNet's sgd keeps mom = momentum * mom - lr * (g + wd * w) and adds it to w: torch's rule with
    # mom = -lr * buf, the same while lr is constant; it has no dampening or Nesterov.
    o = mx.optimizer.SGD(learning_rate=LR, momentum=opt.momentum, wd=opt.weight_decay, rescale_grad=1.0)
    update = mx.optimizer.get_updater(o)
    for g in grads:
        update(0, mx.nd.array(g), w)
    return w.asnumpy()


OWN = {"torch": torch_own, "paddle": paddle_own, "mxnet": mxnet_own}


def _cases(framework: str) -> list[tuple[str, object]]:
    """What each framework's own optimizer can express: Paddle has no dampening, MXNet's sgd no Nesterov either."""
    out = [
        (k, v)
        for k, v in SGD_CASES.items()
        if not v.dampening or framework == "torch"
        if not v.nesterov or framework != "mxnet"
    ]
    return out + [("adamw", ADAMW)]


@pytest.mark.parametrize("framework, case", [(f, c) for f in FRAMEWORKS for c, _ in _cases(f)])
def test_each_optimizer_equals_the_frameworks_own_for_5_steps(framework, case):
    opt = dict(_cases(framework))[case]
    np.testing.assert_allclose(ours(framework, opt), OWN[framework](opt), rtol=2e-6, atol=2e-7)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [*SGD_CASES, "adamw"])
def test_every_backend_runs_the_same_optimizer(backend, case):
    opt = ADAMW if case == "adamw" else SGD_CASES[case]
    np.testing.assert_allclose(ours(backend, opt, scale=1 / 32), ours("numpy", opt), rtol=2e-6, atol=2e-7)


def test_settings_out_of_range_are_refused_by_name():
    for make, match in [
        (lambda: SGD(momentum=-0.1), r"momentum=-0.1 must be at least 0"),
        (lambda: SGD(weight_decay=float("nan")), r"weight_decay=nan must be a finite number"),
        (lambda: SGD(dampening=2.0), r"dampening=2.0 must be at most 1"),
        (lambda: SGD(nesterov=True), r"nesterov=True needs momentum > 0"),
        (lambda: SGD(nesterov=1), r"nesterov=1 must be True or False"),
        (lambda: AdamW(betas=(1.0, 0.9)), r"must each be below 1"),
        (lambda: AdamW(betas=(0.9,)), r"betas=\(0.9,\) must be two numbers"),
        (lambda: AdamW(eps=0.0), r"eps=0.0 must be greater than 0"),
        (lambda: AdamW(weight_decay=-1), r"weight_decay=-1 must be at least 0"),
        (lambda: make_optimizer("adam"), r"optimizer='adam' is unknown; use one of \['sgd', 'adamw'\]"),
    ]:
        with pytest.raises(InputError, match=match):
            make()
