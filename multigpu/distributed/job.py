"""The job description: what a launcher and every engine need to know about a job.

``Job`` is one node's view of a multi-process job; ``LaunchPlan`` is an adapter's
answer to ``launch_plan(job)`` (the variables each local rank needs and any service
processes, such as MXNet's scheduler and servers); the ``ENV_*`` names are the
``MULTIGPU_*`` variables every rank receives. Adapters' process groups import this
module only, never the supervisor that starts the processes.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field, replace

from multigpu.checks import check_count, check_positive
from multigpu.contract.registry import declaration
from multigpu.errors import InputError

# Variables every rank receives, whatever the engine (read by ``multigpu.distributed.rank``).
ENV_BACKEND = "MULTIGPU_BACKEND"
ENV_RANK = "MULTIGPU_RANK"
ENV_WORLD_SIZE = "MULTIGPU_WORLD_SIZE"
ENV_LOCAL_RANK = "MULTIGPU_LOCAL_RANK"
ENV_LOCAL_WORLD_SIZE = "MULTIGPU_LOCAL_WORLD_SIZE"
ENV_MASTER_ADDR = "MULTIGPU_MASTER_ADDR"
ENV_MASTER_PORT = "MULTIGPU_MASTER_PORT"
ENV_TIMEOUT = "MULTIGPU_TIMEOUT"
ENV_INIT_TIMEOUT = "MULTIGPU_INIT_TIMEOUT"
ENV_JOB_ID = "MULTIGPU_JOB_ID"
ENV_CHECK = "MULTIGPU_CHECK"

DEFAULT_TIMEOUT = 60.0
DEFAULT_INIT_TIMEOUT = 300.0
DEFAULT_MULTI_HOST_PORT = 29500  # torchrun's default; every node must agree on it


@dataclass(frozen=True)
class Job:
    """What this node's launcher knows about the job."""

    backend: str
    nproc: int  # ranks on this node
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0  # 0: pick a free port (single node only)
    node_addr: str | None = None  # this node's address as the other nodes reach it
    timeout: float = DEFAULT_TIMEOUT
    init_timeout: float = DEFAULT_INIT_TIMEOUT
    servers: int = 1  # MXNet parameter servers per node
    check: bool = True  # the header exchange before each collective
    job_id: str = ""

    @property
    def world_size(self) -> int:
        """Ranks across every node."""
        return self.nproc * self.nnodes

    def rank(self, local_rank: int) -> int:
        """The global rank of this node's ``local_rank``."""
        return self.node_rank * self.nproc + local_rank

    @property
    def host(self) -> str:
        """This node's address: where its ranks and services listen and how the other nodes
        reach it. ``node_addr`` when given; loopback on one node (nothing else can reach the
        job); on several, the address this host sends from toward ``master_addr``."""
        if self.node_addr:
            return self.node_addr
        return "127.0.0.1" if self.nnodes == 1 else route_address(self.master_addr)


@dataclass
class Service:
    """A process an engine needs besides the ranks (e.g. MXNet's scheduler and servers)."""

    name: str
    argv: list[str]
    env: dict[str, str]


@dataclass
class LaunchPlan:
    """An adapter's answer to ``launch_plan(job)``: variables per local rank and services."""

    rank_env: list[dict[str, str]]
    services: list[Service] = field(default_factory=list)


def route_address(destination: str) -> str:
    """The local address this host sends from toward ``destination`` (a UDP connect, which
    sends nothing). InputError when no route leads there."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((destination, 9))
            return str(s.getsockname()[0])
    except OSError as e:
        raise InputError(
            f"--master-addr {destination!r}: this host has no route to it ({e.strerror or e}); "
            f"check the address, or give this host's own with --node-addr"
        ) from None


def interface_of(address: str) -> str | None:
    """The name of this host's network interface that holds ``address`` ("lo" for
    127.0.0.1), or None when no interface does (Linux; None elsewhere)."""
    import fcntl
    import struct

    siocgifaddr = 0x8915
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in names:
            try:
                got = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(got[20:24]) == address:
                return name
    return None


def interface_env(job: Job, variable: str) -> dict[str, str]:
    """``{variable: NAME}`` naming the interface of ``job.host`` (for engines that bind to an
    interface, such as Gloo's ``GLOO_SOCKET_IFNAME``); empty when the caller has set the
    variable already or no interface holds the address."""
    if variable in os.environ:
        return {}
    name = interface_of(job.host)
    return {} if name is None else {variable: name}


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_job(job: Job) -> Job:
    """Return ``job`` with a port picked and a job id; raise InputError for a bad setting."""
    check_count(job.nproc, "nproc", example="--nproc-per-node 2")
    nnodes = check_count(job.nnodes, "nnodes", example="--nnodes 2")
    check_count(job.node_rank, "node_rank", minimum=0, maximum=nnodes - 1, example="one distinct value per node")
    check_count(job.master_port, "master_port", minimum=0, maximum=65535, example="29500 (0 picks a free port)")
    for name in ("timeout", "init_timeout"):
        check_positive(getattr(job, name), name, unit="seconds", example=60)
    check_count(job.servers, "servers", example="1 parameter server per node")
    if not declaration(job.backend).has_engine:
        raise InputError(f"backend {job.backend!r} has no multi-process engine; use numpy, torch, paddle or mxnet")
    port = job.master_port
    if port == 0:
        if job.nnodes > 1:
            port = DEFAULT_MULTI_HOST_PORT
        else:
            port = free_port(job.master_addr)
    return replace(job, master_port=port, job_id=job.job_id or uuid.uuid4().hex[:12])


def rank_env(job: Job, local_rank: int) -> dict[str, str]:
    """The ``MULTIGPU_*`` variables of one local rank."""
    return {
        ENV_BACKEND: job.backend,
        ENV_RANK: str(job.rank(local_rank)),
        ENV_WORLD_SIZE: str(job.world_size),
        ENV_LOCAL_RANK: str(local_rank),
        ENV_LOCAL_WORLD_SIZE: str(job.nproc),
        ENV_MASTER_ADDR: job.master_addr,
        ENV_MASTER_PORT: str(job.master_port),
        ENV_TIMEOUT: repr(float(job.timeout)),
        ENV_INIT_TIMEOUT: repr(float(job.init_timeout)),
        ENV_JOB_ID: job.job_id,
        ENV_CHECK: "1" if job.check else "0",
    }
