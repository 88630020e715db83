"""Getting a data set's files: a local copy by the search order, else a download checked by pooch.

Each missing file is fetched by :func:`pooch.retrieve` from the source's mirrors in
turn; pooch streams it to a temporary file and checks the published MD5 before
keeping it. The verified file is then copied into the data folder through
:func:`multigpu.data.files.atomic_write` (flushed, renamed, folder flushed, the
umask's normal mode), so the folder holds a complete, verified file or none, even
after a Ctrl-C or a power cut. pooch downloads into a private staging folder inside
the target folder, removed whatever happens.
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from multigpu.data.files import PathLike, atomic_write
from multigpu.data.search import ENV_VAR, cache_dir, find, locate, searched
from multigpu.data.source import DataSource
from multigpu.errors import DataError, DataNotFoundError

__all__ = ["TIMEOUT_S", "fetch", "obtain"]

#: Seconds a connection may stall before a mirror counts as failed.
TIMEOUT_S = 60.0


def _downloader(progress: bool) -> Callable[..., Any]:
    """pooch's HTTP downloader; module-level so tests replace it and never touch the network."""
    import pooch  # lazy: pooch and requests cost ~0.2 s to import, and only a download needs them

    return pooch.HTTPDownloader(progressbar=progress, timeout=TIMEOUT_S)


def fetch(source: DataSource, folder: PathLike | None = None, *, progress: bool = False) -> Path:
    """Download the files of ``source`` missing from ``folder`` (default: its cache folder).

    Each file is tried from every mirror in turn and must match the published
    MD5 of its ``.gz``. Files already present (gz or raw) are kept. Returns the
    folder; raises :class:`DataError` naming the file, every address's error
    and the ways to get the file by hand when a file could not be obtained.
    """
    folder = Path(folder) if folder is not None else cache_dir(source)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create {folder}: {e}") from e
    for name in locate(folder, source)[1]:
        gz_name = f"{name}.gz"
        errors: list[str] = []
        for base in source.mirrors:
            url = base + gz_name
            try:
                _retrieve(url, source.gz_md5[gz_name], folder / gz_name, progress)
                break
            except Exception as e:  # noqa: BLE001 - network, HTTP, disk or checksum: try the next address
                errors.append(f"{url}: {_describe(e)}")
        else:
            tried = "; ".join(errors) if errors else f"{source.title} has no download address"
            raise DataError(
                f"could not download {gz_name} into {folder}: {tried}. Put the published file "
                f"there by hand ({source.origin(name)}), or try again later"
            )
    return folder


def obtain(
    source: DataSource, data_dir: PathLike | None = None, *, download: bool = True, progress: bool = False
) -> Path:
    """Return the folder holding ``source``'s files: found by the search order, else downloaded.

    Raises :class:`DataNotFoundError` for an explicit folder lacking the files,
    and, when nothing is found and the download is off (``download=False``) or
    fails, one that lists every way to provide the files and the download's error.
    """
    folder = find(source, data_dir)
    if folder is not None:
        return folder
    if not download:
        raise DataNotFoundError(_not_found_message(source, "not attempted (download=False)"))
    try:
        return fetch(source, cache_dir(source), progress=progress)
    except DataError as e:
        raise DataNotFoundError(_not_found_message(source, str(e))) from e


def _retrieve(url: str, md5: str, dest: Path, progress: bool) -> None:
    """Fetch ``url`` with pooch, checked against ``md5``, and place it at ``dest`` atomically."""
    import pooch  # lazy, as in _downloader

    if progress:
        sys.stderr.write(f"downloading {dest.name} from {url}\n")
    bar = progress and sys.stderr.isatty()  # a bar's carriage-return updates belong on a terminal only
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".download"))
    try:
        with _quiet(pooch.get_logger()):
            got = pooch.retrieve(
                url,
                known_hash=f"md5:{md5}",
                fname=dest.name,
                path=staging,
                downloader=_downloader(bar),
                progressbar=bar,
            )
        with open(got, "rb") as src, atomic_write(dest) as out:
            shutil.copyfileobj(src, out, 1 << 20)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def _quiet(logger: logging.Logger) -> Iterator[None]:
    # pooch logs "Downloading data from ..." at INFO to stderr, naming the staging
    # folder; our own line (with progress=True) names the real file instead.
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def _describe(e: Exception) -> str:
    # pooch reports a hash mismatch as a ValueError saying "... does not match the known hash"
    # (tests/test_data_download.py checks those words, so a pooch that changes them is noticed).
    if isinstance(e, ValueError) and "does not match the known hash" in str(e):
        return f"checksum mismatch: {e}"
    return f"{type(e).__name__}: {e}"


def _not_found_message(source: DataSource, reason: str) -> str:
    names = ", ".join(f"{n}.gz" for n in source.files.values())
    places = searched(source)
    ways = [
        f"pass data_dir=FOLDER, or set the environment variable {ENV_VAR}=FOLDER;",
        f"put them in the cache folder {places[0]};",
    ]
    if source.package and source.system_dir is not None:
        ways.append(
            f"install the Debian/Ubuntu package: sudo apt-get install {source.package}\n"
            f"     (it puts them in {source.system_dir})."
        )
    listed = "".join(f"  {i}. {way}\n" for i, way in enumerate(ways, 1))
    return (
        f"{source.title} was not found and could not be downloaded.\n"
        f"No data_dir was given and {ENV_VAR} is unset; searched {' and '.join(map(str, places))}.\n"
        f"Provide the {len(source.files)} files ({names}; gzip or unpacked) in one of these "
        f"{len(ways)} ways:\n{listed}"
        f"Download error: {reason}"
    )
