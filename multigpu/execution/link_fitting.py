"""Link fitting: hops of several sizes through the engine between workers that compute,
timed at both ends, and each pair's ``latency + bytes / bandwidth`` fitted to them;
bare hops beside bare actor calls of the same payload, as the engine's yardstick.

Ray moves a payload of at most ``max_direct_call_object_size`` bytes inside its own
messages and a larger one through the object store (a put, a location lookup and a
pull), so one latency cannot fit both: where the probes straddle that threshold, each
side gets its own latency over one bandwidth (``inline_latency`` below it).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from multigpu.execution.progress import bar as progress_bar
from multigpu.execution.worker import PROBE, PROBE_IDLE
from multigpu.partition.inputs.cluster import transfer_latency

__all__ = [
    "HopSamples",
    "HopVsBare",
    "LINK_PROBE_WAIT",
    "LinkFit",
    "PROBE_WORK",
    "fit_link",
    "fit_link_regimes",
    "fit_links",
    "hop_vs_bare",
    "link_sizes",
    "pair_walk",
    "time_links",
]

PROBE_WORK = 3e-4  # seconds of real layers a probe computes on each worker (see worker.PROBE)
# Seconds a link probe's worker sleeps before those layers. A hop costs more after its
# processes waited: on the 2-core machine (a local Ray, 48 KB between two actors, alternating
# rounds) a hop after 0.3 ms of work took 1.46 ms (median), after 3 ms 1.88, after 10 ms 2.40
# and after 30 ms 2.46; the driver's hops to and from the workers grew by 0.2-0.3 ms. Probes
# without a wait fitted the hops of plans whose stages run for milliseconds 0.2-1.7 ms short
# (ResNet-18, AlexNet), so links are fitted after a wait at which that growth has levelled
# off. One latency per link is what the solvers price exactly, so a hop after a stage shorter
# than a few milliseconds (LeNet's) is priced up to about a millisecond high. Streams and
# transfer-CPU probes do not wait, and neither does a worker held below one core by a CPU
# quota (``profiler``: a sleep would refill the quota a stage spends before it sends).
LINK_PROBE_WAIT = 1e-2
MIN_INV_BANDWIDTH = 1e-15  # a fit with no measurable per-byte cost: 1 PB/s, never a 0 or inf


@dataclass(frozen=True)
class LinkFit:
    """The fitted link between two devices and what it was fitted to: ``samples`` holds
    (bytes, seconds, count) per payload size, the seconds being the mean of the two
    directions' medians where both were timed. ``inline_latency`` (None: ``latency``)
    is the latency of a payload of at most ``inline_bytes``."""

    between: tuple[str, str]
    latency: float
    bandwidth: float
    samples: list[tuple[int, float, int]]
    inline_latency: float | None = None
    inline_bytes: float = 0.0

    def predict(self, nbytes: float) -> float:
        """Fitted seconds for ``nbytes``."""
        return (
            float(transfer_latency(nbytes, self.latency, self.inline_latency, self.inline_bytes))
            + nbytes / self.bandwidth
        )

    @property
    def worst_error(self) -> float:
        """Largest relative miss of the fit on its own medians."""
        return max(abs(self.predict(b) - t) / t for b, t, _ in self.samples)


@dataclass(frozen=True)
class HopVsBare:
    """A hop between two workers against a bare actor call with the same payload, timed alternately."""

    between: tuple[str, str]
    nbytes: int
    hop: float
    bare: float

    @property
    def ratio(self) -> float:
        """hop / bare."""
        return self.hop / self.bare


def fit_link(samples: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Fit ``t = latency + bytes / bandwidth`` to (bytes, seconds) pairs, least squares on
    relative error, both terms >= 0; return (latency, bandwidth)."""
    b = np.array([s[0] for s in samples], dtype=float)
    t = np.array([s[1] for s in samples], dtype=float)
    if len(b) == 0 or np.any(t <= 0):
        raise ValueError("fit_link needs positive times")
    a = np.stack([1.0 / t, b / t], axis=1)  # [lat, inv_bw] . row = 1
    coef, *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    lat, inv = float(coef[0]), float(coef[1])
    if inv < MIN_INV_BANDWIDTH:  # no measurable per-byte cost: latency only
        inv = MIN_INV_BANDWIDTH
        lat = _latency_only(t)
    if lat < 0:  # per-byte cost only
        lat = 0.0
        inv = max(float(np.sum(b / t) / np.sum((b / t) ** 2)), MIN_INV_BANDWIDTH)
    return lat, 1.0 / inv


