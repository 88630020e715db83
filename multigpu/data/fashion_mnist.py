"""Fashion-MNIST in its original IDX format: find it, download it, load it.

Where the four files are looked for, in this order:

(a) ``data_dir`` if given, else the ``MULTIGPU_DATA`` environment variable.  An
    explicit choice is never silently replaced: if that folder lacks the files,
    :class:`DataNotFoundError` names it and no other place is tried.
(b) the user cache folder, ``$XDG_CACHE_HOME/multigpu/fashion-mnist``
    (``~/.cache/multigpu/fashion-mnist`` by default);
(c) the folder where Debian's and Ubuntu's package ``dataset-fashion-mnist``
    installs them, ``/usr/share/datasets/fashion-mnist``;
(d) a download from Zalando's published address into the cache folder, checked
    against the published MD5 checksums and written through a temporary file
    that is renamed into place only once complete and verified.

In every folder each file may be gzip-compressed (``name.gz``, as published) or
raw (``name``, as after ``gunzip``); a folder may also hold them in a
``fashion-mnist`` subfolder, so ``MULTIGPU_DATA`` can point at a general data root.

Wherever a file comes from, its MD5 is checked on first use against the published
one (the ``.gz`` file's, or the decompressed content's, since Debian recompresses
the archives): MNIST's digit files have the same names and format and would
otherwise train silently as Fashion-MNIST. A verified file is remembered by path,
size, modification time and inode in ``verified.json`` in the user cache folder
(never in the data folder, which may be read-only or shared), so later loads
read no extra byte. ``verify=False`` skips the check for your own IDX files.

This module imports only numpy and the standard library.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Mapping

import numpy as np

from multigpu.data.files import atomic_write
from multigpu.errors import DataError, DataNotFoundError

__all__ = [
    "CLASSES", "ENV_VAR", "FILES", "GZ_MD5", "MIRRORS", "RAW_MD5", "SYSTEM_DIR",
    "FashionMNIST", "default_cache_dir", "download_fashion_mnist", "find_fashion_mnist",
    "load_fashion_mnist", "read_idx",
]

#: Environment variable naming a folder that holds the data (search step a).
ENV_VAR = "MULTIGPU_DATA"

#: Where ``apt-get install dataset-fashion-mnist`` puts the four ``.gz`` files
#: (``dpkg -L dataset-fashion-mnist``).  Module-level so tests can redirect it.
SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")

#: The four files by role, without the ``.gz`` suffix.
FILES: Mapping[str, str] = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

#: MD5 of the published ``.gz`` files (Zalando's README; torchvision uses the same).
GZ_MD5: dict[str, str] = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}

#: MD5 of the decompressed files.  Debian recompresses the archives (new gzip
#: header), so its ``.gz`` files do not match :data:`GZ_MD5`, but their content
#: matches these; the real-data test checks that.
RAW_MD5: dict[str, str] = {
    "train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
    "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
    "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
    "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965",
}

#: Base addresses tried in order.  The first is the one Zalando's README links;
#: it is plain HTTP (S3 website endpoints have no TLS), which is acceptable
#: because every file is checked against :data:`GZ_MD5`.  The second is the
#: same files in Zalando's GitHub repository, over HTTPS.
MIRRORS: tuple[str, ...] = (
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
)

#: Label names, index = class.
CLASSES: tuple[str, ...] = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)

# The network entry point, module-level so tests can replace it and never touch
# the network.  Called as _urlopen(url, timeout=seconds); must return a context
# manager with .read(n) (and optionally .headers).
_urlopen: Callable[..., Any] = urllib.request.urlopen
_TIMEOUT_S = 60.0
_CHUNK = 1 << 16

# IDX type codes -> big-endian numpy dtypes (http://yann.lecun.com/exdb/mnist/).
_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8"),
}
_IMAGE_SIDE = 28
_NUM_CLASSES = len(CLASSES)


@dataclass(frozen=True, eq=False)  # eq=False: comparing arrays elementwise makes no sense here
class FashionMNIST:
    """The loaded data set: NCHW float32 images in [0, 1] and int64 labels."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    source: Path

    @property
    def classes(self) -> tuple[str, ...]:
        """Label names, index = class."""
        return CLASSES

    def __repr__(self) -> str:  # the default would print the arrays
        return (f"FashionMNIST(train={self.train_images.shape[0]}, "
                f"test={self.test_images.shape[0]}, source={str(self.source)!r})")


