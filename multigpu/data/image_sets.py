"""Image classification sets published as four IDX files: describe one, load it.

An :class:`ImageSetSpec` says where the files come from (a
:class:`~multigpu.data.source.DataSource` whose roles are :data:`ROLES`), what
the images look like and which class the loaded set is; :func:`load_image_set`
finds or downloads the files (:func:`multigpu.data.download.obtain`), checks
their MD5s on first use (:class:`multigpu.data.verify.VerifiedFiles`), reads them
(:mod:`multigpu.data.idx`) and checks their shapes, counts and labels.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Generic, TypeVar

import numpy as np

from multigpu.data.download import obtain
from multigpu.data.files import PathLike
from multigpu.data.idx import decompress, parse_idx, read_bytes
from multigpu.data.search import locate
from multigpu.data.source import DataSource
from multigpu.data.verify import VerifiedFiles
from multigpu.errors import DataError, DataNotFoundError

__all__ = ["ROLES", "ImageSetSpec", "LabelledImages", "load_image_set"]

#: The four files of an image classification set, by role.
ROLES = ("train_images", "train_labels", "test_images", "test_labels")


@dataclass(frozen=True, eq=False)  # eq=False: comparing arrays elementwise makes no sense here
class LabelledImages:
    """A loaded image set: NCHW float32 images in [0, 1] and int64 labels; ``source`` is the folder.

    Each data set subclasses it and sets :attr:`classes`.
    """

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    source: Path
    #: Label names, index = class.
    classes: ClassVar[tuple[str, ...]] = ()

    def __repr__(self) -> str:  # the default would print the arrays
        return (
            f"{type(self).__name__}(train={self.train_images.shape[0]}, "
            f"test={self.test_images.shape[0]}, source={str(self.source)!r})"
        )


T = TypeVar("T", bound=LabelledImages)


@dataclass(frozen=True)
class ImageSetSpec(Generic[T]):
    """An image classification set: its files, the class it loads as, its images' height and width.

    Images are single-channel uint8 files of shape (N, *image_shape), labels
    uint8 of shape (N,) below ``len(kind.classes)``. Raises :class:`DataError`
    when ``source`` does not name exactly the files of :data:`ROLES` or
    ``kind`` declares no classes.
    """

    source: DataSource
    kind: type[T]
    image_shape: tuple[int, int]

    def __post_init__(self) -> None:
        if sorted(self.source.files) != sorted(ROLES):
            raise DataError(
                f"ImageSetSpec {self.source.name!r}: files has roles {sorted(self.source.files)}; "
                f"an image set needs exactly {list(ROLES)}"
            )
        if not self.kind.classes:
            raise DataError(
                f"ImageSetSpec {self.source.name!r}: {self.kind.__name__}.classes is empty; "
                "name the classes, e.g. classes = ('cat', 'dog')"
            )


def load_image_set(
    spec: ImageSetSpec[T],
    data_dir: PathLike | None = None,
    *,
    download: bool = True,
    progress: bool = False,
    verify: bool = True,
) -> T:
    """Find (or download) and load the set ``spec`` describes, as a ``spec.kind``.

    Images come back as float32 arrays of shape (N, 1, H, W) in [0, 1], labels
    as int64. The search order is :func:`multigpu.data.search.find`'s; each file's
    MD5 is checked on first use unless ``verify=False``. Raises
    :class:`DataNotFoundError` when no copy is found and none can be downloaded,
    and :class:`DataError` naming the file for a malformed or inconsistent file
    or one whose MD5 is not the published one.
    """
    folder = obtain(spec.source, data_dir, download=download, progress=progress)
    files, missing = locate(folder, spec.source)
    if missing:  # removed between the search and now
        raise DataNotFoundError(f"{folder} lacks {', '.join(missing)}")
    verified = VerifiedFiles(spec.source) if verify else None
    train_x, train_y = _load_split(spec, files["train_images"], files["train_labels"], verified)
    test_x, test_y = _load_split(spec, files["test_images"], files["test_labels"], verified)
    if verified is not None:
        verified.save()
    return spec.kind(train_x, train_y, test_x, test_y, Path(folder))


def _read(path: Path, verified: VerifiedFiles | None) -> np.ndarray:
    stat = os.stat(path) if verified is not None else None  # before reading: a later change re-verifies
    data = read_bytes(path)
    raw = decompress(data, path)
    arr = parse_idx(raw, path)  # a structural error says more than a checksum
    if verified is not None and stat is not None:
        verified.check(path, data, raw, stat)
    return arr


def _load_split(
    spec: ImageSetSpec[T], images_path: Path, labels_path: Path, verified: VerifiedFiles | None
) -> tuple[np.ndarray, np.ndarray]:
    images, labels = _read(images_path, verified), _read(labels_path, verified)
    title, (height, width), count = spec.source.title, spec.image_shape, len(spec.kind.classes)
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (height, width):
        raise DataError(
            f"{images_path} is not a {title} image file: expected uint8 of shape "
            f"(N, {height}, {width}), found {images.dtype} of shape {images.shape}"
        )
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise DataError(
            f"{labels_path} is not a {title} label file: expected uint8 "
            f"of shape (N,), found {labels.dtype} of shape {labels.shape}"
        )
    if images.shape[0] != labels.shape[0]:
        raise DataError(
            f"{images_path} holds {images.shape[0]} images but {labels_path} holds {labels.shape[0]} labels"
        )
    if labels.size and int(labels.max()) >= count:
        raise DataError(f"{labels_path} has label {int(labels.max())}; {title} labels are 0..{count - 1}")
    x = images.reshape(-1, 1, height, width).astype(np.float32)
    x /= np.float32(255.0)  # in place: Fashion-MNIST's training set is 188 MB as float32
    return x, labels.astype(np.int64)
