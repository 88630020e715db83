"""Layer timing: each layer's forward time on each device, without per-layer timers.

A layer's time is the difference of two prefixes of the model (layers 0..k and
0..k+1), each run the way a stage runs (one call of the slice, one synchronize) in
one call into the worker after it waited, the devices taking turns. The stage
overhead is how much slower a cheap layer runs alone, as the first work of a call.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

__all__ = ["LayerProfile", "MAX_FIRST_LAYERS", "MIN_LAYER_TIME", "PassProfile", "probe_layers", "time_devices"]


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
    are; ``warm``: the median pass run back to back, with no wait in between (the
    driver only: how it runs a plan that never leaves it), else None."""

    device: str
    graph: str
    median: float
    q1: float
    q3: float
    n: int
    warm: Optional[float] = None


MAX_FIRST_LAYERS = 6   # cheap layers timed as the first work of a call, for the stage overhead
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


def time_devices(ws: Any, names: Sequence[str], model: Any, batch: int, repeats: int, warmup: int, seed: int
                  ) -> dict[str, tuple[list[float], list[float], list[float], int, float, tuple[float, ...],
                                   Optional[float]]]:
    """Per device: per-layer median and quartiles, sample count, stage overhead, the
    quartiles of a whole pass and, for the driver, the median whole pass back to back.

    A layer's time is the difference of two prefixes of the model (layers 0..k and
    0..k+1), each run the way a stage runs (one call of the slice, one synchronize)
    in one call into the worker after it waited (an actor call; for the driver,
    after a Ray round trip), the devices taking turns so each finds its caches as
    the others left them. Timing layer by layer instead adds a call, a synchronize
    and a timer read per layer (about 10 us: most of a small layer's time). The
    medians of the prefixes are made non-decreasing before taking differences, so a
    sum over a run of layers is the difference of two medians.

    The stage overhead is how much slower a cheap layer runs alone, as the first
    work of a call, than inside a prefix (median over up to MAX_FIRST_LAYERS of the
    cheaper half of the layers, the earliest first); the first layer's time is its
    prefix minus that overhead.

    The driver also runs whole passes back to back, with no Ray call between them, as
    it runs a plan that never leaves it: a pass that starts after a wait is slower
    (cold caches, a core that went idle), so that plan has a time of its own.
    """
    import ray

    echo_to = next(iter(ws.actors.values()), None)

    def call(name: str, method: str, *args: Any) -> Any:
        if ws.local is not None and ws.local.name == name:
            if echo_to is not None:   # wait in Ray as the driver does between items
                ray.get(echo_to.clock.remote(), timeout=ws.timeout)
            return getattr(ws.local, method)(*args)
        return ws._get(getattr(ws.actors[name], method).remote(*args), lambda: f"device {name!r}",
                       what="profiling its layers")

    n = len(model)
    for name in names:   # each worker makes the parameters from the seed (nothing shipped)
        call(name, "prepare_profile", model, None, batch, seed)
    for _ in range(warmup):
        for name in names:
            call(name, "time_pass")
    prefix: dict[str, list[list[float]]] = {name: [[] for _ in range(n + 1)] for name in names}
    for _ in range(repeats):
        for k in range(1, n + 1):
            for name in names:
                prefix[name][k].append(call(name, "time_prefix", k))
    out = {}
    for name in names:
        med = [0.0] + [statistics.median(prefix[name][k]) for k in range(1, n + 1)]
        mono = list(np.maximum.accumulate(med))
        inner = [mono[k + 1] - mono[k] for k in range(n)]
        per_round = [[prefix[name][k + 1][r] - (prefix[name][k][r] if k else 0.0) for r in range(repeats)]
                     for k in range(n)]
        order = sorted(range(1, n), key=lambda k: inner[k])[:max(1, (n - 1) // 2)] if n > 1 else []
        cheap = sorted(order)[:MAX_FIRST_LAYERS]
        firsts: dict[int, list[float]] = {k: [] for k in cheap}
        out[name] = (inner, per_round, cheap, firsts)
    for _ in range(repeats):
        for name in names:
            for k in out[name][2]:
                out[name][3][k].append(call(name, "time_first", k))
    warm: dict[str, float] = {}
    local = ws.local.name if ws.local is not None and ws.local.name in names else None
    if local is not None:
        for _ in range(warmup + 1):
            ws.local.time_prefix(n)
        warm[local] = statistics.median(ws.local.time_prefix(n) for _ in range(repeats))
    result = {}
    for name in names:
        inner, per_round, cheap, firsts = out[name]
        overhead = 0.0
        if cheap:
            overhead = max(0.0, statistics.median(statistics.median(firsts[k]) - inner[k] for k in cheap))
        med = [max(t, MIN_LAYER_TIME) for t in inner]
        med[0] = max(inner[0] - overhead, MIN_LAYER_TIME)
        quart = [statistics.quantiles(c, n=4, method="inclusive") if len(c) > 1 else [c[0]] * 3 for c in per_round]
        shift = inner[0] - med[0]
        q1 = [max(min(q[0], m), MIN_LAYER_TIME) for q, m in zip(quart, med)]
        q3 = [max(q[2], m) for q, m in zip(quart, med)]
        q1[0] = max(min(quart[0][0] - shift, med[0]), MIN_LAYER_TIME)
        q3[0] = max(quart[0][2] - shift, med[0])
        full = statistics.quantiles(prefix[name][n], n=4, method="inclusive") if repeats > 1 else [mono[n]] * 3
        result[name] = (med, q1, q3, repeats, overhead, (full[0], statistics.median(prefix[name][n]), full[2]),
                        warm.get(name))
    return result
