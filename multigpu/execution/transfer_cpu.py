"""Transfer CPU: how much CPU each process spends moving an activation through the engine.

A streamed run is limited by CPU as well as by its stages: with Ray's actor calls a
hop is work in the sending worker (converting to numpy, serializing, replying), in
the driver (which owns every intermediate result, receives it and sends it on with
the next call) and in the receiving worker. On one host that work shares the cores
with the stages. This measures it through the engine a run uses, as CPU time
(``time.process_time`` of each process, every thread), which other jobs on the
machine do not inflate the way they stretch wall-clock time.

Probes pass a payload through a route of workers, streamed as a run streams (a window
of items in flight), and each process's CPU per item is read. The workers compute a
few hundred microseconds of real layers on each visit (the link probes' work), so
items arrive spaced as a run's do: a driver whose replies come back at once handles
them in batches and spends less per item than in a run. The CPU of that work is
taken out. Per item:

* a worker visited v times per item: ``v * (2 * fixed + 2 * per_byte * bytes)`` (it
  receives and sends the payload on each visit);
* the driver, on a route of L workers: ``2 * fixed + 2 * per_byte * bytes`` (it sends
  the input and receives the output) ``+ (L - 1) * (relay_fixed + relay_per_byte * bytes)``
  (each hop between two workers passes through it).

The same is read for the thread that runs each process's calls (``time.thread_time``):
the *serial* part, which a device's own items wait for; the rest runs on Ray's I/O
threads, beside the stages when the host has a core to spare.

A worker's process CPU also takes in its node daemon's (``daemon_cpu``: the raylet, which
pulls the worker's inputs from other nodes and serves its outputs) when that daemon serves
no other worker of the session: a worker alone on its host, as on the emulated lab's, where
it is the host's CPU too. A daemon several workers share (one host) is left out, since its
CPU cannot be split among them; there it moves no object between nodes.

Routes: each worker alone, and a walk crossing every pair of workers; a few payload
sizes. The figures are fitted by non-negative least squares on relative error.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from multigpu.execution.link_fitting import pair_walk
from multigpu.execution.progress import bar as progress_bar
from multigpu.execution.worker import PROBE
from multigpu.partition.inputs.hosts import Relay, TransferCpu

__all__ = ["CpuSample", "TransferCpuFit", "cpu_sizes", "fit_transfer_cpu", "time_transfer_cpu"]


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds per item of each process (``cpu``: device -> seconds, its own node
    daemon's included), of the thread that runs its calls (``serial``) and of the node
    daemon alone (``daemon``: only the devices whose daemon is counted) while ``items``
    payloads of ``nbytes`` streamed through ``route`` (worker names, in order)."""

    route: tuple[str, ...]
    nbytes: int
    items: int
    cpu: dict[str, float]
    serial: dict[str, float] = field(default_factory=dict)
    daemon: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class TransferCpuFit:
    """The fitted figures: per device (``devices``), the driver's ``relay`` (None when it
    could not be measured: fewer than two workers), and the samples behind them."""

    devices: dict[str, TransferCpu]
    relay: Optional[Relay]
    samples: list[CpuSample]

    def predict(self, device: str, route: Sequence[str], nbytes: float, driver: str) -> float:
        """The fit's CPU seconds per item of ``device`` on a probe ``route``."""
        f = self.devices[device]
        if device == driver:
            out = 2 * f.cost(nbytes)
            if self.relay is not None:
                out += (len(route) - 1) * self.relay.cost(nbytes)
            return out
        return list(route).count(device) * 2 * f.cost(nbytes)

    def worst_error(self, driver: str) -> float:
        """Largest relative miss of the fit on its own samples."""
        errs = [abs(self.predict(d, s.route, s.nbytes, driver) - t) / t
                for s in self.samples for d, t in s.cpu.items() if t > 0 and d in self.devices]
        return max(errs, default=0.0)


