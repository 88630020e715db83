"""A plan's stages as ONNX files, one per stage, and a manifest of which stage feeds which.

``export_stages(model, params, plan, folder)`` cuts ``plan`` (one device name per node) into
the stages every executor here uses (``multigpu.partition.stages``: a DAG of connected runs
of one device, each stage consuming only from stages of smaller index), and writes each as
``stageN.onnx`` (N = 1, 2, ...: the partition report's numbering) with ``to_onnx(nodes=...)``:
its graph inputs are the tensors it consumes (the model's inputs by name, or other stages'
outputs named as the producing nodes), its outputs the tensors other stages or the caller
need. ``manifest.json`` says, for any ONNX runtime on the devices:

.. code-block:: json

    {"format": "multigpu-onnx-stages", "version": 1, "model": "resnet18", "opset": 17,
     "batch": "batch", "inputs": [{"name": "input", "dtype": "float32", "shape": ["batch", 3, 224, 224]}],
     "outputs": ["fc"],
     "stages": [{"stage": 1, "file": "stage1.onnx", "device": "pi1", "nodes": ["conv1", ...],
                 "inputs": ["input"], "outputs": ["layer1.0.relu2"], "after": []}, ...],
     "tensors": [{"name": "layer1.0.relu2", "dtype": "float32", "shape": ["batch", 64, 56, 56],
                  "producer": 1, "consumers": [2]}, ...]}

Running the stages in manifest order, each fed the tensors it lists from the model's inputs
and the earlier stages' outputs, gives the model's output (``producer`` null: a model input;
``consumers`` empty: the model's output). The folder is written whole or not at all.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from multigpu.errors import ExportFolderError, OnnxExportError, PlanError
from multigpu.execution.plan import read_plan
from multigpu.models.graph import Model
from multigpu.models.onnx_export import (
    BATCH_DIM,
    DEFAULT_OPSET,
    imported_batch,
    node_dtypes,
    serialize,
    stage_io,
    to_onnx,
)
from multigpu.partition.stages import Stage, split_stages

__all__ = ["MANIFEST", "ExportFolderError", "check_export_folder", "export_stages", "plan_stages"]

#: The manifest's file name inside the folder.
MANIFEST = "manifest.json"
FORMAT = "multigpu-onnx-stages"


def check_export_folder(folder: str | os.PathLike[str]) -> Path:
    """Return ``folder`` as a Path when a stage export may write it: absent (its parent
    existing) or an empty folder; ExportFolderError otherwise (nothing is written)."""
    target = Path(folder)
    if target.exists():
        if not target.is_dir():
            raise ExportFolderError(f"export folder {str(target)!r} is a file; give a new or empty folder")
        if any(target.iterdir()):
            raise ExportFolderError(
                f"export folder {str(target)!r} exists and is not empty; give a new or empty folder "
                "(stage files are never written over others)"
            )
    elif not target.parent.is_dir():
        raise ExportFolderError(
            f"export folder {str(target)!r}: its parent {str(target.parent)!r} does not exist; create it first"
        )
    return target


def plan_stages(model: Model, plan: Any) -> list[Stage]:
    """The stages of ``plan`` on ``model``: ``plan`` is one device name per node, a planner
    ``Plan``, the dict ``multigpu partition --json`` prints or a JSON file of either.
    PlanError for a plan of the wrong length or form."""
    assignment = read_plan(plan)
    names = [n.name for n in model.nodes]
    if any(isinstance(a, tuple) for a in assignment):
        raise PlanError("the plan lists [layer, device] pairs; give one device name per node, in the model's order")
    if len(assignment) != len(names):
        raise PlanError(
            f"the plan has {len(assignment)} entries but {model.name} has {len(names)} nodes "
            f"({', '.join(names[:8])}{', ...' if len(names) > 8 else ''}); give one device per node"
        )
    producers = [tuple(model.index.get(i, -1) for i in node.inputs) for node in model.nodes]
    return split_stages(list(assignment), names, producers)


def _tensor_entry(model: Model, name: str, batch: int | None, dtypes: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "dtype": dtypes[name], "shape": [BATCH_DIM if batch is None else batch, *model.shapes[name]]}


def export_stages(
    model: Model,
    params: Sequence[Any],
    plan: Any,
    folder: str | os.PathLike[str],
    state: Sequence[Any] | None = None,
    *,
    opset: int = DEFAULT_OPSET,
    batch: int | None = None,
) -> dict[str, Any]:
    """Write each stage of ``plan`` on ``model`` as ``stageN.onnx`` in ``folder``, with
    ``manifest.json``; return the manifest.

    ``params`` and ``state`` are the model's (as ``to_onnx`` takes them); ``plan`` as
    ``plan_stages`` takes it; ``opset`` and ``batch`` as in ``to_onnx``. ``folder`` must not
    exist or be empty (ExportFolderError); on any error nothing is left in it.
    """
    target = check_export_folder(folder)
    stages = plan_stages(model, plan)
    entries: list[dict[str, Any]] = []
    files: list[tuple[str, bytes]] = []
    for s in stages:
        nodes = [model.nodes[m].name for m in s.members]
        feeds, outs = stage_io(model, nodes)
        proto = to_onnx(model, params, None, state, opset=opset, batch=batch, nodes=nodes)
        name = f"stage{s.index + 1}.onnx"
        files.append((name, serialize(proto, f"stage {s.index + 1} ({s.span})")))
        entries.append(
            {
                "stage": s.index + 1,
                "file": name,
                "device": s.device,
                "nodes": nodes,
                "inputs": feeds,
                "outputs": outs,
                "after": [a + 1 for a in s.after],
            }
        )
    dtypes = node_dtypes(model)
    batch = imported_batch(model, batch)
    producer = {o: e["stage"] for e in entries for o in e["outputs"]}
    tensors = []
    for name in [*model.input_names, *(n.name for n in model.nodes)]:
        consumers = [e["stage"] for e in entries if name in e["inputs"]]
        if consumers or (name in producer and name == model.output):
            entry = _tensor_entry(model, name, batch, dtypes)
            entry.update(producer=producer.get(name), consumers=consumers)
            tensors.append(entry)
    manifest = {
        "format": FORMAT,
        "version": 1,
        "model": model.name,
        "opset": opset,
        "batch": BATCH_DIM if batch is None else batch,
        "inputs": [_tensor_entry(model, n, batch, dtypes) for n in model.input_names],
        "outputs": [model.output],
        "stages": entries,
        "tensors": tensors,
    }
    # Write everything into a hidden sibling folder, then rename it into place: a failure
    # (a full disk, an interrupt) leaves no partial export behind.
    tmp = target.parent / f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial"
    tmp.mkdir()  # with the user's umask, as the folder itself would be
    emptied = False
    try:
        for name, data in files:
            (tmp / name).write_bytes(data)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        if target.exists():
            target.rmdir()  # empty, checked above
            emptied = True
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if emptied and not target.exists():
            target.mkdir()  # the empty folder the caller gave, as it was
        raise
    return manifest


def cli_export_check(graph: str, folder: str, batch: int = 1) -> tuple[Model, list[Any], list[Any], str]:
    """``multigpu partition --export-stages``, before the solve: the model that ``--model`` names, its
    parameters and state, and where they come from, once the folder is known to be writable and onnx
    importable. A built-in model comes with its initial parameters (seed 0); an ONNX file with its own
    weights, imported at ``batch``. OnnxExportError for a graph file (it holds costs, not weights) and
    ExportFolderError."""
    from multigpu import models
    from multigpu.models.onnx_export import max_opset

    is_onnx = graph.lower().endswith(".onnx")
    if graph not in models.MODELS and not is_onnx:
        raise OnnxExportError(
            f"--export-stages needs --model to name a built-in model ({', '.join(sorted(models.MODELS))}) "
            f"or an ONNX file; {graph!r} is a graph file of costs, with no layers or weights to export (from "
            "Python, multigpu.execution.onnx_stages.export_stages takes any model and its parameters)"
        )
    check_export_folder(folder)
    max_opset()  # MissingDependencyError now, not after the solve
    if is_onnx:
        imp = models.from_onnx(graph, batch=batch)
        return imp.model, imp.params, imp.state, f"the weights of {graph}"
    model = models.get(graph)
    return model, model.init_params(seed=0), model.init_state(), f"{model.name}'s initial parameters, seed 0"


def cli_export(model: Model, params: list[Any], state: list[Any], source: str, plan: Any, folder: str) -> None:
    """Export ``plan``'s stages of ``model`` with ``params`` and ``state`` (``source`` says whose) to
    ``folder``; say what was written on stderr (stdout may carry --json)."""
    import sys

    manifest = export_stages(model, params, plan, folder, state)
    print(f"wrote {len(manifest['stages'])} stage files and {MANIFEST} to {folder} ({source})", file=sys.stderr)
