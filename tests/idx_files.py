"""Small IDX files that the tests write themselves (never downloaded)."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

# IDX type codes, written out independently of the module under test.
CODES = {
    np.dtype(np.uint8): 0x08,
    np.dtype(np.int8): 0x09,
    np.dtype(np.int16): 0x0B,
    np.dtype(np.int32): 0x0C,
    np.dtype(np.float32): 0x0D,
    np.dtype(np.float64): 0x0E,
}


def idx_bytes(arr: np.ndarray, *, code: int | None = None) -> bytes:
    """Encode ``arr`` as an IDX file: 0, 0, type code, ndim, big-endian dims, data."""
    arr = np.asarray(arr)
    code = CODES[arr.dtype] if code is None else code
    header = bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


def write_idx(path: Path, arr: np.ndarray | bytes, *, gz: bool | None = None) -> Path:
    """Write an IDX file; gzip it when ``gz`` (default: when the name ends in .gz)."""
    data = arr if isinstance(arr, bytes) else idx_bytes(arr)
    gz = path.name.endswith(".gz") if gz is None else gz
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


def write_set(
    folder: Path, n_train: int = 20, n_test: int = 10, *, gz: bool = True, seed: int = 0, side: int = 28
) -> Path:
    """Write a small but well-formed Fashion-MNIST-named folder (labels cycle through 0..9)."""
    rng = np.random.default_rng(seed)
    suffix = ".gz" if gz else ""
    for split, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, side, side), dtype=np.uint8)
        images[0, 0, 0], images[0, 0, 1] = 0, 255  # make the [0, 1] ends exact
        write_idx(folder / f"{split}-images-idx3-ubyte{suffix}", images)
        write_idx(folder / f"{split}-labels-idx1-ubyte{suffix}", (np.arange(n) % 10).astype(np.uint8))
    return folder


def write_learnable_set(folder: Path, n_train: int, n_test: int, seed: int = 0) -> Path:
    """Write a Fashion-MNIST-shaped folder whose classes are noisy copies of 10 templates,
    so a few epochs of LeNet can learn it."""
    rng = np.random.default_rng(seed)
    templates = np.zeros((10, 28, 28), np.int64)
    for c in range(10):  # a bright 9x9 block per class, on a 4x3 grid: coarse enough for LeNet
        r, q = divmod(c, 4)
        templates[c, 9 * r : 9 * r + 9, 7 * q : 7 * q + 9] = 230
    for split, n in (("train", n_train), ("t10k", n_test)):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        noise = rng.integers(0, 60, size=(n, 28, 28))
        images = np.clip(templates[labels] + noise, 0, 255).astype(np.uint8)
        write_idx(folder / f"{split}-images-idx3-ubyte.gz", images)
        write_idx(folder / f"{split}-labels-idx1-ubyte.gz", labels)
    return folder
