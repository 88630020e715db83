"""Exceptions raised by multigpu. Every user mistake maps to one of these.

Each class says in its docstring whether it is bad input (the command line exits 2)
or a failure at run time (exit 1); ``multigpu.cli.exit_code`` maps them.
"""

from __future__ import annotations


class MultigpuError(Exception):
    """Base class of every error multigpu raises on purpose."""


class UnknownBackendError(MultigpuError, LookupError):
    """A backend name that no installed adapter provides (bad input, exit 2)."""


class BackendNotInstalledError(MultigpuError, ImportError):
    """The adapter exists but its framework is not installed (bad input, exit 2)."""


class UnknownAlgorithmError(MultigpuError, ValueError):
    """An allreduce algorithm (or other named choice) that does not exist (bad input, exit 2)."""


class InputError(MultigpuError, ValueError):
    """Bad input data or a protocol call that breaks the backend contract: wrong shape,
    dtype, size, empty, labels out of range, or an output path that cannot be written
    (bad input, exit 2)."""


class ParamsError(MultigpuError, ValueError):
    """A params list of the wrong length, shapes or dtype for the model (bad input, exit 2)."""


class DeviceError(MultigpuError, ValueError):
    """A device specification that cannot be satisfied or parsed (bad input, exit 2)."""


class ModelError(MultigpuError, ValueError):
    """A model spec that is inconsistent with its input shape (bad input, exit 2)."""


class DataError(MultigpuError, ValueError):
    """A data set that is missing, truncated, malformed or not the published one (bad input, exit 2)."""


class DataNotFoundError(DataError, FileNotFoundError):
    """No copy of a data set could be found or downloaded (bad input, exit 2)."""


class ClusterError(MultigpuError, ValueError):
    """A cluster or graph description for the cost model that is invalid (bad input, exit 2)."""


class InfeasibleError(MultigpuError, ValueError):
    """A placement problem whose constraints no assignment satisfies (a result of the run,
    not a mistake in the input: exit 1)."""


class MissingDependencyError(MultigpuError, ImportError):
    """An optional package (a pip extra) that a requested feature needs is not installed
    (bad input, exit 2)."""


class CheckpointError(MultigpuError, ValueError):
    """A checkpoint that is unreadable or belongs to a different run (bad input, exit 2)."""


class CollectiveError(MultigpuError, RuntimeError):
    """A collective across processes failed: a peer left or died (run-time failure, exit 1)."""


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """A collective did not complete within the process group's timeout (run-time failure, exit 1)."""


class CollectiveMismatchError(CollectiveError):
    """Ranks called different collectives, or the same one with different buffer sizes
    (run-time failure, exit 1; the message names both sides)."""


class RankFailedError(MultigpuError, RuntimeError):
    """A process of a multi-process job died, raised or was stopped; the message names the
    rank (run-time failure, exit 1; the CLI exits 2 when that rank exited 2, refusing its
    input)."""

    status: int | None = None  # the failing rank's exit status (negative: the signal that killed it)


class TrainingDivergedError(MultigpuError, FloatingPointError):
    """The training loss became NaN or infinite; the message names the epoch and step
    (a failure at run time, exit 1)."""

    def __init__(self, message: str, epoch: int, step: int, loss: float):
        super().__init__(message)
        self.epoch, self.step, self.loss = epoch, step, loss


class AdapterError(MultigpuError, RuntimeError):
    """An adapter returned something the backend contract forbids: a bug in the adapter,
    not in the caller's input (a failure at run time, exit 1)."""


class SolverError(MultigpuError, RuntimeError):
    """A solver (HiGHS) stopped without an answer, e.g. at its time limit
    (a failure at run time, exit 1)."""


class PlanError(MultigpuError, ValueError):
    """A plan that cannot run: wrong length for the model, a device the cluster
    lacks, a device with no backend, or a malformed plan file. Bad input (exit 2)."""


class WorkerDiedError(MultigpuError, RuntimeError):
    """A stage's worker process died while running a plan; the message names the
    stage and its device. A run-time failure (exit 1)."""


class WorkerTimeoutError(MultigpuError, TimeoutError):
    """A stage's worker did not answer within the run's timeout; the message names
    the stage and its device. A run-time failure (exit 1)."""


class BenchmarkError(MultigpuError, RuntimeError):
    """A benchmark failed while it ran (a run-time failure: exit 1)."""


class LabUnsupportedError(MultigpuError, ValueError):
    """This machine cannot host the emulated lab: not root, or the kernel lacks network
    namespaces, a tc qdisc or a cgroup controller the lab needs (bad input, exit 2)."""


class LabError(MultigpuError, RuntimeError):
    """The emulated lab failed while it was built, used or taken down: a command such as
    ``ip`` or ``ray start`` failed, or a host's process did not start (run-time failure, exit 1)."""


class OnnxError(ModelError):
    """An ONNX model that cannot be imported: not an ONNX file, an op, attribute or opset
    outside the supported set, external data that is missing, a dynamic dimension with no
    shape given, or several graph outputs with none chosen (bad input, exit 2)."""


class UnsupportedOnnxError(OnnxError):
    """An ONNX node whose op or attribute the importer does not support; ``op``, ``node`` and
    ``opset`` name it, and the message lists the supported ops (bad input, exit 2)."""

    op: str | None = None
    node: str | None = None
    opset: int | None = None


class OnnxExportError(ModelError):
    """A model, its arguments or a destination that cannot be written as ONNX: a BatchNorm model
    without its state, an opset or batch out of range, a path whose folder is missing, a file over
    protobuf's 2 GiB limit (bad input, exit 2)."""


class UnsupportedLayerError(OnnxExportError):
    """A layer kind (or an imported op) with no ONNX export; the message names the node and lists
    the kinds that export (bad input, exit 2)."""


class ExportFolderError(OnnxExportError):
    """A stage export to a folder that exists and is not empty, or whose parent does not exist;
    nothing is written (bad input, exit 2)."""
