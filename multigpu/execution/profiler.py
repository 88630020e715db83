"""``profile``: measure each layer on each device and each link through the engine, and
write them as a cluster file the cost model reads. This module runs the steps and
builds the cluster; ``layer_timing`` times layers, ``link_fitting`` fits links.

* Layers: every layer's forward pass on every device, after warm-up, ``repeats``
  times with the device synchronized, in the worker process that ``multigpu run``
  would use (same backend, threads and Ray placement). Devices are timed one after
  another, so none competes with another for the CPU. The median becomes the
  device's ``layer_times`` for the graph; the spread is reported.
* Links: payloads of several sizes (spanning the models' activations) travel
  through the same engine and code path as a run's activations (``run_chain``),
  between workers that wait 10 ms and then compute a few hundred microseconds of
  real layers before each hop, as stages do (``link_fitting.LINK_PROBE_WAIT``: a hop
  whose processes waited costs more than one between busy ones), and every hop is
  timed at both ends. Each pair's
  ``latency + bytes / bandwidth`` is fitted to them (least squares on relative
  error). Bare hops (nothing computed) and bare actor calls with the same payload
  are timed alternately, as the yardstick for the engine's own cost.
* Transfer CPU (``transfer_cpu``): payloads streamed through the engine between
  workers that compute nothing, each process's CPU time read around them (a worker
  alone on its node with its node daemon's, the raylet that moves its objects between
  nodes: ``daemon_cpu``); each device's CPU per transfer and the driver's per relayed
  hop are fitted to them.
* Hosts: every device's worker reports its machine and the cores it may use; the
  devices of one machine share a ``hosts`` entry.
* Each device's ``flops`` becomes its effective FLOP/s on the profiled graphs
  (FLOPs / measured time), the estimate the cost model uses for other graphs.
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from multigpu.checks import check_count
from multigpu.data.files import atomic_write
from multigpu.errors import InputError, PlanError
from multigpu.execution.cores import usable_cores
from multigpu.execution.layer_timing import LayerProfile, PassProfile, probe_layers, time_devices
from multigpu.execution.link_fitting import (
    LINK_PROBE_WAIT,
    PROBE_WORK,
    HopVsBare,
    LinkFit,
    fit_link,
    fit_links,
    hop_vs_bare,
    link_sizes,
    time_links,
)
from multigpu.execution.progress import bar as progress_bar
from multigpu.execution.runner import ENGINES, resolve_model
from multigpu.execution.stream_fitting import StreamSample, fit_message_bytes, stream_probe_size, time_streams
from multigpu.execution.transfer_cpu import TransferCpuFit, cpu_sizes, fit_transfer_cpu, time_transfer_cpu
from multigpu.partition.inputs.cluster import Cluster, DeviceSpec, EngineProfile, HostSpec, Link, LinkSpec, TransferCpu
from multigpu.partition.inputs.graph import graph_from_model

__all__ = ["LayerProfile", "LinkFit", "PassProfile", "HopVsBare", "ProfileResult", "fit_link", "profile", "link_sizes"]


def json_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path; InputError unless it names a .json file (a profile is JSON)."""
    p = Path(path)
    if p.suffix.lower() != ".json":
        raise InputError(f"--out {str(p)!r}: the profile is written as JSON; name it .json")
    return p


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
    transfer_cpu: TransferCpuFit | None = None
    hosts: dict[str, float] = field(default_factory=dict)
    streams: list[StreamSample] = field(default_factory=list)
    stream_message_bytes: dict[str, float | None] = field(default_factory=dict)

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the cluster as JSON to ``path`` (atomically)."""
        import json

        p = json_path(path)
        with atomic_write(p) as f:
            f.write((json.dumps(self.cluster.to_dict(), indent=1) + "\n").encode())
        return p

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the cluster, per-layer spreads, link fits, hop against bare call."""
        return {
            "engine": self.engine,
            "batch": self.batch,
            "graphs": self.graphs,
            "seconds": self.seconds,
            "cluster": self.cluster.to_dict(),
            "layers": [vars(x) for x in self.layers],
            "passes": [vars(x) for x in self.passes],
            "links": [
                {
                    "between": list(f.between),
                    "latency": f.latency,
                    "bandwidth": f.bandwidth,
                    "inline_latency": f.inline_latency,
                    "inline_bytes": f.inline_bytes,
                    "worst_error": f.worst_error,
                    "samples": [{"bytes": b, "median": t, "n": n} for b, t, n in f.samples],
                }
                for f in self.links
            ],
            "hop_vs_bare": [
                {"between": list(h.between), "bytes": h.nbytes, "hop": h.hop, "bare": h.bare, "ratio": h.ratio}
                for h in self.hop_vs_bare
            ],
            "hosts": self.hosts,
            "streams": [
                {
                    "worker": x.worker,
                    "bytes": x.nbytes,
                    "items": x.items,
                    "seconds": x.seconds,
                    "message_bytes": self.stream_message_bytes.get(x.worker),
                }
                for x in self.streams
            ],
            "transfer_cpu": None
            if self.transfer_cpu is None
            else {
                "devices": {d: f.to_dict() for d, f in self.transfer_cpu.devices.items()},
                "relay": None if self.transfer_cpu.relay is None else self.transfer_cpu.relay.to_dict(),
                "worst_error": self.transfer_cpu.worst_error(self.cluster.source),
                "samples": [
                    {
                        "route": list(x.route),
                        "bytes": x.nbytes,
                        "sent": x.sent,
                        "items": x.items,
                        "cpu": x.cpu,
                        "serial": x.serial,
                        "daemon": x.daemon,
                    }
                    for x in self.transfer_cpu.samples
                ],
            },
            "notes": self.notes,
        }

    def format(self) -> str:
        """A readable summary: per device and graph, per link, hop against bare call."""
        from multigpu.partition.units import fmt_bytes, fmt_time

        out = [
            f"profiled {', '.join(self.graphs)} on {self.cluster.k} device(s) in {self.seconds:.1f} s "
            f"(engine: Ray {self.engine}); driver: {self.cluster.source}"
        ]
        for d in self.cluster.devices:
            rows = [x for x in self.layers if x.device == d.name]
            if not rows:
                out.append(f"  {d.name:<16} runs no layers (the driver without a backend)")
            for g in self.graphs if rows else []:
                xs = [x for x in rows if x.graph == g]
                total = math.fsum(x.median for x in xs)
                slowest = max(xs, key=lambda x: x.median)
                full = next(p for p in self.passes if p.device == d.name and p.graph == g)
                out.append(
                    f"  {d.name:<10} {d.backend:<7} {g:<17} layers {fmt_time(total):>9} + stage overhead "
                    f"{fmt_time(d.stage_overhead):>8}; slowest {slowest.layer} {fmt_time(slowest.median)}; "
                    f"a whole pass {fmt_time(full.median)} (IQR {(full.q3 - full.q1) / full.median:.0%})"
                    + ("" if full.warm is None else f", one pass after another {fmt_time(full.warm)}")
                )
        for f in self.links:
            small = (
                ""
                if f.inline_latency is None
                else (f" ({fmt_time(f.inline_latency)} up to {fmt_bytes(f.inline_bytes)}, inside Ray's messages)")
            )
            out.append(
                f"  link {f.between[0]} <-> {f.between[1]}: latency {fmt_time(f.latency)}{small}, bandwidth "
                f"{fmt_bytes(f.bandwidth)}/s (fit within {f.worst_error:.0%} of its medians)"
            )
        routes: dict[tuple[str, str], list[HopVsBare]] = {}
        for h in self.hop_vs_bare:
            routes.setdefault(h.between, []).append(h)
        for (a, b), hs in routes.items():
            worst = max(hs, key=lambda h: h.ratio)
            out.append(
                f"  hop {a} -> {b} against a bare actor call with the same payload: "
                f"{min(h.ratio for h in hs):.2f}x to {worst.ratio:.2f}x over {fmt_bytes(hs[0].nbytes)} to "
                f"{fmt_bytes(hs[-1].nbytes)} (worst: {fmt_time(worst.hop)} against {fmt_time(worst.bare)} "
                f"at {fmt_bytes(worst.nbytes)})"
            )
        for x in self.streams:
            m = self.stream_message_bytes.get(x.worker)
            out.append(
                f"  stream {self.cluster.source} -> {x.worker} of {fmt_bytes(x.nbytes)}: {fmt_time(x.seconds)} "
                f"an item; "
                + (
                    "the hosts' CPU, not the link, set the rate"
                    if m is None
                    else f"the engine's messages add {fmt_bytes(m)} a transfer on the link"
                )
            )
        message_bytes = None if self.cluster.engine is None else self.cluster.engine.message_bytes
        if message_bytes is not None:
            out.append(
                f"  message_bytes {fmt_bytes(message_bytes)} (the median over the links a stream "
                f"filled): the throughput bottleneck's link loads"
            )
        for host, cores in self.hosts.items():
            on = [d.name for d in self.cluster.devices if d.host == host]
            out.append(f"  host {host}: {cores:g} cores, shared by {', '.join(on)}")
        tc = self.transfer_cpu
        if tc is not None:

            def figures(f: Any) -> str:
                # A relay has no receive figures: each hop it carries costs it the same.
                receive, serial_receive = (
                    (f.receive_per_byte, f.serial_receive_per_byte) if isinstance(f, TransferCpu) else (None, None)
                )

                def per(sent: float | None, received: float | None) -> str:
                    text = f"{(sent or 0.0) * 1e9:.3g} ns/byte"
                    return text if received is None else f"{text} sent, {received * 1e9:.3g} ns/byte received"

                def small(fixed: float | None) -> str:
                    return "" if fixed is None else f" ({fmt_time(fixed)} inline)"

                serial = (
                    ""
                    if f.serial_fixed is None
                    else (
                        f" (on its calling thread: {fmt_time(f.serial_fixed)}{small(f.serial_inline_fixed)} + "
                        f"{per(f.serial_per_byte, serial_receive)})"
                    )
                )
                return f"{fmt_time(f.fixed)}{small(f.inline_fixed)} + {per(f.per_byte, receive)}{serial}"

            for name, fig in tc.devices.items():
                out.append(f"  transfer CPU of {name}: {figures(fig)} per transfer it sends or receives")
            if tc.relay is not None:
                out.append(f"  relay {tc.relay.device}: {figures(tc.relay)} per hop between two workers")
            out.append(f"  transfer CPU fit within {tc.worst_error(self.cluster.source):.0%} of its samples")
            daemons = sorted({d for s in tc.samples for d in s.daemon})
            if daemons:
                out.append(
                    f"  transfer CPU of {', '.join(daemons)} includes its node daemon's (the raylet, alone "
                    f"with that worker on its node)"
                )
        out += [f"  note: {n}" for n in self.notes]
        return "\n".join(out)


