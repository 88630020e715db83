"""Each protocol op of a backend against the NumPy reference: its output and its gradients.

``OP_CASES`` are small seeded problems, one per op (the ResNet ops among them: BatchNorm
in its three uses, the joins, pooling with padding, convolution without bias, the sum
over a process group, the copy between devices). ``op_agreement`` runs each on a backend
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


@dataclass(frozen=True)
class OpCase:
    """``op(backend, *tensors)`` on seeded normal arrays of ``shapes`` (the first is the batch)."""

    name: str
    op: Callable[..., Any]
    shapes: Sequence[tuple[int, ...]]


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


OP_CASES = [
    OpCase("conv2d", lambda b, x, w, c: b.conv2d(x, w, c, 1, 1, 1), [(2, 3, 5, 5), (4, 3, 3, 3), (4,)]),
    OpCase(
        "conv2d without bias, stride 2", lambda b, x, w: b.conv2d(x, w, None, 2, 1, 1), [(2, 3, 5, 5), (4, 3, 3, 3)]
    ),
    OpCase("max_pool2d 3/2 with padding 1", lambda b, x: b.max_pool2d(x, 3, 2, 1), [(2, 2, 6, 6)]),
    OpCase("avg_pool2d with padding", lambda b, x: b.avg_pool2d(x, 2, 2, 1), [(2, 2, 5, 5)]),
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
    out = case.op(reference, *[reference.from_numpy(a, CPU) for a in case_arrays(case)])
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
    out = b.to_numpy(case.op(b, *ts))
    y = b.from_numpy(labels, CPU)
    flat = b.value_and_grad(lambda ps: scalar(b, case.op(b, *ps), y), ts)
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
