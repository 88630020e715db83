"""Every allreduce algorithm leaves the exact sum in every replica, in separate buffers."""

from __future__ import annotations

import numpy as np
import pytest

import multigpu
from multigpu.contract.protocol import Device
from multigpu.parallel.allreduce import naive_allreduce, ring_allreduce

ALGOS = ["naive", "ring", "fused"]


def _replicas(be, n, shapes, seed):
    rng = np.random.default_rng(seed)
    devices = [Device("cpu", i) for i in range(n)]
    # Small integers in float32: every summation order gives the exact same sum.
    host = [[rng.integers(-50, 50, s).astype(np.float32) for s in shapes] for _ in range(n)]
    return devices, host, [[be.from_numpy(a, d) for a in per] for per, d in zip(host, devices)]


@pytest.mark.parametrize("algorithm", ALGOS + ["native"])
@pytest.mark.parametrize("n", range(1, 9))
def test_every_replica_holds_the_exact_sum(be, algorithm, n):
    if algorithm == "native" and not hasattr(be, "native_allreduce"):
        with pytest.raises(multigpu.UnknownAlgorithmError, match="native"):
            multigpu.allreduce_grads(be, [[]], [Device("cpu", 0)], algorithm)
        return
    shapes = [(7,), (3, 5), (1,), (2, 3, 3), (11, 1)]  # sizes that do not divide by n
    devices, host, grads = _replicas(be, n, shapes, seed=n)
    multigpu.allreduce_grads(be, grads, devices, algorithm)
    for i, s in enumerate(shapes):
        want = sum(per[i] for per in host)
        for per in grads:
            got = be.to_numpy(per[i])
            assert got.shape == s
            np.testing.assert_array_equal(got, want)
    # No replica aliases another: changing one leaves the others alone.
    be.add_(grads[0][1], be.from_numpy(np.ones(shapes[1], np.float32), devices[0]))
    for per in grads[1:]:
        np.testing.assert_array_equal(be.to_numpy(per[1]), sum(p[1] for p in host))


@pytest.mark.parametrize("fn", [naive_allreduce, ring_allreduce])
def test_single_tensor_algorithms_work_in_place(be, fn):
    devices, host, grads = _replicas(be, 3, [(10,)], seed=0)
    tensors = [g[0] for g in grads]
    fn(be, tensors, devices)
    for t in tensors:
        np.testing.assert_array_equal(be.to_numpy(t), host[0][0] + host[1][0] + host[2][0])


def test_unknown_algorithm_names_the_choices(ref):
    with pytest.raises(multigpu.UnknownAlgorithmError, match="'tree'.*naive"):
        multigpu.allreduce_grads(ref, [[], []], [Device("cpu", 0), Device("cpu", 1)], "tree")
