"""Tests of the verification cache (multigpu.data.verify) used directly, on small files written here."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from data_fakes import count_md5
from idx_files import write_idx

import multigpu.data.verify as verify
from multigpu.data.source import DataSource
from multigpu.data.verify import VerifiedFiles, stamps_path
from multigpu.errors import DataError

pytestmark = pytest.mark.usefixtures("data_cache")  # an empty cache: verified.json starts absent


def _source(name: str, path: Path) -> DataSource:
    """A one-file data set whose published file is the one at ``path``."""
    data = path.read_bytes()
    return DataSource(
        name=name,
        title=name.title(),
        files={"only": "f-idx1-ubyte"},
        gz_md5={"f-idx1-ubyte.gz": hashlib.md5(data).hexdigest()},
        raw_md5={"f-idx1-ubyte": hashlib.md5(gzip.decompress(data)).hexdigest()},
        mirrors=("https://example.invalid/",),
        note="Its twin uses the same name.",
    )


def _check(stamps: VerifiedFiles, path: Path) -> None:
    data = path.read_bytes()
    stamps.check(path, data, gzip.decompress(data), os.stat(path))


def _stamped(path: Path, name: str = "one") -> VerifiedFiles:
    """Verify ``path`` as the published file of data set ``name`` and save the stamp."""
    stamps = VerifiedFiles(_source(name, path))
    _check(stamps, path)
    stamps.save()
    return stamps


def test_stamp_is_keyed_by_path_size_mtime_and_inode(tmp_path, monkeypatch):
    path = write_idx(tmp_path / "d" / "f-idx1-ubyte.gz", np.arange(5, dtype=np.uint8))
    source = _stamped(path).source
    entry = json.loads(stamps_path().read_text())[str(path.resolve())]
    st = path.stat()
    assert entry == [st.st_size, st.st_mtime_ns, st.st_ino, source.gz_md5["f-idx1-ubyte.gz"]]
    calls = count_md5(monkeypatch)
    _check(VerifiedFiles(source), path)
    assert calls[0] == 0  # remembered: no byte hashed
    # The same bytes, size and mtime under a new inode (a copy renamed into place): checked again.
    copy = tmp_path / "d" / "copy"
    copy.write_bytes(path.read_bytes())
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(copy, path)
    assert path.stat().st_ino != st.st_ino
    _check(VerifiedFiles(source), path)
    assert calls[0] == 1


def test_a_file_verified_for_one_data_set_does_not_pass_as_another(tmp_path):
    """Same file name, other content: the twin's stamp must not vouch for it."""
    twin = write_idx(tmp_path / "twin" / "f-idx1-ubyte.gz", np.arange(5, dtype=np.uint8))
    mine = write_idx(tmp_path / "mine" / "f-idx1-ubyte.gz", np.arange(6, dtype=np.uint8))
    _stamped(twin, "twin")
    theirs = VerifiedFiles(_source("mine", mine))
    with pytest.raises(DataError) as e:
        _check(theirs, twin)  # stamped, but under the twin's checksums
    msg = str(e.value)
    assert f"{twin} is not Mine's f-idx1-ubyte" in msg and "https://example.invalid/f-idx1-ubyte.gz" in msg
    assert "Its twin uses the same name." in msg and "verify_data=False" in msg and "--no-verify-data" in msg


def test_a_damaged_stamps_file_only_means_verifying_again(tmp_path, monkeypatch):
    path = write_idx(tmp_path / "f-idx1-ubyte.gz", np.arange(5, dtype=np.uint8))
    stamps_path().parent.mkdir(parents=True)
    stamps_path().write_text("[1, 2")  # cut mid-write by someone else's crash
    calls = count_md5(monkeypatch)
    _stamped(path)
    assert calls[0] == 1 and str(path.resolve()) in json.loads(stamps_path().read_text())


def test_an_unwritable_cache_only_means_verifying_again(tmp_path, monkeypatch):
    path = write_idx(tmp_path / "f-idx1-ubyte.gz", np.arange(5, dtype=np.uint8))
    stamps = VerifiedFiles(_source("one", path))
    _check(stamps, path)

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(verify, "atomic_write", refuse)  # root may write anywhere, so simulate it
    stamps.save()  # no error
    assert not stamps_path().exists()


def test_stamps_of_files_gone_are_dropped_on_the_next_save(tmp_path):
    gone = write_idx(tmp_path / "tmp" / "f-idx1-ubyte.gz", np.arange(5, dtype=np.uint8))
    kept = write_idx(tmp_path / "kept" / "f-idx1-ubyte.gz", np.arange(5, dtype=np.uint8))
    _stamped(gone)
    gone.unlink()
    _stamped(kept)
    assert list(json.loads(stamps_path().read_text())) == [str(kept.resolve())]
