"""Fashion-MNIST (Zalando Research, 2017): what its four IDX files are and where they come from.

This module only describes the data set (:data:`SPEC`); the generic parts do the
work: :mod:`multigpu.data.search` (``data_dir`` or ``$MULTIGPU_DATA``, then
``~/.cache/multigpu/fashion-mnist``, then Debian's ``dataset-fashion-mnist`` in
:data:`SYSTEM_DIR`), :mod:`multigpu.data.download` (pooch, from :data:`MIRRORS`,
checked against :data:`GZ_MD5`), :mod:`multigpu.data.verify` (the MD5 check of
local files on first use, against :data:`GZ_MD5` or :data:`RAW_MD5`) and
:mod:`multigpu.data.image_sets` (reading and checking the files).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from multigpu.data.download import fetch
from multigpu.data.files import PathLike
from multigpu.data.image_sets import ImageSetSpec, LabelledImages, load_image_set
from multigpu.data.search import find
from multigpu.data.source import DataSource

__all__ = [
    "CLASSES",
    "FILES",
    "GZ_MD5",
    "MIRRORS",
    "RAW_MD5",
    "SPEC",
    "SYSTEM_DIR",
    "FashionMNIST",
    "download_fashion_mnist",
    "find_fashion_mnist",
    "load_fashion_mnist",
]

#: Where ``apt-get install dataset-fashion-mnist`` puts the four ``.gz`` files
#: (``dpkg -L dataset-fashion-mnist``).
SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")

#: The four files by role, without the ``.gz`` suffix.
FILES: Mapping[str, str] = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

#: MD5 of the published ``.gz`` files (Zalando's README; torchvision uses the same).
GZ_MD5: Mapping[str, str] = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}

#: MD5 of the decompressed files. Debian recompresses the archives (new gzip
#: header), so its ``.gz`` files do not match :data:`GZ_MD5`, but their content
#: matches these; the real-data test checks that.
RAW_MD5: Mapping[str, str] = {
    "train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
    "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
    "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
    "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965",
}

#: Base addresses tried in order. The first is the one Zalando's README links;
#: it is plain HTTP (S3 website endpoints have no TLS), which is acceptable
#: because every file is checked against :data:`GZ_MD5`. The second is the
#: same files in Zalando's GitHub repository, over HTTPS.
MIRRORS: tuple[str, ...] = (
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
)

#: Label names, index = class.
CLASSES: tuple[str, ...] = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


class FashionMNIST(LabelledImages):
    """Fashion-MNIST as loaded: NCHW float32 images in [0, 1] (N, 1, 28, 28) and int64 labels."""

    classes = CLASSES


#: The whole description; the functions below read it at call time (tests replace it).
SPEC: ImageSetSpec[FashionMNIST] = ImageSetSpec(
    source=DataSource(
        name="fashion-mnist",
        title="Fashion-MNIST",
        files=FILES,
        gz_md5=GZ_MD5,
        raw_md5=RAW_MD5,
        mirrors=MIRRORS,
        system_dir=SYSTEM_DIR,
        package="dataset-fashion-mnist",
        note="MNIST digits use the same file names.",
    ),
    kind=FashionMNIST,
    image_shape=(28, 28),
)


def find_fashion_mnist(data_dir: PathLike | None = None) -> Path | None:
    """Return the folder that holds the four files, or None; never downloads.

    The search order is :func:`multigpu.data.search.find`'s. Raises
    :class:`~multigpu.errors.DataNotFoundError` for an explicit ``data_dir`` or
    ``MULTIGPU_DATA`` that lacks the files.
    """
    return find(SPEC.source, data_dir)


def download_fashion_mnist(folder: PathLike | None = None, *, progress: bool = False) -> Path:
    """Download the files missing from ``folder`` (default: the cache folder); return the folder.

    Raises :class:`~multigpu.errors.DataError` naming the file when no mirror
    delivered it with the published MD5.
    """
    return fetch(SPEC.source, folder, progress=progress)


def load_fashion_mnist(
    data_dir: PathLike | None = None, *, download: bool = True, progress: bool = False, verify: bool = True
) -> FashionMNIST:
    """Find (or download) and load Fashion-MNIST; see :func:`multigpu.data.image_sets.load_image_set`.

    ``verify=False`` skips the MD5 check (for IDX files of your own). Raises
    :class:`~multigpu.errors.DataNotFoundError` when no copy is found and none
    can be downloaded, and :class:`~multigpu.errors.DataError` naming the file
    for a malformed file or one that is not the published one.
    """
    return load_image_set(SPEC, data_dir, download=download, progress=progress, verify=verify)
