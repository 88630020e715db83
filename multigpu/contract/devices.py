"""Turn a user's device request into a list of logical devices for a backend."""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from typing import Any

from multigpu.contract.protocol import Device
from multigpu.errors import DeviceError

DeviceSpec = int | str | Sequence[Device]


class CPUFallbackWarning(UserWarning):
    """``devices=N`` asked for GPUs the framework does not see; CPU replicas are used."""


def _count(text: str, spec: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise DeviceError(f"cannot read a device count from {spec!r}; write e.g. 'cpu:4'") from None
    if n < 1:
        raise DeviceError(f"device count in {spec!r} must be at least 1")
    return n


def resolve_devices(backend: Any, spec: DeviceSpec) -> list[Device]:
    """Return the devices for ``spec``.

    ``N`` means N GPUs when the backend sees that many, otherwise N CPU replicas with
    a CPUFallbackWarning (like the textbook's ``try_gpu``). ``"cpu"``/``"cpu:N"`` are
    1/N CPU replicas, ``"gpu:0,1"`` names GPUs. Raises DeviceError for anything else.
    """
    if isinstance(spec, bool):
        raise DeviceError(f"devices={spec!r} is not a device count; pass an int such as 2")
    if isinstance(spec, int):
        if spec < 1:
            raise DeviceError(f"devices={spec} must be at least 1")
        gpus = backend.gpu_count()
        if gpus >= spec:
            return [Device("gpu", i) for i in range(spec)]
        warnings.warn(
            f"{backend.name} sees {gpus} GPU(s), fewer than devices={spec}; "
            f"training on {spec} CPU replicas instead (pass devices='cpu:{spec}' to silence this)",
            CPUFallbackWarning,
            stacklevel=3,
        )
        return [Device("cpu", i) for i in range(spec)]
    if isinstance(spec, str):
        text = spec.strip().lower()
        if text == "cpu":
            return [Device("cpu", 0)]
        m = re.fullmatch(r"cpu:(\S+)", text)
        if m:
            return [Device("cpu", i) for i in range(_count(m.group(1), spec))]
        m = re.fullmatch(r"(?:gpu|cuda):([\d,\s]+)", text)
        if m:
            ids = [int(t) for t in m.group(1).split(",") if t.strip()]
            if not ids or len(set(ids)) != len(ids):
                raise DeviceError(f"GPU list in {spec!r} must name distinct indices, e.g. 'gpu:0,1'")
            seen = backend.gpu_count()
            bad = [i for i in ids if i >= seen]
            if bad:
                raise DeviceError(
                    f"{backend.name} sees {seen} GPU(s), so GPU index(es) {bad} in {spec!r} do not exist; "
                    f"use devices={len(ids)} to fall back to CPU replicas or 'cpu:{len(ids)}'"
                )
            return [Device("gpu", i) for i in ids]
        raise DeviceError(f"cannot parse devices={spec!r}; use an int N, 'cpu:N' or 'gpu:0,1'")
    if isinstance(spec, (list, tuple)) and spec and all(isinstance(d, Device) for d in spec):
        if len(set(spec)) != len(spec):
            raise DeviceError(f"devices {list(map(str, spec))} repeat a device")
        return list(spec)
    raise DeviceError(f"cannot use devices={spec!r}; use an int N, 'cpu:N' or 'gpu:0,1'")
