"""Fakes for the data tests: an isolated cache, no system copy, and mirrors served from memory.

The network is never touched: :func:`isolate` (the ``isolated_data`` fixture of
conftest.py) replaces ``multigpu.data.download._downloader`` (the factory of pooch's
HTTP downloader) with one whose downloader fails; a test may then install
:class:`FakeMirrors`, whose downloader writes bytes it holds. Everything else, pooch's
temporary file, its MD5 check and our placement of the file, runs for real.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

import multigpu.data.download as download
import multigpu.data.fashion_mnist as fm
import multigpu.data.verify as verify
from multigpu.data.search import ENV_VAR

NAMES = list(fm.FILES.values())


def set_source(monkeypatch: pytest.MonkeyPatch, **changes) -> None:
    """Replace fields of Fashion-MNIST's DataSource for one test (e.g. system_dir, mirrors)."""
    source = dataclasses.replace(fm.SPEC.source, **changes)
    monkeypatch.setattr(fm, "SPEC", dataclasses.replace(fm.SPEC, source=source))


def published(folder: Path) -> dict[str, dict[str, str]]:
    """The gz_md5 and raw_md5 that make the ``.gz`` files in ``folder`` the "published" ones."""
    data = {n: (folder / f"{n}.gz").read_bytes() for n in NAMES}
    return {
        "gz_md5": {f"{n}.gz": hashlib.md5(d).hexdigest() for n, d in data.items()},
        "raw_md5": {n: hashlib.md5(gzip.decompress(d)).hexdigest() for n, d in data.items()},
    }


def publish(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Make the files in ``folder`` Fashion-MNIST's published ones for one test."""
    set_source(monkeypatch, **published(folder))


def offline(url: str, output_file: str, pooch: object = None) -> None:
    """A pooch downloader for a machine without network."""
    raise ConnectionError("network disabled in tests")


def isolate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Empty cache, no env var, no system copy, and no network (the ``isolated_data`` fixture)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(ENV_VAR, raising=False)
    set_source(monkeypatch, system_dir=tmp_path / "system")
    monkeypatch.setattr(download, "_downloader", lambda progress: offline)
    return tmp_path / "xdg" / "multigpu" / "fashion-mnist"


def count_md5(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the MD5s the verification computes: ``calls[0]`` after each load."""
    calls = [0]
    real = verify._md5

    def counting(data: bytes) -> str:
        calls[0] += 1
        return real(data)

    monkeypatch.setattr(verify, "_md5", counting)
    return calls


def leftovers(folder: Path) -> list[str]:
    """The names in ``folder`` (hidden ones included), sorted; [] if it does not exist."""
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


class FakeMirrors:
    """Serve ``payload`` (file name -> bytes) at every address, through pooch's downloader interface.

    ``calls`` lists the URLs asked for; ``respond(url, data)`` may return other
    bytes or raise, to play a broken mirror. Writes in chunks, as a stream would,
    and ``fail_after``/``exc`` raise mid-stream after that many bytes.
    """

    CHUNK = 7000

    def __init__(self, payload: dict[str, bytes]) -> None:
        self.payload = payload
        self.calls: list[str] = []
        self.progress: list[bool] = []
        self.respond: Callable[[str, bytes], bytes] | None = None
        self.fail_after: int | None = None
        self.exc: BaseException | None = None

    def __call__(self, progress: bool) -> Callable[..., None]:  # the _downloader factory
        self.progress.append(progress)
        return self.download

    def download(self, url: str, output_file: str, pooch: object = None) -> None:
        self.calls.append(url)
        data = self.payload[url.rsplit("/", 1)[1]]
        if self.respond is not None:
            data = self.respond(url, data)
        with open(output_file, "w+b") as out:
            for start in range(0, len(data), self.CHUNK):
                if self.fail_after is not None and start >= self.fail_after:
                    raise self.exc
                out.write(data[start : start + self.CHUNK])
