"""The description of a published data set's files: names, checksums, addresses, system copy.

A :class:`DataSource` is data, not code: the search (:mod:`multigpu.data.search`),
the download (:mod:`multigpu.data.download`) and the check of local files
(:mod:`multigpu.data.verify`) read everything they need from it, so a new data set
is a new description, not new logic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from multigpu.errors import DataError

__all__ = ["DataSource"]


@dataclass(frozen=True)
class DataSource:
    """Where a data set's files are published and how to recognise them.

    ``files`` maps each role (e.g. ``"train_images"``) to a file name without
    ``.gz``; every file is published gzip-compressed as ``name.gz``. ``gz_md5``
    gives the published MD5 of each ``name.gz``, ``raw_md5`` that of the
    decompressed ``name`` (a redistributor may recompress the archives, as
    Debian does, and still ship the same content). ``mirrors`` are base
    addresses tried in order (``mirror + name.gz``); empty means the set cannot
    be downloaded. ``system_dir`` is where an operating-system package installs
    the files (``package`` names it), searched before any download. ``note`` is
    added to the message that refuses a file with the wrong content (say which
    other data set uses the same names).

    Raises :class:`DataError` naming the missing entry when a file lacks a
    checksum or a mirror is not an ``http(s)://`` address ending in ``/``.
    """

    name: str
    title: str
    files: Mapping[str, str]
    gz_md5: Mapping[str, str]
    raw_md5: Mapping[str, str]
    mirrors: tuple[str, ...] = ()
    system_dir: Path | None = None
    package: str | None = None
    note: str = ""

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise DataError(f"DataSource name={self.name!r} must be a plain folder name; e.g. 'fashion-mnist'")
        if not self.files:
            raise DataError(f"DataSource {self.name!r} lists no files; give files={{role: file name}}")
        for file in self.files.values():
            if f"{file}.gz" not in self.gz_md5:
                raise DataError(
                    f"DataSource {self.name!r}: gz_md5 lacks {file}.gz; give the published MD5 of every archive"
                )
            if file not in self.raw_md5:
                raise DataError(
                    f"DataSource {self.name!r}: raw_md5 lacks {file}; give the MD5 of every decompressed file"
                )
        for mirror in self.mirrors:
            if not mirror.startswith(("http://", "https://")) or not mirror.endswith("/"):
                raise DataError(
                    f"DataSource {self.name!r}: mirror {mirror!r} must be an http:// or https:// "
                    "base address ending in '/'; e.g. 'https://example.org/data/'"
                )

    def origin(self, file: str) -> str:
        """Where the real ``file`` comes from, in words: its first address and the system package."""
        places = [f"{self.mirrors[0]}{file}.gz"] if self.mirrors else []
        if self.package:
            places.append(f"the Debian package {self.package}")
        return ", or ".join(places) or "its publisher"
