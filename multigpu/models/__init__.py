"""The model spec: layers as data, ``Sequential`` chains, and the built-in models.

``multigpu.models.lenet()`` and friends build the built-in networks; ``get(name)``
looks one up by name. A model spec never imports a framework: a backend walks it.
"""
from __future__ import annotations

from multigpu.models.layers import AvgPool2d, Conv2d, Dense, Flatten, Layer, MaxPool2d, ReLU
from multigpu.models.sequential import LayerStats, Sequential
from multigpu.models.zoo import MODELS, alexnet, get, lenet

__all__ = ["AvgPool2d", "Conv2d", "Dense", "Flatten", "Layer", "LayerStats", "MODELS", "MaxPool2d", "ReLU",
           "Sequential", "alexnet", "get", "lenet"]
