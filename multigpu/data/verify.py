"""The check of local files against a data set's published MD5s, remembered across runs.

Wherever a file comes from (a folder you named, the cache, a system package), its
MD5 is checked on first use against the published one: the ``.gz`` file's, or the
decompressed content's, since a redistributor (Debian) may recompress the
archives. Another data set with the same file names (MNIST's digits and
Fashion-MNIST) would otherwise train silently in its place.

A verified file is remembered by resolved path, size, modification time and inode
in ``verified.json`` in multigpu's user cache folder, never in the data folder
(which may be read-only or shared), so later loads read no extra byte. A file
remembered under one data set's checksums does not pass as another's.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from multigpu.data.files import atomic_write
from multigpu.data.search import cache_root
from multigpu.data.source import DataSource
from multigpu.errors import DataError

__all__ = ["VerifiedFiles", "stamps_path"]


def stamps_path() -> Path:
    """Where verified files are remembered: ``cache_root() / "verified.json"``."""
    return cache_root() / "verified.json"


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


class VerifiedFiles:
    """Files already checked against ``source``'s MD5s: resolved path -> [size, mtime_ns, inode, md5].

    Read once from :func:`stamps_path` (a missing or damaged file only means
    checking again); :meth:`save` writes what :meth:`check` added.
    """

    def __init__(self, source: DataSource) -> None:
        self.source = source
        self.path = stamps_path()
        try:
            known = json.loads(self.path.read_text())
        except (OSError, ValueError):  # none yet, or unreadable: verify again
            known = {}
        self.known: dict[str, list[Any]] = known if isinstance(known, dict) else {}
        self.changed = False

    def check(self, path: Path, data: bytes, raw: bytes, stat: os.stat_result) -> None:
        """Return if ``path`` holds the published file; remember it the first time.

        ``data`` is the file's bytes, ``raw`` the decompressed content (``data``
        itself for an uncompressed file), ``stat`` taken before reading, so a file
        changed meanwhile is checked again next time. Raises :class:`DataError`
        naming the file, the published MD5, where the real file comes from and the
        ``verify_data=False`` escape.
        """
        name = path.name.removesuffix(".gz")
        published = (self.source.gz_md5[f"{name}.gz"], self.source.raw_md5[name])
        key, sig = str(path.resolve()), [stat.st_size, stat.st_mtime_ns, stat.st_ino]
        entry = self.known.get(key)
        if isinstance(entry, list) and entry[:3] == sig and entry[3:4] and entry[3] in published:
            return
        if data is not raw and _md5(data) == published[0]:
            digest = published[0]
        elif (digest := _md5(raw)) != published[1]:
            note = f" {self.source.note}" if self.source.note else ""
            raise DataError(
                f"{path} is not {self.source.title}'s {name}: its content has MD5 {digest}, the published "
                f"file's is {published[1]} ({self.source.origin(name)}).{note} Replace the file, or "
                "pass verify_data=False (--no-verify-data) to train on IDX files of your own"
            )
        self.known[key] = [*sig, digest]
        self.changed = True

    def save(self) -> None:
        """Write the stamps; a folder that cannot take them only means verifying again next time.

        Entries of files that no longer exist (a temporary folder, a moved copy) are
        dropped, so the file does not grow with every folder ever loaded.
        """
        if not self.changed:
            return
        known = {key: entry for key, entry in self.known.items() if os.path.exists(key)}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_write(self.path) as f:
                f.write(json.dumps(known, indent=1).encode())
        except OSError:
            pass
