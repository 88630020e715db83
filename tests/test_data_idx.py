"""Tests of the IDX reader (multigpu.data.idx) on small files written here, good and malformed."""

from __future__ import annotations

import gzip
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from idx_files import CODES, idx_bytes, write_idx

from multigpu.data import read_idx
from multigpu.data.idx import DTYPES, decompress, parse_idx
from multigpu.errors import DataError, DataNotFoundError


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
@given(
    shape=st.lists(st.integers(0, 5), min_size=1, max_size=4),
    dtype=st.sampled_from(list(CODES)),
    gz=st.booleans(),
    seed=st.integers(0, 2**16),
)
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
    path.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(DataError, match="gzip") as e:
        read_idx(path)
    assert str(path) in str(e.value)


def test_missing_file_is_data_not_found(tmp_path):
    with pytest.raises(DataNotFoundError, match="nothing-here"):
        read_idx(tmp_path / "nothing-here")


def test_zero_dimensions_name_file(tmp_path):
    path = write_idx(tmp_path / "scalar", bytes([0, 0, 0x08, 0]))
    with pytest.raises(DataError, match="declares 0 dimensions") as e:
        read_idx(path)
    assert str(path) in str(e.value)


def test_unreadable_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="cannot read IDX file") as e:
        read_idx(tmp_path)  # a folder: open() fails with IsADirectoryError, not FileNotFoundError
    assert not isinstance(e.value, DataNotFoundError)


def test_decompress_passes_raw_bytes_through_and_parse_names_the_given_path():
    raw = idx_bytes(np.arange(4, dtype=np.int16))
    assert decompress(raw, Path("x")) is raw  # the verifier tells gz from raw by identity
    assert decompress(gzip.compress(raw), Path("x")) == raw
    with pytest.raises(DataError, match="label-file"):
        parse_idx(raw[:-1], Path("label-file"))


def test_codes_match_the_format():
    assert {code: dtype.newbyteorder("=") for code, dtype in DTYPES.items()} == {c: d for d, c in CODES.items()}