# --------------------------------------------------------------------- IDX files

def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read one IDX file, gzip-compressed or raw, into a native-endian array.

    Compression is detected from the content, not the name.  Raises
    :class:`DataError` naming the file for a bad magic number, an unknown type
    code, a truncated file or trailing bytes, and :class:`DataNotFoundError` if
    it does not exist.
    """
    path = Path(path)
    return _parse_idx(_unpack(_read(path), path), path)


def _read(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise DataNotFoundError(f"IDX file {path} does not exist") from None
    except OSError as e:
        raise DataError(f"cannot read IDX file {path}: {e}") from e


def _unpack(data: bytes, path: Path) -> bytes:
    if data[:2] == b"\x1f\x8b":  # gzip magic; an IDX file always starts with 0x00
        try:
            return gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
            raise DataError(f"IDX file {path} is a damaged or truncated gzip file: {e}") from e
    return data


def _parse_idx(data: bytes, path: Path) -> np.ndarray:
    if len(data) < 4:
        raise DataError(f"IDX file {path} is truncated: {len(data)} bytes, no complete header")
    zero0, zero1, code, ndim = data[0], data[1], data[2], data[3]
    if zero0 != 0 or zero1 != 0:
        raise DataError(f"IDX file {path} has a wrong magic number "
                        f"0x{data[:4].hex()} (an IDX file starts with two zero bytes)")
    if code not in _IDX_DTYPES:
        raise DataError(f"IDX file {path} has an unknown type code 0x{code:02x} "
                        f"(known: {', '.join(f'0x{c:02x}' for c in _IDX_DTYPES)})")
    if ndim == 0:
        raise DataError(f"IDX file {path} declares 0 dimensions")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"IDX file {path} is truncated: header needs {header} bytes, "
                        f"file has {len(data)}")
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = _IDX_DTYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    actual = len(data) - header
    if actual < expected:
        raise DataError(f"IDX file {path} is truncated: shape {shape} needs {expected} "
                        f"bytes of data, file has {actual}")
    if actual > expected:
        raise DataError(f"IDX file {path} has {actual - expected} trailing bytes after "
                        f"the {expected} bytes that shape {shape} needs")
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    # astype copies: the result is writable, native-endian and owns its memory.
    return arr.astype(dtype.newbyteorder("="))


# ---------------------------------------------------------------------- search

def default_cache_dir() -> Path:
    """The user cache folder: ``$XDG_CACHE_HOME/multigpu/fashion-mnist``."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG spec says relative values are invalid and must be ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "multigpu" / "fashion-mnist"


def _locate(folder: Path) -> tuple[dict[str, Path], list[str]]:
    """Map each role to an existing file in ``folder``; also list missing names."""
    found: dict[str, Path] = {}
    missing: list[str] = []
    for role, name in FILES.items():
        # Raw first: someone who unpacked the files chose the faster form.
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                found[role] = candidate
                break
        else:
            missing.append(name)
    return found, missing


def _complete_folder(folder: Path) -> Path | None:
    """``folder`` or its ``fashion-mnist`` subfolder if it holds all four files."""
    for candidate in (folder, folder / "fashion-mnist"):
        if not _locate(candidate)[1]:
            return candidate
    return None


def _explicit_folder(folder: Path, what: str) -> Path:
    """Resolve a folder the user named; never fall back, so fail loudly."""
    found = _complete_folder(folder)
    if found is not None:
        return found
    if not folder.is_dir():
        problem = "does not exist"
    else:
        problem = "lacks " + ", ".join(f"{n}[.gz]" for n in _locate(folder)[1])
    raise DataNotFoundError(
        f"{what} {folder} {problem}. A folder given explicitly is never replaced by "
        f"another copy; fix it, or leave it unset to search {default_cache_dir()} "
        f"and {SYSTEM_DIR} and download.")