def _spec(x: DeviceSpec | Mapping[str, Any]) -> DeviceSpec:
    if isinstance(x, DeviceSpec):
        return x
    if not isinstance(x, Mapping) or "name" not in x or "backend" not in x:
        raise PlanError(
            f"a profiled device needs at least a name and a backend, e.g. "
            f"{{'name': 'torch-1t', 'backend': 'torch', 'threads': 1}}; got {x!r}"
        )
    extra = set(x) - {"name", "backend", "device", "threads", "resources", "power", "memory"}
    if extra:
        raise PlanError(
            f"device {x['name']!r}: unknown key {sorted(extra)[0]!r}; a profiled device takes "
            f"name, backend, device, threads, resources, power and memory"
        )
    return DeviceSpec(
        name=x["name"],
        flops=1.0,
        power=x.get("power", 0.0),
        memory=x.get("memory"),
        backend=x["backend"],
        device=x.get("device"),
        threads=x.get("threads"),
        resources=x.get("resources"),
    )


def profile(
    models: str | Any | Sequence[Any] = "lenet",
    devices: Sequence[DeviceSpec | Mapping[str, Any]] | None = None,
    *,
    driver: None | DeviceSpec | Mapping[str, Any] = None,
    cluster: Cluster | None = None,
    batch: int = 1,
    repeats: int = 20,
    warmup: int = 3,
    link_repeats: int = 15,
    sizes: Sequence[int] | None = None,
    cpu_items: int = 60,
    stream_items: int = 24,
    engine: str = "tasks",
    address: str | None = None,
    timeout: float = 120.0,
    startup_timeout: float = 180.0,
    progress: bool = True,
    seed: int = 0,
    session: Any = None,
) -> ProfileResult:
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
    ``cpu_items`` payloads per route and size measure the transfer CPU;
    ``stream_items`` payloads streamed to each worker, the engine's message bytes
    (``stream_fitting``).

    Raises PlanError, InputError, BackendNotInstalledError, MissingDependencyError
    (Ray), and WorkerDiedError / WorkerTimeoutError.
    """
    t_begin = time.perf_counter()
    if session is not None and cluster is None and devices is None and driver is None:
        cluster = session.cluster
    model_list = [
        resolve_model(m) for m in ([models] if isinstance(models, str) or hasattr(models, "layers") else list(models))
    ]
    if not model_list:
        raise InputError("profile needs at least one model")
    for name, value, low in (
        ("batch", batch, 1),
        ("repeats", repeats, 1),
        ("warmup", warmup, 0),
        ("link_repeats", link_repeats, 3),
        ("cpu_items", cpu_items, 10),
        ("stream_items", stream_items, 6),
    ):
        check_count(value, name, minimum=low)
    if engine not in ENGINES:
        raise PlanError(f"engine={engine!r} is unknown; choose one of {', '.join(ENGINES)}")
    if cluster is not None:
        if devices is not None or driver is not None:
            raise PlanError("give either cluster= or devices=/driver=, not both")
        base: Cluster | None = cluster
        driver_spec: DeviceSpec = cluster.devices[cluster.source_index]
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
            raise PlanError(f'device {w.name!r} has no backend to profile; add "backend" to it')
    if session is not None:
        have = set(session.workers.actors) if session.workers is not None else set()
        lacking = [w.name for w in workers if w.name not in have]
        if lacking or (driver_spec.backend is not None and session.workers.local is None):
            raise PlanError(
                f"the session has no worker for {lacking or [driver_spec.name]}; open it on every device to profile"
            )
    elif address is None:
        from multigpu.contract import registry

        for spec in [driver_spec] + workers:
            if spec.backend is not None:
                registry.require_installed(spec.backend)
    from multigpu.execution import engine as ray_engine

    inline = ray_engine.inline_payload_bytes()
    link_payloads = sorted(set(int(s) for s in sizes)) if sizes else link_sizes(model_list, batch, inline_bytes=inline)
    if any(s < 4 or s % 4 for s in link_payloads):
        raise InputError(f"sizes={list(link_payloads)} must be positive multiples of 4 bytes (float32 payloads)")

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
            ws = stack.enter_context(
                ray_engine.Workers(
                    workers, driver_spec if driver_spec.backend else None, float(timeout), float(startup_timeout)
                )
            )
        # -- layers: the devices take turns, one pass each, as stages of a run do ----------
        bar = progress_bar(progress, len(model_list), "profiling layers")
        names_computing = [d.name for d in computing]
        first_medians: dict[str, list[float]] = {}
        for m, g in zip(model_list, graphs):
            timed = time_devices(ws, names_computing, m, batch, repeats, warmup, seed)
            for name, (medians, q1, q3, n_samples, oh, full, warm) in timed.items():
                overheads.setdefault(name, []).append(oh)
                passes.append(PassProfile(name, g.name, full[1], full[0], full[2], n_samples, warm))
                first_medians.setdefault(name, medians)
                for (label, _), med, a, b in zip(m.layers, medians, q1, q3):
                    layer_rows.append(LayerProfile(name, g.name, label, med, a, b, n_samples))
            bar.update(1)
        bar.close()
        # -- links through the engine, between workers that compute ---------------------------
        m0 = model_list[0]

        def set_probe_work(wait: float, what: str) -> None:
            for name in [w.name for w in workers]:
                work = probe_layers(first_medians[name], PROBE_WORK)
                # A worker held below one core by a CPU quota does not wait: a sleep refills its
                # quota, while a stage sends with its quota spent on computing (the lab's Pi-class
                # hosts' hops out were fitted 8 ms shorter, 13.6 against 21.7 ms, with the wait).
                cores = ws.info[name].cores
                own = wait if cores is None or cores >= 1 else 0.0
                ws._get(ws.actors[name].set_probe_work.remote(work, own), lambda n=name: f"device {n!r}", what=what)

        for name in [w.name for w in workers]:
            ws._get(
                ws.actors[name].prepare_profile.remote(m0, None, batch, seed),
                lambda n=name: f"device {n!r}",
                what="preparing link probes",
            )
        set_probe_work(LINK_PROBE_WAIT, "preparing link probes")
        hops, idle, bare = time_links(
            ws,
            ray_engine,
            [w.name for w in workers],
            driver_spec.name,
            link_payloads,
            link_repeats,
            warmup,
            engine,
            progress,
            notes,
        )
        # Streams and transfer CPU probe without the wait: their items follow each other, and
        # a wait would make the workers, not the hops, set the rate.
        set_probe_work(0.0, "preparing stream probes")
        # -- transfer CPU through the same engine, and the hosts the workers run on ----------
        cpu_samples = None
        if engine == "tasks" and workers:
            cpu_samples = time_transfer_cpu(
                ws,
                ray_engine,
                [w.name for w in workers],
                driver_spec.name,
                cpu_sizes(link_payloads),
                cpu_items,
                warmup,
                progress,
            )
        elif engine != "tasks":
            notes.append(
                "compiled engine: transfer CPU not measured (a compiled graph's actors poll their "
                "channels, so their CPU per item depends on how long they wait, not on the hop); "
                "the cluster has no transfer_cpu or relay"
            )
        # -- streams: what the engine's messages add on a link a stream fills ------------------
        streams: list[StreamSample] = []
        probe = stream_probe_size(link_payloads, inline)
        if engine == "tasks" and workers and probe is not None:
            streams = time_streams(ws, ray_engine, [w.name for w in workers], probe, stream_items, warmup, progress)
        host_of = {name: (info.host, info.cores) for name, info in ws.info.items()}
    if driver_spec.name not in host_of:  # a driver that runs no layers has no worker of its own
        host_of[driver_spec.name] = (socket.gethostname(), usable_cores())
    fits = fit_links(hops, inline)
    two_regimes = any(f.inline_latency is not None for f in fits)
    kept = base.engine.inline_bytes if base is not None and base.engine is not None else 0
    cluster_inline = int(fits[0].inline_bytes) if two_regimes else kept
    # Transfer CPU gets an inline regime of its own under the threshold the cluster carries.
    cpu_fit = (
        None
        if cpu_samples is None
        else fit_transfer_cpu(cpu_samples, [w.name for w in workers], driver_spec.name, cluster_inline)
    )
    message_bytes, per_link = fit_message_bytes(streams, fits, driver_spec.name)
    if streams and message_bytes is None:
        notes.append(
            "no stream filled a link (the hosts' CPU set every probe's rate): the throughput "
            "bottleneck charges each transfer its hop time"
        )
    pairs_vs_bare = hop_vs_bare(idle, bare, driver_spec.name)
    stage_overhead = {name: statistics.median(v) for name, v in overheads.items()}
    hosts: dict[str, float] = {}
    for host, cores in host_of.values():
        hosts[host] = min(hosts.get(host, math.inf), cores or math.inf)
    result_cluster = _build_cluster(
        base,
        driver_spec,
        workers,
        graphs,
        layer_rows,
        passes,
        fits,
        stage_overhead,
        {name: h for name, (h, _) in host_of.items()},
        hosts,
        cpu_fit,
        # The profile records the engine's threshold even where no probe straddled it (then
        # both regimes share each figure, and a later profile that straddles it fits both).
        cluster_inline or inline,
        message_bytes,
    )
    return ProfileResult(
        cluster=result_cluster,
        layers=layer_rows,
        passes=passes,
        links=fits,
        hop_vs_bare=pairs_vs_bare,
        streams=streams,
        stream_message_bytes=per_link,
        engine=engine,
        batch=batch,
        graphs=[g.name for g in graphs],
        seconds=time.perf_counter() - t_begin,
        notes=notes,
        transfer_cpu=cpu_fit,
        hosts=hosts,
    )


def _build_cluster(
    base: Cluster | None,
    driver: DeviceSpec,
    workers: Sequence[DeviceSpec],
    graphs: Sequence[Any],
    rows: Sequence[LayerProfile],
    passes: Sequence[PassProfile],
    fits: Sequence[LinkFit],
    overhead: Mapping[str, float],
    host_of: Mapping[str, str],
    hosts: Mapping[str, float],
    cpu: TransferCpuFit | None,
    inline_bytes: int,
    message_bytes: float | None,
) -> Cluster:
    devices = []
    old_engine = base.engine if base is not None and base.engine is not None else EngineProfile()
    warm_pass: dict[str, dict[str, float]] = {}
    transfer_cpu = {}
    for spec in [driver, *workers]:
        times = {
            g.name: {r.layer: r.median for r in rows if r.device == spec.name and r.graph == g.name} for g in graphs
        }
        times = {g: t for g, t in times.items() if t}
        old = dict(spec.layer_times or {})
        flops = spec.flops
        if times:
            total_flops = sum(float(np.sum(g.flops)) for g in graphs if g.name in times)
            total_time = sum(math.fsum(times[g.name].values()) for g in graphs if g.name in times)
            flops = total_flops / total_time
            old.update(times)
        warm = dict(old_engine.warm_pass.get(spec.name, {}))
        warm.update({p.graph: p.warm for p in passes if p.device == spec.name and p.warm is not None})
        if warm:
            warm_pass[spec.name] = warm
        if cpu is not None and spec.name in cpu.devices:
            transfer_cpu[spec.name] = cpu.devices[spec.name]
        devices.append(
            DeviceSpec(
                name=spec.name,
                flops=flops,
                power=spec.power,
                memory=spec.memory,
                backend=spec.backend,
                device=spec.device,
                threads=spec.threads,
                resources=spec.resources,
                layer_times=old or None,
                stage_overhead=overhead.get(spec.name, spec.stage_overhead),
                host=host_of[spec.name],
            )
        )
    links = [Link(between=f.between, bandwidth=f.bandwidth, latency=f.latency) for f in fits]
    inline = [(f.between[0], f.between[1], f.inline_latency) for f in fits if f.inline_latency is not None]
    measured = {frozenset(f.between) for f in fits}
    names = [d.name for d in devices]
    missing = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :] if frozenset((a, b)) not in measured]
    default = None
    default_inline = None
    if fits:
        default = LinkSpec(
            bandwidth=statistics.median(f.bandwidth for f in fits),
            latency=statistics.median(f.latency for f in fits),
        )
        default_inline = _median_or_none([f.inline_latency for f in fits])
    driver_fits = [f for f in fits if driver.name in f.between]
    for a, b in missing:
        if driver.name in (a, b) and driver_fits:  # see the compiled-engine note
            inl = [f.inline_latency for f in driver_fits if f.inline_latency is not None]
            links.append(
                Link(
                    between=(a, b),
                    bandwidth=statistics.mean(f.bandwidth for f in driver_fits),
                    latency=statistics.mean(f.latency for f in driver_fits),
                )
            )
            if inl and len(inl) == len(driver_fits):
                inline.append((a, b, statistics.mean(inl)))
    if base is not None:
        keep = [ln for ln in base.links if frozenset(ln.between) not in measured]
        for ln in keep:
            if any(frozenset(ln.between) == frozenset(x.between) for x in links):
                continue
            links.append(ln)
            kept = old_engine.link_inline_latency(*ln.between)
            if kept is not None:
                inline.append((ln.between[0], ln.between[1], kept))
        if default is None:
            default, default_inline = base.default_link, old_engine.default_inline_latency
    # What Ray adds to the hardware: ``multigpu.execution`` measures it and owns these figures.
    engine = EngineProfile(
        name="ray",
        inline_bytes=inline_bytes,
        inline_latency=tuple(inline),
        default_inline_latency=default_inline,
        message_bytes=message_bytes if message_bytes is not None else old_engine.message_bytes,
        transfer_cpu=transfer_cpu,
        relay=None if cpu is None else cpu.relay,
        warm_pass=warm_pass,
    )
    return Cluster(
        devices=tuple(devices),
        source=driver.name,
        links=tuple(links),
        default_link=default,
        sink=driver.name,
        hosts=tuple(HostSpec(h, c) for h, c in hosts.items()),
        engine=engine,
        name=base.name if base is not None else "profiled",
    )


def _median_or_none(values: Sequence[float | None]) -> float | None:
    """The median of the values when none is None (every link fitted two latencies), else None."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if values and len(known) == len(values) else None
