"""Tests of the Fashion-MNIST loader on small IDX files written here.

No test touches the network: an autouse fixture replaces the loader's
``_urlopen`` with one that fails, and download tests serve fake bytes.
"""
from __future__ import annotations

import ast
import gzip
import hashlib
import io
import json
import os
import sys
import tempfile
import urllib.error
from dataclasses import FrozenInstanceError
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import multigpu.data.fashion_mnist as fm
from multigpu.data import FashionMNIST, find_fashion_mnist, load_fashion_mnist, read_idx
from multigpu.errors import DataError, DataNotFoundError

REAL_DIR = Path("/usr/share/datasets/fashion-mnist")  # dpkg -L dataset-fashion-mnist
NAMES = list(fm.FILES.values())

from idx_files import CODES, idx_bytes, write_idx  # noqa: E402


def write_set(folder: Path, n_train: int = 20, n_test: int = 10, *, gz: bool = True,
              seed: int = 0) -> Path:
    """Write a small but well-formed Fashion-MNIST folder (labels cycle through 0..9)."""
    rng = np.random.default_rng(seed)
    suffix = ".gz" if gz else ""
    for split, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        images[0, 0, 0], images[0, 0, 1] = 0, 255  # make the [0, 1] ends exact
        write_idx(folder / f"{split}-images-idx3-ubyte{suffix}", images)
        write_idx(folder / f"{split}-labels-idx1-ubyte{suffix}",
                  (np.arange(n) % 10).astype(np.uint8))
    return folder


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Empty cache, no env var, no system copy, and no network for every test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(fm.ENV_VAR, raising=False)
    monkeypatch.setattr(fm, "SYSTEM_DIR", tmp_path / "system")

    def no_network(url, timeout=None):
        raise urllib.error.URLError("network disabled in tests")

    monkeypatch.setattr(fm, "_urlopen", no_network)
    return tmp_path


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "xdg" / "multigpu" / "fashion-mnist"


# ------------------------------------------------------------------- read_idx

@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("dtype", list(CODES))
def test_read_idx_round_trip(tmp_path, gz, dtype):
    arr = (np.arange(2 * 3 * 4) - 7).astype(dtype).reshape(2, 3, 4)
    path = write_idx(tmp_path / "a.idx", arr, gz=gz)
    got = read_idx(path)
    assert got.dtype == dtype and got.dtype.isnative
    np.testing.assert_array_equal(got, arr)
    got[0, 0, 0] = 1  # the result is writable: it does not alias the file buffer


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(0, 5), min_size=1, max_size=4),
       dtype=st.sampled_from(list(CODES)), gz=st.booleans(), seed=st.integers(0, 2**16))
def test_read_idx_round_trip_property(shape, dtype, gz, seed):
    arr = (np.random.default_rng(seed).standard_normal(shape) * 50).astype(dtype)
    with tempfile.TemporaryDirectory() as d:
        got = read_idx(write_idx(Path(d) / "x", arr, gz=gz))
    assert got.shape == tuple(shape) and got.dtype == dtype
    np.testing.assert_array_equal(got, arr)


def test_compression_is_detected_from_content(tmp_path):
    arr = np.arange(6, dtype=np.uint8)
    np.testing.assert_array_equal(read_idx(write_idx(tmp_path / "raw.gz", arr, gz=False)), arr)
    np.testing.assert_array_equal(read_idx(write_idx(tmp_path / "packed", arr, gz=True)), arr)


@pytest.mark.parametrize("gz", [False, True])
def test_wrong_magic_names_file(tmp_path, gz):
    data = b"\x12\x34" + idx_bytes(np.zeros(4, np.uint8))[2:]
    path = write_idx(tmp_path / "bad-magic", data, gz=gz)
    with pytest.raises(DataError, match="magic") as e:
        read_idx(path)
    assert str(path) in str(e.value)