def find_fashion_mnist(data_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """Return the folder that holds the four files, or None; never downloads.

    Tries ``data_dir``, else ``$MULTIGPU_DATA``, then the cache folder, then the
    Debian package's folder.  An explicit ``data_dir`` or ``MULTIGPU_DATA`` that
    lacks the files raises :class:`DataNotFoundError` naming it rather than
    returning another copy.
    """
    if data_dir is not None:
        return _explicit_folder(Path(data_dir).expanduser(), "data_dir")
    env = os.environ.get(ENV_VAR, "")
    if env:
        return _explicit_folder(Path(env).expanduser(), f"{ENV_VAR}=")
    for folder in (default_cache_dir(), Path(SYSTEM_DIR)):
        found = _complete_folder(folder)
        if found is not None:
            return found
    return None


# -------------------------------------------------------------------- download

def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _fetch_to(url: str, dest: Path, md5: str, progress: bool) -> None:
    """Stream ``url`` to ``dest`` through a temporary file; rename only if verified.

    The temporary file lives in ``dest``'s folder so the final rename is atomic on
    one file system: ``dest`` is either absent or complete (``multigpu.data.files``:
    flushed, renamed, folder flushed, the umask's normal mode). Any exception, a
    Ctrl-C or a checksum mismatch included, removes the temporary file.
    """
    digest = hashlib.md5(usedforsecurity=False)
    with atomic_write(dest) as out, _urlopen(url, timeout=_TIMEOUT_S) as response:
        total = _content_length(response)
        done = 0
        while chunk := response.read(_CHUNK):
            out.write(chunk)
            digest.update(chunk)
            done += len(chunk)
            if progress:
                _report(dest.name, done, total, sys.stderr)
        if progress:
            sys.stderr.write("\n")
        got = digest.hexdigest()
        if got != md5:
            raise DataError(f"checksum mismatch for {url}: MD5 {got}, expected {md5} "
                            f"({done} bytes received)")


def _content_length(response: Any) -> int | None:
    headers = getattr(response, "headers", None)
    try:
        return int(headers.get("Content-Length")) if headers is not None else None
    except (TypeError, ValueError):
        return None


def _report(name: str, done: int, total: int | None, stream: IO[str]) -> None:
    if total:
        stream.write(f"\rdownloading {name}: {done / 1e6:.1f}/{total / 1e6:.1f} MB "
                     f"({100 * done / total:.0f}%)")
    else:
        stream.write(f"\rdownloading {name}: {done / 1e6:.1f} MB")
    stream.flush()


def download_fashion_mnist(folder: str | os.PathLike[str] | None = None, *,
                           progress: bool = False) -> Path:
    """Download the files missing from ``folder`` (default: the cache folder).

    Each file is tried from every address in :data:`MIRRORS` in turn and must
    match :data:`GZ_MD5`.  Files already present (gz or raw) are kept.  Returns
    the folder; raises :class:`DataError` carrying every address's error if a
    file could not be obtained.
    """
    folder = Path(folder) if folder is not None else default_cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create {folder}: {e}") from e
    for name in _locate(folder)[1]:
        gz_name = f"{name}.gz"
        errors: list[str] = []
        for base in MIRRORS:
            url = base + gz_name
            try:
                _fetch_to(url, folder / gz_name, GZ_MD5[gz_name], progress)
                break
            except Exception as e:  # network, HTTP, disk or checksum: try the next address
                errors.append(f"{url}: {type(e).__name__}: {e}")
        else:
            raise DataError(f"could not download {gz_name}: " + "; ".join(errors))
    return folder


# ------------------------------------------------------------------------ load

def _not_found_message(reason: str) -> str:
    names = ", ".join(f"{n}.gz" for n in FILES.values())
    return (
        "Fashion-MNIST was not found and could not be downloaded.\n"
        f"No data_dir was given and {ENV_VAR} is unset; searched {default_cache_dir()} "
        f"and {SYSTEM_DIR}.\n"
        f"Provide the four files ({names}; gzip or unpacked) in one of three ways:\n"
        f"  1. pass data_dir=FOLDER, or set the environment variable {ENV_VAR}=FOLDER;\n"
        f"  2. put them in the cache folder {default_cache_dir()};\n"
        "  3. install the Debian/Ubuntu package: sudo apt-get install dataset-fashion-mnist\n"
        f"     (it puts them in {SYSTEM_DIR}).\n"
        f"Download error: {reason}")


def load_fashion_mnist(data_dir: str | os.PathLike[str] | None = None, *,
                       download: bool = True, progress: bool = False,
                       verify: bool = True) -> FashionMNIST:
    """Find (or download) and load Fashion-MNIST.

    Images come back as float32 arrays of shape (N, 1, 28, 28) in [0, 1], labels
    as int64.  See the module docstring for the search order and the MD5 check
    (``verify=False`` skips it).  Raises :class:`DataNotFoundError` when no copy
    is found and none can be downloaded, and :class:`DataError` naming the file
    for a malformed or inconsistent file or one whose MD5 is not the published one.
    """
    folder = find_fashion_mnist(data_dir)
    if folder is None:
        if not download:
            raise DataNotFoundError(_not_found_message("not attempted (download=False)"))
        try:
            folder = download_fashion_mnist(default_cache_dir(), progress=progress)
        except DataError as e:
            raise DataNotFoundError(_not_found_message(str(e))) from e
    files, missing = _locate(folder)
    if missing:  # removed between the search and now
        raise DataNotFoundError(f"{folder} lacks {', '.join(missing)}")
    stamps = _Stamps() if verify else None
    train_x, train_y = _load_split(files["train_images"], files["train_labels"], stamps)
    test_x, test_y = _load_split(files["test_images"], files["test_labels"], stamps)
    if stamps is not None:
        stamps.save()
    return FashionMNIST(train_x, train_y, test_x, test_y, Path(folder))


# ---------------------------------------------------------------- verification

class _Stamps:
    """Files already verified, by resolved path -> [size, mtime_ns, inode, md5]."""

    def __init__(self) -> None:
        self.path = default_cache_dir().parent / "verified.json"
        try:
            self.known: dict[str, list[Any]] = json.loads(self.path.read_text())
            if not isinstance(self.known, dict):
                self.known = {}
        except (OSError, ValueError):  # none yet, or unreadable: verify again
            self.known = {}
        self.changed = False

    def check(self, path: Path, data: bytes, raw: bytes, stat: os.stat_result) -> None:
        """Raise DataError unless ``path`` holds the published file; remember it if it does."""
        key, sig = str(path.resolve()), [stat.st_size, stat.st_mtime_ns, stat.st_ino]
        entry = self.known.get(key)
        if isinstance(entry, list) and entry[:3] == sig:
            return
        name = path.name[:-3] if path.name.endswith(".gz") else path.name
        if data is not raw and _md5(data) == GZ_MD5[f"{name}.gz"]:
            digest = GZ_MD5[f"{name}.gz"]
        elif (digest := _md5(raw)) != RAW_MD5[name]:
            raise DataError(
                f"{path} is not Fashion-MNIST's {name}: its content has MD5 {digest}, the published "
                f"file's is {RAW_MD5[name]} ({MIRRORS[0]}{name}.gz, or the Debian package "
                "dataset-fashion-mnist). MNIST digits use the same file names. Replace the file, or "
                "pass verify_data=False (--no-verify-data) to train on IDX files of your own")
        self.known[key] = [*sig, digest]
        self.changed = True

    def save(self) -> None:
        """Write the stamps; a folder that cannot take them only means verifying again next time."""
        if not self.changed:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_write(self.path) as f:
                f.write(json.dumps(self.known, indent=1).encode())
        except OSError:
            pass


def _load_idx(path: Path, stamps: _Stamps | None) -> np.ndarray:
    stat = os.stat(path) if stamps is not None else None  # before reading: a later change re-verifies
    data = _read(path)
    raw = _unpack(data, path)
    arr = _parse_idx(raw, path)  # a structural error says more than a checksum
    if stamps is not None and stat is not None:
        stamps.check(path, data, raw, stat)
    return arr


def _load_split(images_path: Path, labels_path: Path,
                stamps: _Stamps | None = None) -> tuple[np.ndarray, np.ndarray]:
    images = _load_idx(images_path, stamps)
    labels = _load_idx(labels_path, stamps)
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (_IMAGE_SIDE,) * 2:
        raise DataError(f"{images_path} is not a Fashion-MNIST image file: expected uint8 "
                        f"of shape (N, 28, 28), found {images.dtype} of shape {images.shape}")
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise DataError(f"{labels_path} is not a Fashion-MNIST label file: expected uint8 "
                        f"of shape (N,), found {labels.dtype} of shape {labels.shape}")
    if images.shape[0] != labels.shape[0]:
        raise DataError(f"{images_path} holds {images.shape[0]} images but {labels_path} "
                        f"holds {labels.shape[0]} labels")
    if labels.size and int(labels.max()) >= _NUM_CLASSES:
        raise DataError(f"{labels_path} has label {int(labels.max())}; "
                        f"Fashion-MNIST labels are 0..{_NUM_CLASSES - 1}")
    x = images.reshape(-1, 1, _IMAGE_SIDE, _IMAGE_SIDE).astype(np.float32)
    x /= np.float32(255.0)  # in place: the full training set is 188 MB as float32
    return x, labels.astype(np.int64)
