"""Tests of the Fashion-MNIST description and its loader on small IDX files written here.

No test touches the network: the fixture ``data_cache`` (conftest.py, data_fakes.py)
gives every test an empty cache, no system copy and a downloader that fails. The
download itself is tested in test_data_download.py, the IDX reader in test_data_idx.py.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
import os
import sys
from dataclasses import FrozenInstanceError
from pathlib import Path

import numpy as np
import pytest
from data_fakes import NAMES, count_md5, leftovers, publish
from idx_files import idx_bytes, write_idx, write_set

import multigpu.data.download as download
import multigpu.data.fashion_mnist as fm
from multigpu.data import FashionMNIST, find_fashion_mnist, load_fashion_mnist, read_idx
from multigpu.data.search import ENV_VAR, cache_dir, cache_root
from multigpu.errors import DataError, DataNotFoundError

REAL_DIR = Path("/usr/share/datasets/fashion-mnist")  # dpkg -L dataset-fashion-mnist
SHIPPED = fm.SPEC  # read at import, before any fixture replaces it

pytestmark = pytest.mark.usefixtures("data_cache")  # an empty cache, no system copy, no network


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


def test_foreign_files_are_refused_naming_file_and_source(tmp_path):
    """MNIST digits (or any other IDX set) with Fashion-MNIST's names: a DataError, not training."""
    folder = write_set(tmp_path / "digits")
    with pytest.raises(DataError) as e:
        load_fashion_mnist(folder)
    msg = str(e.value)
    assert str(folder / "train-images-idx3-ubyte.gz") in msg
    assert fm.RAW_MD5["train-images-idx3-ubyte"] in msg and fm.MIRRORS[0] in msg and "MNIST digits" in msg
    assert "dataset-fashion-mnist" in msg and "--no-verify-data" in msg
    assert load_fashion_mnist(folder, verify=False).train_images.shape[0] == 20  # the opt-out


def test_verification_is_remembered_until_a_file_changes(tmp_path, monkeypatch, data_cache):
    folder = write_set(tmp_path / "d")
    publish(monkeypatch, folder)
    before = leftovers(folder)
    calls = count_md5(monkeypatch)
    load_fashion_mnist(folder)
    assert calls[0] == 4  # one hash per .gz file: each matches the published archive
    stamp = data_cache.parent / "verified.json"
    assert stamp.is_file() and leftovers(folder) == before  # never written into the data folder
    load_fashion_mnist(folder)
    assert calls[0] == 4  # remembered by size, mtime and inode: no byte hashed again
    path = folder / "t10k-labels-idx1-ubyte.gz"
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    load_fashion_mnist(folder)
    assert calls[0] == 5  # the touched file only


def test_changed_content_is_caught_after_verification(tmp_path, monkeypatch):
    folder = write_set(tmp_path / "d")
    publish(monkeypatch, folder)
    load_fashion_mnist(folder)
    write_idx(folder / "train-labels-idx1-ubyte.gz", (np.arange(20) % 9).astype(np.uint8))
    with pytest.raises(DataError, match="train-labels-idx1-ubyte.gz is not Fashion-MNIST"):
        load_fashion_mnist(folder)


def test_recompressed_and_raw_files_match_by_content(tmp_path, monkeypatch):
    """Debian recompresses the archives: the .gz bytes differ, the content matches RAW_MD5."""
    folder = write_set(tmp_path / "d")
    publish(monkeypatch, folder)
    other = tmp_path / "debian"
    other.mkdir()
    for n in NAMES[:2]:  # recompressed with another header
        (other / f"{n}.gz").write_bytes(
            gzip.compress(gzip.decompress((folder / f"{n}.gz").read_bytes()), compresslevel=1, mtime=12345)
        )
    for n in NAMES[2:]:  # unpacked
        (other / n).write_bytes(gzip.decompress((folder / f"{n}.gz").read_bytes()))
    assert load_fashion_mnist(other).train_images.shape[0] == 20


def test_read_only_system_folder_is_verified_into_the_user_cache(tmp_path, monkeypatch, data_cache):
    system = write_set(tmp_path / "system")  # the fixture's SYSTEM_DIR
    publish(monkeypatch, system)
    system.chmod(0o555)
    try:
        assert load_fashion_mnist().source == system
    finally:
        system.chmod(0o755)
    stamps = json.loads((data_cache.parent / "verified.json").read_text())
    assert sorted(stamps) == sorted(str((system / f"{n}.gz").resolve()) for n in NAMES)


# -------------------------------------------------------------- search order


