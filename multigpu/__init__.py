"""multigpu: one data-parallel algorithm, cost model and partitioner for every framework.

Importing this package loads numpy and the standard library only; a framework is
imported when its backend is first asked for, and Ray when a plan first runs.

The subpackages are layers, each importing only those listed before it:
``contract`` (the backend protocol and its checks), ``data`` (files and data sets),
``models`` (the model spec), ``parallel`` (the data-parallel step), ``distributed``
(multi-process jobs), ``training``, ``partition`` (the cost model and its solvers),
``execution`` (running a plan) and ``cli``.
"""

from __future__ import annotations

from multigpu import models, optim
from multigpu.contract.devices import CPUFallbackWarning, resolve_devices
from multigpu.contract.protocol import Backend, Device
from multigpu.contract.registry import available_backends, backend, registered_backends
from multigpu.errors import (
    BackendNotInstalledError,
    DeviceError,
    InputError,
    ModelError,
    MultigpuError,
    ParamsError,
    UnknownAlgorithmError,
    UnknownBackendError,
)
from multigpu.execution import profile, run_partitioned  # no Ray until a plan runs
from multigpu.models.attention import AttentionMask, MultiHeadAttention
from multigpu.models.blocks import Chain, Parallel, Residual
from multigpu.models.dropout import Dropout
from multigpu.models.graph import Model
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
    MaxPool2d,
    ReLU,
)
from multigpu.models.node import Input
from multigpu.models.sequential import LayerStats, Sequential
from multigpu.models.transformer_layers import (
    GELU,
    Embedding,
    LayerNorm,
    PositionEmbedding,
    Sigmoid,
    Tanh,
    TokenTypeEmbedding,
)
from multigpu.parallel.allreduce import ALGORITHMS, allreduce_grads
from multigpu.parallel.data_parallel import DataParallel
from multigpu.parallel.split import shard_sizes, split_batch
from multigpu.partition import autopartition, evaluate, load_cluster, load_graph
from multigpu.training import Callback, Trainer, TrainResult, train

__all__ = [
    "AttentionMask",
    "MultiHeadAttention",
    "Dropout",
    "Input",
    "GELU",
    "Embedding",
    "LayerNorm",
    "PositionEmbedding",
    "Sigmoid",
    "Tanh",
    "TokenTypeEmbedding",
    "ALGORITHMS",
    "Add",
    "AvgPool2d",
    "Backend",
    "BackendNotInstalledError",
    "BatchNorm2d",
    "CPUFallbackWarning",
    "Callback",
    "Chain",
    "Concat",
    "Conv2d",
    "DataParallel",
    "Dense",
    "Device",
    "DeviceError",
    "Flatten",
    "GlobalAvgPool2d",
    "Identity",
    "InputError",
    "LayerStats",
    "MaxPool2d",
    "Model",
    "ModelError",
    "MultigpuError",
    "Parallel",
    "ParamsError",
    "ReLU",
    "Residual",
    "Sequential",
    "TrainResult",
    "Trainer",
    "UnknownAlgorithmError",
    "UnknownBackendError",
    "allreduce_grads",
    "autopartition",
    "available_backends",
    "backend",
    "evaluate",
    "load_cluster",
    "load_graph",
    "models",
    "optim",
    "profile",
    "registered_backends",
    "resolve_devices",
    "run_partitioned",
    "shard_sizes",
    "split_batch",
    "train",
]
__version__ = "0.1.0"
