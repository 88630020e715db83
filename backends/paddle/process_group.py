"""paddle.distributed as a multigpu process group: Gloo on CPU, NCCL on GPU.

``launch_plan`` sets the variables ``paddle.distributed.launch`` gives each trainer
(``PADDLE_TRAINER_ID``, ``PADDLE_TRAINERS_NUM``, ``PADDLE_MASTER``, ...), and the group
joins with Paddle's own ``init_parallel_env()``, whose TCP store listens on
``PADDLE_MASTER``'s port. Gloo is told the interface of this node's address
(``GLOO_SOCKET_IFNAME``), so its connections stay on loopback on one host and on the
given addresses on several (without it Paddle resolves the hostname, which a host
without DNS for itself cannot). Paddle's store cannot be bound to one address: its
C++ server takes only a port and listens on every interface. Paddle is imported only
when a group is created.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Callable
from typing import Any

from multigpu.contract.protocol import Device
from multigpu.distributed.job import Job, LaunchPlan, interface_env


def launch_plan(job: Job) -> LaunchPlan:
    """Paddle's trainer variables for every local rank; Paddle needs no service process."""
    master = f"{job.master_addr}:{job.master_port}"
    host = job.host or job.master_addr
    gloo = interface_env(job, "GLOO_SOCKET_IFNAME")
    envs = []
    for i in range(job.nproc):
        rank = job.rank(i)
        envs.append(
            {
                "PADDLE_MASTER": master,
                "PADDLE_TRAINER_ID": str(rank),
                "PADDLE_TRAINERS_NUM": str(job.world_size),
                "PADDLE_RANK_IN_NODE": str(i),
                "PADDLE_LOCAL_SIZE": str(job.nproc),
                "PADDLE_NNODES": str(job.nnodes),
                # NOTE: Paddle requires this variable; its process-group path only names
                # the trainer with it (Gloo and the store pick their own ports).
                "PADDLE_CURRENT_ENDPOINT": f"{host}:{min(job.master_port + 1 + rank, 65535)}",
                # Paddle logs every store connection at INFO; keep warnings and errors.
                "GLOG_minloglevel": os.environ.get("GLOG_minloglevel", "1"),
                **gloo,
            }
        )
    return LaunchPlan(envs)


class PaddleGroup:
    """Paddle's default process group of this process (created by ``init_parallel_env``)."""

    def __init__(self, device: Device, timeout: float, init_timeout: float):
        self.device = device
        self.timeout = float(timeout)
        self.engine = "nccl" if device.kind == "gpu" else "gloo"
        self.label = f"paddle.distributed ({self.engine})"  # names the engine in CheckedGroup's errors
        # NOTE: init_parallel_env reads the engine and the GPU from the environment.
        os.environ["PADDLE_DISTRI_BACKEND"] = self.engine
        if device.kind == "gpu":
            os.environ["FLAGS_selected_gpus"] = str(device.index)
        import paddle.distributed as dist

        self._dist = dist
        self.rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
        self.world_size = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
        if self.world_size > 1:
            # NOTE: Paddle's Gloo group takes no timeout: each operation waits up to Gloo's
            # default of 30 s; the core's deadline applies on top.
            # NOTE: init_parallel_env writes a "Modified FLAGS detected" banner to stderr on
            # every rank, for a flag Paddle sets itself; it is shown only if joining fails.
            banner = io.StringIO()
            try:
                with contextlib.redirect_stderr(banner):
                    dist.init_parallel_env()
            except BaseException:
                sys.stderr.write(banner.getvalue())
                raise
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()

    def _run(self, fn: Callable[[], Any]) -> Any:
        # NOTE: init_parallel_env does nothing for one trainer, so neither do the collectives.
        return None if self.world_size == 1 else fn()

    def allreduce_(self, flat: Any) -> None:
        """In place SUM over ranks."""
        self._run(lambda: self._dist.all_reduce(flat, sync_op=True))

    def allreduce_async_(self, flat: Any) -> Callable[[], None]:
        """Start an in place SUM; return the function that waits for it."""
        task = self._run(lambda: self._dist.all_reduce(flat, sync_op=False))
        return (lambda: None) if task is None else task.wait

    def broadcast_(self, flat: Any, src: int = 0) -> None:
        """In place: rank ``src``'s values on every rank."""
        self._run(lambda: self._dist.broadcast(flat, src=src, sync_op=True))

    def barrier(self) -> None:
        """Wait for every rank."""
        self._run(self._dist.barrier)

    def close(self) -> None:
        """Leave Paddle's default group."""
        destroy = getattr(self._dist, "destroy_process_group", None)
        if self.world_size > 1 and destroy is not None:
            destroy()


def join(device: Device, timeout: float, init_timeout: float) -> PaddleGroup:
    """Join the job with paddle.distributed."""
    return PaddleGroup(device, timeout, init_timeout)
