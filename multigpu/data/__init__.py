"""Data sets for multigpu's experiments (numpy and the standard library only)."""
from __future__ import annotations

from multigpu.data.fashion_mnist import (
                            FashionMNIST,
                            download_fashion_mnist,
                            find_fashion_mnist,
                            load_fashion_mnist,
                            read_idx,
)

__all__ = ["FashionMNIST", "download_fashion_mnist", "find_fashion_mnist",
           "load_fashion_mnist", "read_idx"]
