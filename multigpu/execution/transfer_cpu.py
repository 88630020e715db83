"""Transfer CPU: how much CPU each process spends moving an activation through the engine.

A streamed run is limited by CPU as well as by its stages: with Ray's actor calls a
hop is work in the sending worker (converting to numpy, serializing, replying), in
the driver (which owns every intermediate result, receives it and sends it on with
the next call) and in the receiving worker. On one host that work shares the cores
with the stages. This measures it through the engine a run uses, as CPU time
(``time.process_time`` of each process, every thread), which other jobs on the
machine do not inflate the way they stretch wall-clock time.

Probes pass a payload through a route of workers, streamed as a run streams (a window
of items in flight), and each process's CPU per item is read. A one-way probe takes the
payload in and sends back 4 bytes, as a stage that takes a large activation in and
gives a small one out: with Ray a worker pulls an argument from another node through
its node daemon but sends a result by writing it to its own store, so receiving and
sending a byte cost differently (the lab's Pi-class hosts: 40-44 ns per byte received
against 9-14 sent). The workers compute a few hundred microseconds of real layers on
each visit (the link probes' work), so
items arrive spaced as a run's do: a driver whose replies come back at once handles
them in batches and spends less per item than in a run. The CPU of that work is
taken out. Per item:

* a worker visited v times per item: ``v * (2 * fixed + receive_per_byte * in +
  per_byte * out)`` (it receives ``in`` bytes and sends ``out`` on each visit);
* the driver, on a route of L workers: ``2 * fixed + per_byte * in + receive_per_byte *
  out`` (it sends the input and receives the output)
  ``+ (L - 1) * (relay_fixed + relay_per_byte * bytes)`` (each hop between two workers
  passes through it).

Each ``fixed`` above is ``inline_fixed`` for a transfer of at most the engine's
``inline_bytes``: Ray passes such a payload inside the call's own message and a larger one
through the object store, whose put, pull and release cost more per object (the lab's
0.46-core host, one way: 0.86 ms per item at 64 bytes, 3.45 ms at 4 KB). The two are
fitted as columns of their own where the samples hold transfers on both sides.

The same is read for the thread that runs each process's calls (``time.thread_time``):
the *serial* part, which a device's own items wait for; the rest runs on Ray's I/O
threads, beside the stages when the host has a core to spare.

A worker's process CPU also takes in its node daemon's (``daemon_cpu``: the raylet, which
pulls the worker's inputs from other nodes and serves its outputs) when that daemon serves
no other worker of the session: a worker alone on its host, as on the emulated lab's, where
it is the host's CPU too. A daemon several workers share (one host) is left out, since its
CPU cannot be split among them; there it moves no object between nodes.

Routes: each worker alone, one way and in and back, and a walk crossing every pair of
workers; a few payload sizes. The figures are fitted by non-negative least squares on
relative error.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from multigpu.execution.link_fitting import pair_walk
from multigpu.execution.progress import bar as progress_bar
from multigpu.execution.worker import PROBE, PROBE_SEND
from multigpu.partition.inputs.hosts import Relay, TransferCpu, is_inline

__all__ = ["CpuSample", "TransferCpuFit", "cpu_sizes", "fit_transfer_cpu", "time_transfer_cpu"]


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds per item of each process (``cpu``: device -> seconds, its own node
    daemon's included), of the thread that runs its calls (``serial``) and of the node
    daemon alone (``daemon``: only the devices whose daemon is counted) while ``items``
    payloads of ``nbytes`` streamed through ``route`` (worker names, in order), each
    worker sending on ``out_bytes`` (None: the payload, unchanged)."""

    route: tuple[str, ...]
    nbytes: int
    items: int
    cpu: dict[str, float]
    serial: dict[str, float] = field(default_factory=dict)
    daemon: dict[str, float] = field(default_factory=dict)
    out_bytes: int | None = None

    @property
    def sent(self) -> int:
        """Bytes each worker visit sends on."""
        return self.nbytes if self.out_bytes is None else self.out_bytes


