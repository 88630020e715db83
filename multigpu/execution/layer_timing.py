"""Layer timing: each layer's forward time on each device, without per-layer timers.

The whole pass runs the way a stage runs (one call of the slice, one synchronize) in
one call into the worker after it waited, the devices taking turns; each layer also runs
alone, as the first work of a call. The
stage overhead is how much longer the layers take alone than in one pass, per extra
call; the layers' times split the whole pass less that overhead in proportion to each layer's
time alone less the overhead (``split_pass``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["LayerProfile", "MIN_LAYER_TIME", "PassProfile", "probe_layers", "split_pass", "time_devices"]


@dataclass(frozen=True)
class LayerProfile:
    """One layer on one device: median and quartiles of ``n`` timed forward passes (s)."""

    device: str
    graph: str
    layer: str
    median: float
    q1: float
    q3: float
    n: int


@dataclass(frozen=True)
class PassProfile:
    """A whole forward pass of one graph on one device (all its layers as one stage):
    median and quartiles of ``n`` timed passes (s), each after a wait as the layer times
    are; ``warm``: the median pass called as a plan with every layer on the device runs
    it, one after another with no other device computing (the driver: back to back, its
    numpy input converted in and its output out; a worker: one call after another), or
    None where it was not timed."""

    device: str
    graph: str
    median: float
    q1: float
    q3: float
    n: int
    warm: float | None = None


MIN_LAYER_TIME = 1e-7  # seconds; floor for the first layer once its stage overhead is taken out


def probe_layers(medians: Sequence[float], budget: float) -> int:
    """How many leading layers fit in ``budget`` seconds (at least one)."""
    total, k = 0.0, 0
    for t in medians:
        if k and total + t > budget:
            break
        total += t
        k += 1
    return max(k, 1)


def split_pass(
    total: float, alone: Sequence[Sequence[float]], overhead: float
) -> tuple[list[float], list[float], list[float]]:
    """Per layer (median, q1, q3): ``total`` seconds split in proportion to each layer's
    median time alone (``alone[k]``: its samples) less ``overhead``, each at least
    MIN_LAYER_TIME; the quartiles of its samples scaled the same way."""
    own = [max(statistics.median(a) - overhead, MIN_LAYER_TIME) for a in alone]
    scale = max(total, MIN_LAYER_TIME * len(own)) / math.fsum(own)
    med = [max(t * scale, MIN_LAYER_TIME) for t in own]
    q1, q3 = [], []
    for a, m in zip(alone, med):
        q = statistics.quantiles(a, n=4, method="inclusive") if len(a) > 1 else [a[0]] * 3
        q1.append(max(min((q[0] - overhead) * scale, m), MIN_LAYER_TIME))
        q3.append(max((q[2] - overhead) * scale, m))
    return med, q1, q3


def time_devices(
    ws: Any, names: Sequence[str], model: Any, batch: int, repeats: int, warmup: int, seed: int
) -> dict[str, tuple[list[float], list[float], list[float], int, float, tuple[float, ...], float | None]]:
    """Per device: per-layer median and quartiles, sample count, stage overhead, the
    quartiles of a whole pass and the median whole pass called one after another.

    The whole pass is run the way a stage runs (one call of the slice, one
    synchronize) in one call into the worker after it waited (an actor call; for the driver,
    after a Ray round trip), the devices taking
    turns so each finds its caches as the others left them. Each layer is also run
    alone, as the first work of a call. The stage overhead is how much longer the
    layers take alone than in one pass, per extra call: (the sum of the layers' medians
    alone - the pass's median) / (n - 1), every call but one paying it. The layers'
    times then split the whole pass less that overhead in
    proportion to each layer alone less the overhead: a sum over a run of layers stays
    the pass's where the run is the whole model, and a small layer's share does not
    carry the noise of two large prefixes (the difference of two 40 ms medians moves
    by a millisecond, as much as a small layer takes). Timing layer by layer inside one
    pass instead would add a call, a synchronize and a timer read per layer (about
    10 us: most of a small layer's time).

    Each device also times whole passes as a plan with every layer there runs them,
    one after another with no other device computing in between: the driver back to
    back, with no Ray call between them; a worker one call after another. A pass that
    starts after the others computed can be slower (cold caches, a core that went
    idle), so such a plan has a time of its own (the engine profile's ``warm_pass``).
    """

    import ray

    echo_to = next(iter(ws.actors.values()), None)

    def call(name: str, method: str, *args: Any) -> Any:
        if ws.local is not None and ws.local.name == name:
            if echo_to is not None:  # wait in Ray as the driver does between items
                ray.get(echo_to.clock.remote(), timeout=ws.timeout)
            return getattr(ws.local, method)(*args)
        return ws._get(
            getattr(ws.actors[name], method).remote(*args), lambda: f"device {name!r}", what="profiling its layers"
        )

    n = len(model)
    for name in names:  # each worker makes the parameters from the seed (nothing shipped)
        call(name, "prepare_profile", model, None, batch, seed)
    for _ in range(warmup):
        for name in names:
            call(name, "time_pass")
    passes: dict[str, list[float]] = {name: [] for name in names}
    firsts: dict[str, list[list[float]]] = {name: [[] for _ in range(n)] for name in names}
    for _ in range(repeats):  # a round: every device's whole pass, then each layer alone on each device
        for name in names:
            passes[name].append(call(name, "time_prefix", n))
        for k in range(n):
            for name in names:
                firsts[name][k].append(call(name, "time_first", k))
    warm: dict[str, float] = {}
    local = ws.local.name if ws.local is not None and ws.local.name in names else None
    if local is not None:
        # As the driver runs such a plan's items: converting the input in and the output out
        # included (0.03 ms of LeNet's 0.35 here), which no link prices.
        for _ in range(warmup + 1):
            ws.local.time_local_pass()
        warm[local] = statistics.median(ws.local.time_local_pass() for _ in range(repeats))
    for name in names:
        if name == local:
            continue
        # As a plan with every layer on this worker calls it: one call after another, only
        # the round trip in between and no other device computing.
        for _ in range(warmup + 1):
            call(name, "time_prefix", n)
        warm[name] = statistics.median(call(name, "time_prefix", n) for _ in range(repeats))
    result: dict[str, tuple[list[float], list[float], list[float], int, float, tuple[float, ...], float | None]] = {}
    for name in names:
        whole = statistics.median(passes[name])
        # Each layer alone takes its time plus the overhead, the whole pass its times plus one overhead:
        # the n - 1 extra overheads are what the layers alone took beyond the pass.
        alone = math.fsum(statistics.median(f) for f in firsts[name])
        overhead = max(0.0, (alone - whole) / (n - 1)) if n > 1 else 0.0
        med, q1, q3 = split_pass(whole - overhead, firsts[name], overhead)
        full = statistics.quantiles(passes[name], n=4, method="inclusive") if repeats > 1 else [whole] * 3
        result[name] = (med, q1, q3, repeats, overhead, (full[0], whole, full[2]), warm.get(name))
    return result
