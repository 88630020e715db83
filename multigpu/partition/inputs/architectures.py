"""The shipped graph files of published architectures, written from ``multigpu.models``:
ResNet-18, ResNet-50 and GoogLeNet (``inception``) in torchvision's layouts, at batch 1 on a
224 x 224 image with 1000 classes (an ImageNet inference). Each file is
``graph_from_model`` of the model (its ``Model.layer_stats``), so the planner reads the same
shapes, FLOPs and bytes as the model spec computes; the files are never edited by hand:

    python -m multigpu.partition.inputs.architectures            # rewrite the files
    python -m multigpu.partition.inputs.architectures --check    # exit 1 if they differ

A built-in model name wins over a shipped file in ``load_graph`` (``resnet18``, ``resnet50``
build the model); ``inception`` is the file's name for ``multigpu.models.googlenet``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from multigpu import models
from multigpu.models import Model
from multigpu.partition.inputs.graph import Graph, graph_from_model

__all__ = ["ARCHITECTURES", "architecture_graph", "write_shipped"]

#: Shipped file name -> the model it is written from.
ARCHITECTURES: dict[str, Callable[..., Model]] = {
    "resnet18": models.resnet18,
    "resnet50": models.resnet50,
    "inception": models.googlenet,
}


def architecture_graph(name: str, batch: int = 1) -> Graph:
    """The layer graph of the shipped architecture ``name`` for ``batch`` examples, named ``name``."""
    return dataclasses.replace(graph_from_model(ARCHITECTURES[name](), batch), name=name)


def _text(graph: Graph) -> str:
    return json.dumps(graph.to_dict(), indent=1) + "\n"


def write_shipped(folder: Path, check: bool = False) -> list[str]:
    """Write (or with ``check`` compare) every shipped graph file in ``folder``; return the
    names that were written (or differ)."""
    out = []
    for name in ARCHITECTURES:
        path = folder / f"{name}.json"
        text = _text(architecture_graph(name))
        if path.exists() and path.read_text() == text:
            continue
        out.append(name)
        if not check:
            path.write_text(text)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite the shipped graph files, or with ``--check`` report whether they differ."""
    p = argparse.ArgumentParser(
        prog="python -m multigpu.partition.inputs.architectures",
        description="Write the shipped graph files from the built-in models (multigpu.models).",
    )
    p.add_argument("--out", type=Path, default=Path(__file__).with_name("graphs"), help="folder (default: shipped)")
    p.add_argument("--check", action="store_true", help="exit 1 if a file differs from what would be written")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    changed = write_shipped(args.out, check=args.check)
    for name in changed:
        print(f"{'differs' if args.check else 'wrote'}: {args.out / (name + '.json')}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
