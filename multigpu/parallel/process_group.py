"""The process-group interface: what the core needs to reduce across processes.

The in-process allreduce (``multigpu.parallel.allreduce``) sums the replicas one Python
process drives. A ``ProcessGroup`` carries that sum across processes, on one host
or many, with the framework's own engine (torch.distributed, paddle.distributed,
MXNet's kvstore). ``DataParallel`` composes the two: local devices reduce into the
first device's flat buffer, that buffer is summed across processes, and the result
is copied back to the local devices. The algorithm above does not change.

Two layers implement this protocol:

* an *engine group*, one per adapter (``backends/<name>/process_group.py``), is a
  thin handle on the framework's engine; the backend's declaration names that module
  as its ``engine``, whose ``join(device, timeout, init_timeout)`` returns the group
  and joins the job the way the framework itself does (torch's ``env://``, Paddle's
  ``PADDLE_*`` variables, MXNet's ``DMLC_*`` roles);
* ``multigpu.distributed.checked_group.CheckedGroup`` wraps an engine group and adds what every
  engine needs alike: a check that reports a rank calling a different collective or size
  (folded into a steady step's bucket sums, a header exchange for other calls), a deadline
  on every call, and errors that name the rank and the call.
  ``multigpu.distributed.rank.init_process_group`` returns one. It reserves
  ``reserved_floats`` floats at the end of an announced bucket set's bucket 0 for its flag.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from multigpu.contract.protocol import Device

# The buffer type; contravariant because a group only takes buffers in, never returns them.
T = TypeVar("T", contravariant=True)


@runtime_checkable
class ProcessGroup(Protocol[T]):
    """One process's handle on a group of ``world_size`` processes.

    Tensors are 1-D float32 buffers of the adapter that created the group, on
    ``device`` (the rank's first local device: a GPU for NCCL, the CPU for Gloo and
    the kvstore). Every rank calls the same collectives in the same order.

    Contract for engine groups (what an adapter implements):

    * a collective returns only when its result can be read, so a dead or stuck peer
      is noticed inside the call that waits for it, not at a later read;
    * an engine failure raises the engine's own exception, untranslated: the checked
      group turns it into ``CollectiveError`` (``CollectiveTimeoutError`` when it says
      it timed out) in one place, naming the rank, the call and the engine's ``label``
      (an optional attribute such as ``"torch.distributed (gloo)"``);
    * ``timeout`` (seconds) is passed to the engine where it takes one; the core
      enforces it for every engine;
    * optionally ``allreduce_async_(flat)`` starts the same sum and returns a function
      that waits for it (and raises as ``allreduce_`` would). Sums started this way
      complete in the order they were started, and a collective called after them
      runs after them. The core uses it to overlap a header exchange with
      computation, and to sum gradient buckets while backward still runs
      (``multigpu.parallel.buckets``): ``DataParallel`` waits for every bucket before
      the update and before any other collective.
    """

    rank: int
    world_size: int
    timeout: float
    device: Device

    def allreduce_(self, flat: T) -> None:
        """In place: ``flat`` becomes the elementwise sum of every rank's ``flat``."""

    def broadcast_(self, flat: T, src: int = 0) -> None:
        """In place: ``flat`` becomes rank ``src``'s ``flat`` on every rank."""

    def barrier(self) -> None:
        """Return once every rank has called ``barrier``."""

    def close(self) -> None:
        """Leave the group and release the engine; the group is unusable afterwards."""


def allreduce_numpy(group: Any, backend: Any, values: np.ndarray) -> np.ndarray:
    """Return the sum over ranks of the float32 vector ``values`` (exact for integers below 2**24)."""
    t = backend.from_numpy(np.asarray(values, np.float32).reshape(-1), group.device)
    group.allreduce_(t)
    return backend.to_numpy(t)
