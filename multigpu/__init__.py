"""multigpu: one data-parallel algorithm, cost model and partitioner for every framework.

Importing this package loads numpy and the standard library only; a framework is
imported when its backend is first asked for.
"""
from __future__ import annotations

from . import models
from .errors import (BackendNotInstalledError, DeviceError, InputError, ModelError,
                     MultigpuError, ParamsError, UnknownAlgorithmError, UnknownBackendError)
from .layers import AvgPool2d, Conv2d, Dense, Flatten, MaxPool2d, ReLU
from .protocol import Backend, Device
from .registry import available_backends, backend, registered_backends
from .sequential import LayerStats, Sequential

__all__ = [
    "AvgPool2d", "Backend", "BackendNotInstalledError", "Conv2d", "Dense", "Device",
    "DeviceError", "Flatten", "InputError", "LayerStats", "MaxPool2d", "ModelError",
    "MultigpuError", "ParamsError", "ReLU", "Sequential", "UnknownAlgorithmError",
    "UnknownBackendError", "available_backends", "backend", "models", "registered_backends",
]
__version__ = "0.1.0"

from .allreduce import ALGORITHMS, allreduce_grads  # noqa: E402
from .data_parallel import DataParallel  # noqa: E402
from .devices import CPUFallbackWarning, resolve_devices  # noqa: E402
from .split import shard_sizes, split_batch  # noqa: E402

__all__ += ["ALGORITHMS", "CPUFallbackWarning", "DataParallel", "allreduce_grads",
            "resolve_devices", "shard_sizes", "split_batch"]

from .training import TrainResult, train  # noqa: E402

__all__ += ["TrainResult", "train"]

from .partition import autopartition, evaluate, load_cluster, load_graph  # noqa: E402

__all__ += ["autopartition", "evaluate", "load_cluster", "load_graph"]

from .execution import profile, run_partitioned  # noqa: E402  (no Ray until a plan runs)

__all__ += ["profile", "run_partitioned"]
