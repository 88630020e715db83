"""Data sets for multigpu's experiments (numpy, the standard library and pooch only).

A data set is a description (:class:`DataSource` for its files, :class:`ImageSetSpec`
for an image classification set); the generic modules find, download, verify and
read it: ``search``, ``download``, ``verify``, ``idx``, ``image_sets``.
``fashion_mnist`` is the one shipped image set; ``fortunes`` a real English text corpus
(Debian's ``fortunes`` package) with a character tokenizer, for the text models.
"""

from __future__ import annotations

from multigpu.data.fashion_mnist import FashionMNIST, download_fashion_mnist, find_fashion_mnist, load_fashion_mnist
from multigpu.data.fortunes import CharTokenizer, TextCorpus, load_fortunes
from multigpu.data.idx import read_idx
from multigpu.data.image_sets import ImageSetSpec, LabelledImages, load_image_set
from multigpu.data.source import DataSource

__all__ = [
    "CharTokenizer",
    "TextCorpus",
    "load_fortunes",
    "DataSource",
    "FashionMNIST",
    "ImageSetSpec",
    "LabelledImages",
    "download_fashion_mnist",
    "find_fashion_mnist",
    "load_fashion_mnist",
    "load_image_set",
    "read_idx",
]
