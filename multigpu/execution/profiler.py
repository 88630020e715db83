"""``profile``: measure each layer on each device and each link through the engine, and
write them as a cluster file the cost model reads.

* Layers: every layer's forward pass on every device, after warm-up, ``repeats``
  times with the device synchronized, in the worker process that ``multigpu run``
  would use (same backend, threads and Ray placement). Devices are timed one after
  another, so none competes with another for the CPU. The median becomes the
  device's ``layer_times`` for the graph; the spread is reported.
* Links: payloads of several sizes (spanning the models' activations) travel
  through the same engine and code path as a run's activations (``run_chain``),
  between workers that compute a few hundred microseconds of real layers around
  each hop, as stages do, and every hop is timed at both ends. Each pair's
  ``latency + bytes / bandwidth`` is fitted to them (least squares on relative
  error). Bare hops (nothing computed) and bare actor calls with the same payload
  are timed alternately, as the yardstick for the engine's own cost.
* Each device's ``flops`` becomes its effective FLOP/s on the profiled graphs
  (FLOPs / measured time), the estimate the cost model uses for other graphs.
"""
from __future__ import annotations

import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from ..errors import InputError, PlanError
from ..partition.cluster import Cluster, DeviceSpec, Link, LinkSpec
from ..partition.graph import graph_from_model
from .runner import ENGINES, resolve_model
from .worker import PROBE, PROBE_IDLE

__all__ = ["LayerProfile", "LinkFit", "PassProfile", "HopVsBare", "ProfileResult", "fit_link", "profile", "link_sizes"]

PROBE_WORK = 3e-4      # seconds of real layers a link probe computes on each worker (see worker.PROBE)
MIN_INV_BANDWIDTH = 1e-15   # a fit with no measurable per-byte cost: 1 PB/s, never a 0 or inf


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
    median and quartiles of ``n`` timed passes (s)."""

    device: str
    graph: str
    median: float
    q1: float
    q3: float
    n: int


@dataclass(frozen=True)
class LinkFit:
    """The fitted link between two devices and what it was fitted to: ``samples`` holds
    (bytes, seconds, count) per payload size, the seconds being the mean of the two
    directions' medians where both were timed."""

    between: tuple[str, str]
    latency: float
    bandwidth: float
    samples: list[tuple[int, float, int]]

    def predict(self, nbytes: float) -> float:
        """Fitted seconds for ``nbytes``."""
        return self.latency + nbytes / self.bandwidth

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


