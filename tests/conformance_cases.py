"""The bad calls of the conformance suite: one row each, the exception every backend must raise.

Shared by ``test_contract.py`` (which asserts the type on every adapter) and
``conformance_table.py`` (which prints the table: bad call x adapter -> exception).
``issue`` marks the cases that issue 10 reported, with the divergence it found.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from multigpu.contract.protocol import Device
from multigpu.errors import DeviceError, InputError

CPU, CPU1 = Device("cpu", 0), Device("cpu", 1)
THIRD_PARTY_DIR = Path(__file__).parent / "thirdparty"  # holds mgpu_lenient and its .dist-info
THIRD_PARTY = "lenient"


def third_party_on_path() -> None:
    """Put the third-party distribution where importlib.metadata finds its entry point."""
    if str(THIRD_PARTY_DIR) not in sys.path:
        sys.path.insert(0, str(THIRD_PARTY_DIR))


def third_party_off_path() -> None:
    """Undo :func:`third_party_on_path`."""
    while str(THIRD_PARTY_DIR) in sys.path:
        sys.path.remove(str(THIRD_PARTY_DIR))


@dataclass(frozen=True)
class Case:
    """One bad call: ``call(backend)`` must raise ``raises`` (that exact class) on every backend."""

    name: str
    raises: type
    call: Callable[[Any], Any]
    issue: str = ""  # what issue 10 found, for the cases it reported


def f32(be: Any, *shape: int, device: Device = CPU) -> Any:
    """A float32 tensor of ``shape`` with seeded normal values."""
    return be.from_numpy(np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32), device)


def i64(be: Any, values: Any, device: Device = CPU) -> Any:
    """An int64 tensor holding ``values``."""
    return be.from_numpy(np.asarray(values, np.int64), device)


def _ce(labels: Any) -> Callable[[Any], Any]:
    return lambda be: be.softmax_cross_entropy(f32(be, 2, 3), i64(be, labels))


class _NoGroup:
    """Looks like a process group; a bad call must be refused before it is used."""

    def allreduce_(self, t: Any) -> None:
        raise AssertionError("the contract should have refused the call first")


def _vg(fn: Callable[..., Any], params: Callable[[Any], list[Any]]) -> Callable[[Any], Any]:
    return lambda be: be.value_and_grad(lambda ps: fn(be, ps), params(be))


CASES: list[Case] = [
    # -- the cases issue 10 reported --------------------------------------------------
    Case(
        "assign_ (3,) <- (1,)",
        InputError,
        lambda be: be.assign_(f32(be, 3), f32(be, 1)),
        "numpy and torch broadcast, mxnet raised, paddle resized dst to 1 element",
    ),
    Case(
        "assign_ (3,) <- (6,)",
        InputError,
        lambda be: be.assign_(f32(be, 3), f32(be, 6)),
        "paddle resized dst to 6 elements",
    ),
    Case(
        "softmax_cross_entropy label -1",
        InputError,
        _ce([0, -1]),
        "numpy wrapped to the last class, mxnet clipped to class 0",
    ),
    Case("softmax_cross_entropy label -100", InputError, _ce([0, -100]), "paddle returned loss 0 (its ignore_index)"),
    Case(
        "split sizes [1, 1] of 3 rows",
        InputError,
        lambda be: be.split(f32(be, 3, 2), [1, 1]),
        "numpy accepted sizes that do not add up",
    ),
    Case(
        "split sizes [0, 3] (a zero size)",
        InputError,
        lambda be: be.split(f32(be, 3, 2), [0, 3]),
        "numpy, torch and paddle accepted a zero size",
    ),
    Case(
        "from_numpy bool array",
        InputError,
        lambda be: be.from_numpy(np.array([True, False]), CPU),
        "numpy gave float32, mxnet int64",
    ),
    Case(
        "from_numpy complex array",
        InputError,
        lambda be: be.from_numpy(np.array([1 + 2j]), CPU),
        "numpy dropped the imaginary part",
    ),
    # -- every other method, with wrong shapes, dtypes, sizes, labels and devices ------
    Case("add_ (3,) += (1,)", InputError, lambda be: be.add_(f32(be, 3), f32(be, 1))),
    Case("assign_ float32 <- int64", InputError, lambda be: be.assign_(f32(be, 3), i64(be, [1, 2, 3]))),
    Case("softmax_cross_entropy label == classes", InputError, _ce([0, 3])),
    Case(
        "softmax_cross_entropy float labels", InputError, lambda be: be.softmax_cross_entropy(f32(be, 2, 3), f32(be, 2))
    ),
    Case("softmax_cross_entropy 3 labels for 2 rows", InputError, _ce([0, 1, 2])),
    Case(
        "softmax_cross_entropy labels from argmax, out of range",
        InputError,
        lambda be: be.softmax_cross_entropy(  # argmax gives [10, 11]: checked by reading them back
            f32(be, 2, 3), be.argmax(be.from_numpy(np.eye(2, 40, k=10, dtype=np.float32), CPU), 1)
        ),
    ),
    Case("split sizes [-1, 4]", InputError, lambda be: be.split(f32(be, 3, 2), [-1, 4])),
    Case("from_numpy string array", InputError, lambda be: be.from_numpy(np.array(["a"]), CPU)),
    Case("from_numpy on Device('tpu', 0)", DeviceError, lambda be: be.from_numpy(np.zeros(2), Device("tpu", 0))),
    Case(
        "from_numpy on a GPU the framework lacks", DeviceError, lambda be: be.from_numpy(np.zeros(2), Device("gpu", 99))
    ),
    Case("copy_to Device('cpu', -1)", DeviceError, lambda be: be.copy_to(f32(be, 2), Device("cpu", -1))),
    Case("synchronize('cpu:0') (a string)", DeviceError, lambda be: be.synchronize("cpu:0")),
    Case(
        "conv2d channels 2 vs weight's 3",
        InputError,
        lambda be: be.conv2d(f32(be, 1, 2, 5, 5), f32(be, 4, 3, 3, 3), f32(be, 4), 1, 0, 1),
    ),
    Case(
        "conv2d kernel 5 > input 3",
        InputError,
        lambda be: be.conv2d(f32(be, 1, 1, 3, 3), f32(be, 2, 1, 5, 5), f32(be, 2), 1, 0, 1),
    ),
    Case(
        "conv2d groups=2, 3 out channels",
        InputError,
        lambda be: be.conv2d(f32(be, 1, 2, 5, 5), f32(be, 3, 1, 3, 3), f32(be, 3), 1, 0, 2),
    ),
    Case(
        "conv2d 3-D input", InputError, lambda be: be.conv2d(f32(be, 1, 5, 5), f32(be, 2, 1, 3, 3), f32(be, 2), 1, 0, 1)
    ),
    Case(
        "conv2d stride 0",
        InputError,
        lambda be: be.conv2d(f32(be, 1, 1, 5, 5), f32(be, 2, 1, 3, 3), f32(be, 2), 0, 0, 1),
    ),
    Case(
        "avg_pool2d padding 2 > kernel 2 // 2",
        InputError,
        lambda be: be.avg_pool2d(f32(be, 1, 1, 4, 4), 2, 2, 2, False),
    ),
    Case("max_pool2d kernel 5 > input 4", InputError, lambda be: be.max_pool2d(f32(be, 1, 1, 4, 4), 5, 1, 0, False)),
    Case(
        "max_pool2d kernel 5 > input 4 in ceil mode",
        InputError,
        lambda be: be.max_pool2d(f32(be, 1, 1, 4, 4), 5, 1, 0, True),
    ),
    Case("max_pool2d ceil_mode=1 (not a bool)", InputError, lambda be: be.max_pool2d(f32(be, 1, 1, 4, 4), 2, 2, 0, 1)),
    Case(
        "avg_pool2d ceil_mode='ceil' (a string)",
        InputError,
        lambda be: be.avg_pool2d(f32(be, 1, 1, 4, 4), 2, 2, 0, "ceil"),
    ),
    Case("dense x (2, 3) @ w (4, 5)", InputError, lambda be: be.dense(f32(be, 2, 3), f32(be, 4, 5), f32(be, 5))),
    Case("dense bias (4,) for 5 outputs", InputError, lambda be: be.dense(f32(be, 2, 3), f32(be, 3, 5), f32(be, 4))),
    Case("reshape 6 elements to (4, -1)", InputError, lambda be: be.reshape(f32(be, 2, 3), (4, -1))),
    Case("reshape to (-1, -1)", InputError, lambda be: be.reshape(f32(be, 2, 3), (-1, -1))),
    Case("reshape to (0, 6)", InputError, lambda be: be.reshape(f32(be, 2, 3), (0, 6))),
    Case("relu on int64", InputError, lambda be: be.relu(i64(be, [1, -2]))),
    Case("relu on an empty tensor", InputError, lambda be: be.relu(f32(be, 0, 3))),
    Case("sum of an empty tensor", InputError, lambda be: be.sum(f32(be, 0))),
    Case("argmax axis 2 of a 2-D tensor", InputError, lambda be: be.argmax(f32(be, 2, 3), 2)),
    Case("concat []", InputError, lambda be: be.concat([])),
    Case("concat (2, 3) with (2, 4)", InputError, lambda be: be.concat([f32(be, 2, 3), f32(be, 2, 4)])),
    Case("flatten []", InputError, lambda be: be.flatten([])),
    Case("flatten float32 with int64", InputError, lambda be: be.flatten([f32(be, 2), i64(be, [1])])),
    Case("unflatten 5 elements into (2,) + (2,)", InputError, lambda be: be.unflatten(f32(be, 5), [(2,), (2,)])),
    Case("unflatten a 2-D buffer", InputError, lambda be: be.unflatten(f32(be, 2, 2), [(4,)])),
    Case(
        "value_and_grad fn returns a (3,) vector",
        InputError,
        _vg(lambda be, ps: be.relu(ps[0]), lambda be: [f32(be, 3)]),
    ),
    Case("value_and_grad no params", InputError, _vg(lambda be, ps: be.sum(f32(be, 2)), lambda be: [])),
    Case("value_and_grad int64 param", InputError, _vg(lambda be, ps: be.sum(f32(be, 2)), lambda be: [i64(be, [1])])),
    Case("sgd_ 2 params, 1 grad", InputError, lambda be: be.sgd_([f32(be, 2), f32(be, 2)], [f32(be, 2)], 0.1)),
    Case("sgd_ param (2,), grad (3,)", InputError, lambda be: be.sgd_([f32(be, 2)], [f32(be, 3)], 0.1)),
    Case("sgd_ lr nan", InputError, lambda be: be.sgd_([f32(be, 2)], [f32(be, 2)], float("nan"))),
    Case("relu(numpy array), not a tensor", InputError, lambda be: be.relu(np.ones(3, np.float32))),
    # -- the ops of issue 15: BatchNorm, joins, pooling, the group sum, whole-buffer math --
    Case(
        "conv2d bias (3,) for 4 out channels",
        InputError,
        lambda be: be.conv2d(f32(be, 1, 2, 5, 5), f32(be, 4, 2, 3, 3), f32(be, 3), 1, 0, 1),
    ),
    Case("global_avg_pool2d of a 2-D tensor", InputError, lambda be: be.global_avg_pool2d(f32(be, 2, 3))),
    Case(
        "batch_norm gamma (3,) for 4 channels",
        InputError,
        lambda be: be.batch_norm(f32(be, 2, 4, 3, 3), f32(be, 3), f32(be, 4), f32(be, 4), f32(be, 4), 1e-5),
    ),
    Case(
        "batch_norm eps 0",
        InputError,
        lambda be: be.batch_norm(f32(be, 2, 4, 3, 3), f32(be, 4), f32(be, 4), f32(be, 4), f32(be, 4), 0.0),
    ),
    Case(
        "batch_norm_train on one example at 1x1 (one value per channel)",
        InputError,
        lambda be: be.batch_norm_train(f32(be, 1, 4, 1, 1), f32(be, 4), f32(be, 4), 1e-5),
    ),
    Case(
        "batch_norm_train eps nan",
        InputError,
        lambda be: be.batch_norm_train(f32(be, 2, 4, 3, 3), f32(be, 4), f32(be, 4), float("nan")),
    ),
    Case(
        "batch_norm_train stats of shape (2, 2, 4), not (parts, 3, 4)",
        InputError,
        lambda be: be.batch_norm_train(
            f32(be, 2, 4, 3, 3), f32(be, 4), f32(be, 4), 1e-5, stats=f32(be, 2, 2, 4), count=36
        ),
    ),
    Case(
        "batch_norm_train stats without count",
        InputError,
        lambda be: be.batch_norm_train(f32(be, 2, 4, 3, 3), f32(be, 4), f32(be, 4), 1e-5, stats=f32(be, 2, 3, 4)),
    ),
    Case(
        "batch_norm_train stats with count 1",
        InputError,
        lambda be: be.batch_norm_train(
            f32(be, 2, 4, 3, 3), f32(be, 4), f32(be, 4), 1e-5, stats=f32(be, 2, 3, 4), count=1
        ),
    ),
    Case(
        "batch_norm_train count without stats",
        InputError,
        lambda be: be.batch_norm_train(f32(be, 2, 4, 3, 3), f32(be, 4), f32(be, 4), 1e-5, count=36),
    ),
    Case("batch_norm_stats of a 3-D tensor", InputError, lambda be: be.batch_norm_stats(f32(be, 2, 4, 3))),
    Case("batch_norm_stats part 2 of 2", InputError, lambda be: be.batch_norm_stats(f32(be, 2, 4, 3, 3), 2, 2)),
    Case("batch_norm_stats parts 0", InputError, lambda be: be.batch_norm_stats(f32(be, 2, 4, 3, 3), 0, 0)),
    Case(
        "add (2, 3) + (3, 2) (shapes that do not broadcast)",
        InputError,
        lambda be: be.add(f32(be, 2, 3), f32(be, 3, 2)),
    ),
    Case(
        "concat_channels of H 3 and H 4",
        InputError,
        lambda be: be.concat_channels([f32(be, 1, 2, 3, 3), f32(be, 1, 2, 4, 3)]),
    ),
    Case("concat_channels []", InputError, lambda be: be.concat_channels([])),
    Case("group_sum of a 2-D tensor", InputError, lambda be: be.group_sum(f32(be, 2, 2), _NoGroup())),
    Case("group_sum without a process group", InputError, lambda be: be.group_sum(f32(be, 4), object())),
    Case("axpby_ y (3,), x (4,)", InputError, lambda be: be.axpby_(f32(be, 3), 0.9, f32(be, 4), 0.1)),
    Case("axpby_ a nan", InputError, lambda be: be.axpby_(f32(be, 3), float("nan"), f32(be, 3), 0.1)),
    Case(
        "addcmul_ x2 (2,) for y (3,)", InputError, lambda be: be.addcmul_(f32(be, 3), 0.9, f32(be, 3), f32(be, 2), 0.1)
    ),
    Case(
        "addcdiv_sqrt_ divisor 0",
        InputError,
        lambda be: be.addcdiv_sqrt_(f32(be, 3), f32(be, 3), f32(be, 3), -0.1, 0.0, 1e-8),
    ),
    Case("scale_ by inf", InputError, lambda be: be.scale_(f32(be, 3), float("inf"))),
    Case("scale_ an int64 tensor", InputError, lambda be: be.scale_(i64(be, [1, 2]), 2.0)),
    Case(
        "value_and_grad(aux=True) fn returns no aux",
        InputError,
        lambda be: be.value_and_grad(lambda ps: be.sum(ps[0]), [f32(be, 3)], aux=True),
    ),
    Case(
        "value_and_grad out of 3 elements for 3 gradients and the value",
        InputError,
        lambda be: be.value_and_grad(lambda ps: be.sum(ps[0]), [f32(be, 3)], out=f32(be, 3)),
    ),
    Case(
        "value_and_grad aux='yes'",
        InputError,
        lambda be: be.value_and_grad(lambda ps: be.sum(ps[0]), [f32(be, 3)], aux="yes"),
    ),
    Case(
        "value_and_grad buckets without on_bucket",
        InputError,
        lambda be: be.value_and_grad(lambda ps: be.sum(ps[0]), [f32(be, 3)], out=f32(be, 4), buckets=[(0, 1)]),
    ),
    Case(
        "value_and_grad buckets without out",
        InputError,
        lambda be: be.value_and_grad(
            lambda ps: be.sum(ps[0]), [f32(be, 3)], buckets=[(0, 1)], on_bucket=lambda k: None
        ),
    ),
    Case(
        "value_and_grad buckets leave parameter 0 out",
        InputError,
        lambda be: be.value_and_grad(
            lambda ps: be.sum(ps[1]),
            [f32(be, 3), f32(be, 2)],
            out=f32(be, 6),
            buckets=[(1, 2)],
            on_bucket=lambda k: None,
        ),
    ),
    Case(
        "value_and_grad buckets in forward order",
        InputError,
        lambda be: be.value_and_grad(
            lambda ps: be.sum(ps[1]),
            [f32(be, 3), f32(be, 2)],
            out=f32(be, 6),
            buckets=[(0, 1), (1, 2)],
            on_bucket=lambda k: None,
        ),
    ),
    Case(
        "value_and_grad buckets of floats",
        InputError,
        lambda be: be.value_and_grad(
            lambda ps: be.sum(ps[0]), [f32(be, 3)], out=f32(be, 4), buckets=[(0.0, 1.0)], on_bucket=lambda k: None
        ),
    ),
    Case(
        "value_and_grad out as a list without buckets",
        InputError,
        lambda be: be.value_and_grad(lambda ps: be.sum(ps[0]), [f32(be, 3)], out=[f32(be, 4)]),
    ),
    Case(
        "value_and_grad one out buffer for two buckets",
        InputError,
        lambda be: be.value_and_grad(
            lambda ps: be.sum(ps[1]),
            [f32(be, 3), f32(be, 2)],
            out=[f32(be, 6)],
            buckets=[(1, 2), (0, 1)],
            on_bucket=lambda k: None,
        ),
    ),
    Case(
        "value_and_grad bucket 0's buffer without the value's place",
        InputError,
        lambda be: be.value_and_grad(
            lambda ps: be.sum(ps[1]),
            [f32(be, 3), f32(be, 2)],
            out=[f32(be, 2), f32(be, 3)],
            buckets=[(1, 2), (0, 1)],
            on_bucket=lambda k: None,
        ),
    ),
    # -- the transformer and ONNX ops (issues 37 and 38) ---------------------------------
    Case("add int64 + float32", InputError, lambda be: be.add(i64(be, [1, 2]), f32(be, 2))),
    Case("subtract (2, 3) - (4, 3)", InputError, lambda be: be.subtract(f32(be, 2, 3), f32(be, 4, 3))),
    Case("multiply (2, 3) * (2,)", InputError, lambda be: be.multiply(f32(be, 2, 3), f32(be, 2))),
    Case("divide (3,) / (2, 2)", InputError, lambda be: be.divide(f32(be, 3), f32(be, 2, 2))),
    Case("divide by an empty tensor", InputError, lambda be: be.divide(f32(be, 3), f32(be, 0))),
    Case("matmul (2, 3) @ (4, 5)", InputError, lambda be: be.matmul(f32(be, 2, 3), f32(be, 4, 5))),
    Case("matmul of a 1-D tensor", InputError, lambda be: be.matmul(f32(be, 3), f32(be, 3, 2))),
    Case("matmul batch axes 2 against 3", InputError, lambda be: be.matmul(f32(be, 2, 3, 4), f32(be, 3, 4, 5))),
    Case("transpose perm (0, 0)", InputError, lambda be: be.transpose(f32(be, 2, 3), (0, 0))),
    Case("transpose perm (1, 0) of a 3-D tensor", InputError, lambda be: be.transpose(f32(be, 2, 3, 4), (1, 0))),
    Case("transpose perm (-1, 0) (negative)", InputError, lambda be: be.transpose(f32(be, 2, 3), (-1, 0))),
    Case("scale by nan", InputError, lambda be: be.scale(f32(be, 3), float("nan"))),
    Case("scale by '2' (a string)", InputError, lambda be: be.scale(f32(be, 3), "2")),
    Case("tanh on int64", InputError, lambda be: be.tanh(i64(be, [1, 2]))),
    Case("sigmoid on an empty tensor", InputError, lambda be: be.sigmoid(f32(be, 2, 0))),
    Case("erf(numpy array), not a tensor", InputError, lambda be: be.erf(np.ones(3, np.float32))),
    Case("sqrt on int64", InputError, lambda be: be.sqrt(i64(be, [4]))),
    Case("gelu approximate='tanh' (a string)", InputError, lambda be: be.gelu(f32(be, 3), "tanh")),
    Case("gelu approximate=1 (not a bool)", InputError, lambda be: be.gelu(f32(be, 3), 1)),
    Case("softmax axis 3 of a 3-D tensor", InputError, lambda be: be.softmax(f32(be, 2, 3, 4), 3)),
    Case("softmax axis -4 of a 3-D tensor", InputError, lambda be: be.softmax(f32(be, 2, 3, 4), -4)),
    Case("softmax axis True", InputError, lambda be: be.softmax(f32(be, 2, 3), True)),
    Case(
        "layer_norm gamma (4,) for x (2, 3)",
        InputError,
        lambda be: be.layer_norm(f32(be, 2, 3), f32(be, 4), f32(be, 4), 1e-5),
    ),
    Case(
        "layer_norm gamma (3,) with beta (4,)",
        InputError,
        lambda be: be.layer_norm(f32(be, 2, 3), f32(be, 3), f32(be, 4), 1e-5),
    ),
    Case(
        "layer_norm gamma (2, 3) for x (2, 3, 4) (leading axes)",
        InputError,
        lambda be: be.layer_norm(f32(be, 2, 3, 4), f32(be, 2, 3), f32(be, 2, 3), 1e-5),
    ),
    Case("layer_norm eps 0", InputError, lambda be: be.layer_norm(f32(be, 2, 3), f32(be, 3), f32(be, 3), 0.0)),
    Case(
        "layer_norm eps inf", InputError, lambda be: be.layer_norm(f32(be, 2, 3), f32(be, 3), f32(be, 3), float("inf"))
    ),
    Case("embedding float ids", InputError, lambda be: be.embedding(f32(be, 2, 3), f32(be, 5, 4))),
    Case("embedding id 5 of a 5-row table", InputError, lambda be: be.embedding(i64(be, [[0, 5]]), f32(be, 5, 4))),
    Case("embedding id -1", InputError, lambda be: be.embedding(i64(be, [[-1, 2], [0, 1]]), f32(be, 5, 4))),
    Case(
        "embedding ids reshaped, out of range",
        InputError,
        lambda be: be.embedding(be.reshape(i64(be, [0, 1, 2, 7]), (2, 2)), f32(be, 5, 4)),
    ),
    Case(
        "embedding ids from argmax, out of range",
        InputError,
        lambda be: be.embedding(  # argmax gives [10, 11]: checked by reading them back
            be.argmax(be.from_numpy(np.eye(2, 40, k=10, dtype=np.float32), CPU), 1), f32(be, 5, 4)
        ),
    ),
    Case("embedding table of rank 3", InputError, lambda be: be.embedding(i64(be, [0, 1]), f32(be, 5, 4, 2))),
    Case("embedding empty ids", InputError, lambda be: be.embedding(i64(be, np.zeros((2, 0))), f32(be, 5, 4))),
    Case("reduce_sum axes []", InputError, lambda be: be.reduce_sum(f32(be, 2, 3), [], False)),
    Case(
        "reduce_sum axes (1, -1) (one axis twice)", InputError, lambda be: be.reduce_sum(f32(be, 2, 3), (1, -1), False)
    ),
    Case("reduce_sum axis 2 of a 2-D tensor", InputError, lambda be: be.reduce_sum(f32(be, 2, 3), [2], False)),
    Case("reduce_sum keepdims=1", InputError, lambda be: be.reduce_sum(f32(be, 2, 3), [1], 1)),
    Case("reduce_mean axis -3 of a 2-D tensor", InputError, lambda be: be.reduce_mean(f32(be, 2, 3), [-3], True)),
    Case("reduce_mean axes 1 (not a list)", InputError, lambda be: be.reduce_mean(f32(be, 2, 3), 1, True)),
    Case(
        "masked_fill mask (3,) for x (2, 4)",
        InputError,
        lambda be: be.masked_fill(f32(be, 2, 4), i64(be, [0, 1, 0]), -1e9),
    ),
    Case(
        "masked_fill mask (2, 2, 4) for x (2, 4) (it would grow x)",
        InputError,
        lambda be: be.masked_fill(f32(be, 2, 4), i64(be, np.zeros((2, 2, 4))), -1e9),
    ),
    Case(
        "masked_fill value nan",
        InputError,
        lambda be: be.masked_fill(f32(be, 2, 4), i64(be, [0, 1, 0, 1]), float("nan")),
    ),
    Case(
        "masked_fill value '-inf' (a string)",
        InputError,
        lambda be: be.masked_fill(f32(be, 2, 4), i64(be, [0, 1, 0, 1]), "-inf"),
    ),
    Case(
        "masked_fill mask as a numpy array",
        InputError,
        lambda be: be.masked_fill(f32(be, 2, 4), np.zeros(4, np.int64), -1e9),
    ),
    Case("dropout rate 1", InputError, lambda be: be.dropout(f32(be, 2, 3), f32(be, 2, 3), 1.0)),
    Case("dropout rate -0.1", InputError, lambda be: be.dropout(f32(be, 2, 3), f32(be, 2, 3), -0.1)),
    Case("dropout keep (2, 4) for x (2, 3)", InputError, lambda be: be.dropout(f32(be, 2, 3), f32(be, 2, 4), 0.1)),
    Case("dropout keep int64", InputError, lambda be: be.dropout(f32(be, 2), i64(be, [1, 0]), 0.1)),
    Case(
        "cross_entropy label -1 with ignore_index -100",
        InputError,
        lambda be: be.cross_entropy(f32(be, 2, 3, 4), i64(be, [[0, -100, -1], [1, 2, 3]]), -100),
    ),
    Case(
        "cross_entropy label 4 of 4 classes",
        InputError,
        lambda be: be.cross_entropy(f32(be, 2, 3, 4), i64(be, [[0, 1, 4], [1, 2, 3]]), -100),
    ),
    Case(
        "cross_entropy label -100 with ignore_index -1",
        InputError,
        lambda be: be.cross_entropy(f32(be, 2, 3, 4), i64(be, [[0, -1, -100], [1, 2, 3]]), -1),
    ),
    Case(
        "cross_entropy labels (2,) for logits (2, 3, 4)",
        InputError,
        lambda be: be.cross_entropy(f32(be, 2, 3, 4), i64(be, [0, 1]), -100),
    ),
    Case(
        "cross_entropy float labels",
        InputError,
        lambda be: be.cross_entropy(f32(be, 2, 3, 4), f32(be, 2, 3), -100),
    ),
    Case("cross_entropy 1-D logits", InputError, lambda be: be.cross_entropy(f32(be, 4), i64(be, 0), -100)),
    Case(
        "cross_entropy ignore_index 1.5",
        InputError,
        lambda be: be.cross_entropy(f32(be, 2, 4), i64(be, [0, 1]), 1.5),
    ),
    Case(
        "cross_entropy labels from argmax, out of range",
        InputError,
        lambda be: be.cross_entropy(  # argmax gives [10, 11]: checked by reading them back
            f32(be, 2, 3), be.argmax(be.from_numpy(np.eye(2, 40, k=10, dtype=np.float32), CPU), 1), -100
        ),
    ),
    Case("take indices []", InputError, lambda be: be.take(f32(be, 2, 3), [], 1)),
    Case("take index 3 of an axis of 3", InputError, lambda be: be.take(f32(be, 2, 3), [0, 3], 1)),
    Case("take index -4 of an axis of 3", InputError, lambda be: be.take(f32(be, 2, 3), [-4], -1)),
    Case("take index 0.5", InputError, lambda be: be.take(f32(be, 2, 3), [0.5], 1)),
    Case("take axis 2 of a 2-D tensor", InputError, lambda be: be.take(f32(be, 2, 3), [0], 2)),
    Case("concatenate []", InputError, lambda be: be.concatenate([], 0)),
    Case("concatenate ranks 2 and 3", InputError, lambda be: be.concatenate([f32(be, 2, 3), f32(be, 2, 3, 1)], 1)),
    Case(
        "concatenate (2, 3) with (3, 3) on axis 1",
        InputError,
        lambda be: be.concatenate([f32(be, 2, 3), f32(be, 3, 3)], 1),
    ),
    Case("concatenate axis 2 of 2-D tensors", InputError, lambda be: be.concatenate([f32(be, 2, 3)], 2)),
    Case("concatenate int64 tensors", InputError, lambda be: be.concatenate([i64(be, [1]), i64(be, [2])], 0)),
    Case("dense of a 1-D x", InputError, lambda be: be.dense(f32(be, 3), f32(be, 3, 5), f32(be, 5))),
    Case("dense x (2, 3, 4) @ w (3, 5)", InputError, lambda be: be.dense(f32(be, 2, 3, 4), f32(be, 3, 5), f32(be, 5))),
]
