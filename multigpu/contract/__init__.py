"""The backend contract: the protocol adapters implement, the checks that enforce it,
the registry that finds adapters, and how a device request becomes devices.

The lowest layer above ``multigpu.errors``: it imports no other multigpu package.
"""

from __future__ import annotations

from multigpu.contract.checked import CheckedBackend, checked, unchecked
from multigpu.contract.devices import CPUFallbackWarning, DeviceSpec, resolve_devices
from multigpu.contract.protocol import Backend, Device
from multigpu.contract.registry import available_backends, backend, default_backend, registered_backends

__all__ = [
    "Backend",
    "CPUFallbackWarning",
    "CheckedBackend",
    "Device",
    "DeviceSpec",
    "available_backends",
    "backend",
    "checked",
    "default_backend",
    "registered_backends",
    "resolve_devices",
    "unchecked",
]