@dataclass
class ProfileResult:
    """What ``profile`` measured, and the cluster built from it (``cluster``)."""

    cluster: Cluster
    layers: list[LayerProfile]
    passes: list[PassProfile]
    links: list[LinkFit]
    hop_vs_bare: list[HopVsBare]
    engine: str
    batch: int
    graphs: list[str]
    seconds: float
    notes: list[str] = field(default_factory=list)

    def write(self, path: Union[str, "os.PathLike[str]"]) -> Path:
        """Write the cluster as JSON to ``path`` (atomically)."""
        import json

        p = Path(path)
        if p.suffix.lower() != ".json":
            raise InputError(f"--out {str(p)!r}: the profile is written as JSON; name it .json")
        tmp = p.with_name(f".{p.name}.part")
        tmp.write_text(json.dumps(self.cluster.to_dict(), indent=1) + "\n")
        os.replace(tmp, p)
        return p

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the cluster, per-layer spreads, link fits, hop against bare call."""
        return {"engine": self.engine, "batch": self.batch, "graphs": self.graphs, "seconds": self.seconds,
                "cluster": self.cluster.to_dict(),
                "layers": [vars(x) for x in self.layers], "passes": [vars(x) for x in self.passes],
                "links": [{"between": list(f.between), "latency": f.latency, "bandwidth": f.bandwidth,
                           "worst_error": f.worst_error,
                           "samples": [{"bytes": b, "median": t, "n": n} for b, t, n in f.samples]}
                          for f in self.links],
                "hop_vs_bare": [{"between": list(h.between), "bytes": h.nbytes, "hop": h.hop, "bare": h.bare,
                                 "ratio": h.ratio} for h in self.hop_vs_bare],
                "notes": self.notes}

    def format(self) -> str:
        """A readable summary: per device and graph, per link, hop against bare call."""
        from ..partition.report import fmt_bytes, fmt_time

        out = [f"profiled {', '.join(self.graphs)} on {self.cluster.k} device(s) in {self.seconds:.1f} s "
               f"(engine: Ray {self.engine}); driver: {self.cluster.source}"]
        for d in self.cluster.devices:
            rows = [x for x in self.layers if x.device == d.name]
            if not rows:
                out.append(f"  {d.name:<16} runs no layers (the driver without a backend)")
            for g in self.graphs if rows else []:
                xs = [x for x in rows if x.graph == g]
                total = math.fsum(x.median for x in xs)
                slowest = max(xs, key=lambda x: x.median)
                full = next(p for p in self.passes if p.device == d.name and p.graph == g)
                out.append(f"  {d.name:<10} {d.backend:<7} {g:<17} layers {fmt_time(total):>9} + stage overhead "
                           f"{fmt_time(d.stage_overhead):>8}; slowest {slowest.layer} {fmt_time(slowest.median)}; "
                           f"a whole pass {fmt_time(full.median)} (IQR {(full.q3 - full.q1) / full.median:.0%})")
        for f in self.links:
            out.append(f"  link {f.between[0]} <-> {f.between[1]}: latency {fmt_time(f.latency)}, bandwidth "
                       f"{fmt_bytes(f.bandwidth)}/s (fit within {f.worst_error:.0%} of its medians)")
        routes: dict[tuple[str, str], list[HopVsBare]] = {}
        for h in self.hop_vs_bare:
            routes.setdefault(h.between, []).append(h)
        for (a, b), hs in routes.items():
            worst = max(hs, key=lambda h: h.ratio)
            out.append(f"  hop {a} -> {b} against a bare actor call with the same payload: "
                       f"{min(h.ratio for h in hs):.2f}x to {worst.ratio:.2f}x over {fmt_bytes(hs[0].nbytes)} to "
                       f"{fmt_bytes(hs[-1].nbytes)} (worst: {fmt_time(worst.hop)} against {fmt_time(worst.bare)} "
                       f"at {fmt_bytes(worst.nbytes)})")
        out += [f"  note: {n}" for n in self.notes]
        return "\n".join(out)


def fit_link(samples: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Fit ``t = latency + bytes / bandwidth`` to (bytes, seconds) pairs, least squares on
    relative error, both terms >= 0; return (latency, bandwidth)."""
    b = np.array([s[0] for s in samples], dtype=float)
    t = np.array([s[1] for s in samples], dtype=float)
    if len(b) == 0 or np.any(t <= 0):
        raise ValueError("fit_link needs positive times")
    a = np.stack([1.0 / t, b / t], axis=1)          # [lat, inv_bw] . row = 1
    coef, *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    lat, inv = float(coef[0]), float(coef[1])
    if inv < MIN_INV_BANDWIDTH:       # no measurable per-byte cost: latency only
        inv = MIN_INV_BANDWIDTH
        lat = float(np.sum(1.0 / t) / np.sum(1.0 / t ** 2))
    if lat < 0:                       # per-byte cost only
        lat = 0.0
        inv = max(float(np.sum(b / t) / np.sum((b / t) ** 2)), MIN_INV_BANDWIDTH)
    return lat, 1.0 / inv


def link_sizes(models: Sequence[Any], batch: int, count: int = 5) -> list[int]:
    """``count`` payload sizes (bytes, multiples of 4) log-spaced over every activation
    the models pass between layers, including the input and the output."""
    sizes: list[int] = []
    for m in models:
        sizes.append(m.input_bytes(batch))
        sizes += [s.output_bytes for s in m.layer_stats(batch)]
    lo, hi = max(min(sizes), 4), max(sizes)
    if hi <= lo:
        return [int(lo)]
    return sorted({int(round(x / 4)) * 4 for x in np.geomspace(lo, hi, count)})


def _spec(x: Union[DeviceSpec, Mapping[str, Any]]) -> DeviceSpec:
    if isinstance(x, DeviceSpec):
        return x
    if not isinstance(x, Mapping) or "name" not in x or "backend" not in x:
        raise PlanError(f"a profiled device needs at least a name and a backend, e.g. "
                        f"{{'name': 'torch-1t', 'backend': 'torch', 'threads': 1}}; got {x!r}")
    extra = set(x) - {"name", "backend", "device", "threads", "resources", "power", "memory"}
    if extra:
        raise PlanError(f"device {x['name']!r}: unknown key {sorted(extra)[0]!r}; a profiled device takes "
                        f"name, backend, device, threads, resources, power and memory")
    return DeviceSpec(name=x["name"], flops=1.0, power=x.get("power", 0.0), memory=x.get("memory"),
                      backend=x["backend"], device=x.get("device"), threads=x.get("threads"),
                      resources=x.get("resources"))


def _bar(progress: bool, total: int, desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not progress, file=sys.stderr, leave=False)