def _latency_only(t: np.ndarray) -> float:
    """The constant that fits times ``t`` best in relative error (a link with no per-byte cost)."""
    return float(np.sum(1.0 / t) / np.sum(1.0 / t**2))


def fit_link_regimes(samples: Sequence[tuple[float, float]], inline_bytes: float) -> tuple[float, float, float | None]:
    """Fit ``t = latency + bytes / bandwidth`` above ``inline_bytes`` and ``t =
    inline_latency + bytes / bandwidth`` at or below it (one bandwidth), least squares on
    relative error, every term >= 0; return (latency, bandwidth, inline_latency), the last
    None when the samples lie on one side only (then it is ``fit_link``)."""
    from scipy.optimize import nnls

    small = np.array([s[0] <= inline_bytes for s in samples])
    if small.all() or not small.any():
        return (*fit_link(samples), None)
    b = np.array([s[0] for s in samples], dtype=float)
    t = np.array([s[1] for s in samples], dtype=float)
    if np.any(t <= 0):
        raise ValueError("fit_link_regimes needs positive times")
    a = np.stack([~small / t, small / t, b / t], axis=1)  # [lat, inline_lat, inv_bw] . row = 1
    (lat, inline, inv), _ = nnls(a, np.ones_like(t))
    if inv < MIN_INV_BANDWIDTH:  # no measurable per-byte cost: latencies only
        inv = MIN_INV_BANDWIDTH
        lat, inline = _latency_only(t[~small]), _latency_only(t[small])
    return float(lat), 1.0 / float(inv), float(inline)


