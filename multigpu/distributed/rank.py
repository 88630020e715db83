"""Join a multi-process job from inside a rank: the process group, this rank's devices, helpers.

A rank started by ``multigpu launch`` (or ``multigpu.train(processes=N)``) finds the
``MULTIGPU_*`` variables and its engine's own variables in its environment.
``init_process_group()`` joins the job with the adapter's engine and returns a
``CheckedGroup``; nothing here imports a framework before a backend is asked for.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import numpy as np

from multigpu.checks import check_positive
from multigpu.contract.devices import CPUFallbackWarning, DeviceSpec, resolve_devices
from multigpu.contract.protocol import Device
from multigpu.contract.registry import backend as get_backend
from multigpu.contract.registry import declaration
from multigpu.distributed.checked_group import CheckedGroup, Watchdog
from multigpu.distributed.job import (
    DEFAULT_INIT_TIMEOUT,
    DEFAULT_TIMEOUT,
    ENV_BACKEND,
    ENV_CHECK,
    ENV_INIT_TIMEOUT,
    ENV_LOCAL_RANK,
    ENV_LOCAL_WORLD_SIZE,
    ENV_RANK,
    ENV_TIMEOUT,
)
from multigpu.errors import CollectiveError, InputError
from multigpu.parallel.process_group import allreduce_numpy


def launched() -> bool:
    """True inside a rank that ``multigpu launch`` or ``train(processes=N)`` started."""
    return ENV_RANK in os.environ


def launched_rank() -> int:
    """This process's rank in a launched job (0 outside one)."""
    return int(os.environ.get(ENV_RANK, "0"))


def launched_backend() -> str | None:
    """The backend the launcher started this rank for, or None outside a launched job."""
    return os.environ.get(ENV_BACKEND) if launched() else None


def env_seconds(name: str, default: float) -> float:
    """The positive number of seconds in environment variable ``name`` (``default`` when unset)."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{name}={text!r} must be a number of seconds, e.g. 60") from None
    return check_positive(value, name, unit="seconds", example=60)


def local_devices(backend: Any, spec: DeviceSpec) -> list[Device]:
    """This rank's devices for ``spec``: with N GPUs per rank, local rank r takes GPUs r*N..r*N+N-1.

    Without enough GPUs for every local rank, every rank falls back to N CPU replicas
    (with the usual CPUFallbackWarning); explicit specs (``"cpu:2"``, ``"gpu:1"``) are
    taken as given.
    """
    local_rank = int(os.environ.get(ENV_LOCAL_RANK, "0"))
    local_world = int(os.environ.get(ENV_LOCAL_WORLD_SIZE, "1"))
    if isinstance(spec, int) and not isinstance(spec, bool) and spec >= 1 and local_world > 1:
        gpus = backend.gpu_count()
        if gpus >= spec * local_world:
            return [Device("gpu", local_rank * spec + i) for i in range(spec)]
        warnings.warn(
            f"{backend.name} sees {gpus} GPU(s), fewer than {spec} per rank for {local_world} ranks on this "
            f"node; each rank trains on {spec} CPU replica(s) instead (pass 'cpu:{spec}' to silence this)",
            CPUFallbackWarning,
            stacklevel=2,
        )
        return [Device("cpu", i) for i in range(spec)]
    return resolve_devices(backend, spec)


def init_process_group(
    backend: str | None = None,
    device: Device | None = None,
    timeout: float | None = None,
    init_timeout: float | None = None,
    check: bool | None = None,
) -> CheckedGroup:
    """Join the job this process was launched into; return its checked process group.

    ``backend`` defaults to the launcher's (``MULTIGPU_BACKEND``); ``device`` is where
    the group's buffers live (default the CPU; a GPU selects NCCL). ``timeout``
    (default ``MULTIGPU_TIMEOUT`` or 60 s) bounds every collective, ``init_timeout``
    (default 300 s) the rendezvous and the first barrier. Works under each engine's own
    launcher too (torchrun, ``paddle.distributed.launch``, MXNet's dmlc tracker).
    ``check`` (default ``MULTIGPU_CHECK``, on) keeps the header exchange that reports
    mismatched collectives; turning it off saves one small allreduce per collective.
    Raises InputError for a backend that differs from the launcher's or has no engine.
    """
    env_backend = os.environ.get(ENV_BACKEND)
    name = backend or env_backend
    if name is None:
        raise InputError(
            "no backend for the process group: pass backend= or start the rank with 'multigpu launch --backend NAME'"
        )
    if env_backend is not None and name != env_backend:
        raise InputError(
            f"this rank was launched for backend {env_backend!r} but asks for {name!r}; "
            f"use --backend {env_backend} (or launch with --backend {name})"
        )
    decl = declaration(name)
    if not decl.has_engine:
        raise InputError(f"backend {name!r} has no multi-process engine; use numpy, torch, paddle or mxnet")
    be = get_backend(name)
    device = Device("cpu", 0) if device is None else device
    timeout = env_seconds(ENV_TIMEOUT, DEFAULT_TIMEOUT) if timeout is None else float(timeout)
    init_timeout = env_seconds(ENV_INIT_TIMEOUT, DEFAULT_INIT_TIMEOUT) if init_timeout is None else float(init_timeout)
    where = f"rank {os.environ.get(ENV_RANK, '?')} ({name})"
    watchdog = Watchdog()
    watchdog.arm(
        init_timeout,
        (
            f"multigpu.errors.CollectiveTimeoutError: {where}: joining the job timed out after {init_timeout:g} s: "
            "not every rank reached the rendezvous (check that every node runs the launcher with the same "
            "--nnodes, --master-addr and --master-port, and that the port is reachable)"
        ),
    )
    try:
        engine = decl.join(device, timeout, init_timeout)
    except CollectiveError:
        raise
    except Exception as exc:
        raise CollectiveError(f"{where}: cannot join the job: {type(exc).__name__}: {exc}") from exc
    finally:
        watchdog.disarm()
    if check is None:
        check = os.environ.get(ENV_CHECK, "1") != "0"
    group = CheckedGroup(engine, be, check=check, name=name)
    group.timeout = init_timeout  # the first barrier waits for slow starters too
    group.barrier()
    group.timeout = timeout
    return group


def broadcast_json(group: Any, backend: Any, obj: Any = None, src: int = 0) -> Any:
    """Return rank ``src``'s JSON-able ``obj`` on every rank (the others pass anything)."""
    data = json.dumps(obj).encode() if group.rank == src else b""
    if len(data) >= 1 << 24:
        raise InputError(f"broadcast_json carries below 16 MiB of JSON, got {len(data)} bytes")
    n = int(allreduce_numpy(group, backend, np.array([len(data)], np.float32))[0])
    buf = np.zeros(n, np.float32)
    if group.rank == src:
        buf[:] = np.frombuffer(data, np.uint8)
    t = backend.from_numpy(buf, group.device)
    group.broadcast_(t, src)
    return json.loads(backend.to_numpy(t).astype(np.uint8).tobytes().decode())
