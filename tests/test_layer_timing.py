"""The profiler's layer times: prefixes of the model and each layer alone, through a fake worker.

A worker whose layers take known times (plus a stage overhead when a call starts, plus noise
that grows with the work timed, as a long prefix's median moves by more than a small layer
takes): the whole pass keeps its time, and each layer's share comes from the layer alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from multigpu.execution.layer_timing import MIN_LAYER_TIME, split_pass, time_devices

TIMES = [4e-3, 1e-4, 5e-3, 2e-4, 1e-4, 3e-3]  # seconds per layer: big and tiny ones
OVERHEAD = 2e-4
CONVERT = 3e-5  # the driver's input onto the device and output back to numpy, in a local run


class FakeWorker:
    """A stage worker whose calls take the layers' times: a prefix of k layers, one layer alone."""

    name = "drv"

    def __init__(self, noise: float, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.noise = noise

    def _jitter(self, t: float) -> float:
        return t * (1 + self.noise * self.rng.standard_normal())

    def prepare_profile(self, *args):
        return None

    def time_pass(self):
        return list(TIMES)

    def time_prefix(self, k: int) -> float:
        return self._jitter(OVERHEAD + sum(TIMES[:k]))

    def time_first(self, k: int) -> float:
        return self._jitter(OVERHEAD + TIMES[k])

    def time_local_pass(self) -> float:
        return self._jitter(CONVERT + OVERHEAD + sum(TIMES))


class FakeWorkers:
    actors: dict = {}
    timeout = 10.0

    def __init__(self, noise: float):
        self.local = FakeWorker(noise)


def test_each_layer_gets_its_own_time_and_the_pass_keeps_its_total():
    got = time_devices(FakeWorkers(0.0), ["drv"], list(TIMES), 1, 5, 1, 0)["drv"]
    med, q1, q3, n, overhead, full, warm = got
    assert overhead == pytest.approx(OVERHEAD)
    assert med == pytest.approx(TIMES)
    assert sum(med) + overhead == pytest.approx(full[1])  # a whole pass as one stage
    # The driver's passes back to back, as it runs a local plan's items: with the conversions,
    # which the layers' times and the stage overhead leave out.
    assert warm == pytest.approx(CONVERT + OVERHEAD + sum(TIMES))
    assert all(a <= m <= b for a, m, b in zip(q1, med, q3)) and n == 5


def test_a_tiny_layer_is_not_priced_at_the_noise_of_two_large_prefixes():
    # 3% noise on a 12 ms prefix is 0.4 ms: four times the 0.1 ms layers. Alone they are timed to 3% of 0.3 ms.
    med = time_devices(FakeWorkers(0.03), ["drv"], list(TIMES), 1, 15, 1, 0)["drv"][0]
    for t, m in zip(TIMES, med):
        assert m == pytest.approx(t, rel=0.35, abs=4e-5), (TIMES, med)


def test_split_pass_keeps_the_total_and_a_floor():
    # Alone: 0.3, 0.2 and 0.05 ms, the overhead 0.1 ms: shares 0.2, 0.1 and the floor, scaled to 1 ms in all.
    med, q1, q3 = split_pass(1e-3, [[3e-4, 3e-4], [2e-4, 2e-4], [0.5e-4, 0.5e-4]], 1e-4)
    scale = 1e-3 / (3e-4 + MIN_LAYER_TIME)
    assert sum(med) == pytest.approx(1e-3)
    assert med == pytest.approx([2e-4 * scale, 1e-4 * scale, MIN_LAYER_TIME * scale])
    assert all(a <= m <= b for a, m, b in zip(q1, med, q3))


@pytest.mark.parametrize(
    "make",
    [lambda m: m.lenet(), lambda m: m.resnet18(num_classes=10, input_shape=(3, 16, 16))],
    ids=["lenet", "resnet18"],
)
def test_a_local_pass_runs_a_whole_chain_or_graph_from_numpy_to_numpy(make):
    import multigpu.models
    from multigpu.execution.worker import StageWorker

    w = StageWorker("drv", "numpy", None, 1)
    w.setup()
    w.prepare_profile(make(multigpu.models), None, 1, 0)
    assert all(0 < w.time_local_pass() < 5.0 for _ in range(2))
