"""The IDX file format (MNIST's, Fashion-MNIST's): read one file, gzip-compressed or raw.

An IDX file is two zero bytes, a type code, the number of dimensions, one big-endian
uint32 per dimension, then the values, big-endian, in C order
(http://yann.lecun.com/exdb/mnist/). Every malformed file is a :class:`DataError`
naming it; nothing is guessed or padded.

This module imports only numpy and the standard library.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

import numpy as np

from multigpu.errors import DataError, DataNotFoundError

__all__ = ["DTYPES", "decompress", "parse_idx", "read_bytes", "read_idx"]

#: IDX type codes -> big-endian numpy dtypes.
DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

_GZIP_MAGIC = b"\x1f\x8b"  # an IDX file always starts with 0x00, so the two never mix


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read one IDX file, gzip-compressed or raw, into a native-endian array.

    Compression is detected from the content, not the name. Raises
    :class:`DataError` naming the file for a bad magic number, an unknown type
    code, a truncated file or trailing bytes, and :class:`DataNotFoundError` if
    it does not exist.
    """
    path = Path(path)
    return parse_idx(decompress(read_bytes(path), path), path)


def read_bytes(path: Path) -> bytes:
    """Return the bytes of ``path``; DataNotFoundError if it is absent, DataError if unreadable."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise DataNotFoundError(f"IDX file {path} does not exist") from None
    except OSError as e:
        raise DataError(f"cannot read IDX file {path}: {e}") from e


def decompress(data: bytes, path: Path) -> bytes:
    """Return ``data`` unpacked if it is gzip (by its magic bytes), else ``data`` itself.

    Raises :class:`DataError` naming ``path`` for a damaged or cut gzip stream.
    """
    if data[:2] == _GZIP_MAGIC:
        try:
            return gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
            raise DataError(f"IDX file {path} is a damaged or truncated gzip file: {e}") from e
    return data


def parse_idx(data: bytes, path: Path) -> np.ndarray:
    """Decode uncompressed IDX bytes into a writable native-endian array that owns its memory.

    ``path`` only names the file in messages. Raises :class:`DataError` for a
    wrong magic number, an unknown type code, zero dimensions, a truncated header
    or body, and trailing bytes.
    """
    if len(data) < 4:
        raise DataError(f"IDX file {path} is truncated: {len(data)} bytes, no complete header")
    zero0, zero1, code, ndim = data[0], data[1], data[2], data[3]
    if zero0 != 0 or zero1 != 0:
        raise DataError(
            f"IDX file {path} has a wrong magic number 0x{data[:4].hex()} (an IDX file starts with two zero bytes)"
        )
    if code not in DTYPES:
        raise DataError(
            f"IDX file {path} has an unknown type code 0x{code:02x} (known: {', '.join(f'0x{c:02x}' for c in DTYPES)})"
        )
    if ndim == 0:
        raise DataError(f"IDX file {path} declares 0 dimensions")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"IDX file {path} is truncated: header needs {header} bytes, file has {len(data)}")
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = DTYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    actual = len(data) - header
    if actual < expected:
        raise DataError(
            f"IDX file {path} is truncated: shape {shape} needs {expected} bytes of data, file has {actual}"
        )
    if actual > expected:
        raise DataError(
            f"IDX file {path} has {actual - expected} trailing bytes after "
            f"the {expected} bytes that shape {shape} needs"
        )
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    # astype copies: the result is writable, native-endian and owns its memory.
    return arr.astype(dtype.newbyteorder("="))