def test_unknown_type_code_names_file(tmp_path):
    path = write_idx(tmp_path / "bad-code", idx_bytes(np.zeros(4, np.uint8), code=0x07))
    with pytest.raises(DataError, match="type code 0x07") as e:
        read_idx(path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("keep", [315, 216, 10, 3])  # of 316: data short by 1 / 100, dims, magic
def test_truncated_names_file(tmp_path, gz, keep):
    data = idx_bytes(np.zeros((3, 10, 10), np.uint8))
    assert len(data) == 316
    path = write_idx(tmp_path / "short", data[:keep], gz=gz)
    with pytest.raises(DataError, match="truncated") as e:
        read_idx(path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize("gz", [False, True])
def test_trailing_bytes_name_file(tmp_path, gz):
    data = idx_bytes(np.zeros((3, 4), np.int32)) + b"junk"
    path = write_idx(tmp_path / "long", data, gz=gz)
    with pytest.raises(DataError, match="4 trailing bytes") as e:
        read_idx(path)
    assert str(path) in str(e.value)


def test_cut_gzip_stream_names_file(tmp_path):
    packed = gzip.compress(idx_bytes(np.arange(1000, dtype=np.int32)))
    path = tmp_path / "cut.gz"
    path.write_bytes(packed[:len(packed) // 2])
    with pytest.raises(DataError, match="gzip") as e:
        read_idx(path)
    assert str(path) in str(e.value)


def test_missing_file_is_data_not_found(tmp_path):
    with pytest.raises(DataNotFoundError, match="nothing-here"):
        read_idx(tmp_path / "nothing-here")


# ------------------------------------------------------------------- loading

@pytest.mark.parametrize("gz", [False, True])
def test_load_gives_float32_in_unit_interval(tmp_path, gz):
    folder = write_set(tmp_path / "d", n_train=20, n_test=10, gz=gz)
    ds = load_fashion_mnist(folder, verify=False)
    assert isinstance(ds, FashionMNIST) and ds.source == folder
    assert ds.train_images.shape == (20, 1, 28, 28) and ds.test_images.shape == (10, 1, 28, 28)
    for x in (ds.train_images, ds.test_images):
        assert x.dtype == np.float32 and x.min() == 0.0 and x.max() == 1.0
    for y in (ds.train_labels, ds.test_labels):
        assert y.dtype == np.int64
    np.testing.assert_array_equal(ds.train_labels, np.arange(20) % 10)
    raw = read_idx(folder / "train-images-idx3-ubyte.gz" if gz else folder / NAMES[0])
    np.testing.assert_allclose(ds.train_images[:, 0] * 255, raw, atol=1e-4)
    assert ds.classes[9] == "Ankle boot" and "train=20" in repr(ds)
    with pytest.raises(FrozenInstanceError):
        ds.source = tmp_path  # type: ignore[misc]


def test_mixed_gz_and_raw_in_one_folder(tmp_path):
    folder = write_set(tmp_path / "d", gz=True)
    for name in NAMES[:2]:  # unpack the training files only
        (folder / name).write_bytes(gzip.decompress((folder / f"{name}.gz").read_bytes()))
        (folder / f"{name}.gz").unlink()
    assert load_fashion_mnist(folder, verify=False).train_images.shape[0] == 20


def test_count_mismatch_names_both_files(tmp_path):
    folder = write_set(tmp_path / "d")
    write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.zeros(9, np.uint8))
    with pytest.raises(DataError) as e:
        load_fashion_mnist(folder, verify=False)
    msg = str(e.value)
    assert "t10k-images-idx3-ubyte.gz" in msg and "t10k-labels-idx1-ubyte.gz" in msg
    assert "10 images" in msg and "9 labels" in msg


def test_corrupt_file_in_set_names_it(tmp_path):
    folder = write_set(tmp_path / "d")
    bad = folder / "train-images-idx3-ubyte.gz"
    bad.write_bytes(gzip.compress(idx_bytes(np.zeros((20, 28, 28), np.uint8))[:-5]))
    with pytest.raises(DataError, match="truncated") as e:
        load_fashion_mnist(folder, verify=False)
    assert str(bad) in str(e.value)


def test_wrong_image_shape_and_label_range(tmp_path):
    folder = write_set(tmp_path / "d")
    write_idx(folder / "train-images-idx3-ubyte.gz", np.zeros((20, 32, 32), np.uint8))
    with pytest.raises(DataError, match=r"train-images.*\(N, 28, 28\)"):
        load_fashion_mnist(folder, verify=False)
    folder = write_set(tmp_path / "e")
    write_idx(folder / "train-labels-idx1-ubyte.gz", np.full(20, 10, np.uint8))
    with pytest.raises(DataError, match="train-labels.*label 10"):
        load_fashion_mnist(folder, verify=False)


# ---------------------------------------------------------- MD5 verification

def _publish(monkeypatch, folder: Path) -> None:
    """Make the files in ``folder`` the "published" ones: patch the expected MD5s to theirs."""
    raw = {n: hashlib.md5(gzip.decompress((folder / f"{n}.gz").read_bytes())).hexdigest() for n in NAMES}
    gz = {f"{n}.gz": hashlib.md5((folder / f"{n}.gz").read_bytes()).hexdigest() for n in NAMES}
    monkeypatch.setattr(fm, "RAW_MD5", raw)
    monkeypatch.setattr(fm, "GZ_MD5", gz)


def _count_md5(monkeypatch) -> list[int]:
    calls = [0]
    real = fm._md5

    def counting(data):
        calls[0] += 1
        return real(data)

    monkeypatch.setattr(fm, "_md5", counting)
    return calls


def test_foreign_files_are_refused_naming_file_and_source(tmp_path):
    """MNIST digits (or any other IDX set) with Fashion-MNIST's names: a DataError, not training."""
    folder = write_set(tmp_path / "digits")
    with pytest.raises(DataError) as e:
        load_fashion_mnist(folder)
    msg = str(e.value)
    assert str(folder / "train-images-idx3-ubyte.gz") in msg
    assert fm.RAW_MD5["train-images-idx3-ubyte"] in msg and fm.MIRRORS[0] in msg
    assert "dataset-fashion-mnist" in msg and "--no-verify-data" in msg
    assert load_fashion_mnist(folder, verify=False).train_images.shape[0] == 20  # the opt-out


def test_verification_is_remembered_until_a_file_changes(tmp_path, monkeypatch, cache):
    folder = write_set(tmp_path / "d")
    _publish(monkeypatch, folder)
    before = leftovers(folder)
    calls = _count_md5(monkeypatch)
    load_fashion_mnist(folder)
    assert calls[0] == 4  # one hash per .gz file: each matches the published archive
    stamp = cache.parent / "verified.json"
    assert stamp.is_file() and leftovers(folder) == before  # never written into the data folder
    load_fashion_mnist(folder)
    assert calls[0] == 4  # remembered by size, mtime and inode: no byte hashed again
    path = folder / "t10k-labels-idx1-ubyte.gz"
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    load_fashion_mnist(folder)
    assert calls[0] == 5  # the touched file only


def test_changed_content_is_caught_after_verification(tmp_path, monkeypatch):
    folder = write_set(tmp_path / "d")
    _publish(monkeypatch, folder)
    load_fashion_mnist(folder)
    write_idx(folder / "train-labels-idx1-ubyte.gz", (np.arange(20) % 9).astype(np.uint8))
    with pytest.raises(DataError, match="train-labels-idx1-ubyte.gz is not Fashion-MNIST"):
        load_fashion_mnist(folder)


def test_recompressed_and_raw_files_match_by_content(tmp_path, monkeypatch):
    """Debian recompresses the archives: the .gz bytes differ, the content matches RAW_MD5."""
    folder = write_set(tmp_path / "d")
    _publish(monkeypatch, folder)
    other = tmp_path / "debian"
    other.mkdir()
    for n in NAMES[:2]:  # recompressed with another header
        (other / f"{n}.gz").write_bytes(gzip.compress(gzip.decompress((folder / f"{n}.gz").read_bytes()),
                                                      compresslevel=1, mtime=12345))
    for n in NAMES[2:]:  # unpacked
        (other / n).write_bytes(gzip.decompress((folder / f"{n}.gz").read_bytes()))
    assert load_fashion_mnist(other).train_images.shape[0] == 20


def test_read_only_system_folder_is_verified_into_the_user_cache(tmp_path, monkeypatch, cache):
    system = write_set(tmp_path / "system")  # the fixture's SYSTEM_DIR
    _publish(monkeypatch, system)
    system.chmod(0o555)
    try:
        assert load_fashion_mnist().source == system
    finally:
        system.chmod(0o755)
    stamps = json.loads((cache.parent / "verified.json").read_text())
    assert sorted(stamps) == sorted(str((system / f"{n}.gz").resolve()) for n in NAMES)


# -------------------------------------------------------------- search order

def test_search_order(tmp_path, monkeypatch, cache):
    explicit = write_set(tmp_path / "explicit", n_train=11)
    env = write_set(tmp_path / "env", n_train=12)
    write_set(cache, n_train=13)
    system = write_set(tmp_path / "system", n_train=14)  # fixture's SYSTEM_DIR
    monkeypatch.setenv(fm.ENV_VAR, str(env))

    assert find_fashion_mnist(explicit) == explicit  # data_dir beats env
    assert load_fashion_mnist(explicit, verify=False).train_images.shape[0] == 11
    assert find_fashion_mnist() == env  # env beats cache
    assert load_fashion_mnist(verify=False).train_images.shape[0] == 12
    monkeypatch.delenv(fm.ENV_VAR)
    assert find_fashion_mnist() == cache  # cache beats system
    assert load_fashion_mnist(verify=False).train_images.shape[0] == 13
    for name in NAMES[:1]:  # an incomplete cache does not hide the system copy
        (cache / f"{name}.gz").unlink()
    assert find_fashion_mnist() == system
    ds = load_fashion_mnist(download=False, verify=False)
    assert ds.source == system and ds.train_images.shape[0] == 14


def test_nothing_found_returns_none():
    assert find_fashion_mnist() is None


def test_raw_names_accepted_in_system_folder(tmp_path):
    system = write_set(tmp_path / "system", gz=False)
    assert find_fashion_mnist() == system


def test_data_root_with_fashion_mnist_subfolder(tmp_path, monkeypatch):
    sub = write_set(tmp_path / "root" / "fashion-mnist")
    assert find_fashion_mnist(tmp_path / "root") == sub
    monkeypatch.setenv(fm.ENV_VAR, str(tmp_path / "root"))
    assert load_fashion_mnist(verify=False).source == sub


def test_explicit_data_dir_lacking_files_is_an_error(tmp_path, cache):
    write_set(cache)  # a usable copy exists, but an explicit choice is not overridden
    partial = write_set(tmp_path / "partial")
    (partial / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataNotFoundError) as e:
        load_fashion_mnist(partial)
    assert str(partial) in str(e.value) and "t10k-labels-idx1-ubyte" in str(e.value)
    with pytest.raises(DataNotFoundError, match="does not exist"):
        find_fashion_mnist(tmp_path / "nope")


def test_env_var_lacking_files_is_an_error(tmp_path, monkeypatch, cache):
    write_set(cache)
    monkeypatch.setenv(fm.ENV_VAR, str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataNotFoundError, match=f"{fm.ENV_VAR}=.*empty"):
        load_fashion_mnist()


def test_default_cache_dir(monkeypatch, tmp_path):
    assert fm.default_cache_dir() == tmp_path / "xdg" / "multigpu" / "fashion-mnist"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert fm.default_cache_dir() == tmp_path / "home" / ".cache" / "multigpu" / "fashion-mnist"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # XDG: relative is invalid
    assert fm.default_cache_dir() == tmp_path / "home" / ".cache" / "multigpu" / "fashion-mnist"


# ----------------------------------------------------------- offline message

def test_offline_error_tells_three_ways(cache):
    with pytest.raises(DataNotFoundError) as e:
        load_fashion_mnist()
    msg = str(e.value)
    assert isinstance(e.value, FileNotFoundError)
    assert "data_dir" in msg and fm.ENV_VAR in msg  # way 1
    assert str(cache) in msg  # way 2
    assert "apt-get install dataset-fashion-mnist" in msg  # way 3
    assert "network disabled in tests" in msg  # what the download error was
    assert leftovers(cache) == []  # no partial files from the failed attempts


def test_download_false_does_not_fetch(monkeypatch):
    def forbidden(url, timeout=None):
        raise AssertionError("fetched although download=False")

    monkeypatch.setattr(fm, "_urlopen", forbidden)
    with pytest.raises(DataNotFoundError, match="download=False"):
        load_fashion_mnist(download=False)


# ------------------------------------------------------------------ download

class FakeResponse:
    """Enough of http.client.HTTPResponse: a context manager with read(n)."""

    def __init__(self, data: bytes, fail_after: int | None = None,
                 exc: BaseException | None = None):
        self._buf = io.BytesIO(data)
        self._fail_after, self._exc = fail_after, exc
        self.headers = {"Content-Length": str(len(data))}

    def read(self, n: int = -1) -> bytes:
        if self._fail_after is not None and self._buf.tell() >= self._fail_after:
            raise self._exc
        return self._buf.read(min(n, 7000))  # several chunks per file

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def fake_server(tmp_path, monkeypatch):
    """Serve a small valid set at every mirror; checksums patched to match it."""
    src = write_set(tmp_path / "published", n_train=30, n_test=10, gz=True)
    payload = {f"{n}.gz": (src / f"{n}.gz").read_bytes() for n in NAMES}
    monkeypatch.setattr(fm, "GZ_MD5", {k: hashlib.md5(v).hexdigest() for k, v in payload.items()})
    monkeypatch.setattr(fm, "RAW_MD5", {k[:-3]: hashlib.md5(gzip.decompress(v)).hexdigest()
                                        for k, v in payload.items()})
    monkeypatch.setattr(fm, "MIRRORS", ("http://primary.invalid/", "https://backup.invalid/"))
    server = {"payload": payload, "calls": [], "respond": None}

    def urlopen(url, timeout=None):
        server["calls"].append(url)
        name = url.rsplit("/", 1)[1]
        if server["respond"] is not None:
            return server["respond"](url, payload[name])
        return FakeResponse(payload[name])

    monkeypatch.setattr(fm, "_urlopen", urlopen)
    return server


def test_download_into_cache(fake_server, cache, capsys):
    ds = load_fashion_mnist(progress=True)
    assert ds.source == cache and ds.train_images.shape == (30, 1, 28, 28)
    assert leftovers(cache) == sorted(f"{n}.gz" for n in NAMES)  # no .part files
    assert len(fake_server["calls"]) == 4
    assert all(u.startswith("http://primary.invalid/") for u in fake_server["calls"])
    assert "downloading train-images-idx3-ubyte.gz" in capsys.readouterr().err
    load_fashion_mnist()  # second load uses the cache
    assert len(fake_server["calls"]) == 4


def test_download_fetches_only_missing_files(fake_server, cache):
    for name in NAMES[:2]:
        write_idx(cache / f"{name}.gz", gzip.decompress(fake_server["payload"][f"{name}.gz"]))
    load_fashion_mnist()
    assert sorted(u.rsplit("/", 1)[1] for u in fake_server["calls"]) == sorted(
        f"{n}.gz" for n in NAMES[2:])


def test_download_falls_back_to_next_mirror(fake_server, cache):
    def respond(url, data):
        if "primary" in url:
            raise urllib.error.URLError("primary down")
        return FakeResponse(data)

    fake_server["respond"] = respond
    assert load_fashion_mnist().source == cache
    assert len(fake_server["calls"]) == 8


def test_checksum_mismatch_leaves_no_file(fake_server, cache):
    def respond(url, data):
        if url.endswith("t10k-images-idx3-ubyte.gz"):
            return FakeResponse(data[:-1] + bytes([data[-1] ^ 1]))  # one bit flipped
        return FakeResponse(data)

    fake_server["respond"] = respond
    with pytest.raises(DataNotFoundError, match="checksum mismatch") as e:
        load_fashion_mnist()
    assert "t10k-images-idx3-ubyte.gz" in str(e.value)
    assert "t10k-images-idx3-ubyte.gz" not in leftovers(cache)
    assert not any(n.endswith(".part") for n in leftovers(cache))


def test_interrupted_download_leaves_no_partial_file(fake_server, cache):
    fake_server["respond"] = lambda url, data: FakeResponse(
        data, fail_after=7000, exc=ConnectionResetError("connection reset mid-stream"))
    with pytest.raises(DataNotFoundError, match="connection reset mid-stream"):
        load_fashion_mnist()
    assert leftovers(cache) == []


def test_ctrl_c_mid_download_leaves_no_partial_file(fake_server, cache):
    fake_server["respond"] = lambda url, data: FakeResponse(
        data, fail_after=7000, exc=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        load_fashion_mnist()
    assert leftovers(cache) == []


def test_real_checksums_match_published_values():
    # Zalando's README; if someone edits these the download check is meaningless.
    assert fm.GZ_MD5 == {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    }


def test_module_imports_only_numpy_and_stdlib():
    tree = ast.parse(Path(fm.__file__).read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots.add(node.module.split(".")[0])
    assert roots - set(sys.stdlib_module_names) <= {"numpy", "multigpu"}


# ------------------------------------------------------------------ real data

@pytest.mark.slow
@pytest.mark.skipif(not all((REAL_DIR / f"{n}.gz").is_file() or (REAL_DIR / n).is_file()
                            for n in NAMES),
                    reason=f"real Fashion-MNIST absent: {REAL_DIR} is installed by "
                           "`apt-get install dataset-fashion-mnist`")
def test_real_debian_copy():
    ds = load_fashion_mnist(REAL_DIR, download=False)
    assert ds.train_images.shape == (60000, 1, 28, 28)
    assert ds.test_images.shape == (10000, 1, 28, 28)
    assert ds.train_images.dtype == np.float32
    assert 0.0 <= ds.train_images.min() and ds.train_images.max() <= 1.0
    for labels, per_class in ((ds.train_labels, 6000), (ds.test_labels, 1000)):
        assert labels.min() == 0 and labels.max() == 9
        np.testing.assert_array_equal(np.bincount(labels, minlength=10), [per_class] * 10)
    # Debian recompressed the archives, so compare the content with the published
    # decompressed checksums rather than the .gz ones.
    for name in NAMES:
        path = REAL_DIR / name if (REAL_DIR / name).is_file() else REAL_DIR / f"{name}.gz"
        data = path.read_bytes()
        data = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
        assert hashlib.md5(data).hexdigest() == fm.RAW_MD5[name], path
