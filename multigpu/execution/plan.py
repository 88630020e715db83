"""Plans that run: a list of device names, one per layer, checked against a model and a
cluster and cut into stages (``multigpu.partition.stages``: runs of equal names on a
chain, connected sets of layers forming a DAG on a graph model). No Ray here: the core
builds and prices plans; only ``engine.py`` imports Ray.

For a graph model, ``routes`` says what every stage receives and sends: an activation
goes once to each other device that consumes it (one message per producing stage and
consuming device, carrying every tensor that device needs from that stage), to the
first stage there that consumes any of it; the device's worker keeps what later stages
on it consume.

The cluster's ``source`` is the driver: the process that calls ``run_partitioned``
holds the input and receives the output, so ``sink`` must equal ``source``. Stages
on the source device run inside the driver; every other device gets one worker
process (a Ray actor) hosting all of its stages.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from multigpu.errors import PlanError
from multigpu.partition.cost.evaluate import resolve_assignment
from multigpu.partition.exceptions import PartitionInputError
from multigpu.partition.inputs.cluster import Cluster, DeviceSpec
from multigpu.partition.inputs.graph import graph_from_model
from multigpu.partition.stages import Stage, split_stages

__all__ = [
    "ExecutionPlan",
    "Send",
    "Stage",
    "StagePart",
    "StageRoute",
    "check_plan",
    "read_plan",
    "routes",
    "split_stages",
    "worker_params",
]

INPUT = "input"  # the model's input, as nodes name it
SINK = -1  # Send.stage of the message that carries the model's output to the driver
SOURCE = -1  # Send.source of a message carrying the input from the driver

PlanLike = Union[Sequence[str], Mapping[str, Any], str, "os.PathLike[str]"]


@dataclass(frozen=True)
class ExecutionPlan:
    """A checked plan: the model, the cluster, one device per layer, and its stages."""

    model: Any
    cluster: Cluster
    assignment: tuple[str, ...]
    stages: tuple[Stage, ...]
    producers: tuple[tuple[int, ...], ...] | None = None  # per layer (-1: the input); None: a chain

    @property
    def chain(self) -> bool:
        """True for a chain model (the stages are runs of layers, one after another)."""
        return self.producers is None

    @property
    def driver(self) -> str:
        """The device the driver process is (the cluster's source and sink)."""
        return self.cluster.source

    @property
    def workers(self) -> list[str]:
        """Devices that get a worker process, in order of first use."""
        out: list[str] = []
        for s in self.stages:
            if s.device != self.driver and s.device not in out:
                out.append(s.device)
        return out

    def spec(self, device: str) -> DeviceSpec:
        """The cluster's entry for ``device``."""
        return self.cluster.devices[self.cluster.index(device)]


def read_plan(plan: PlanLike) -> list[Any]:
    """One device name per layer from a list, a planner ``Plan``, the dict ``multigpu partition
    --json`` prints (its ``"assignment"``), or a JSON file holding either; a list of
    ``[layer, device]`` pairs (any order) comes back as pairs, for ``check_plan``.

    Raises PlanError for anything else.
    """
    source = "plan"
    if hasattr(plan, "assignment") and not isinstance(plan, (str, os.PathLike, Mapping)):
        plan = list(plan.assignment)  # a planner Plan (multigpu.partition.autopartition's result)
    if isinstance(plan, (str, os.PathLike)):
        path = Path(plan)
        source = f"plan file {str(path)!r}"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise PlanError(
                f"cannot read {source}: {e.strerror or e}; give the JSON that "
                f"`multigpu partition --json` prints, or a JSON list of device names"
            ) from None
        try:
            plan = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(
                f"{source} is not JSON (line {e.lineno} column {e.colno}: {e.msg}); give the "
                f'output of `multigpu partition --json` or a list such as ["a", "a", "b"]'
            ) from None
    if isinstance(plan, Mapping):
        if "assignment" not in plan:
            raise PlanError(
                f'{source} is an object without an "assignment" key; give the output of '
                f"`multigpu partition --json` or a plain list of device names"
            )
        plan = plan["assignment"]
    if isinstance(plan, (str, bytes)) or not isinstance(plan, Sequence):
        raise PlanError(f"{source} must list one device name per layer, got {type(plan).__name__}")
    if len(plan) and all(isinstance(x, (list, tuple)) and len(x) == 2 for x in plan):
        return [tuple(x) for x in plan]
    out = []
    for i, name in enumerate(plan):
        if not isinstance(name, str) or not name:
            raise PlanError(f"{source}: entry {i} is {name!r}; every entry must be a device name")
        out.append(name)
    if not out:
        raise PlanError(f"{source} is empty; give one device name per layer")
    return out


def check_plan(model: Any, cluster: Cluster, plan: PlanLike) -> ExecutionPlan:
    """Check ``plan`` against ``model`` (a ``Sequential`` or a graph ``Model``) and
    ``cluster``; return it cut into stages (for a graph model, a DAG of stages).

    Raises PlanError for a plan of the wrong length, a layer placed on two devices, a
    device the cluster lacks, a device with no backend, or a cluster whose sink is not
    its source.
    """
    names = [label for label, _ in model.layers]
    assignment = read_plan(plan)
    graph = graph_from_model(model, 1)
    if isinstance(assignment[0], tuple):
        try:  # the planner's own reading of (layer, device) pairs: a layer placed twice, one left out
            assignment = [cluster.names[d] for d in resolve_assignment(graph, cluster, assignment)]
        except PartitionInputError as e:
            raise PlanError(f"the plan's [layer, device] pairs: {e}") from None
    if len(assignment) != len(names):
        raise PlanError(
            f"the plan has {len(assignment)} entries but {model.name} has {len(names)} layers "
            f"({', '.join(names[:12])}{', ...' if len(names) > 12 else ''}); give one device "
            f'per layer, e.g. the "assignment" of `multigpu partition --model {model.name} --json`'
        )
    known = set(cluster.names)
    for i, dev in enumerate(assignment):
        if dev not in known:
            raise PlanError(
                f"the plan puts layer {names[i]!r} on device {dev!r}, which cluster "
                f"{cluster.name!r} lacks; its devices are: {', '.join(cluster.names)}"
            )
    if cluster.sink != cluster.source:
        raise PlanError(
            f"cluster {cluster.name!r} has sink {cluster.sink!r} but source {cluster.source!r}; "
            f'a run returns its output to the driver, which is the source: set "sink" to '
            f"{cluster.source!r} or leave it out"
        )
    producers = None if graph.is_chain else tuple(tuple(p) for p in graph.producers)
    stages = split_stages(assignment, names, producers)
    for s in stages:
        spec = cluster.devices[cluster.index(s.device)]
        if spec.backend is None:
            role = " (the driver: the process that starts the run)" if s.device == cluster.source else ""
            raise PlanError(
                f'{s.label()} cannot run: device {s.device!r}{role} has no "backend" in '
                f'cluster {cluster.name!r}; add e.g. "backend": "torch" to it '
                f"(multigpu profile writes one)"
            )
    return ExecutionPlan(
        model=model, cluster=cluster, assignment=tuple(assignment), stages=tuple(stages), producers=producers
    )


def worker_params(xplan: ExecutionPlan, device: str, params: Sequence[Any]) -> dict[int, Any]:
    """The parameters (by index in the model's list) that ``device``'s stages use."""
    model = xplan.model
    offsets = [0]
    for i in range(len(model)):
        offsets.append(offsets[-1] + len(model.layer_params(params, i)))
    out: dict[int, Any] = {}
    for s in xplan.stages:
        if s.device == device:
            for layer in s.members:
                for j in range(offsets[layer], offsets[layer + 1]):
                    out[j] = params[j]
    return out


@dataclass(frozen=True)
class Send:
    """One message of a DAG plan: the tensors ``names`` from stage ``source`` (SOURCE:
    the input, from the driver) to stage ``stage`` on ``device`` (SINK: the model's
    output to the driver)."""

    source: int
    device: str
    stage: int
    names: tuple[str, ...]


@dataclass(frozen=True)
class StagePart:
    """A run of a stage's layers that ends where one of the stage's messages can leave:
    its ``nodes``, the tensors they consume from outside the part (``feeds``: received,
    or kept from an earlier part or stage on the device) and the messages it sends
    (``sends``, indices into ``routes``' list of sends)."""

    nodes: tuple[str, ...]
    feeds: tuple[str, ...]
    sends: tuple[int, ...]


@dataclass(frozen=True)
class StageRoute:
    """What a worker needs to run one stage of a DAG plan: its ``nodes``, the tensors it
    consumes from outside itself (``feeds``, from the device's store: received or kept
    from an earlier stage there), the messages it receives (``receives``: indices into
    ``routes``' list of sends, in argument order) and sends (``sends``), and whether it
    is the device's ``last`` stage (the worker then forgets the item).

    ``parts`` cut the stage after each layer whose output another device waits for
    (one part when only its last layer's output leaves): a worker runs each part as
    its own call and a message leaves as soon as its part is done, so a branch on
    another device starts while this stage goes on, as the cost model's schedule has
    it (``partition.cost.schedule``: an activation leaves when its layer finishes)."""

    index: int
    device: str
    nodes: tuple[str, ...]
    feeds: tuple[str, ...]
    receives: tuple[int, ...]
    sends: tuple[int, ...]
    last: bool
    parts: tuple[StagePart, ...] = ()

    def __post_init__(self) -> None:
        if not self.parts:
            object.__setattr__(self, "parts", (StagePart(self.nodes, self.feeds, self.sends),))


def routes(xplan: ExecutionPlan) -> tuple[list[StageRoute], list[Send]]:
    """Every stage's route and every message of a DAG plan (``xplan.producers`` set).

    A stage's consumed tensors from another device arrive in one message per producing
    stage (SOURCE for the input) and device, addressed to the first stage there that
    consumes any of them; the stage holding the model's output sends it to the driver.
    Messages are listed by source stage (the input first), then device, in stage order.
    """
    if xplan.producers is None:
        raise PlanError("routes() is for plans of graph models; a chain's stages pass their output on")
    names = [label for label, _ in xplan.model.layers]
    stages = xplan.stages
    stage_of = {m: s.index for s in stages for m in s.members}
    # (source stage, device) -> {name: first consuming stage on that device}
    wanted: dict[tuple[int, str], dict[str, int]] = {}
    feeds: list[list[str]] = []
    for s in stages:
        mine: list[str] = []
        for layer, src in s.inputs:
            name = INPUT if layer < 0 else names[layer]
            mine.append(name)
            if src >= 0 and stages[src].device == s.device:
                continue  # kept by the device's worker from an earlier stage there
            wanted.setdefault((SOURCE if layer < 0 else stage_of[layer], s.device), {}).setdefault(name, s.index)
        feeds.append(mine)
    sends: list[Send] = []
    for (src, dev), got in sorted(wanted.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        sends.append(Send(src, dev, min(got.values()), tuple(sorted(got))))
    out_stage = stage_of[len(names) - 1]
    sends.append(Send(out_stage, xplan.driver, SINK, (names[-1],)))
    last = {s.device: s.index for s in stages}
    out = []
    for s in stages:
        sent = tuple(j for j, m in enumerate(sends) if m.source == s.index)
        out.append(
            StageRoute(
                s.index,
                s.device,
                tuple(names[m] for m in s.members),
                tuple(feeds[s.index]),
                tuple(j for j, m in enumerate(sends) if m.stage == s.index),
                sent,
                last[s.device] == s.index,
                _parts(s, names, xplan.producers, sends, sent),
            )
        )
    return out, sends


def _parts(
    stage: Stage, names: Sequence[str], producers: Sequence[Sequence[int]], sends: Sequence[Send], mine: Sequence[int]
) -> tuple[StagePart, ...]:
    """``stage`` cut after each member whose output completes one of its messages (``mine``)."""
    position = {names[m]: k for k, m in enumerate(stage.members)}
    # A message can leave once the last of its tensors is computed.
    ready = {j: max(position[name] for name in sends[j].names) for j in mine}
    cuts = sorted({k for k in ready.values()} | {len(stage.members) - 1})
    parts, begin = [], 0
    for end in cuts:
        members = stage.members[begin : end + 1]
        inside = set(members)
        feeds = sorted({INPUT if p < 0 else names[p] for c in members for p in producers[c] if p not in inside})
        parts.append(
            StagePart(
                tuple(names[m] for m in members), tuple(feeds), tuple(j for j in mine if begin <= ready[j] <= end)
            )
        )
        begin = end + 1
    return tuple(parts)
