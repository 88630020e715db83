"""Output files: check up front that a path can be written, then replace it atomically.

Every file multigpu writes (checkpoints, downloads, results, plots, verification
stamps) goes through :func:`atomic_write`: the data lands in a temporary file
beside the target, is flushed to disk, renamed over the target, and the folder is
flushed too, so a crash leaves the old file or the new one, never a torn one. The
temporary file is created with mode 0666 minus the umask, like any new file (not
mkstemp's 0600), so a shared folder stays readable to the group.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Union

from multigpu.errors import InputError

PathLike = Union[str, "os.PathLike[str]"]


def check_writable(path: PathLike, what: str) -> Path:
    """Return ``path`` as a Path; raise InputError unless a file can be written there.

    ``what`` names the option in the message (e.g. ``"--json"``). Nothing is left
    behind: the check creates and removes a probe file in the target's folder.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        raise InputError(f"{what} {p} is a folder; give a file name, e.g. {p / 'result.json'}")
    folder = p.parent
    if not folder.is_dir():
        raise InputError(f"{what} {p}: the folder {folder} does not exist; create it or choose another path")
    _probe(folder, what, p)
    if p.exists() and not os.access(p, os.W_OK):
        raise InputError(f"{what} {p} exists and is read-only; choose another path")
    return p


def check_writable_dir(path: PathLike, what: str) -> Path:
    """Create the folder ``path`` if needed; raise InputError unless files can be written in it."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise InputError(f"{what} {p} is a file, not a folder; give a folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{what} {p} cannot be created ({exc.strerror}); choose a writable folder") from exc
    _probe(p, what, p)
    return p


def _probe(folder: Path, what: str, target: Path) -> None:
    # os.access says "writable" to root even on a read-only mount; only a real file tells.
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".multigpu-probe-")
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise InputError(
            f"{what} {target} cannot be written ({exc.strerror} in {folder}); choose a writable path"
        ) from exc


@contextmanager
def atomic_write(path: PathLike) -> Iterator[BinaryIO]:
    """Yield a binary file whose content replaces ``path`` when the block ends without error.

    On an exception (Ctrl-C included) the temporary file is removed and ``path`` is
    left as it was.
    """
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}.part")
    # 0o666 & ~umask, as open() gives any new file; O_EXCL: never follow or reuse a name.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # the data is on disk before the rename makes it visible
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def fsync_dir(folder: PathLike) -> None:
    """Flush ``folder``'s entries to disk, so a rename into it survives a power cut."""
    if os.name != "posix":  # Windows cannot open a folder; its renames are journaled
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
