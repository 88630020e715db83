"""torch.distributed as a multigpu process group: Gloo on CPU, NCCL on GPU, joined via env://.

``launch_plan`` sets exactly the variables torchrun sets for ``env://`` rendezvous, so a
rank joins the same way under ``multigpu launch`` and under torchrun. torch is imported
only when a group is created, never by the launcher.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable

from multigpu.contract.protocol import Device
from multigpu.distributed.job import Job, LaunchPlan


def launch_plan(job: Job) -> LaunchPlan:
    """torchrun's variables for every local rank; torch needs no service process."""
    return LaunchPlan([{"MASTER_ADDR": job.master_addr, "MASTER_PORT": str(job.master_port),
                        "RANK": str(job.rank(i)), "WORLD_SIZE": str(job.world_size),
                        "LOCAL_RANK": str(i), "LOCAL_WORLD_SIZE": str(job.nproc),
                        "GROUP_RANK": str(job.node_rank)} for i in range(job.nproc)])


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
            dist.init_process_group(self.engine, init_method="env://",
                                    timeout=timedelta(seconds=max(timeout, init_timeout)))
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