def cpu_sizes(link_payloads: Sequence[int]) -> list[int]:
    """Three payload sizes from the link sizes: the smallest, the middle one, the largest."""
    sizes = sorted(set(int(s) for s in link_payloads))
    return sorted({sizes[0], sizes[len(sizes) // 2], sizes[-1]})


def time_transfer_cpu(ws: Any, ray_engine: Any, workers: Sequence[str], driver: str, sizes: Sequence[int],
                      items: int, warmup: int, progress: bool) -> list[CpuSample]:
    """Stream ``items`` payloads of each size through each route (each worker alone, and a
    walk over every pair) and read every process's CPU time around them."""
    walk = pair_walk(list(workers))
    routes = [[w] for w in workers] + ([walk] if len(workers) > 1 else [])
    bar = progress_bar(progress, len(routes) * len(sizes), "profiling transfer CPU")
    out: list[CpuSample] = []

    def clocks(route: Sequence[str]) -> dict[str, tuple[Any, ...]]:
        refs = {d: ws.actors[d].cpu_time.remote() for d in set(route)}
        return {d: ws._get(r, lambda d=d: f"device {d!r}", what="reading its CPU time") for d, r in refs.items()}

    # Whose node daemon to count: a daemon (pid) that serves one worker of the session only.
    first = clocks(workers)
    pids = Counter(c[4] for c in first.values() if c[4] is not None)
    own = {d for d, c in first.items() if c[4] is not None and pids[c[4]] == 1}

    def read(route: Sequence[str]) -> dict[str, tuple[float, float, float]]:
        """(process with its own daemon, calling thread, daemon) CPU seconds of each
        process so far, less what its probes' layers took."""
        got = {}
        for d, (proc, thread, probe_proc, probe_thread, _, daemon) in clocks(route).items():
            extra = daemon if d in own and daemon is not None else 0.0
            got[d] = (proc - probe_proc + extra, thread - probe_thread, extra)
        got[driver] = (time.process_time(), time.thread_time(), 0.0)
        return got

    for route in routes:
        chain = [(d, PROBE) for d in route]
        labels = [f"transfer CPU probe on device {d!r}" for d in route]
        window = 2 * len(route) + 1
        # What reading the clocks costs each process (subtracted from every sample).
        a = read(route)
        b = read(route)
        base = {d: tuple(b[d][i] - a[d][i] for i in range(3)) for d in a}
        for size in sizes:
            x = np.zeros(size // 4, np.float32)
            if warmup:
                ray_engine.run_chain(ws, chain, labels, [x] * max(warmup, window), window=window)
            c0 = read(route)
            ray_engine.run_chain(ws, chain, labels, [x] * items, window=window)
            c1 = read(route)
            per = {d: [max(c1[d][i] - c0[d][i] - base[d][i], 0.0) / items for i in range(3)] for d in c0}
            out.append(CpuSample(tuple(route), int(x.nbytes), items, {d: v[0] for d, v in per.items()},
                                 {d: min(v[1], v[0]) for d, v in per.items()},
                                 {d: min(v[2], v[0]) for d, v in per.items() if d in own}))
            bar.update(1)
    bar.close()
    return out


def _nnls(rows: list[list[float]], ys: list[float]) -> np.ndarray:
    """Non-negative least squares on relative error (each row divided by its target)."""
    from scipy.optimize import nnls

    a = np.array(rows, dtype=float)
    y = np.array(ys, dtype=float)
    keep = y > 0
    a, y = a[keep], y[keep]
    if not len(y):
        return np.zeros(np.array(rows).shape[1])
    # Columns of bytes are ~1e6 times those of counts: scale them to the same size first.
    col = np.maximum(np.abs(a).max(axis=0), 1e-300)
    coef, _ = nnls(a / y[:, None] / col[None, :], np.ones_like(y))
    return coef / col


def _fit(samples: Sequence[CpuSample], workers: Sequence[str], driver: str, serial: bool
         ) -> tuple[dict[str, tuple[float, float]], Optional[tuple[float, float]]]:
    """(fixed, per_byte) per process and the relay's, from the process CPU or, with
    ``serial``, the calling thread's."""
    def y(s: CpuSample, d: str) -> float:
        return (s.serial if serial else s.cpu)[d]

    out: dict[str, tuple[float, float]] = {}
    for w in workers:
        rows, ys = [], []
        for s in samples:
            v = Counter(s.route)[w]
            if v and w in s.cpu:
                rows.append([2.0 * v, 2.0 * v * s.nbytes])
                ys.append(y(s, w))
        if rows:
            fixed, per_byte = _nnls(rows, ys)
            out[w] = (float(fixed), float(per_byte))
    relay = None
    relayed = any(len(s.route) > 1 for s in samples)
    rows, ys = [], []
    for s in samples:
        hops = len(s.route) - 1
        rows.append([2.0, 2.0 * s.nbytes] + ([float(hops), float(hops * s.nbytes)] if relayed else []))
        ys.append(y(s, driver))
    if rows:
        coef = _nnls(rows, ys)
        out[driver] = (float(coef[0]), float(coef[1]))
        if relayed:
            relay = (float(coef[2]), float(coef[3]))
    return out, relay


def fit_transfer_cpu(samples: Sequence[CpuSample], workers: Sequence[str], driver: str) -> TransferCpuFit:
    """Fit each worker's and the driver's ``transfer_cpu`` and the driver's relay figure,
    with their serial parts (each at most the whole, which the fits of the two clocks
    on their own need not respect)."""
    total, relay = _fit(samples, workers, driver, serial=False)
    have_serial = all(s.serial for s in samples)
    part, relay_part = _fit(samples, workers, driver, serial=True) if have_serial else ({}, None)

    def serial_of(whole: tuple[float, float], p: Optional[tuple[float, float]]) -> tuple[Optional[float], ...]:
        return (None, None) if p is None else (min(p[0], whole[0]), min(p[1], whole[1]))

    devices = {d: TransferCpu(f, c, *serial_of((f, c), part.get(d))) for d, (f, c) in total.items()}
    relay_fig = None if relay is None else Relay(driver, relay[0], relay[1], *serial_of(relay, relay_part))
    return TransferCpuFit(devices, relay_fig, list(samples))
