"""How a sub-command adds its parser, its shared options and their deprecated old spellings.

Every command spells a shared option the same way (``tests/test_cli_spelling.py`` checks):

* ``--json`` prints the result as one JSON object on stdout (the human report, if any,
  goes to stderr instead); ``--out FILE`` writes that JSON to FILE (``profile``: the
  cluster file; ``bench``: the folder of its pages);
* ``--batch-size`` the examples one step or one forward pass takes; ``--devices`` the
  devices of one process (a count or ``cpu:N`` / ``gpu:0,1``); ``--model`` the network
  (a built-in name or, where a command reads one, a graph file); ``launch
  --nproc-per-node`` the processes on each host, as torchrun spells it.

An old spelling (``--gpus``, ``--batch``, ``--graph``, ``--nproc``, ``--json PATH``) is
accepted for one release: ``add_alias`` adds it with a deprecation note in ``--help``,
and using it prints one on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from multigpu.data.files import atomic_write, check_writable

#: The release in which the deprecated spellings are removed.
REMOVED_IN = "the next release"


def add_command(
    sub: Any,
    name: str,
    run: Callable[[argparse.Namespace], int],
    *,
    help: str,
    description: str,
    epilog: str | None = None,
    raw: bool = False,
) -> argparse.ArgumentParser:
    """Add the sub-command ``name`` to argparse's subparsers ``sub``; return its parser.

    ``help`` is its line in ``multigpu --help``, ``description`` (and ``epilog``)
    its own ``--help``; ``raw=True`` keeps their line breaks, as written, instead
    of reflowing them. Parsing the command's arguments leaves ``run`` as ``func``,
    which ``multigpu.cli.main`` calls.
    """
    formatter = argparse.RawDescriptionHelpFormatter if raw else argparse.HelpFormatter
    parser = sub.add_parser(name, help=help, description=description, epilog=epilog, formatter_class=formatter)
    parser.set_defaults(func=run)
    return parser


def deprecation_note(old: str, new: str) -> str:
    """The note printed when ``old`` is used instead of ``new``."""
    return f"{old} is deprecated and goes in {REMOVED_IN}; use {new}"


class DeprecatedAlias(argparse.Action):
    """An old spelling of another option: sets the same ``dest``, with a note on stderr."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: Any = None
    ) -> None:
        print(f"{parser.prog}: note: {deprecation_note(str(option_string), self.new)}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_alias(parser: argparse.ArgumentParser, old: str, new: argparse.Action) -> argparse.Action:
    """Accept ``old`` as a deprecated spelling of the option ``new`` (same dest, type and arity)."""
    return parser.add_argument(
        old,
        dest=new.dest,
        action=DeprecatedAlias,
        new=new.option_strings[0],
        # NOTE: typeshed's add_argument types `type` without None, argparse's own default (new.type is None
        # for an option with no converter): the stub is too narrow, not the call.
        type=new.type,  # type: ignore[arg-type]
        nargs=new.nargs,
        metavar=new.metavar or new.dest.upper(),
        default=argparse.SUPPRESS,  # the new option's default stands
        help=f"deprecated spelling of {new.option_strings[0]}; accepted until {REMOVED_IN}",
    )


class JsonFlag(argparse.Action):
    """``--json`` prints the result; the old ``--json PATH`` (train, check) means ``--out PATH``."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: Any = None
    ) -> None:
        if values is None:
            namespace.json = True
            return
        print(f"{parser.prog}: note: {deprecation_note('--json PATH', '--out PATH')}", file=sys.stderr)
        namespace.out = values


def add_json_output(parser: argparse.ArgumentParser, what: str, *, path_alias: bool = False) -> None:
    """Add ``--json`` (print ``what`` as JSON on stdout) and ``--out FILE`` (write it to FILE).

    ``path_alias=True`` keeps the old ``--json PATH`` of ``train`` and ``check`` working,
    as a deprecated spelling of ``--out PATH``.
    """
    help_json = f"print {what} as one JSON object on stdout; the report goes to stderr"
    if path_alias:
        parser.add_argument(
            "--json",
            nargs="?",
            default=False,
            action=JsonFlag,
            metavar="PATH",
            help=f"{help_json} (--json PATH: deprecated spelling of --out PATH, accepted until {REMOVED_IN})",
        )
    else:
        parser.add_argument("--json", action="store_true", help=help_json)
    parser.add_argument("--out", default=None, metavar="FILE", help=f"write {what} as JSON to FILE")


def check_output(args: argparse.Namespace) -> None:
    """Raise InputError now, before any work, when ``--out`` cannot be written."""
    if getattr(args, "out", None) is not None:
        check_writable(args.out, "--out")


def emit_json(args: argparse.Namespace, obj: Any) -> None:
    """Print ``obj`` as JSON when ``--json``; write it to ``--out`` (atomically) when given."""
    if args.out is not None:
        with atomic_write(args.out) as f:
            f.write(json.dumps(obj, indent=2).encode())
    if args.json:
        print(json.dumps(obj), flush=True)


@contextlib.contextmanager
def report_stream(args: argparse.Namespace) -> Iterator[None]:
    """Send what the command prints for people to stderr while ``--json`` owns stdout."""
    if not getattr(args, "json", False):
        yield
        return
    with contextlib.redirect_stdout(sys.stderr):
        yield
