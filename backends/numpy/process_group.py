"""The NumPy reference backend's process group: a star of TCP sockets around rank 0.

NumPy has no distributed engine, so the reference defines the plainest one: every
rank sends its buffer to rank 0, which adds them in rank order (so every run sums in
the same order) and sends the sum back. It exists so that the default backend runs
multi-process too, and so that the core's multi-process logic can be tested without
a framework. Each wait has the group's timeout and names the rank it waited for.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from multigpu.backends.numpy.adapter import Var
from multigpu.contract.protocol import Device
from multigpu.distributed.job import ENV_MASTER_ADDR, ENV_MASTER_PORT, ENV_RANK, ENV_WORLD_SIZE, Job, LaunchPlan
from multigpu.errors import CollectiveError, CollectiveTimeoutError

_LEN = struct.Struct("!Q")


def launch_plan(job: Job) -> LaunchPlan:
    """Nothing beyond the ``MULTIGPU_*`` variables, which this group reads itself."""
    return LaunchPlan([{} for _ in range(job.nproc)])


class ReferenceGroup:
    """Rank 0 accepts one connection per other rank; collectives go through rank 0.

    ``rank``, ``world_size`` and ``master`` (address, port) default to the launcher's
    ``MULTIGPU_*`` variables.
    """

    def __init__(
        self,
        device: Device,
        timeout: float,
        init_timeout: float,
        rank: int | None = None,
        world_size: int | None = None,
        master: tuple[str, int] | None = None,
    ):
        self.device = device
        self.timeout = float(timeout)
        try:
            self.rank = int(os.environ[ENV_RANK]) if rank is None else rank
            self.world_size = int(os.environ[ENV_WORLD_SIZE]) if world_size is None else world_size
            addr, port = (os.environ[ENV_MASTER_ADDR], int(os.environ[ENV_MASTER_PORT])) if master is None else master
        except (KeyError, ValueError) as exc:
            raise CollectiveError(
                f"the reference group needs {ENV_RANK}, {ENV_WORLD_SIZE}, {ENV_MASTER_ADDR} "
                f"and {ENV_MASTER_PORT}; start the ranks with 'multigpu launch'"
            ) from exc
        self._peers: dict[int, socket.socket] = {}
        self._listener: socket.socket | None = None
        self._sums: ThreadPoolExecutor | None = None  # one thread: the sums keep their order on the sockets
        if self.rank == 0:
            self._accept(addr, port, init_timeout)
        else:
            self._connect(addr, port, init_timeout)

    # -- setup -----------------------------------------------------------
    def _accept(self, addr: str, port: int, limit: float) -> None:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((addr, port))  # the master's address only: loopback on one host
        srv.listen(self.world_size)
        self._listener = srv
        deadline = time.monotonic() + limit
        while len(self._peers) < self.world_size - 1:
            srv.settimeout(max(deadline - time.monotonic(), 1e-3))
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                missing = sorted(set(range(1, self.world_size)) - set(self._peers))
                raise CollectiveTimeoutError(f"rank(s) {missing} did not connect within {limit:g} s") from None
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(limit)
            (peer,) = struct.unpack("!q", self._recv_exact(conn, 8, 0))
            self._peers[int(peer)] = conn

    def _connect(self, addr: str, port: int, limit: float) -> None:
        deadline = time.monotonic() + limit
        while True:
            try:
                conn = socket.create_connection((addr, port), timeout=max(deadline - time.monotonic(), 1e-3))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise CollectiveTimeoutError(f"rank 0 at {addr}:{port} did not accept within {limit:g} s") from None
                time.sleep(0.05)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(struct.pack("!q", self.rank))
        self._peers[0] = conn

    # -- transport -------------------------------------------------------
    def _recv_exact(self, conn: socket.socket, n: int, peer: int) -> bytes:
        chunks, got = [], 0
        while got < n:
            try:
                chunk = conn.recv(min(n - got, 1 << 20))
            except TimeoutError:
                raise CollectiveTimeoutError(f"rank {peer} sent nothing for {conn.gettimeout():g} s") from None
            except OSError as exc:
                raise CollectiveError(f"connection to rank {peer} failed: {exc}") from exc
            if not chunk:
                raise CollectiveError(f"rank {peer} closed its connection (it died or left the job)")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _send(self, peer: int, data: np.ndarray) -> None:
        conn = self._peers[peer]
        try:
            conn.sendall(_LEN.pack(data.nbytes) + data.tobytes())
        except OSError as exc:
            raise CollectiveError(f"sending to rank {peer} failed: {exc} (it died or left the job)") from exc

    def _recv(self, peer: int, like: np.ndarray) -> np.ndarray:
        conn = self._peers[peer]
        conn.settimeout(self.timeout)
        (n,) = _LEN.unpack(self._recv_exact(conn, _LEN.size, peer))
        if n != like.nbytes:
            raise CollectiveError(f"rank {peer} sent {n} bytes where {like.nbytes} were expected")
        return np.frombuffer(self._recv_exact(conn, n, peer), like.dtype).reshape(like.shape)

    # -- collectives -----------------------------------------------------
    def allreduce_(self, flat: Var) -> None:
        """In place SUM over ranks, added in rank order on rank 0 (after every sum started before it)."""
        if self._sums is not None:
            self._sums.submit(self._sum, flat).result()
        else:
            self._sum(flat)

    def _sum(self, flat: Var) -> None:
        data = flat.data
        if self.rank == 0:
            total = data.copy()
            for peer in range(1, self.world_size):
                total += self._recv(peer, data)
            for peer in range(1, self.world_size):
                self._send(peer, total)
            data[...] = total
        else:
            self._send(0, data)
            data[...] = self._recv(0, data)

    def allreduce_async_(self, flat: Var) -> Callable[[], None]:
        """Start the sum on this group's one background thread; return the function that waits for it."""
        if self._sums is None:
            self._sums = ThreadPoolExecutor(1, thread_name_prefix="multigpu-reference-sum")
        future = self._sums.submit(self._sum, flat)
        return lambda: future.result()

    def broadcast_(self, flat: Var, src: int = 0) -> None:
        """In place: rank ``src``'s values on every rank, relayed by rank 0."""
        if self._sums is not None:  # after the sums started before it
            self._sums.submit(lambda: None).result()
        data = flat.data
        if self.rank == 0:
            if src != 0:
                data[...] = self._recv(src, data)
            for peer in range(1, self.world_size):
                if peer != src:
                    self._send(peer, data)
        elif self.rank == src:
            self._send(0, data)
        else:
            data[...] = self._recv(0, data)

    def barrier(self) -> None:
        """Wait for every rank (an allreduce of one number)."""
        self.allreduce_(Var(np.zeros(1, np.float32), self.device))

    def close(self) -> None:
        """Wait for the started sums, then close every socket."""
        if self._sums is not None:
            self._sums.shutdown(wait=True)
            self._sums = None
        for conn in self._peers.values():
            conn.close()
        self._peers.clear()
        if self._listener is not None:
            self._listener.close()
            self._listener = None


def join(device: Device, timeout: float, init_timeout: float) -> ReferenceGroup:
    """Join the job as one rank of the star."""
    return ReferenceGroup(device, timeout, init_timeout)