def test_search_order(tmp_path, monkeypatch, data_cache):
    explicit = write_set(tmp_path / "explicit", n_train=11)
    env = write_set(tmp_path / "env", n_train=12)
    write_set(data_cache, n_train=13)
    system = write_set(tmp_path / "system", n_train=14)  # fixture's SYSTEM_DIR
    monkeypatch.setenv(ENV_VAR, str(env))

    assert find_fashion_mnist(explicit) == explicit  # data_dir beats env
    assert load_fashion_mnist(explicit, verify=False).train_images.shape[0] == 11
    assert find_fashion_mnist() == env  # env beats cache
    assert load_fashion_mnist(verify=False).train_images.shape[0] == 12
    monkeypatch.delenv(ENV_VAR)
    assert find_fashion_mnist() == data_cache  # cache beats system
    assert load_fashion_mnist(verify=False).train_images.shape[0] == 13
    for name in NAMES[:1]:  # an incomplete cache does not hide the system copy
        (data_cache / f"{name}.gz").unlink()
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
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "root"))
    assert load_fashion_mnist(verify=False).source == sub


def test_explicit_data_dir_lacking_files_is_an_error(tmp_path, data_cache):
    write_set(data_cache)  # a usable copy exists, but an explicit choice is not overridden
    partial = write_set(tmp_path / "partial")
    (partial / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataNotFoundError) as e:
        load_fashion_mnist(partial)
    assert str(partial) in str(e.value) and "t10k-labels-idx1-ubyte" in str(e.value)
    with pytest.raises(DataNotFoundError, match="does not exist"):
        find_fashion_mnist(tmp_path / "nope")


def test_env_var_lacking_files_is_an_error(tmp_path, monkeypatch, data_cache):
    write_set(data_cache)
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataNotFoundError, match=f"{ENV_VAR}=.*empty"):
        load_fashion_mnist()


def test_default_cache_dir(monkeypatch, tmp_path):
    assert cache_dir(fm.SPEC.source) == tmp_path / "xdg" / "multigpu" / "fashion-mnist"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir(fm.SPEC.source) == tmp_path / "home" / ".cache" / "multigpu" / "fashion-mnist"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # XDG: relative is invalid
    assert cache_root() == tmp_path / "home" / ".cache" / "multigpu"


# ----------------------------------------------------------- offline message


def test_offline_error_tells_three_ways(data_cache):
    with pytest.raises(DataNotFoundError) as e:
        load_fashion_mnist()
    msg = str(e.value)
    assert isinstance(e.value, FileNotFoundError)
    assert "data_dir" in msg and ENV_VAR in msg  # way 1
    assert str(data_cache) in msg  # way 2
    assert "apt-get install dataset-fashion-mnist" in msg  # way 3
    assert "network disabled in tests" in msg  # what the download error was
    assert leftovers(data_cache) == []  # no partial files from the failed attempts


def test_download_false_does_not_fetch(monkeypatch):
    def forbidden(progress):
        raise AssertionError("fetched although download=False")

    monkeypatch.setattr(download, "_downloader", forbidden)
    with pytest.raises(DataNotFoundError, match="download=False"):
        load_fashion_mnist(download=False)


def test_real_checksums_match_published_values():
    # Zalando's README; if someone edits these the download check is meaningless.
    assert fm.GZ_MD5 == {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    }


def test_the_description_is_what_the_loader_reads():
    real = SHIPPED  # not the fixture's copy, whose system_dir is a temporary folder
    assert real.source.gz_md5 == fm.GZ_MD5 and real.source.raw_md5 == fm.RAW_MD5
    assert real.source.mirrors == fm.MIRRORS and real.source.system_dir == fm.SYSTEM_DIR == REAL_DIR
    assert real.source.package == "dataset-fashion-mnist" and dict(real.source.files) == dict(fm.FILES)
    assert real.kind is fm.FashionMNIST and real.kind.classes == fm.CLASSES and real.image_shape == (28, 28)


def _third_party_imports(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots - set(sys.stdlib_module_names) - {"multigpu"}


def test_data_modules_import_only_numpy_and_pooch():
    """The data layer stays light: numpy everywhere, pooch only in the download, and lazily."""
    folder = Path(fm.__file__).parent
    found = {p.name: _third_party_imports(p) for p in folder.glob("*.py")}
    assert {name for name, roots in found.items() if roots - {"numpy"}} == {"download.py"}
    assert found["download.py"] == {"pooch"}
    top = ast.parse((folder / "download.py").read_text()).body  # module level: no pooch
    assert not any(isinstance(n, (ast.Import, ast.ImportFrom)) and "pooch" in ast.dump(n) for n in top)


# ------------------------------------------------------------------ real data


@pytest.mark.slow
@pytest.mark.skipif(
    not all((REAL_DIR / f"{n}.gz").is_file() or (REAL_DIR / n).is_file() for n in NAMES),
    reason=f"real Fashion-MNIST absent: {REAL_DIR} is installed by `apt-get install dataset-fashion-mnist`",
)
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
