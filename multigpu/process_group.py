"""The process-group interface: what the core needs to reduce across processes.

The in-process allreduce (``multigpu.allreduce``) sums the replicas one Python
process drives. A ``ProcessGroup`` carries that sum across processes, on one host
or many, with the framework's own engine (torch.distributed, paddle.distributed,
MXNet's kvstore). ``DataParallel`` composes the two: local devices reduce into the
first device's flat buffer, that buffer is summed across processes, and the result
is copied back to the local devices. The algorithm above does not change.
"""
from __future__ import annotations

from typing import Protocol, TypeVar, runtime_checkable

T = TypeVar("T")


@runtime_checkable
class ProcessGroup(Protocol[T]):
    """One process's handle on a group of ``world_size`` processes.

    Tensors are 1-D float32 buffers of the adapter that created the group. Every
    collective waits at most ``timeout`` seconds and then raises
    ``multigpu.errors.CollectiveError`` naming the ranks it waited for.
    """

    rank: int
    world_size: int
    timeout: float

    def allreduce_(self, flat: T) -> None:
        """In place: ``flat`` becomes the elementwise sum of every rank's ``flat``."""

    def broadcast_(self, flat: T, src: int = 0) -> None:
        """In place: ``flat`` becomes rank ``src``'s ``flat`` on every rank."""

    def barrier(self) -> None:
        """Return once every rank has called ``barrier``."""

    def close(self) -> None:
        """Leave the group and release the engine; the group is unusable afterwards."""
