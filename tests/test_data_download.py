"""Tests of the download (multigpu.data.download): pooch fetches and checks, we place the file.

No test touches the network: mirrors are served from memory through pooch's
downloader interface (tests/data_fakes.py), or by an HTTP server on the loopback
interface for the one test that runs pooch's own HTTP downloader.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import sys
import threading

import pytest
from data_fakes import NAMES, FakeMirrors, leftovers, published, set_source
from idx_files import write_idx, write_set

import multigpu.data.download as download
from multigpu.data import download_fashion_mnist, load_fashion_mnist
from multigpu.data.source import DataSource
from multigpu.errors import DataError, DataNotFoundError

pytestmark = pytest.mark.usefixtures("data_cache")  # an empty cache, no system copy, no network
POOCH_DOWNLOADER = download._downloader  # read at import, before the fixture replaces it


@pytest.fixture
def mirrors(tmp_path, monkeypatch) -> FakeMirrors:
    """Serve a small valid set at two mirrors; the published checksums patched to match it."""
    src = write_set(tmp_path / "published", n_train=30, n_test=10, gz=True)
    set_source(monkeypatch, mirrors=("http://primary.invalid/", "https://backup.invalid/"), **published(src))
    fake = FakeMirrors({f"{n}.gz": (src / f"{n}.gz").read_bytes() for n in NAMES})
    monkeypatch.setattr(download, "_downloader", fake)
    return fake


def test_download_into_cache(mirrors, data_cache, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a bar draws on a terminal only
    ds = load_fashion_mnist(progress=True)
    assert ds.source == data_cache and ds.train_images.shape == (30, 1, 28, 28)
    assert leftovers(data_cache) == sorted(f"{n}.gz" for n in NAMES)  # no temporary or staging files
    assert len(mirrors.calls) == 4 and mirrors.progress == [True] * 4
    assert all(u.startswith("http://primary.invalid/") for u in mirrors.calls)
    assert "downloading train-images-idx3-ubyte.gz from http://primary.invalid/" in capsys.readouterr().err
    load_fashion_mnist()  # the second load uses the cache
    assert len(mirrors.calls) == 4


def test_download_draws_no_bar_off_a_terminal(mirrors, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)  # piped to a file: no carriage-return updates
    load_fashion_mnist(progress=True)
    assert mirrors.progress == [False] * 4
    assert "downloading train-images-idx3-ubyte.gz" in capsys.readouterr().err  # one line per file still


def test_download_is_quiet_without_progress(mirrors, capsys):
    load_fashion_mnist()
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""  # pooch's INFO lines silenced too
    assert mirrors.progress == [False] * 4


def test_download_fetches_only_missing_files(mirrors, data_cache):
    for name in NAMES[:2]:
        write_idx(data_cache / f"{name}.gz", gzip.decompress(mirrors.payload[f"{name}.gz"]))
    load_fashion_mnist()
    assert sorted(u.rsplit("/", 1)[1] for u in mirrors.calls) == sorted(f"{n}.gz" for n in NAMES[2:])


def test_download_falls_back_to_next_mirror(mirrors, data_cache):
    def respond(url, data):
        if "primary" in url:
            raise ConnectionError("primary down")
        return data

    mirrors.respond = respond
    assert load_fashion_mnist().source == data_cache
    assert len(mirrors.calls) == 8


def test_pooch_hash_failure_is_our_data_error_naming_file_and_fix(mirrors, data_cache):
    def respond(url, data):
        if url.endswith("t10k-images-idx3-ubyte.gz"):
            return data[:-1] + bytes([data[-1] ^ 1])  # one bit flipped, at both mirrors
        return data

    mirrors.respond = respond
    with pytest.raises(DataError) as e:
        download_fashion_mnist()
    msg = str(e.value)
    assert not isinstance(e.value, DataNotFoundError)
    assert "could not download t10k-images-idx3-ubyte.gz into " + str(data_cache) in msg
    assert msg.count("checksum mismatch") == 2 and "does not match the known hash" in msg  # pooch's words
    assert "http://primary.invalid/t10k-images-idx3-ubyte.gz" in msg and "https://backup.invalid/" in msg
    assert "Put the published file there by hand" in msg and "dataset-fashion-mnist" in msg  # the fix
    assert "t10k-images-idx3-ubyte.gz" not in leftovers(data_cache)  # nothing unverified kept
    assert not [n for n in leftovers(data_cache) if n.startswith(".")]  # no staging or temporary files


def test_checksum_mismatch_through_load_lists_every_way(mirrors, data_cache):
    mirrors.respond = lambda url, data: data[::-1] if url.endswith("labels-idx1-ubyte.gz") else data
    with pytest.raises(DataNotFoundError, match="checksum mismatch") as e:
        load_fashion_mnist()
    assert "apt-get install dataset-fashion-mnist" in str(e.value)
    assert not [n for n in leftovers(data_cache) if "labels" in n or n.startswith(".")]


def test_interrupted_download_leaves_no_partial_file(mirrors, data_cache):
    mirrors.fail_after, mirrors.exc = 7000, ConnectionResetError("connection reset mid-stream")
    with pytest.raises(DataNotFoundError, match="connection reset mid-stream"):
        load_fashion_mnist()
    assert leftovers(data_cache) == []


def test_ctrl_c_mid_download_leaves_no_partial_file(mirrors, data_cache):
    mirrors.fail_after, mirrors.exc = 7000, KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        load_fashion_mnist()
    assert leftovers(data_cache) == []
    assert len(mirrors.calls) == 1  # Ctrl-C is not a broken mirror: no second address tried


def test_a_source_without_mirrors_says_so(tmp_path):
    source = DataSource(
        name="local-only",
        title="Local",
        files={"a": "a-file"},
        gz_md5={"a-file.gz": "0" * 32},
        raw_md5={"a-file": "0" * 32},
    )
    with pytest.raises(DataError, match="Local has no download address.*by hand \\(its publisher\\)"):
        download.fetch(source, tmp_path / "dl")


def test_real_pooch_downloader_over_loopback_http(tmp_path, monkeypatch, data_cache):
    """pooch's own HTTPDownloader (requests), a real HTTP 404 at the first mirror, no internet."""
    src = write_set(tmp_path / "served" / "good", n_train=5, n_test=3)
    seen: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_request(self, code="-", size="-"):  # record instead of printing
            seen.append(f"{self.path} {code}")

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(tmp_path / "served"))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setattr(download, "_downloader", POOCH_DOWNLOADER)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        set_source(monkeypatch, mirrors=(base + "missing/", base + "good/"), **published(src))
        ds = load_fashion_mnist()
    finally:
        server.shutdown()
        server.server_close()
    assert ds.source == data_cache and ds.train_images.shape == (5, 1, 28, 28)
    assert sorted(seen) == sorted([f"/missing/{n}.gz 404" for n in NAMES] + [f"/good/{n}.gz 200" for n in NAMES])
    for name in NAMES:
        got = (data_cache / f"{name}.gz").read_bytes()
        assert hashlib.md5(got).hexdigest() == hashlib.md5((src / f"{name}.gz").read_bytes()).hexdigest()
