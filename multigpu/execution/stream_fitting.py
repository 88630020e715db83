"""Stream fitting: what a transfer keeps its link busy for when items stream.

A hop's fitted latency holds the engine's round trips (the task, the object's
location, the pull) and the wire time of its messages. In a stream the round trips
of one item overlap the payloads of others, but the messages' bytes still take the
link: measured on the lab's 1 MB/s WiFi with the tbf counters, each transfer through
Ray's object store carried some 4-7 KB of them forward and about 4 KB back. So the
throughput bottleneck charges a transfer ``(bytes + message_bytes) / bandwidth``.

The probe streams payloads of one size through the object store from the driver to
each worker, which replies with one value (inside Ray's messages), three items in
flight as a run of one remote stage has. Where the payload's own wire time is at least
half of the time per item (the link, not the CPU, sets the rate), the item's link time
is solved for the message bytes of its two transfers; the cluster gets the median over
such links. On links
no stream can fill (loopback, a LAN faster than the hosts) nothing is fitted, and the
bottleneck keeps charging the whole hop time there.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from multigpu.execution.link_fitting import LinkFit
from multigpu.execution.progress import bar as progress_bar
from multigpu.execution.worker import PROBE_SEND

__all__ = [
    "LINK_BOUND",
    "MAX_STREAM_PROBE",
    "REPLY_BYTES",
    "StreamSample",
    "fit_message_bytes",
    "stream_probe_size",
    "time_streams",
]

LINK_BOUND = 0.5  # the payload's wire time over the time per item above which the link sets the rate
MAX_STREAM_PROBE = 256 * 1024  # bytes: the largest payload streamed (a slow link takes it 0.25 s an item)
REPLY_BYTES = 4  # the probe's reply: one float32
SKIP = 2  # items at the start of a stream left out of its rate (the window filling)


@dataclass(frozen=True)
class StreamSample:
    """``items`` payloads of ``nbytes`` streamed from the driver to ``worker`` (one value
    back each): ``seconds`` per item at the steady rate."""

    worker: str
    nbytes: int
    items: int
    seconds: float


def stream_probe_size(sizes: Sequence[int], inline_bytes: float) -> int | None:
    """The payload to stream: the largest of ``sizes`` that goes through the object store
    (above ``inline_bytes``) and is at most MAX_STREAM_PROBE; None if there is none."""
    big = [s for s in sizes if inline_bytes < s <= MAX_STREAM_PROBE]
    return max(big) if big else None


def time_streams(
    ws: Any, ray_engine: Any, workers: Sequence[str], nbytes: int, items: int, warmup: int, progress: bool
) -> list[StreamSample]:
    """Stream ``items`` payloads of ``nbytes`` to each worker in turn (a window of 3, as a
    run of one remote stage has in flight); return the seconds per item of each."""
    out = []
    bar = progress_bar(progress, len(workers), "profiling streams")
    x = np.zeros(nbytes // 4, np.float32)
    for w in workers:
        chain = [(w, PROBE_SEND)]
        labels = [f"stream probe on device {w!r}"]
        if warmup:
            ray_engine.run_chain(ws, chain, labels, [x] * max(warmup, 3), window=3)
        res = ray_engine.run_chain(ws, chain, labels, [x] * items, window=3)
        done = sorted(res.done)
        first = min(SKIP, len(done) - 2)
        out.append(StreamSample(w, int(x.nbytes), items, (done[-1] - done[first]) / (len(done) - 1 - first)))
        bar.update(1)
    bar.close()
    return out


def fit_message_bytes(
    samples: Sequence[StreamSample], fits: Sequence[LinkFit], driver: str
) -> tuple[float | None, dict[str, float | None]]:
    """(the engine profile's ``message_bytes``, the bytes solved per worker's link or None where the
    link did not set the rate).

    Per item the link carries the payload and the reply, each with the messages:
    ``(b + m) / bandwidth + (4 + m) / bandwidth``, as the cost model prices a stream;
    ``m`` is solved from the time per item and kept within [0, latency * bandwidth]
    (never more than the whole hop)."""
    by_worker: dict[str, float | None] = {}
    link = {frozenset(f.between): f for f in fits}
    for s in samples:
        f = link.get(frozenset((driver, s.worker)))
        if f is None or s.seconds <= 0 or s.nbytes / f.bandwidth < LINK_BOUND * s.seconds:
            by_worker[s.worker] = None
            continue
        # Per item: the payload and the reply, each with the messages: (b + m + 4 + m) / bandwidth.
        m = (s.seconds * f.bandwidth - s.nbytes - REPLY_BYTES) / 2
        by_worker[s.worker] = float(min(max(m, 0.0), f.latency * f.bandwidth))
    fitted = [m for m in by_worker.values() if m is not None]
    return (statistics.median(fitted) if fitted else None), by_worker
