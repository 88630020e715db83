"""The ``multigpu`` command line: one sub-command per file in ``multigpu.cli.commands``.

Exit status, the same for every command (a command only returns 0, or 1 for a
negative result such as ``check``'s disagreement, and raises on every error):

* 0: success;
* 1: a failure at run time: an infeasible plan, a disagreement, a diverged run, a
  worker or rank that died, a collective that timed out, a file that could not be
  written;
* 2: bad input or usage: argparse's own errors, and every ``MultigpuError`` that
  is also a ``ValueError``, ``TypeError``, ``LookupError`` or ``ImportError``
  (``InputError``, ``ParamsError``, ``DeviceError``, ``ModelError``,
  ``ClusterError``, ``DataError``, ``CheckpointError``, ``UnknownBackendError``,
  ``BackendNotInstalledError``, ``MissingDependencyError``, ...), except the
  classes listed in ``RUN_TIME`` (``InfeasibleError``), and a ``RankFailedError``
  whose rank exited with 2 (the rank refused its input);
* 130: interrupted (Ctrl-C).

The error itself is one line on stderr: ``multigpu COMMAND: error: MESSAGE``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from multigpu.errors import InfeasibleError, MultigpuError, RankFailedError

COMMANDS = ("check", "train", "partition", "profile", "run", "launch", "bench", "lab")

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130

#: Builtin bases that mark a MultigpuError as bad input (exit 2).
BAD_INPUT = (ValueError, TypeError, LookupError, ImportError)
#: Errors with a bad-input base that are results of the run, not mistakes (exit 1).
RUN_TIME: tuple[type[BaseException], ...] = (InfeasibleError,)


def exit_code(exc: BaseException) -> int:
    """Return the exit status for ``exc`` under the scheme above."""
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, RankFailedError) and exc.status == EXIT_BAD_INPUT:
        return EXIT_BAD_INPUT  # the rank refused its input: the job's input was bad
    if isinstance(exc, MultigpuError) and isinstance(exc, BAD_INPUT) and not isinstance(exc, RUN_TIME):
        return EXIT_BAD_INPUT
    return EXIT_FAILURE


def one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line (a multi-line hint is joined with spaces)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="multigpu",
        description="Data-parallel training, cost model and partitioner for PyTorch, MXNet and PaddlePaddle.",
        epilog="Exit status: 0 ok, 1 failure at run time (infeasible, disagreement, divergence), "
        "2 bad input or usage, 130 interrupted.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"multigpu.cli.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit code (0 ok, 1 failure, 2 bad input, 130 interrupted)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print(f"multigpu {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (MultigpuError, OSError) as exc:  # an OSError: a disk full or a file vanished mid-run
        print(f"multigpu {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return exit_code(exc)


if __name__ == "__main__":
    sys.exit(main())
