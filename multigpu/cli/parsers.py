"""How a sub-command adds its parser: one call names it, documents it and binds its ``run``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


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
