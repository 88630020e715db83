"""MXNet's kvstore ``dist_sync`` parameter server as a multigpu process group.

A job is a scheduler, parameter servers and workers (the ranks), each told its role
through ``DMLC_*`` variables, as MXNet's dmlc tracker does (Li et al., OSDI 2014). A
sum-allreduce is a push of every worker's buffer to the servers, which add them in
sync mode, and a pull of the sum. Service processes only ``import mxnet``: MXNet
runs the scheduler or server loop on import when ``DMLC_ROLE`` says so. MXNet is
imported only in those processes and in the ranks, never by the launcher.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from multigpu.contract.protocol import Device
from multigpu.distributed.job import ENV_RANK, Job, LaunchPlan, Service

KEY_BASE = 1 << 30  # far above the integer keys a Gluon Trainer uses on the same kvstore


def launch_plan(job: Job) -> LaunchPlan:
    """Workers for the ranks; the scheduler on node 0 and ``job.servers`` servers per node."""
    common = {
        "DMLC_PS_ROOT_URI": job.master_addr,
        "DMLC_PS_ROOT_PORT": str(job.master_port),
        "DMLC_NUM_WORKER": str(job.world_size),
        "DMLC_NUM_SERVER": str(job.servers * job.nnodes),
    }
    # ps-lite binds and announces this address (without it, its host's first interface).
    common["DMLC_NODE_HOST"] = job.host
    argv = [sys.executable, "-c", "import mxnet"]
    services = [Service("scheduler", argv, {**common, "DMLC_ROLE": "scheduler"})] if job.node_rank == 0 else []
    services += [
        Service(f"server {job.node_rank * job.servers + i}", argv, {**common, "DMLC_ROLE": "server"})
        for i in range(job.servers)
    ]
    return LaunchPlan([{**common, "DMLC_ROLE": "worker"} for _ in range(job.nproc)], services)


class MXNetGroup:
    """Sum-allreduce, broadcast and barrier on one ``dist_sync`` kvstore."""

    def __init__(self, device: Device, timeout: float, init_timeout: float, kvstore: Any | None = None):
        import mxnet as mx

        self._mx = mx
        self.device = device
        self.timeout = float(timeout)
        self.label = "MXNet kvstore (dist_sync)"  # names the engine in CheckedGroup's errors
        self.kvstore = mx.kv.create("dist_sync") if kvstore is None else kvstore
        # NOTE: ps-lite numbers workers by (host, port) of a randomly bound port, not by
        # launch order. The sums do not depend on it, and broadcast_ below names its
        # source by this group's rank, so the launcher's rank is used when there is one.
        env_rank = os.environ.get(ENV_RANK)
        self.rank = int(env_rank) if env_rank is not None else int(self.kvstore.rank)
        self.world_size = int(self.kvstore.num_workers)
        self._keys: dict[tuple[int, int], int] = {}
        self._open: dict[int, set[int]] = {}  # size -> slots of the sums started and not yet waited for

    def _key(self, size: int, slot: int = 0) -> int:
        key = self._keys.get((size, slot))
        if key is None:
            # init is collective (worker 0's value, then a barrier); the core's header check
            # has already made sure that every rank asks for the same size here.
            key = KEY_BASE + len(self._keys)
            self.kvstore.init(key, self._mx.nd.zeros((size,), dtype="float32"))
            self._keys[(size, slot)] = key
        return key

    def allreduce_(self, flat: Any) -> None:
        """In place SUM over ranks: push to the servers, pull the sum back."""
        # NOTE: push/pull only queue work on MXNet's engine; wait here so that a dead peer
        # stalls this call, under the core's deadline, and not a later read.
        self.allreduce_async_(flat)()

    def allreduce_async_(self, flat: Any) -> Callable[[], None]:
        """Queue the push and the pull; return the function that waits for the sum."""
        size = int(flat.size)
        # NOTE: a dist_sync server adds one push per worker and key; two sums of one size in
        # flight at once (two buckets) need two keys, so the k-th open sum of a size takes the
        # k-th key of that size (every rank opens them in the same order).
        busy = self._open.setdefault(size, set())
        slot = min(set(range(len(busy) + 1)) - busy)
        busy.add(slot)
        key = self._key(size, slot)
        priority = -sum(map(len, self._open.values()))  # Gluon's Trainer: the earlier a sum is due, the higher
        # NOTE: without an optimizer a dist_sync server stores the sum of the pushes of
        # every worker, so the pull returns the allreduce.
        self.kvstore.push(key, flat, priority=priority)
        self.kvstore.pull(key, out=flat, priority=priority)

        def wait() -> None:
            flat.wait_to_read()
            busy.discard(slot)

        return wait

    def broadcast_(self, flat: Any, src: int = 0) -> None:
        """In place: rank ``src``'s values on every rank (the others contribute zeros)."""
        if self.rank != src:
            flat[:] = 0
        self.allreduce_(flat)

    def barrier(self) -> None:
        """Wait for every worker (the scheduler's barrier)."""
        self.kvstore._barrier()

    def close(self) -> None:
        """Nothing to do: MXNet finalizes the kvstore (a barrier of every node) at exit."""


def join(device: Device, timeout: float, init_timeout: float) -> MXNetGroup:
    """Join the job as a ``dist_sync`` worker."""
    return MXNetGroup(device, timeout, init_timeout)
