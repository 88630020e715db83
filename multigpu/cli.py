"""The ``multigpu`` command line: one sub-command per file in ``multigpu.commands``."""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence

from .errors import MultigpuError

COMMANDS = ("check", "train", "partition", "profile", "run", "bench")


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="multigpu",
        description="Data-parallel training, cost model and partitioner for PyTorch, MXNet and PaddlePaddle.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"multigpu.commands.{name}").register(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI; return the exit code (0 success, 1 failure, 2 usage error)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except MultigpuError as exc:
        print(f"multigpu {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"multigpu {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