@dataclass(frozen=True)
class TransferCpuFit:
    """The fitted figures: per device (``devices``), the driver's ``relay`` (None when it
    could not be measured: fewer than two workers), and the samples behind them."""

    devices: dict[str, TransferCpu]
    relay: Relay | None
    samples: list[CpuSample]
    inline_bytes: float = 0.0

    def predict(
        self, device: str, route: Sequence[str], nbytes: float, driver: str, out_bytes: float | None = None
    ) -> float:
        """The fit's CPU seconds per item of ``device`` on a probe ``route`` of ``nbytes`` in,
        each worker sending ``out_bytes`` on (None: ``nbytes``)."""
        f, ib = self.devices[device], self.inline_bytes
        sent = nbytes if out_bytes is None else out_bytes
        if device == driver:
            out = f.cost(nbytes, ib) + f.receive_cost(sent, ib)
            if self.relay is not None:
                out += (len(route) - 1) * self.relay.cost(nbytes, ib)
            return out
        return list(route).count(device) * (f.receive_cost(nbytes, ib) + f.cost(sent, ib))

    def worst_error(self, driver: str) -> float:
        """Largest relative miss of the fit on its own samples."""
        errs = [
            abs(self.predict(d, s.route, s.nbytes, driver, s.out_bytes) - t) / t
            for s in self.samples
            for d, t in s.cpu.items()
            if t > 0 and d in self.devices
        ]
        return max(errs, default=0.0)


