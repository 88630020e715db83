"""The ``multigpu`` command line: ``main`` in ``multigpu.cli.main``, one sub-command per
module in ``multigpu.cli.commands``. The top layer: nothing below imports it."""

from __future__ import annotations

from multigpu.cli.main import (
    COMMANDS,
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    build_parser,
    exit_code,
    main,
)

__all__ = [
    "COMMANDS",
    "EXIT_BAD_INPUT",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "build_parser",
    "exit_code",
    "main",
]
