"""MkDocs hook: the parts of pages that are generated from the code, so they cannot drift.

A page asks for a part with a marker on a line of its own:

* ``<!-- generated: cli -->``: every command's ``--help``, from the argparse parsers
  (``multigpu.cli.main.build_parser``);
* ``<!-- generated: exit-status -->``: the exit statuses and the error classes behind
  each, computed with ``multigpu.cli.main.exit_code``;
* ``<!-- generated: errors -->``: every exception class multigpu raises, its bases, its
  exit status and its docstring;
* ``<!-- generated: api-index -->``: every name ``import multigpu`` gives, linked to the API page
  of the subpackage that documents it;
* ``<!-- generated: layers -->``: the layers, bottom to top, as
  ``tests/test_architecture.py`` enforces them, each with its package's docstring;
* ``<!-- include: CONTRIBUTING.md -->``: a file of the repository root, its links into
  ``docs/`` made relative to the site.

An unknown marker fails the build.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- (generated|include): ([\w.-]+) -->$", re.M)
HELP_WIDTH = "100"  # argparse wraps --help to $COLUMNS: one width, whatever terminal builds the site


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace every marker on the page by what it names."""
    return MARKER.sub(lambda m: _part(m.group(1), m.group(2), page.file.src_uri), markdown)


def _part(kind: str, name: str, where: str) -> str:
    if kind == "include":
        return include(name)
    parts = {
        "cli": cli_reference,
        "exit-status": exit_status_table,
        "errors": errors_table,
        "layers": layers_table,
        "api-index": api_index,
    }
    if name not in parts:
        raise ValueError(f"{where}: unknown generated part {name!r}; one of {sorted(parts)}")
    return parts[name]()


def command_help(argv: list[str]) -> str:
    """The text ``multigpu ARGV --help`` prints."""
    from multigpu.cli.main import build_parser

    out = io.StringIO()
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            build_parser().parse_args([*argv, "--help"])
    finally:
        if saved is None:
            os.environ.pop("COLUMNS")
        else:
            os.environ["COLUMNS"] = saved
    return out.getvalue().rstrip()


def cli_reference() -> str:
    """One section per command, each holding its whole ``--help``."""
    from multigpu.cli.main import COMMANDS

    out = ["## multigpu", "", "```text", command_help([]), "```", ""]
    for name in COMMANDS:
        out += [f"## multigpu {name}", "", "```text", command_help([name]), "```", ""]
    return "\n".join(out)


def _error_classes() -> list[type[BaseException]]:
    """Every exception class of ``multigpu.errors`` and the public ones defined elsewhere in the package."""
    import multigpu.errors
    import multigpu.partition

    found = [
        c
        for c in vars(multigpu.errors).values()
        if isinstance(c, type) and issubclass(c, BaseException) and c.__module__ == "multigpu.errors"
    ]
    for name in multigpu.partition.__all__:  # the partition inputs' own subclasses
        c = getattr(multigpu.partition, name)
        if isinstance(c, type) and issubclass(c, BaseException) and c not in found:
            found.append(c)
    return found


def _status(cls: type[BaseException]) -> int:
    from multigpu.cli.main import exit_code

    try:
        exc = cls("an example")
    except TypeError:  # a class that takes more than a message (TrainingDivergedError)
        exc = cls.__new__(cls)
    return exit_code(exc)  # exit_code reads the class (and RankFailedError's status, None here)


def exit_status_table() -> str:
    """The exit statuses, each with the error classes that lead to it."""
    from multigpu.cli.main import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK

    by_status: dict[int, list[str]] = {EXIT_FAILURE: [], EXIT_BAD_INPUT: []}
    for cls in _error_classes():
        by_status[_status(cls)].append(f"`{cls.__name__}`")
    rows = [
        (EXIT_OK, "success", ""),
        (
            EXIT_FAILURE,
            "a failure at run time (and `OSError`: a disk full, a file that vanished)",
            ", ".join(by_status[EXIT_FAILURE]),
        ),
        (EXIT_BAD_INPUT, "bad input or usage (and argparse's own usage errors)", ", ".join(by_status[EXIT_BAD_INPUT])),
        (EXIT_INTERRUPTED, "interrupted (Ctrl-C)", "`KeyboardInterrupt`"),
    ]
    return "\n".join(
        ["| status | meaning | raised as |", "|---|---|---|"]
        + [f"| {code} | {meaning} | {classes} |" for code, meaning, classes in rows]
    )


def errors_table() -> str:
    """Every error class: where it is defined, what it is a kind of, its exit status, its docstring."""
    rows = ["| error | also a | exit status | when |", "|---|---|---|---|"]
    for cls in _error_classes():
        bases = ", ".join(f"`{b.__name__}`" for b in cls.__bases__)
        doc = " ".join((cls.__doc__ or "").split())
        rows.append(f"| `{cls.__module__}.{cls.__name__}` | {bases} | {_status(cls)} | {doc} |")
    return "\n".join(rows)


#: The subpackages with an API page (``docs/reference/api/NAME.md``), in the order they are searched.
API_PAGES = ("models", "parallel", "training", "data", "contract", "distributed", "partition", "execution", "errors")


def api_index() -> str:
    """A table of ``multigpu.__all__``: each name, its summary, and the API page that documents it.

    Raises LookupError for a name no API page exports, so a new top-level name gets a home.
    """
    import importlib
    import inspect

    import multigpu

    rows = ["| name | what | documented in |", "|---|---|---|"]
    for name in multigpu.__all__:
        obj = getattr(multigpu, name)
        if inspect.ismodule(obj):
            page, anchor = obj.__name__.split(".")[1], obj.__name__
        else:
            page = next(
                (sub for sub in API_PAGES if getattr(importlib.import_module(f"multigpu.{sub}"), name, None) is obj),
                None,
            )
            if page is None:
                raise LookupError(f"multigpu.{name} is exported by none of the API pages' packages {API_PAGES}")
            anchor = f"multigpu.{page}.{name}"
        if callable(obj) or inspect.ismodule(obj):
            what = (inspect.getdoc(obj) or "").split("\n\n", 1)[0].replace("\n", " ")
        else:  # a constant: its value says what it is
            what = f"`{obj!r}`"
        what = what.replace("|", "/")
        rows.append(f"| `multigpu.{name}` | {what} | [`{anchor}`]({page}.md#{anchor}) |")
    return "\n".join(rows)


def _docstring_paragraph(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def layers_table() -> str:
    """The layers of ``tests/test_architecture.py``, bottom to top, with each package's docstring."""
    tree = ast.parse((ROOT / "tests" / "test_architecture.py").read_text())
    layers = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["LAYERS"]
    )
    rows = ["| # | layer | what it holds |", "|---|---|---|"]
    for i, name in enumerate(layers, 1):
        package, module = ROOT / "multigpu" / name / "__init__.py", ROOT / "multigpu" / f"{name}.py"
        if package.is_file():
            what, label = _docstring_paragraph(package), f"`multigpu/{name}/`"
        elif module.is_file():
            what, label = _docstring_paragraph(module), f"`multigpu/{name}.py`"
        else:
            what, label = "(a place kept for it in the architecture test; not in the package yet)", f"`{name}`"
        rows.append(f"| {i} | {label} | {what.replace('|', '/')} |")
    return "\n".join(rows)


def include(name: str) -> str:
    """A file of the repository root, with its ``docs/...`` links made relative to the site root."""
    text = (ROOT / name).read_text()
    return re.sub(r"\]\(docs/", "](", text)
