"""What a run measured, what the cost model predicted, and the two side by side. No Ray here."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from multigpu.execution.plan import SINK, SOURCE, ExecutionPlan, Stage, routes
from multigpu.partition.cost.choices import measured_devices
from multigpu.partition.cost.evaluate import evaluate
from multigpu.partition.exceptions import UnusableLinkError
from multigpu.partition.inputs.graph import graph_from_model
from multigpu.partition.units import fmt_bytes, fmt_time

__all__ = ["Prediction", "RunResult", "predict"]


@dataclass(frozen=True)
class Prediction:
    """The cost model's figures for one plan at one batch size (seconds).

    ``stage_compute`` includes each stage's ``stage_overhead``.
    ``hops`` has one entry more than ``stages``: source -> stage 1, between stages,
    last stage -> sink (0 where both ends are one device); for a graph model, one per
    message of ``plan.routes`` (the transfers it carries). ``end_to_end`` is the cost
    model's T on a chain, the makespan on a graph (branches on different devices at
    once; on a chain they are equal). ``measured`` lists the devices whose compute
    times come from ``layer_times`` (the rest from FLOP/s).
    """

    graph: str
    stage_compute: list[float]
    hops: list[float]
    end_to_end: float
    bottleneck: float
    measured: list[str]
    bottleneck_at: str = ""

    @property
    def throughput(self) -> float:
        """Items per second when pipelined: 1 / bottleneck."""
        return 1.0 / self.bottleneck if self.bottleneck > 0 else math.inf


def predict(xplan: ExecutionPlan, batch: int = 1) -> Prediction:
    """Price ``xplan`` with the cost model (``evaluate``) on its own cluster.

    Raises ClusterError when the cluster's measured times do not match the model's
    layers, UnusableLinkError when the plan crosses a pair with no link.
    """
    graph = graph_from_model(xplan.model, batch)
    measured = measured_devices(graph, xplan.cluster)
    bd = evaluate(graph, xplan.cluster, list(xplan.assignment))
    compute = [
        math.fsum(bd.layers[i].compute_time + bd.layers[i].stage_overhead for i in s.members) for s in xplan.stages
    ]
    if xplan.chain:
        hops = [bd.layers[s.start].transfer_time for s in xplan.stages] + [bd.output_time]
        end_to_end = bd.time
    else:
        times = {(t.producer, t.between): t.time for t in bd.transfers}
        hops = []
        for msg in routes(xplan)[1]:
            src = xplan.driver if msg.source == SOURCE else xplan.stages[msg.source].device
            hops.append(
                bd.output_time
                if msg.stage == SINK
                else math.fsum(times.get((name, (src, msg.device)), 0.0) for name in msg.names)
            )
        end_to_end = bd.makespan
    return Prediction(
        graph=graph.name,
        stage_compute=compute,
        hops=hops,
        end_to_end=end_to_end,
        bottleneck=bd.bottleneck,
        measured=measured,
        bottleneck_at=bd.bottleneck_at,
    )


def try_predict(xplan: ExecutionPlan, batch: int) -> tuple[Prediction | None, str | None]:
    """``predict``, or (None, why) when the plan uses a pair the cluster has no link for."""
    try:
        return predict(xplan, batch), None
    except UnusableLinkError as e:
        return None, str(e)


def _median(xs: Sequence[float] | np.ndarray) -> float:
    return statistics.median(xs) if len(xs) else math.nan


def _err(pred: float, meas: float) -> float:
    return (pred - meas) / meas if meas > 0 else math.nan


@dataclass
class RunResult:
    """What ``run_partitioned`` measured.

    ``outputs`` are in input order (one row per input). Per item (after the
    untimed warm-up): ``stage_times[j][i]`` is stage i's compute, ``hop_times[j][h]``
    the time of hop h (measured at both ends), ``end_to_end[j]`` the driver's time
    from sending the input to holding the output. ``param_bytes``/``param_seconds``
    is the parameter shipping before the first item, reported apart.
    ``items_per_second`` is the streaming rate (results per second once the
    pipeline is full), None for one-at-a-time runs. For a graph model each hop is one
    message (``hop_names``: the tensors it carries; ``hop_stages``: from which stage to
    which, -1 for the driver's input and output), timed from the sender's end to the
    receiving stage's start, which includes any wait for the stage's other inputs.
    """

    outputs: np.ndarray
    assignment: list[str]
    stages: list[Stage]
    hop_routes: list[tuple[str, str]]
    hop_bytes: list[int]
    stage_times: np.ndarray
    hop_times: np.ndarray
    end_to_end: np.ndarray
    param_bytes: int
    param_seconds: float
    startup_seconds: float
    wall_seconds: float
    engine: str
    batch: int
    stream: bool
    items_per_second: float | None
    workers: list[dict[str, Any]]
    prediction: Prediction | None = None
    prediction_note: str | None = None
    driver: str = ""
    notes: list[str] = field(default_factory=list)
    hop_names: list[tuple[str, ...]] | None = None
    hop_stages: list[tuple[int, int]] | None = None
    stage_starts: np.ndarray | None = None  # graph models: per item and stage, seconds from the send
    sent_at: np.ndarray | None = None  # graph models: each item's send, seconds after the first item's

    def overlapped(self, i: int, k: int) -> float:
        """Share of the items in which stages ``i`` and ``k`` computed at the same time
        (their intervals intersect); NaN without ``stage_starts``."""
        if self.stage_starts is None:
            return math.nan
        a0, b0 = self.stage_starts[:, i], self.stage_starts[:, k]
        a1, b1 = a0 + self.stage_times[:, i], b0 + self.stage_times[:, k]
        return float(np.mean((a0 < b1) & (b0 < a1)))

    def _hop_kind(self, h: int) -> str:
        """ "hop", or "join hop" for a message into a graph stage that also waits for another
        input (its measured time then includes that wait, which the makespan models apart)."""
        if self.hop_stages is None or self.hop_stages[h][1] < 0:
            return "hop"
        stage = self.stages[self.hop_stages[h][1]]
        return "join hop" if len({src for _, src in stage.inputs}) > 1 else "hop"

    def hop_label(self, h: int) -> str:
        """``"torch-1t -> paddle-1t"``, with the tensors a graph model's message carries."""
        a, b = self.hop_routes[h]
        if self.hop_names is None:
            return f"{a} -> {b}"
        src, dst = self.hop_stages[h] if self.hop_stages else (0, 0)
        ends = f"{'input' if src < 0 else f's{src + 1}'}->{'output' if dst < 0 else f's{dst + 1}'}"
        return f"{a} -> {b} ({ends}: {', '.join(self.hop_names[h])})"

    # -- summaries ----------------------------------------------------------------
    def stage_time(self, i: int) -> float:
        """Median compute seconds of stage ``i``."""
        return _median(self.stage_times[:, i])

    def hop_time(self, h: int) -> float:
        """Median seconds of hop ``h``."""
        return _median(self.hop_times[:, h])

    @property
    def latency(self) -> float:
        """Median end-to-end seconds per item."""
        return _median(self.end_to_end)

    def predictions(self) -> np.ndarray:
        """Class index per input (argmax of the outputs)."""
        return np.asarray(self.outputs).reshape(len(self.outputs), -1).argmax(axis=1)

    def compare_rows(self) -> list[dict[str, Any]]:
        """Predicted against measured (medians): each stage, each hop, end to end, and
        the streaming rate; ``error`` is (predicted - measured) / measured."""
        p = self.prediction
        if p is None:
            return []
        rows: list[dict[str, Any]] = []
        for i, s in enumerate(self.stages):
            rows.append(
                {
                    "what": f"stage {i + 1} compute ({s.span} on {s.device})",
                    "kind": "stage",
                    "predicted": p.stage_compute[i],
                    "measured": self.stage_time(i),
                }
            )
        if not self.stream:  # streamed items wait in queues, so their hops are not transfers
            for h, (a, b) in enumerate(self.hop_routes):
                if a == b and p.hops[h] == 0:
                    continue
                rows.append(
                    {
                        "what": f"hop {self.hop_label(h)} ({fmt_bytes(self.hop_bytes[h])})",
                        "kind": self._hop_kind(h),
                        "predicted": p.hops[h],
                        "measured": self.hop_time(h),
                    }
                )
            rows.append(
                {"what": "end to end", "kind": "end_to_end", "predicted": p.end_to_end, "measured": self.latency}
            )
        else:
            rows.append(
                {
                    "what": f"streaming: seconds per item (1 / rate; bottleneck at {p.bottleneck_at})",
                    "kind": "stream",
                    "predicted": p.bottleneck,
                    "measured": 1.0 / self.items_per_second if self.items_per_second else math.nan,
                }
            )
        for r in rows:
            r["error"] = _err(r["predicted"], r["measured"])
        return rows

    # -- text -------------------------------------------------------------------
    def format_timing(self) -> str:
        """Per-part timing: workers, parameter shipping, each stage, each hop, end to end."""
        lines = [
            f"engine: Ray ({self.engine}); {len(self.stages)} stage(s); batch {self.batch}; "
            f"{len(self.end_to_end)} timed item(s)" + ("; streamed" if self.stream else "")
        ]
        for w in self.workers:
            where = "in the driver" if w["local"] else f"pid {w['pid']} on {w['host']}"
            threads = f", {w['threads']} thread(s)" if w.get("threads") else ""
            lines.append(f"  worker {w['device']}: {w['backend']}{threads}, {where}")
        lines.append(
            f"  workers started in {self.startup_seconds:.2f} s; parameters shipped: "
            f"{fmt_bytes(self.param_bytes)} in {fmt_time(self.param_seconds)} (not counted below)"
        )
        sw = max(len(s.span) for s in self.stages)
        dw = max(len(s.device) for s in self.stages)
        for i, s in enumerate(self.stages):
            after = ""
            if self.hop_names is not None:  # a graph model: the stages it waits for
                after = "  <- " + (", ".join(f"stage {k + 1}" for k in s.after) or "input")
            lines.append(
                f"  stage {i + 1} {s.span:<{sw}} on {s.device:<{dw}}  compute {fmt_time(self.stage_time(i))}{after}"
            )
        width = max(len(self.hop_label(h)) for h in range(len(self.hop_routes)))
        for h in range(len(self.hop_routes)):
            lines.append(
                f"  hop {self.hop_label(h):<{width}}  {fmt_bytes(self.hop_bytes[h]):>9}  {fmt_time(self.hop_time(h))}"
            )
        lines.append(f"  end to end (median per item): {fmt_time(self.latency)}")
        if self.items_per_second is not None:
            lines.append(
                f"  streaming: {self.items_per_second:.1f} items/s"
                + (
                    f" (predicted {self.prediction.throughput:.1f} items/s = 1 / bottleneck "
                    f"{fmt_time(self.prediction.bottleneck)} at {self.prediction.bottleneck_at})"
                    if self.prediction
                    else ""
                )
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def format_compare(self) -> str:
        """The predicted-against-measured table (``--compare``)."""
        if self.prediction is None:
            return f"no prediction: {self.prediction_note}"
        p = self.prediction
        src = (
            f"compute from layer_times on {', '.join(p.measured)}"
            if p.measured
            else "compute from nominal FLOP/s (no layer_times for this graph)"
        )
        rows = self.compare_rows()
        w = max(len(r["what"]) for r in rows)
        lines = [
            f"predicted (cost model on {p.graph}; {src}) against measured (median):",
            f"  {'':<{w}}  {'predicted':>10}  {'measured':>10}  {'error':>7}",
        ]
        for r in rows:
            err = f"{100 * r['error']:+.1f}%" if math.isfinite(r["error"]) else "-"
            lines.append(f"  {r['what']:<{w}}  {fmt_time(r['predicted']):>10}  {fmt_time(r['measured']):>10}  {err:>7}")
        if self.stream and self.items_per_second:
            lines.append(
                f"  throughput: predicted {p.throughput:.1f} items/s, measured {self.items_per_second:.1f} items/s"
            )
        return "\n".join(lines)

    def to_dict(self, include_outputs: bool = False) -> dict[str, Any]:
        """JSON-ready summary (medians, per-item samples, the comparison)."""
        p = self.prediction
        d: dict[str, Any] = {
            "engine": self.engine,
            "batch": self.batch,
            "stream": self.stream,
            "assignment": self.assignment,
            "stages": [
                {
                    "device": s.device,
                    "first": s.first,
                    "last": s.last,
                    "layers": s.layers,
                    "after": list(s.after),
                    "compute": self.stage_time(i),
                    "samples": self.stage_times[:, i].tolist(),
                }
                for i, s in enumerate(self.stages)
            ],
            "hops": [
                {
                    "from": a,
                    "to": b,
                    "bytes": self.hop_bytes[h],
                    "time": self.hop_time(h),
                    **({} if self.hop_names is None else {"tensors": list(self.hop_names[h])}),
                    "samples": self.hop_times[:, h].tolist(),
                }
                for h, (a, b) in enumerate(self.hop_routes)
            ],
            "end_to_end": self.latency,
            "end_to_end_samples": self.end_to_end.tolist(),
            "items": int(len(self.end_to_end)),
            "wall_seconds": self.wall_seconds,
            "items_per_second": self.items_per_second,
            "param_bytes": self.param_bytes,
            "param_seconds": self.param_seconds,
            "startup_seconds": self.startup_seconds,
            "workers": self.workers,
            "predictions": self.predictions().tolist(),
            "notes": self.notes,
            "prediction": None
            if p is None
            else {
                "graph": p.graph,
                "stage_compute": p.stage_compute,
                "hops": p.hops,
                "end_to_end": p.end_to_end,
                "bottleneck": p.bottleneck,
                "bottleneck_at": p.bottleneck_at,
                "throughput": p.throughput,
                "measured_devices": p.measured,
            },
            "compare": self.compare_rows(),
        }
        if include_outputs:
            d["outputs"] = np.asarray(self.outputs).tolist()
        return d
