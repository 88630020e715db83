"""Where a data set's local copy is looked for, in a fixed order; never downloads.

For a :class:`~multigpu.data.source.DataSource` named ``NAME``:

(a) ``data_dir`` if given, else the ``MULTIGPU_DATA`` environment variable. An
    explicit choice is never silently replaced: if that folder lacks the files,
    :class:`DataNotFoundError` names it and no other place is tried.
(b) the user cache folder, ``$XDG_CACHE_HOME/multigpu/NAME``
    (``~/.cache/multigpu/NAME`` by default), where downloads go;
(c) the source's ``system_dir``, where an operating-system package installs it.

In every folder each file may be gzip-compressed (``name.gz``, as published) or
raw (``name``, as after ``gunzip``); a folder may also hold them in a ``NAME``
subfolder, so ``MULTIGPU_DATA`` can point at a general data root.
"""

from __future__ import annotations

import os
from pathlib import Path

from multigpu.data.files import PathLike
from multigpu.data.source import DataSource
from multigpu.errors import DataNotFoundError

__all__ = ["ENV_VAR", "cache_dir", "cache_root", "find", "locate", "searched"]

#: Environment variable naming a folder that holds the data (search step a).
ENV_VAR = "MULTIGPU_DATA"


def cache_root() -> Path:
    """multigpu's user cache folder: ``$XDG_CACHE_HOME/multigpu`` (``~/.cache/multigpu``)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG spec says relative values are invalid and must be ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "multigpu"


def cache_dir(source: DataSource) -> Path:
    """The cache folder of one data set: ``cache_root() / source.name`` (search step b)."""
    return cache_root() / source.name


def locate(folder: Path, source: DataSource) -> tuple[dict[str, Path], list[str]]:
    """Map each role to an existing file in ``folder``; also list the names of the missing ones."""
    found: dict[str, Path] = {}
    missing: list[str] = []
    for role, name in source.files.items():
        # Raw first: someone who unpacked the files chose the faster form.
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                found[role] = candidate
                break
        else:
            missing.append(name)
    return found, missing


def searched(source: DataSource) -> list[Path]:
    """The folders tried when nothing is named explicitly, in order (steps b and c)."""
    return [cache_dir(source)] + ([Path(source.system_dir)] if source.system_dir is not None else [])


def find(source: DataSource, data_dir: PathLike | None = None) -> Path | None:
    """Return the folder that holds every file of ``source``, or None; never downloads.

    Tries ``data_dir``, else ``$MULTIGPU_DATA``, then the cache folder, then the
    source's system folder. An explicit ``data_dir`` or ``MULTIGPU_DATA`` that
    lacks the files raises :class:`DataNotFoundError` naming it rather than
    returning another copy.
    """
    if data_dir is not None:
        return _explicit_folder(Path(data_dir).expanduser(), "data_dir", source)
    env = os.environ.get(ENV_VAR, "")
    if env:
        return _explicit_folder(Path(env).expanduser(), f"{ENV_VAR}=", source)
    for folder in searched(source):
        found = _complete_folder(folder, source)
        if found is not None:
            return found
    return None


def _complete_folder(folder: Path, source: DataSource) -> Path | None:
    """``folder`` or its ``source.name`` subfolder if it holds every file."""
    for candidate in (folder, folder / source.name):
        if not locate(candidate, source)[1]:
            return candidate
    return None


def _explicit_folder(folder: Path, what: str, source: DataSource) -> Path:
    """Resolve a folder the user named; never fall back, so fail loudly."""
    found = _complete_folder(folder, source)
    if found is not None:
        return found
    if not folder.is_dir():
        problem = "does not exist"
    else:
        problem = "lacks " + ", ".join(f"{n}[.gz]" for n in locate(folder, source)[1])
    others = " and ".join(str(p) for p in searched(source)) + (" and download" if source.mirrors else "")
    raise DataNotFoundError(
        f"{what} {folder} {problem}. A folder given explicitly is never replaced by "
        f"another copy; fix it, or leave it unset to search {others}."
    )