def profile(models: Union[str, Any, Sequence[Any]] = "lenet",
            devices: Optional[Sequence[Union[DeviceSpec, Mapping[str, Any]]]] = None, *,
            driver: Union[None, DeviceSpec, Mapping[str, Any]] = None, cluster: Optional[Cluster] = None,
            batch: int = 1, repeats: int = 20, warmup: int = 3, link_repeats: int = 15,
            sizes: Optional[Sequence[int]] = None, engine: str = "tasks", address: Optional[str] = None,
            timeout: float = 120.0, startup_timeout: float = 180.0, progress: bool = True,
            seed: int = 0, session: Any = None) -> ProfileResult:
    """Profile ``models`` on the worker ``devices`` and the ``driver`` (this process);
    return the measurements and the cluster built from them.

    ``devices`` are DeviceSpecs or dicts with ``name``, ``backend`` and optionally
    ``device``, ``threads``, ``resources``, ``power``, ``memory``. ``driver`` is the
    source/sink device (default: named "driver", on the first worker's backend;
    give ``{"name": ..., "backend": None}`` for a driver that runs no layers). Or
    pass ``cluster``: its source is the driver and every other device a worker; its
    other figures (power, memory, other graphs' layer_times) are kept. ``session``
    (an open ``Session`` on that cluster) profiles its workers instead of starting
    new ones, so profiling and runs can alternate on the same processes.

    Raises PlanError, InputError, BackendNotInstalledError, MissingDependencyError
    (Ray), and WorkerDiedError / WorkerTimeoutError.
    """
    t_begin = time.perf_counter()
    if session is not None and cluster is None and devices is None and driver is None:
        cluster = session.cluster
    model_list = [resolve_model(m) for m in ([models] if isinstance(models, str) or hasattr(models, "layers")
                                             else list(models))]
    if not model_list:
        raise InputError("profile needs at least one model")
    for name, value, low in (("batch", batch, 1), ("repeats", repeats, 1), ("warmup", warmup, 0),
                             ("link_repeats", link_repeats, 3)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InputError(f"{name}={value!r} must be a whole number >= {low}")
    if engine not in ENGINES:
        raise PlanError(f"engine={engine!r} is unknown; choose one of {', '.join(ENGINES)}")
    if cluster is not None:
        if devices is not None or driver is not None:
            raise PlanError("give either cluster= or devices=/driver=, not both")
        base: Optional[Cluster] = cluster
        driver_spec: Optional[DeviceSpec] = cluster.devices[cluster.source_index]
        workers = [d for d in cluster.devices if d.name != cluster.source]
    else:
        base = None
        workers = [_spec(d) for d in (devices or [])]
        if driver is None:
            if not workers:
                raise PlanError("profile needs at least one device: pass devices=[{'name': ..., 'backend': ...}]")
            driver_spec = DeviceSpec("driver", 1.0, 0.0, backend=workers[0].backend)
        elif isinstance(driver, Mapping) and driver.get("backend", "x") is None:
            driver_spec = DeviceSpec(driver["name"], 1.0, 0.0)
        else:
            driver_spec = _spec(driver)
    names = [driver_spec.name] + [w.name for w in workers]
    if len(set(names)) != len(names):
        raise PlanError(f"device names must be unique, got {names}")
    for w in workers:
        if w.backend is None:
            raise PlanError(f"device {w.name!r} has no backend to profile; add \"backend\" to it")
    if session is not None:
        have = set(session.workers.actors) if session.workers is not None else set()
        lacking = [w.name for w in workers if w.name not in have]
        if lacking or (driver_spec.backend is not None and session.workers.local is None):
            raise PlanError(f"the session has no worker for {lacking or [driver_spec.name]}; open it on every "
                            f"device to profile")
    elif address is None:
        from .. import registry

        for spec in [driver_spec] + workers:
            if spec.backend is not None:
                registry.require_installed(spec.backend)
    link_payloads = sorted(set(int(s) for s in sizes)) if sizes else link_sizes(model_list, batch)
    if any(s < 4 or s % 4 for s in link_payloads):
        raise InputError(f"sizes={list(link_payloads)} must be positive multiples of 4 bytes (float32 payloads)")

    from . import engine as ray_engine

    graphs = [graph_from_model(m, batch) for m in model_list]
    layer_rows: list[LayerProfile] = []
    passes: list[PassProfile] = []
    overheads: dict[str, list[float]] = {}
    notes: list[str] = []
    computing = [driver_spec] if driver_spec.backend is not None else []
    computing += workers
    from contextlib import ExitStack

    with ExitStack() as stack:
        if session is not None:
            ws = session.workers
        else:
            stack.enter_context(ray_engine.RaySession(address))
            ws = stack.enter_context(ray_engine.Workers(workers, driver_spec if driver_spec.backend else None,
                                                        float(timeout), float(startup_timeout)))
        # -- layers: the devices take turns, one pass each, as stages of a run do ----------
        bar = _bar(progress, len(model_list), "profiling layers")
        names_computing = [d.name for d in computing]
        first_medians: dict[str, list[float]] = {}
        for m, g in zip(model_list, graphs):
            timed = _time_devices(ws, names_computing, m, batch, repeats, warmup, seed)
            for name, (medians, q1, q3, n_samples, oh, full) in timed.items():
                overheads.setdefault(name, []).append(oh)
                passes.append(PassProfile(name, g.name, full[1], full[0], full[2], n_samples))
                first_medians.setdefault(name, medians)
                for (label, _), med, a, b in zip(m.layers, medians, q1, q3):
                    layer_rows.append(LayerProfile(name, g.name, label, med, a, b, n_samples))
            bar.update(1)
        bar.close()
        # -- links through the engine, between workers that compute ---------------------------
        m0 = model_list[0]
        for name in [w.name for w in workers]:
            work = _probe_layers(first_medians[name], PROBE_WORK)
            ws._get(ws.actors[name].prepare_profile.remote(m0, m0.init_params(seed), batch, seed),
                    lambda n=name: f"device {n!r}", what="preparing link probes")
            ws._get(ws.actors[name].set_probe_work.remote(work), lambda n=name: f"device {n!r}",
                    what="preparing link probes")
        hops, idle, bare = _time_links(ws, ray_engine, [w.name for w in workers], driver_spec.name,
                                       link_payloads, link_repeats, warmup, engine, progress, notes)
    fits = _fit_links(hops)
    pairs_vs_bare = _hop_vs_bare(idle, bare, driver_spec.name)
    stage_overhead = {name: statistics.median(v) for name, v in overheads.items()}
    result_cluster = _build_cluster(base, driver_spec, workers, graphs, layer_rows, fits, stage_overhead)
    return ProfileResult(cluster=result_cluster, layers=layer_rows, passes=passes, links=fits,
                         hop_vs_bare=pairs_vs_bare,
                         engine=engine, batch=batch, graphs=[g.name for g in graphs],
                         seconds=time.perf_counter() - t_begin, notes=notes)


MAX_FIRST_LAYERS = 6   # cheap layers timed as the first work of a call, for the stage overhead
MIN_LAYER_TIME = 1e-7  # seconds; floor for the first layer once its stage overhead is taken out


def _probe_layers(medians: Sequence[float], budget: float) -> int:
    """How many leading layers fit in ``budget`` seconds (at least one)."""
    total, k = 0.0, 0
    for t in medians:
        if k and total + t > budget:
            break
        total += t
        k += 1
    return max(k, 1)


def _time_devices(ws: Any, names: Sequence[str], model: Any, batch: int, repeats: int, warmup: int, seed: int
                  ) -> dict[str, tuple[list[float], list[float], list[float], int, float, tuple[float, ...]]]:
    """Per device: per-layer median and quartiles, sample count, stage overhead and the
    quartiles of a whole pass.

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
    params = model.init_params(seed)
    for name in names:
        call(name, "prepare_profile", model, params, batch, seed)
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
        result[name] = (med, q1, q3, repeats, overhead, (full[0], statistics.median(prefix[name][n]), full[2]))
    return result


def _walk(workers: Sequence[str]) -> list[str]:
    """A walk over the workers that crosses every unordered pair at least once."""
    walk: list[str] = []
    for i, a in enumerate(workers):
        for b in workers[i + 1:]:
            if walk and walk[-1] == a:
                walk.append(b)
            elif walk and walk[-1] == b:
                walk.append(a)
            else:
                walk += [a, b]
    return walk


HopSamples = dict[tuple[str, str, int], list[float]]


def _time_links(ws: Any, ray_engine: Any, workers: list[str], driver: str, sizes: Sequence[int],
                repeats: int, warmup: int, engine: str, progress: bool,
                notes: list[str]) -> tuple[HopSamples, HopSamples, dict[tuple[str, int], list[float]]]:
    """Hops for the link fits (probes between computing workers), and, timed
    alternately, bare hops (nothing computed) beside bare actor calls."""
    import ray

    walk = _walk(workers)
    if engine == "tasks":
        routes = [[w] for w in workers] + ([walk] if walk else [])
    else:   # one compiled graph: its actors take no other calls while it exists
        routes = [walk or workers[:1]] if workers else []
        if len(workers) > 2:
            notes.append("compiled engine: one graph crosses every worker pair; the driver's links to "
                         "workers other than the first and last of it are the mean of the measured ones")
    hops: HopSamples = {}
    idle: HopSamples = {}
    bare: dict[tuple[str, int], list[float]] = {}
    bar = _bar(progress, len(sizes) * len(routes), "profiling links")

    def bare_call(dev: str, x: np.ndarray) -> float:
        t0 = time.perf_counter()
        ray.get(ws.actors[dev].echo.remote(x), timeout=ws.timeout)
        return time.perf_counter() - t0

    def probe(route: list[str], stage: int, x: np.ndarray, into: HopSamples) -> None:
        chain = [(d, stage) for d in route]
        res = ray_engine.run_chain(ws, chain, [f"link probe on device {d!r}" for d in route], [x], window=1,
                                   engine=engine)
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
                if compare:   # alternately: a bare hop into each worker, and a bare call to the last
                    probe(route, PROBE_IDLE, x, idle)
                    for dev in set(route):
                        bare.setdefault((dev, size), []).append(bare_call(dev, x))
            bar.update(1)
    bar.close()
    return hops, idle, bare


def _fit_links(hops: HopSamples) -> list[LinkFit]:
    """One symmetric link per pair, fitted to the mean of the two directions' medians at
    each size (a plan crosses a link one way or, for the driver's, once each way)."""
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
        samples = [(size, statistics.mean(t for t, _ in v), sum(n for _, n in v))
                   for size, v in sorted(per_size.items())]
        lat, bw = fit_link([(b, t) for b, t, _ in samples])
        fits.append(LinkFit(order[key], lat, bw, samples))
    return fits


def _hop_vs_bare(hops: HopSamples, bare: dict[tuple[str, int], list[float]], driver: str) -> list[HopVsBare]:
    out = []
    for (a, b, size), ts in sorted(hops.items()):
        if a == driver or b == driver or (b, size) not in bare:
            continue
        out.append(HopVsBare((a, b), size, statistics.median(ts), statistics.median(bare[(b, size)])))
    return out


def _build_cluster(base: Optional[Cluster], driver: DeviceSpec, workers: Sequence[DeviceSpec], graphs: Sequence[Any],
                   rows: Sequence[LayerProfile], fits: Sequence[LinkFit], overhead: Mapping[str, float]) -> Cluster:
    devices = []
    for spec in [driver, *workers]:
        times = {g.name: {r.layer: r.median for r in rows if r.device == spec.name and r.graph == g.name}
                 for g in graphs}
        times = {g: t for g, t in times.items() if t}
        old = dict(spec.layer_times or {})
        flops = spec.flops
        if times:
            total_flops = sum(float(np.sum(g.flops)) for g in graphs if g.name in times)
            total_time = sum(math.fsum(times[g.name].values()) for g in graphs if g.name in times)
            flops = total_flops / total_time
            old.update(times)
        devices.append(DeviceSpec(name=spec.name, flops=flops, power=spec.power, memory=spec.memory,
                                  backend=spec.backend, device=spec.device, threads=spec.threads,
                                  resources=spec.resources, layer_times=old or None,
                                  stage_overhead=overhead.get(spec.name, spec.stage_overhead)))
    links = [Link(between=f.between, bandwidth=f.bandwidth, latency=f.latency) for f in fits]
    measured = {frozenset(f.between) for f in fits}
    names = [d.name for d in devices]
    missing = [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if frozenset((a, b)) not in measured]
    default = None
    if fits:
        default = LinkSpec(bandwidth=statistics.median(f.bandwidth for f in fits),
                           latency=statistics.median(f.latency for f in fits))
    driver_fits = [f for f in fits if driver.name in f.between]
    for a, b in missing:
        if driver.name in (a, b) and driver_fits:   # see the compiled-engine note
            links.append(Link(between=(a, b), bandwidth=statistics.mean(f.bandwidth for f in driver_fits),
                              latency=statistics.mean(f.latency for f in driver_fits)))
    if base is not None:
        keep = [ln for ln in base.links if frozenset(ln.between) not in measured]
        links += [ln for ln in keep if not any(frozenset(ln.between) == frozenset(x.between) for x in links)]
        default = default or base.default_link
    return Cluster(devices=tuple(devices), source=driver.name, links=tuple(links), default_link=default,
                   sink=driver.name, name=base.name if base is not None else "profiled")