def link_sizes(models: Sequence[Any], batch: int, count: int = 5, inline_bytes: int | None = None) -> list[int]:
    """``count`` payload sizes (bytes, multiples of 4) log-spaced over every activation
    the models pass between layers, including the input and the output; with
    ``inline_bytes`` inside that span, half and twice it too, so that each side of the
    threshold has sizes to fit its latency on."""
    sizes: list[int] = []
    for m in models:
        sizes.append(m.input_bytes(batch))
        sizes += [s.output_bytes for s in m.layer_stats(batch)]
    lo, hi = max(min(sizes), 4), max(sizes)
    if hi <= lo:
        return [int(lo)]
    out = {int(round(x / 4)) * 4 for x in np.geomspace(lo, hi, count)}
    if inline_bytes is not None and lo < inline_bytes < hi:
        out |= {max(inline_bytes // 8 * 4, 4), min(2 * inline_bytes, hi) // 4 * 4}
    return sorted(out)


def pair_walk(workers: Sequence[str]) -> list[str]:
    """A walk over the workers that crosses every unordered pair at least once."""
    walk: list[str] = []
    for i, a in enumerate(workers):
        for b in workers[i + 1 :]:
            if walk and walk[-1] == a:
                walk.append(b)
            elif walk and walk[-1] == b:
                walk.append(a)
            else:
                walk += [a, b]
    return walk


HopSamples = dict[tuple[str, str, int], list[float]]


def time_links(
    ws: Any,
    ray_engine: Any,
    workers: list[str],
    driver: str,
    sizes: Sequence[int],
    repeats: int,
    warmup: int,
    engine: str,
    progress: bool,
    notes: list[str],
) -> tuple[HopSamples, HopSamples, dict[tuple[str, int], list[float]]]:
    """Hops for the link fits (probes between computing workers), and, timed
    alternately, bare hops (nothing computed) beside bare actor calls."""
    import ray

    walk = pair_walk(workers)
    if engine == "tasks":
        routes = [[w] for w in workers] + ([walk] if walk else [])
    else:  # one compiled graph: its actors take no other calls while it exists
        routes = [walk or workers[:1]] if workers else []
        if len(workers) > 2:
            notes.append(
                "compiled engine: one graph crosses every worker pair; the driver's links to "
                "workers other than the first and last of it are the mean of the measured ones"
            )
    hops: HopSamples = {}
    idle: HopSamples = {}
    bare: dict[tuple[str, int], list[float]] = {}
    bar = progress_bar(progress, len(sizes) * len(routes), "profiling links")

    def bare_call(dev: str, x: np.ndarray) -> float:
        t0 = time.perf_counter()
        ray.get(ws.actors[dev].echo.remote(x), timeout=ws.timeout)
        return time.perf_counter() - t0

    def probe(route: list[str], stage: int, x: np.ndarray, into: HopSamples) -> None:
        chain = [(d, stage) for d in route]
        res = ray_engine.run_chain(
            ws, chain, [f"link probe on device {d!r}" for d in route], [x], window=1, engine=engine
        )
        tr = res.traces[0]
        full = [driver] + route + [driver]
        off = [0.0] + [ws.info[d].clock_offset for d in route] + [0.0]
        starts = [tr[1 + 2 * i] - off[i + 1] for i in range(len(route))] + [tr[-1]]
        ends = [tr[0]] + [tr[2 + 2 * i] - off[i + 1] for i in range(len(route))]
        for h in range(len(full) - 1):
            into.setdefault((full[h], full[h + 1], x.nbytes), []).append(starts[h] - ends[h])

    for route in routes:
        compare = engine == "tasks" and route is routes[-1] and len(route) > 1
        for size in sizes:
            x = np.zeros(size // 4, np.float32)
            for _ in range(warmup):
                probe(route, PROBE, x, {})
                if compare:
                    probe(route, PROBE_IDLE, x, {})
                    bare_call(route[-1], x)
            for _ in range(repeats):
                probe(route, PROBE, x, hops)
                if compare:  # alternately: a bare hop into each worker, and a bare call to the last
                    probe(route, PROBE_IDLE, x, idle)
                    for dev in set(route):
                        bare.setdefault((dev, size), []).append(bare_call(dev, x))
            bar.update(1)
    bar.close()
    return hops, idle, bare


def fit_links(hops: HopSamples, inline_bytes: float = 0.0) -> list[LinkFit]:
    """One symmetric link per pair, fitted to the mean of the two directions' medians at
    each size (a plan crosses a link one way or, for the driver's, once each way); sizes
    up to ``inline_bytes`` get a latency of their own (``fit_link_regimes``)."""
    by_pair: dict[frozenset[str], dict[int, list[tuple[float, int]]]] = {}
    order: dict[frozenset[str], tuple[str, str]] = {}
    for (a, b, size), ts in sorted(hops.items()):
        if a == b:
            continue
        key = frozenset((a, b))
        order.setdefault(key, (a, b))
        by_pair.setdefault(key, {}).setdefault(size, []).append((statistics.median(ts), len(ts)))
    fits = []
    for key, per_size in by_pair.items():
        samples = [
            (size, statistics.mean(t for t, _ in v), sum(n for _, n in v)) for size, v in sorted(per_size.items())
        ]
        lat, bw, inline = fit_link_regimes([(b, t) for b, t, _ in samples], inline_bytes)
        fits.append(LinkFit(order[key], lat, bw, samples, inline, float(inline_bytes)))
    return fits


def hop_vs_bare(hops: HopSamples, bare: dict[tuple[str, int], list[float]], driver: str) -> list[HopVsBare]:
    out = []
    for (a, b, size), ts in sorted(hops.items()):
        if a == driver or b == driver or (b, size) not in bare:
            continue
        out.append(HopVsBare((a, b), size, statistics.median(ts), statistics.median(bare[(b, size)])))
    return out
