"""Plans that run: a list of device names, one per layer, checked against a model and a
cluster and cut into stages (runs of equal names). No Ray here: the core builds and
prices plans; only ``engine.py`` imports Ray.

The cluster's ``source`` is the driver: the process that calls ``run_partitioned``
holds the input and receives the output, so ``sink`` must equal ``source``. Stages
on the source device run inside the driver; every other device gets one worker
process (a Ray actor) hosting all of its stages.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

from multigpu.errors import PlanError
from multigpu.partition.inputs.cluster import Cluster, DeviceSpec
from multigpu.partition.stages import Stage, split_stages

__all__ = ["ExecutionPlan", "Stage", "check_plan", "read_plan", "split_stages", "worker_params"]

PlanLike = Union[Sequence[str], Mapping[str, Any], str, "os.PathLike[str]"]


@dataclass(frozen=True)
class ExecutionPlan:
    """A checked plan: the model, the cluster, one device per layer, and its stages."""

    model: Any
    cluster: Cluster
    assignment: tuple[str, ...]
    stages: tuple[Stage, ...]

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


def read_plan(plan: PlanLike) -> list[str]:
    """One device name per layer from a list, from the dict ``multigpu partition --json``
    prints (its ``"assignment"``), or from a JSON file holding either.

    Raises PlanError for anything else.
    """
    source = "plan"
    if isinstance(plan, (str, os.PathLike)):
        path = Path(plan)
        source = f"plan file {str(path)!r}"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise PlanError(f"cannot read {source}: {e.strerror or e}; give the JSON that "
                            f"`multigpu partition --json` prints, or a JSON list of device names") from None
        try:
            plan = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"{source} is not JSON (line {e.lineno} column {e.colno}: {e.msg}); give the "
                            f"output of `multigpu partition --json` or a list such as [\"a\", \"a\", \"b\"]") from None
    if isinstance(plan, Mapping):
        if "assignment" not in plan:
            raise PlanError(f"{source} is an object without an \"assignment\" key; give the output of "
                            f"`multigpu partition --json` or a plain list of device names")
        plan = plan["assignment"]
    if isinstance(plan, (str, bytes)) or not isinstance(plan, Sequence):
        raise PlanError(f"{source} must list one device name per layer, got {type(plan).__name__}")
    out = []
    for i, name in enumerate(plan):
        if not isinstance(name, str) or not name:
            raise PlanError(f"{source}: entry {i} is {name!r}; every entry must be a device name")
        out.append(name)
    if not out:
        raise PlanError(f"{source} is empty; give one device name per layer")
    return out


def check_plan(model: Any, cluster: Cluster, plan: PlanLike) -> ExecutionPlan:
    """Check ``plan`` against ``model`` (a ``Sequential``) and ``cluster``; return it cut
    into stages.

    Raises PlanError for a plan of the wrong length, a device the cluster lacks, a
    device with no backend, or a cluster whose sink is not its source.
    """
    assignment = read_plan(plan)
    names = [label for label, _ in model.layers]
    if len(assignment) != len(names):
        raise PlanError(f"the plan has {len(assignment)} entries but {model.name} has {len(names)} layers "
                        f"({', '.join(names[:12])}{', ...' if len(names) > 12 else ''}); give one device "
                        f"per layer, e.g. the \"assignment\" of `multigpu partition --graph {model.name} --json`")
    known = set(cluster.names)
    for i, dev in enumerate(assignment):
        if dev not in known:
            raise PlanError(f"the plan puts layer {names[i]!r} on device {dev!r}, which cluster "
                            f"{cluster.name!r} lacks; its devices are: {', '.join(cluster.names)}")
    if cluster.sink != cluster.source:
        raise PlanError(f"cluster {cluster.name!r} has sink {cluster.sink!r} but source {cluster.source!r}; "
                        f"a run returns its output to the driver, which is the source: set \"sink\" to "
                        f"{cluster.source!r} or leave it out")
    stages = split_stages(assignment, names)
    for s in stages:
        spec = cluster.devices[cluster.index(s.device)]
        if spec.backend is None:
            role = " (the driver: the process that starts the run)" if s.device == cluster.source else ""
            raise PlanError(f"{s.label()} cannot run: device {s.device!r}{role} has no \"backend\" in "
                            f"cluster {cluster.name!r}; add e.g. \"backend\": \"torch\" to it "
                            f"(multigpu profile writes one)")
    return ExecutionPlan(model=model, cluster=cluster, assignment=tuple(assignment), stages=tuple(stages))


def worker_params(xplan: ExecutionPlan, device: str, params: Sequence[Any]) -> dict[int, Any]:
    """The parameters (by index in the model's list) that ``device``'s stages use."""
    model = xplan.model
    offsets = [0]
    for i in range(len(model)):
        offsets.append(offsets[-1] + len(model.layer_params(params, i)))
    out: dict[int, Any] = {}
    for s in xplan.stages:
        if s.device == device:
            for j in range(offsets[s.start], offsets[s.stop]):
                out[j] = params[j]
    return out
