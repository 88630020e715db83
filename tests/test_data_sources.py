"""A data set is a description: a second one takes a few lines and no new logic.

``Digits`` below is a made-up MNIST-like set of 8x8 images with other file names;
the generic parts (search, pooch download, verification, IDX reading, checks) serve
it from its description alone, as they serve Fashion-MNIST.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
from pathlib import Path

import numpy as np
import pytest
from data_fakes import FakeMirrors
from idx_files import write_idx

import multigpu.data.download as download
from multigpu.data import DataSource, ImageSetSpec, LabelledImages, load_image_set
from multigpu.data.search import ENV_VAR, cache_root
from multigpu.errors import DataError

pytestmark = pytest.mark.usefixtures("data_cache")  # an empty cache, no system copy, no network

FILES = {
    "train_images": "digits-train-images",
    "train_labels": "digits-train-labels",
    "test_images": "digits-test-images",
    "test_labels": "digits-test-labels",
}


def write_digits(folder: Path, n_train: int = 12, n_test: int = 4) -> dict[str, dict[str, str]]:
    """Write the four files; return their checksums as a DataSource takes them."""
    rng = np.random.default_rng(1)
    for split, n in (("train", n_train), ("test", n_test)):
        write_idx(folder / f"{FILES[split + '_images']}.gz", rng.integers(0, 256, (n, 8, 8), dtype=np.uint8))
        write_idx(folder / f"{FILES[split + '_labels']}.gz", (np.arange(n) % 3).astype(np.uint8))
    gz = {f"{n}.gz": (folder / f"{n}.gz").read_bytes() for n in FILES.values()}
    return {
        "gz_md5": {k: hashlib.md5(v).hexdigest() for k, v in gz.items()},
        "raw_md5": {k[:-3]: hashlib.md5(gzip.decompress(v)).hexdigest() for k, v in gz.items()},
    }


class Digits(LabelledImages):
    classes = ("zero", "one", "two")


def digits_spec(md5s: dict[str, dict[str, str]]) -> ImageSetSpec[Digits]:
    # The whole of a second data set: its description.
    return ImageSetSpec(
        DataSource(
            name="digits",
            title="Digits",
            files=FILES,
            mirrors=("https://digits.invalid/",),
            note="Fashion-MNIST uses other names.",
            **md5s,
        ),
        kind=Digits,
        image_shape=(8, 8),
    )


def test_a_second_data_set_loads_from_its_description(tmp_path, monkeypatch):
    folder = tmp_path / "data" / "digits"
    spec = digits_spec(write_digits(folder))
    ds = load_image_set(spec, folder)
    assert isinstance(ds, Digits) and ds.train_images.shape == (12, 1, 8, 8) and ds.test_labels.shape == (4,)
    assert ds.classes == ("zero", "one", "two") and repr(ds).startswith("Digits(train=12, test=4")
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "data"))  # a data root: the set's own subfolder is found
    assert load_image_set(spec).source == folder
    assert (cache_root() / "verified.json").is_file()  # verified against its own checksums


def test_a_second_data_set_downloads_into_its_own_cache_folder(tmp_path, monkeypatch):
    served = tmp_path / "served"
    spec = digits_spec(write_digits(served))
    fake = FakeMirrors({f"{n}.gz": (served / f"{n}.gz").read_bytes() for n in FILES.values()})
    monkeypatch.setattr(download, "_downloader", fake)
    ds = load_image_set(spec)
    assert ds.source == cache_root() / "digits"
    assert sorted(fake.calls) == sorted(f"https://digits.invalid/{n}.gz" for n in FILES.values())


def test_its_own_shapes_labels_and_checksums_are_enforced(tmp_path):
    folder = tmp_path / "digits"
    md5s = write_digits(folder)
    spec = digits_spec(md5s)
    wide = dataclasses.replace(spec, image_shape=(8, 9))
    with pytest.raises(DataError, match=r"not a Digits image file: expected uint8 of shape \(N, 8, 9\)"):
        load_image_set(wide, folder, verify=False)
    two = type("TwoDigits", (LabelledImages,), {"classes": ("zero", "one")})
    with pytest.raises(DataError, match="label 2; Digits labels are 0..1"):
        load_image_set(dataclasses.replace(spec, kind=two), folder, verify=False)
    other = write_digits(tmp_path / "other", n_train=13)  # same names, other content
    with pytest.raises(DataError, match="is not Digits's digits-train-images.*Fashion-MNIST uses other names"):
        load_image_set(digits_spec(other), folder)


@pytest.mark.parametrize(
    "change, words",
    [
        ({"name": "a/b"}, "name='a/b' must be a plain folder name"),
        ({"files": {}}, "lists no files"),
        ({"gz_md5": {}}, "gz_md5 lacks digits-train-images.gz"),
        ({"raw_md5": {}}, "raw_md5 lacks digits-train-images"),
        ({"mirrors": ("ftp://x/",)}, "mirror 'ftp://x/' must be an http:// or https:// base address ending in '/'"),
        ({"mirrors": ("https://x",)}, "ending in '/'"),
    ],
)
def test_a_wrong_description_is_refused_by_name(tmp_path, change, words):
    spec = digits_spec(write_digits(tmp_path))
    with pytest.raises(DataError, match="DataSource") as e:
        dataclasses.replace(spec.source, **change)
    assert words in str(e.value)


def test_an_image_set_needs_its_four_roles_and_classes(tmp_path):
    spec = digits_spec(write_digits(tmp_path))
    three = {k: v for k, v in FILES.items() if k != "test_labels"}
    with pytest.raises(DataError, match="an image set needs exactly"):
        dataclasses.replace(spec, source=dataclasses.replace(spec.source, files=three))
    with pytest.raises(DataError, match="LabelledImages.classes is empty"):
        dataclasses.replace(spec, kind=LabelledImages)
