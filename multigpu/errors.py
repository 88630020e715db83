"""Exceptions raised by multigpu. Every user mistake maps to one of these."""
from __future__ import annotations


class MultigpuError(Exception):
    """Base class of every error multigpu raises on purpose."""


class UnknownBackendError(MultigpuError, LookupError):
    """A backend name that no installed adapter provides."""


class BackendNotInstalledError(MultigpuError, ImportError):
    """The adapter exists but its framework is not installed."""


class UnknownAlgorithmError(MultigpuError, ValueError):
    """An allreduce algorithm (or other named choice) that does not exist."""


class InputError(MultigpuError, ValueError):
    """Bad batch data: wrong shape, dtype, empty, or labels out of range."""


class ParamsError(MultigpuError, ValueError):
    """A params list of the wrong length, shapes or dtype for the model."""


class DeviceError(MultigpuError, ValueError):
    """A device specification that cannot be satisfied or parsed."""


class ModelError(MultigpuError, ValueError):
    """A model spec that is inconsistent with its input shape."""


class DataError(MultigpuError, ValueError):
    """A data set that is missing, truncated or malformed."""


class DataNotFoundError(DataError, FileNotFoundError):
    """No copy of a data set could be found or downloaded."""


class ClusterError(MultigpuError, ValueError):
    """A cluster or graph description for the cost model that is invalid."""


class InfeasibleError(MultigpuError, ValueError):
    """A placement problem whose constraints no assignment satisfies."""


class MissingDependencyError(MultigpuError, ImportError):
    """An optional package (a pip extra) that a requested feature needs is not installed."""


class CheckpointError(MultigpuError, ValueError):
    """A checkpoint that is unreadable or belongs to a different run."""


class BenchmarkError(MultigpuError, RuntimeError):
    """A benchmark failed while it ran (a run-time failure: exit 1)."""
