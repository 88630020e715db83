"""torch.distributed as a multigpu process group: Gloo on CPU, NCCL on GPU, joined via env://.

``launch_plan`` sets exactly the variables torchrun sets for ``env://`` rendezvous, so a
rank joins under torchrun as well. Under ``multigpu launch`` rank 0 binds the store's
socket itself, on ``MASTER_ADDR`` only (torch's own store listens on every interface),
and Gloo is told the interface of this node's address (``GLOO_SOCKET_IFNAME``): a job on
one host listens on loopback only, a job on several only on the addresses it is given.
torch is imported only when a group is created, never by the launcher.
"""

from __future__ import annotations

import atexit
import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from multigpu.contract.protocol import Device
from multigpu.distributed.job import ENV_JOB_ID, Job, LaunchPlan, interface_env


def launch_plan(job: Job) -> LaunchPlan:
    """torchrun's variables for every local rank, and Gloo's interface (unless the caller set
    ``GLOO_SOCKET_IFNAME``); torch needs no service process."""
    extra = interface_env(job, "GLOO_SOCKET_IFNAME")
    return LaunchPlan(
        [
            {
                "MASTER_ADDR": job.master_addr,
                "MASTER_PORT": str(job.master_port),
                "RANK": str(job.rank(i)),
                "WORLD_SIZE": str(job.world_size),
                "LOCAL_RANK": str(i),
                "LOCAL_WORLD_SIZE": str(job.nproc),
                "GROUP_RANK": str(job.node_rank),
                **extra,
            }
            for i in range(job.nproc)
        ]
    )


def _store(timeout: timedelta) -> Any:
    """The rendezvous store of a ``multigpu launch`` job: rank 0 listens on ``MASTER_ADDR``
    only, the others connect to it."""
    import torch.distributed as dist

    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if rank != 0:
        return dist.TCPStore(addr, port, world, False, timeout)
    # NOTE: TCPStore binds every interface when it opens its own socket; given a listening
    # socket (master_listen_fd, as torchrun's elastic agent passes one) it serves on that.
    sock = socket.create_server(
        (addr, port), family=socket.AF_INET6 if ":" in addr else socket.AF_INET, backlog=max(128, world)
    )
    return dist.TCPStore(addr, port, world, True, timeout, wait_for_workers=False, master_listen_fd=sock.detach())


class TorchGroup:
    """The default torch.distributed group of this process (created here unless it exists)."""

    def __init__(self, device: Device, timeout: float, init_timeout: float):
        import torch
        import torch.distributed as dist

        self._dist = dist
        self.device = device
        self.timeout = float(timeout)
        self.engine = "nccl" if device.kind == "gpu" else "gloo"
        self.label = f"torch.distributed ({self.engine})"  # names the engine in CheckedGroup's errors
        self._owner = not dist.is_initialized()
        if device.kind == "gpu":
            torch.cuda.set_device(device.index)
        if self._owner:
            # NOTE: one timeout covers torch's rendezvous and its collectives; join with the
            # longer one, then lower it for collectives where torch allows that.
            join_timeout = timedelta(seconds=max(timeout, init_timeout))
            if ENV_JOB_ID in os.environ:  # started by multigpu launch: the store on MASTER_ADDR only
                dist.init_process_group(
                    self.engine,
                    store=_store(join_timeout),
                    rank=int(os.environ["RANK"]),
                    world_size=int(os.environ["WORLD_SIZE"]),
                    timeout=join_timeout,
                )
            else:  # torchrun or a user's own set-up
                dist.init_process_group(self.engine, init_method="env://", timeout=join_timeout)
            # NOTE: a process that exits with its Gloo group alive can die of SIGABRT ("terminate
            # called without an active exception"): the group's threads outlive the interpreter
            # (pytorch/pytorch#190489; an atexit hook in torch itself was abandoned, #179291).
            # A rank that never calls close() is a normal script, so the group is destroyed at exit
            # (close() does nothing once it is). Seen in the lab's two-host launch: both ranks
            # aborted after their last barrier in 2 of 4 CI runs.
            atexit.register(self.close)
        set_timeout = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
        if set_timeout is not None:
            set_timeout(timedelta(seconds=timeout))
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()

    def allreduce_(self, flat: Any) -> None:
        """In place SUM over ranks (synchronous on Gloo; stream-ordered on NCCL)."""
        self._dist.all_reduce(flat, op=self._dist.ReduceOp.SUM)

    def allreduce_async_(self, flat: Any) -> Callable[[], None]:
        """Start an in place SUM; return the function that waits for it."""
        return self._dist.all_reduce(flat, op=self._dist.ReduceOp.SUM, async_op=True).wait

    def broadcast_(self, flat: Any, src: int = 0) -> None:
        """In place: rank ``src``'s values on every rank."""
        self._dist.broadcast(flat, src=src)

    def barrier(self) -> None:
        """Wait for every rank."""
        self._dist.barrier()

    def close(self) -> None:
        """Destroy the default group if this object created it."""
        if self._owner and self._dist.is_initialized():
            self._dist.destroy_process_group()


def join(device: Device, timeout: float, init_timeout: float) -> TorchGroup:
    """Join the job with torch.distributed (env:// rendezvous)."""
    return TorchGroup(device, timeout, init_timeout)
