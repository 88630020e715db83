"""Each protocol op of a backend against the NumPy reference: its output and its gradients.

``OP_CASES`` are small seeded problems, one or more per op (the ResNet ops among them: BatchNorm
in its three uses, the joins, pooling with padding and in ceil mode, convolution without bias, the sum
over a process group, the copy between devices; and the transformer and ONNX ops, with
broadcasting shapes, negative axes, both GELU forms, repeated ids, a padding ignore index,
causal and padding masks, and attention composed of them). ``op_agreement`` runs each on a backend
and on the reference, each through the same scalar (cross-entropy of the flattened
output), and returns the worst differences of the outputs and of every gradient.
``multigpu check`` prints them; ``tests/test_ops.py`` asserts them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from multigpu.contract.protocol import Device

CPU, CPU1 = Device("cpu", 0), Device("cpu", 1)


class DoublingGroup:
    """A stand-in process group of two ranks that hold the same tensor: ``allreduce_`` doubles it."""

    def __init__(self, backend: Any):
        self.backend = backend

    def allreduce_(self, t: Any) -> None:
        """In place: the sum over two identical ranks."""
        self.backend.scale_(t, 2.0)


@dataclass(frozen=True, eq=False)
class OpCase:
    """``op(backend, *tensors, *constants)`` on seeded normal arrays of ``shapes`` (the first is the batch).

    ``constants`` are fixed arrays passed after the float inputs and never differentiated:
    int64 ids and labels, float32 or int64 masks, a dropout keep mask.
    """

    name: str
    op: Callable[..., Any]
    shapes: Sequence[tuple[int, ...]]
    constants: tuple[np.ndarray, ...] = ()


def _n(b: Any, x: Any, factor: int = 1) -> int:
    shape = b.shape(x)
    return factor * shape[0] * shape[2] * shape[3]


def _sync(b: Any, x: Any, g: Any, beta: Any, z: Any) -> Any:
    table = b.add(
        b.batch_norm_stats(x, 0, 2), b.batch_norm_stats(z, 1, 2)
    )  # x's statistics pooled with a second shard's
    return b.add(b.batch_norm_train(x, g, beta, 1e-5, stats=table, count=_n(b, x, 2))[0], z)


def _group(b: Any, x: Any, g: Any, beta: Any) -> Any:
    # two identical ranks, both in row 0: the summed table holds x's statistics doubled (a function like any other)
    table = b.batch_norm_stats(x, 0, 2)
    table = b.reshape(b.group_sum(b.reshape(table, (-1,)), DoublingGroup(b)), b.shape(table))
    return b.batch_norm_train(x, g, beta, 1e-5, stats=table, count=_n(b, x, 2))[0]


def _inference(b: Any, x: Any, g: Any, beta: Any) -> Any:
    c = b.shape(x)[1]
    mean = b.from_numpy(np.linspace(-0.5, 0.5, c), CPU)
    var = b.from_numpy(np.linspace(0.5, 2.0, c), CPU)
    return b.batch_norm(x, g, beta, mean, var, 1e-5)


# -- the transformer and ONNX ops --------------------------------------------------------

_ONE = np.ones((1,), np.float32)
_CAUSAL = np.triu(np.ones((4, 4), np.float32), k=1)  # 1 above the diagonal: a position sees no later one
_PADDING = np.array([0, 0, 0, 1, 0, 0, 1, 1], np.int64).reshape(2, 1, 1, 4)  # (B, 1, 1, T): 1 marks a pad
_KEEP = (np.random.default_rng(7).random((2, 3, 4)) > 0.25).astype(np.float32)


def _positive(b: Any, y: Any, one: Any) -> Any:
    """y * y + 1: a divisor (or a square root's argument) kept away from zero."""
    return b.add(b.multiply(y, y), one)


def _attention(b: Any, q: Any, k: Any, v: Any, mask: Any) -> Any:
    """Causal scaled dot-product attention over (B, H, T, D) heads, composed of the protocol ops."""
    scores = b.scale(b.matmul(q, b.transpose(k, (0, 1, 3, 2))), 1 / np.sqrt(b.shape(q)[-1]))
    return b.matmul(b.softmax(b.masked_fill(scores, mask, float("-inf")), -1), v)


TRANSFORMER_CASES = [
    OpCase("matmul (B, T, D) @ (D, E)", lambda b, x, y: b.matmul(x, y), [(2, 3, 4), (4, 5)]),
    OpCase("matmul broadcasting batch axes", lambda b, x, y: b.matmul(x, y), [(2, 1, 3, 4), (3, 4, 2)]),
    OpCase("transpose (0, 2, 1, 3)", lambda b, x: b.transpose(x, (0, 2, 1, 3)), [(2, 3, 4, 2)]),
    OpCase("transpose reversed", lambda b, x: b.transpose(x, (2, 1, 0)), [(2, 3, 4)]),
    OpCase("add broadcasting (2, 3, 4) + (3, 1)", lambda b, x, y: b.add(x, y), [(2, 3, 4), (3, 1)]),
    OpCase("add of equal shapes", lambda b, x, y: b.add(x, y), [(2, 5), (2, 5)]),
    OpCase("subtract broadcasting (4,) - (2, 3, 4)", lambda b, x, y: b.subtract(x, y), [(4,), (2, 3, 4)]),
    OpCase("multiply broadcasting (2, 1, 4) * (3, 1)", lambda b, x, y: b.multiply(x, y), [(2, 1, 4), (3, 1)]),
    OpCase(
        "divide broadcasting by y * y + 1",
        lambda b, x, y, one: b.divide(x, _positive(b, y, one)),
        [(2, 3, 4), (1, 4)],
        (_ONE,),
    ),
    OpCase("scale by -0.75", lambda b, x: b.scale(x, -0.75), [(2, 5)]),
    OpCase("tanh", lambda b, x: b.tanh(x), [(2, 3, 4)]),
    OpCase("sigmoid", lambda b, x: b.sigmoid(x), [(2, 3, 4)]),
    OpCase("gelu exact (erf)", lambda b, x: b.gelu(x, False), [(2, 3, 4)]),
    OpCase("gelu tanh approximation", lambda b, x: b.gelu(x, True), [(2, 3, 4)]),
    OpCase("erf", lambda b, x: b.erf(x), [(2, 3, 4)]),
    OpCase("sqrt of x * x + 1", lambda b, x, one: b.sqrt(_positive(b, x, one)), [(2, 3, 4)], (_ONE,)),
    OpCase("softmax axis -1", lambda b, x: b.softmax(x, -1), [(2, 3, 5)]),
    OpCase("softmax axis 1", lambda b, x: b.softmax(x, 1), [(2, 4, 3)]),
    OpCase("layer_norm over the last axis", lambda b, x, g, c: b.layer_norm(x, g, c, 1e-5), [(2, 3, 6), (6,), (6,)]),
    OpCase(
        "layer_norm over the last two axes, eps 1e-12",
        lambda b, x, g, c: b.layer_norm(x, g, c, 1e-12),
        [(2, 3, 4), (3, 4), (3, 4)],
    ),
    OpCase(
        "embedding with repeated ids",
        lambda b, table, ids: b.embedding(ids, table),
        [(5, 4)],
        (np.array([[1, 3, 1], [0, 3, 3]], np.int64),),
    ),
    OpCase("reduce_sum axes (0, -1) keepdims", lambda b, x: b.reduce_sum(x, (0, -1), True), [(2, 3, 4)]),
    OpCase("reduce_sum axis 1", lambda b, x: b.reduce_sum(x, [1], False), [(2, 3, 4)]),
    OpCase("reduce_mean axis -1 keepdims", lambda b, x: b.reduce_mean(x, [-1], True), [(2, 3, 4)]),
    OpCase("reduce_mean axes (2, 1)", lambda b, x: b.reduce_mean(x, (2, 1), False), [(2, 3, 4)]),
    OpCase(
        "masked_fill causal -inf, then softmax",
        lambda b, x, mask: b.softmax(b.masked_fill(x, mask, float("-inf")), -1),
        [(2, 2, 4, 4)],
        (_CAUSAL,),
    ),
    OpCase(
        "masked_fill int64 padding mask (B, 1, 1, T), -1e9, then softmax",
        lambda b, x, mask: b.softmax(b.masked_fill(x, mask, -1e9), -1),
        [(2, 2, 4, 4)],
        (_PADDING,),
    ),
    OpCase(
        "masked_fill 0.5 under a broadcast float mask",
        lambda b, x, mask: b.masked_fill(x, mask, 0.5),
        [(2, 3, 4)],
        (np.array([[1.0], [0.0], [1.0]], np.float32),),
    ),
    OpCase("dropout rate 0.25 with a given mask", lambda b, x, keep: b.dropout(x, keep, 0.25), [(2, 3, 4)], (_KEEP,)),
    OpCase(
        "dropout rate 0", lambda b, x, keep: b.dropout(x, keep, 0.0), [(2, 3, 4)], (np.ones((2, 3, 4), np.float32),)
    ),
    OpCase(
        "cross_entropy with padding ignore_index -100",
        lambda b, z, labels: b.cross_entropy(z, labels, -100),
        [(2, 3, 5)],
        (np.array([[1, -100, 4], [0, 2, -100]], np.int64),),
    ),
    OpCase(
        "cross_entropy ignore_index 0 (a pad id inside the classes)",
        lambda b, z, labels: b.cross_entropy(z, labels, 0),
        [(2, 3, 5)],
        (np.array([[0, 1, 2], [3, 0, 4]], np.int64),),
    ),
    OpCase("take (2, 0, 2) on axis -1", lambda b, x: b.take(x, [2, 0, 2], -1), [(2, 3, 4)]),
    OpCase("take (-1,) on axis 1", lambda b, x: b.take(x, (-1,), 1), [(2, 3, 4)]),
    OpCase("concatenate on axis -1", lambda b, x, y: b.concatenate([x, y, x], -1), [(2, 3, 2), (2, 3, 4)]),
    OpCase("concatenate on axis 1", lambda b, x, y: b.concatenate([x, y], 1), [(2, 1, 4), (2, 3, 4)]),
    OpCase("dense on (B, T, I)", lambda b, x, w, c: b.dense(x, w, c), [(2, 3, 4), (4, 5), (5,)]),
    OpCase("causal attention composed of the ops", _attention, [(2, 2, 4, 3), (2, 2, 4, 3), (2, 2, 4, 3)], (_CAUSAL,)),
]

OP_CASES = [
    OpCase("conv2d", lambda b, x, w, c: b.conv2d(x, w, c, 1, 1, 1), [(2, 3, 5, 5), (4, 3, 3, 3), (4,)]),
    OpCase(
        "conv2d without bias, stride 2", lambda b, x, w: b.conv2d(x, w, None, 2, 1, 1), [(2, 3, 5, 5), (4, 3, 3, 3)]
    ),
    OpCase("max_pool2d 3/2 with padding 1", lambda b, x: b.max_pool2d(x, 3, 2, 1, False), [(2, 2, 6, 6)]),
    OpCase("avg_pool2d with padding", lambda b, x: b.avg_pool2d(x, 2, 2, 1, False), [(2, 2, 5, 5)]),
    # Ceil mode: a last window over the edge on both axes; then one that would start in the
    # right padding on H only (torch drops it, Paddle's and MXNet's own rule keeps it).
    OpCase("max_pool2d 3/2 ceil mode", lambda b, x: b.max_pool2d(x, 3, 2, 0, True), [(2, 2, 6, 8)]),
    OpCase("avg_pool2d 3/2 pad 1 ceil mode", lambda b, x: b.avg_pool2d(x, 3, 2, 1, True), [(2, 2, 6, 8)]),
    OpCase(
        "max_pool2d ceil, a window dropped",
        lambda b, x: b.max_pool2d(x, 3, 3, 1, True),
        [(2, 2, 5, 7)],
    ),
    OpCase(
        "avg_pool2d ceil, a window dropped",
        lambda b, x: b.avg_pool2d(x, 3, 3, 1, True),
        [(2, 2, 5, 7)],
    ),
    OpCase("global_avg_pool2d", lambda b, x: b.global_avg_pool2d(x), [(2, 3, 4, 5)]),
    OpCase("batch_norm (inference)", _inference, [(2, 3, 3, 3), (3,), (3,)]),
    OpCase(
        "batch_norm_train", lambda b, x, g, beta: b.batch_norm_train(x, g, beta, 1e-5)[0], [(3, 4, 3, 3), (4,), (4,)]
    ),
    OpCase("batch_norm_train with stats", _sync, [(2, 3, 2, 3), (3,), (3,), (2, 3, 2, 3)]),
    OpCase("group_sum of BatchNorm stats", _group, [(2, 3, 2, 2), (3,), (3,)]),
    OpCase(
        "add and concat_channels",
        lambda b, x, y: b.concat_channels([b.add(x, y), x, b.relu(y)]),
        [(2, 2, 3, 3), (2, 2, 3, 3)],
    ),
    OpCase("dense and relu", lambda b, x, w, c: b.relu(b.dense(x, w, c)), [(3, 5), (5, 4), (4,)]),
    OpCase("copy_to there and back", lambda b, x: b.copy_to(b.relu(b.copy_to(x, CPU1)), CPU), [(2, 6)]),
    *TRANSFORMER_CASES,
]


@dataclass(frozen=True)
class OpAgreement:
    """The worst absolute differences of one op from the reference, and the reference's scale."""

    op: str
    forward: float
    gradient: float
    scale: float  # the largest magnitude among the reference's output and gradients


def case_arrays(case: OpCase, dtype: Any = np.float32) -> list[np.ndarray]:
    """The seeded inputs of ``case`` (normal, mean 0.5, standard deviation 2)."""
    rng = np.random.default_rng(len(case.name))
    return [(rng.standard_normal(s) * 2 + 0.5).astype(dtype) for s in case.shapes]


def case_labels(case: OpCase, reference: Any) -> np.ndarray:
    """Labels for the scalar of ``case``: one class of the flattened output per example."""
    constants = [reference.from_numpy(c, CPU) for c in case.constants]
    out = case.op(reference, *[reference.from_numpy(a, CPU) for a in case_arrays(case)], *constants)
    shape = reference.shape(out)
    rng = np.random.default_rng(len(case.name) + 1)
    return rng.integers(0, int(np.prod(shape[1:])), shape[0])


def scalar(backend: Any, out: Any, labels: Any) -> Any:
    """The sum over examples of the cross-entropy of the flattened ``out``: every output element
    gets its own gradient."""
    flat = backend.reshape(out, (backend.shape(out)[0], -1))
    return backend.sum(backend.softmax_cross_entropy(flat, labels))


def run_case(backend: Any, case: OpCase, labels: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """``case`` on ``backend``: its output and the gradient of every input, as numpy."""
    b = backend
    ts = [b.from_numpy(a, CPU) for a in case_arrays(case)]
    cs = [b.from_numpy(c, CPU) for c in case.constants]
    out = b.to_numpy(case.op(b, *ts, *cs))
    y = b.from_numpy(labels, CPU)
    flat = b.value_and_grad(lambda ps: scalar(b, case.op(b, *ps, *cs), y), ts)
    grads = b.unflatten(flat, [*(b.shape(t) for t in ts), (1,)])[:-1]
    return out, [b.to_numpy(g) for g in grads]


def op_agreement(backend: Any, reference: Any) -> list[OpAgreement]:
    """Every case of ``OP_CASES`` on ``backend`` against ``reference`` (both checked backends)."""
    rows = []
    for case in OP_CASES:
        labels = case_labels(case, reference)
        (out, grads), (ref_out, ref_grads) = run_case(backend, case, labels), run_case(reference, case, labels)
        rows.append(
            OpAgreement(
                op=case.name,
                forward=float(np.abs(out - ref_out).max()),
                gradient=max(float(np.abs(a - r).max()) for a, r in zip(grads, ref_grads)),
                scale=max([float(np.abs(ref_out).max()), *(float(np.abs(g).max()) for g in ref_grads)]),
            )
        )
    return rows
