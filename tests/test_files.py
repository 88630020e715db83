"""Output files: the umask's normal mode, a flushed folder after the rename, nothing torn,
and unwritable paths refused up front."""

from __future__ import annotations

import gzip
import hashlib
import os
import stat

import numpy as np
import pytest
from data_fakes import FakeMirrors

import multigpu.data.download as download
from multigpu.data import files
from multigpu.data.source import DataSource
from multigpu.errors import InputError
from multigpu.training.checkpoint import save_checkpoint


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield 0o027
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_atomic_write_gives_the_umask_mode_and_flushes_the_folder(tmp_path, monkeypatch, umask_027):
    order = []
    real_replace, real_fsync_dir = os.replace, files.fsync_dir
    monkeypatch.setattr(files.os, "replace", lambda a, b: (order.append("rename"), real_replace(a, b)))
    monkeypatch.setattr(files, "fsync_dir", lambda d: (order.append(("fsync_dir", str(d))), real_fsync_dir(d)))
    with files.atomic_write(tmp_path / "out.bin") as f:
        f.write(b"data")
    assert (tmp_path / "out.bin").read_bytes() == b"data"
    assert _mode(tmp_path / "out.bin") == 0o640  # 0o666 & ~0o027, not mkstemp's 0o600
    assert order == ["rename", ("fsync_dir", str(tmp_path))]


def test_atomic_write_leaves_the_old_file_on_error(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt):
        with files.atomic_write(target) as f:
            f.write(b"half")
            raise KeyboardInterrupt
    assert target.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["out.bin"]


def test_checkpoints_and_downloads_get_the_umask_mode(tmp_path, monkeypatch, umask_027):
    path = save_checkpoint(tmp_path / "ck", [np.zeros(3, np.float32)], {"epoch": 1})
    assert _mode(path) == 0o640

    payload = gzip.compress(b"payload")
    source = DataSource(
        name="one",
        title="One",
        files={"only": "f"},
        mirrors=("https://x.invalid/",),
        gz_md5={"f.gz": hashlib.md5(payload).hexdigest()},
        raw_md5={"f": hashlib.md5(b"payload").hexdigest()},
    )
    monkeypatch.setattr(download, "_downloader", FakeMirrors({"f.gz": payload}))  # pooch runs, no network
    download.fetch(source, tmp_path)
    assert _mode(tmp_path / "f.gz") == 0o640


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda p: p / "missing" / "out.json", "does not exist"),
        (lambda p: p, "is a folder"),
    ],
)
def test_check_writable_refuses_bad_paths(tmp_path, make, match):
    with pytest.raises(InputError, match=match):
        files.check_writable(make(tmp_path), "--json")


def test_check_writable_refuses_an_unwritable_folder(tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    # Root may write anywhere, so the refusal is simulated where the probe creates its file.
    monkeypatch.setattr(files.tempfile, "mkstemp", refuse)
    with pytest.raises(InputError, match="cannot be written.*Permission denied"):
        files.check_writable(tmp_path / "out.json", "--json")


def test_check_writable_dir_creates_and_refuses_files(tmp_path):
    assert files.check_writable_dir(tmp_path / "a" / "b", "checkpoint").is_dir()
    (tmp_path / "f").write_text("x")
    with pytest.raises(InputError, match="is a file"):
        files.check_writable_dir(tmp_path / "f", "checkpoint")
    assert not [p for p in os.listdir(tmp_path / "a" / "b")]  # the probe left nothing
