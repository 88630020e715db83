"""The model spec: layers as data, composed into DAG models, and the built-in models.

A model is a ``Model``: named nodes in one topological order, each naming its
inputs, built from blocks (a list is a chain, ``Residual`` and ``Parallel`` join
branches) or from explicit ``Node``s; ``Sequential`` is the chain case.
``multigpu.models.lenet()``, ``resnet18()`` and friends build the built-in networks;
``get(name)`` looks one up by name. A model spec never imports a framework: a backend
walks it.
"""

from __future__ import annotations

from multigpu.models.batchnorm import BatchNormMode, BatchStatistics, RunningStatistics
from multigpu.models.blocks import Chain, Parallel, Residual
from multigpu.models.graph import LayerStats, Model
from multigpu.models.layers import (
    Add,
    AvgPool2d,
    BatchNorm2d,
    Concat,
    Conv2d,
    Dense,
    Flatten,
    GlobalAvgPool2d,
    Identity,
    Layer,
    MaxPool2d,
    ReLU,
)
from multigpu.models.node import INPUT, Node
from multigpu.models.sequential import Sequential
from multigpu.models.zoo import MODELS, alexnet, basic_block, get, lenet, resnet, resnet18, resnet18_textbook

__all__ = [
    "INPUT",
    "MODELS",
    "Add",
    "AvgPool2d",
    "BatchNorm2d",
    "BatchNormMode",
    "BatchStatistics",
    "Chain",
    "Concat",
    "Conv2d",
    "Dense",
    "Flatten",
    "GlobalAvgPool2d",
    "Identity",
    "Layer",
    "LayerStats",
    "MaxPool2d",
    "Model",
    "Node",
    "Parallel",
    "ReLU",
    "Residual",
    "RunningStatistics",
    "Sequential",
    "alexnet",
    "basic_block",
    "get",
    "lenet",
    "resnet",
    "resnet18",
    "resnet18_textbook",
]