def cpu_sizes(link_payloads: Sequence[int]) -> list[int]:
    """Three payload sizes from the link sizes: the smallest, the middle one, the largest."""
    sizes = sorted(set(int(s) for s in link_payloads))
    return sorted({sizes[0], sizes[len(sizes) // 2], sizes[-1]})


def time_transfer_cpu(
    ws: Any,
    ray_engine: Any,
    workers: Sequence[str],
    driver: str,
    sizes: Sequence[int],
    items: int,
    warmup: int,
    progress: bool,
) -> list[CpuSample]:
    """Stream ``items`` payloads of each size through each route (each worker alone, one
    way and in and back, and a walk over every pair) and read every process's CPU time
    around them."""
    walk = pair_walk(list(workers))
    routes = (
        [([w], PROBE) for w in workers]
        + [([w], PROBE_SEND) for w in workers]
        + ([(walk, PROBE)] if len(workers) > 1 else [])
    )
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

    for route, stage in routes:
        chain = [(d, stage) for d in route]
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
            out.append(
                CpuSample(
                    tuple(route),
                    int(x.nbytes),
                    items,
                    {d: v[0] for d, v in per.items()},
                    {d: min(v[1], v[0]) for d, v in per.items()},
                    {d: min(v[2], v[0]) for d, v in per.items() if d in own},
                    # PROBE_SEND replies with the payload's first element.
                    x.itemsize if stage == PROBE_SEND else None,
                )
            )
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


def _counts(sizes: Sequence[int], inline_bytes: float) -> tuple[int, int]:
    """(inline, store): how many of the transfers of ``sizes`` bytes travel inside the
    engine's message (at most ``inline_bytes``; none when it is 0) and how many through its store."""
    small = int(np.count_nonzero(is_inline(list(sizes), inline_bytes)))
    return small, len(sizes) - small


Figures = tuple[float, float, float | None, float | None]


def _fit(
    samples: Sequence[CpuSample], workers: Sequence[str], driver: str, serial: bool, inline_bytes: float
) -> tuple[dict[str, Figures], tuple[float, float, float | None] | None]:
    """(fixed, per_byte, receive_per_byte, inline_fixed) per process and the relay's
    (fixed, per_byte, inline_fixed), from the process CPU or, with ``serial``, the calling
    thread's. receive_per_byte is None unless some sample sends on other than it takes in
    (only then can the two differ in the fit); inline_fixed is None unless the samples hold
    transfers both at most ``inline_bytes`` and above it (only then can the two fixed
    figures differ in the fit)."""

    def y(s: CpuSample, d: str) -> float:
        return (s.serial if serial else s.cpu)[d]

    one_way = any(s.sent != s.nbytes for s in samples)
    regimes = [_counts((s.nbytes, s.sent), inline_bytes) for s in samples]
    two = any(r[0] for r in regimes) and any(r[1] for r in regimes)

    def fixed_columns(small: float, store: float) -> list[float]:
        # Inline transfers (inside Ray's messages) and store transfers (a put, a pull and a
        # release per object) have fixed costs of their own where both were sampled.
        return [store, small] if two else [small + store]

    def figures(coef: np.ndarray) -> Figures:
        fixed, inline = (float(coef[0]), float(coef[1])) if two else (float(coef[0]), None)
        rest = coef[2:] if two else coef[1:]
        return fixed, float(rest[0]), (float(rest[1]) if one_way else None), inline

    def bytes_columns(sent: float, received: float) -> list[float]:
        # Symmetric samples alone cannot tell a byte sent from one received: one column.
        return [sent, received] if one_way else [sent + received]

    out: dict[str, Figures] = {}
    for w in workers:
        rows, ys = [], []
        for s, (small, store) in zip(samples, regimes):
            v = Counter(s.route)[w]
            if v and w in s.cpu:
                # Each visit receives the payload and sends on what it gives out.
                rows.append(fixed_columns(v * small, v * store) + [v * c for c in bytes_columns(s.sent, s.nbytes)])
                ys.append(y(s, w))
        if rows:
            out[w] = figures(_nnls(rows, ys))
    relay = None
    relayed = any(len(s.route) > 1 for s in samples)
    rows, ys = [], []
    for s, (small, store) in zip(samples, regimes):
        hops = len(s.route) - 1
        # The driver sends the payload in and receives what comes back; it relays each hop.
        relay_cols: list[float] = []
        if relayed:
            hop_small = hops if is_inline(s.nbytes, inline_bytes) else 0
            relay_cols = fixed_columns(hop_small, hops - hop_small) + [float(hops * s.nbytes)]
        rows.append(fixed_columns(small, store) + bytes_columns(s.nbytes, s.sent) + relay_cols)
        ys.append(y(s, driver))
    if rows:
        coef = _nnls(rows, ys)
        width = (2 if two else 1) + (2 if one_way else 1)
        out[driver] = figures(coef[:width])
        if relayed:
            r = coef[width:]
            relay = (float(r[0]), float(r[2]), float(r[1])) if two else (float(r[0]), float(r[1]), None)
    return out, relay


def fit_transfer_cpu(
    samples: Sequence[CpuSample], workers: Sequence[str], driver: str, inline_bytes: float = 0.0
) -> TransferCpuFit:
    """Fit each worker's and the driver's ``transfer_cpu`` and the driver's relay figure,
    with their serial parts (each at most the whole, which the fits of the two clocks
    on their own need not respect). ``inline_bytes`` is the cluster's: transfers of at
    most that many bytes get a fixed figure of their own (``inline_fixed``) where the
    samples hold both kinds."""
    total, relay = _fit(samples, workers, driver, False, inline_bytes)
    have_serial = all(s.serial for s in samples)
    part, relay_part = _fit(samples, workers, driver, True, inline_bytes) if have_serial else ({}, None)

    def serial_of(whole: tuple[float | None, ...], p: tuple[float | None, ...] | None) -> tuple[float | None, ...]:
        if p is None:
            return (None,) * len(whole)
        return tuple(None if w is None or q is None else min(q, w) for w, q in zip(whole, p))

    devices = {}
    for d, (f, c, r, i) in total.items():
        sf, sc, sr, si = serial_of((f, c, r, i), part.get(d))
        devices[d] = TransferCpu(f, c, sf, sc, r, sr, inline_fixed=i, serial_inline_fixed=si)
    relay_fig = None
    if relay is not None:
        rf, rc, ri = relay
        sf, sc, si = serial_of(relay, relay_part)
        relay_fig = Relay(driver, rf, rc, sf, sc, inline_fixed=ri, serial_inline_fixed=si)
    return TransferCpuFit(devices, relay_fig, list(samples), float(inline_bytes))
