"""Hosts and the CPU work of transfers: what a pipelined (streaming) run shares.

Devices whose workers run on one machine share its cores, and moving an activation
between two worker processes is CPU work at both ends (and, with Ray's actor calls,
in the driver, which receives every intermediate result and sends it on). The cost
model counts that work in the throughput bottleneck. The hosts are hardware (cluster-file
keys); the CPU a transfer costs is what the engine adds, in the file's ``engine`` section
(``engine.py``):

* a device's ``host`` names an entry of the cluster's ``hosts``, which gives that
  machine's ``cores``;
* the engine's ``transfer_cpu`` gives per device ``{"fixed": s, "per_byte": s}``: the CPU seconds it
  spends on each transfer it sends or receives (``fixed + per_byte * bytes``). It may add
  ``"receive_per_byte": s``, the per-byte figure of a transfer it receives, where that
  differs from one it sends: with Ray, a node pulls an argument from another node
  (its daemon's work) but sends a result by writing it to its own store (fitted on the
  lab's Pi-class hosts: 40-44 ns per byte received against 9-14 sent);
* the engine's ``relay`` is ``{"device": NAME, "fixed": s, "per_byte": s}``: every
  transfer between two other devices passes through that device's process, which
  spends ``fixed + per_byte * bytes`` of CPU on it;
* either may add ``"inline_fixed": s``, the fixed figure of a transfer of at most the
  engine's ``inline_bytes``: with Ray, such a payload travels inside the call's own
  message, while a larger one goes through the object store, whose put, pull and release
  cost more per object (fitted on the lab's 0.46-core host: about 0.4 ms a transfer of
  64 bytes against 2.4-3.0 ms one of 4 KB);
* either may add ``"serial": {"fixed": s, "per_byte": s}``, the part of that CPU spent
  on the thread that computes the device's stages (Ray's actor calls also use I/O
  threads, which run beside the stages when the host has a core to spare). A device
  serves items one after another only as fast as that thread allows, so its own
  load counts the serial part; its host's load counts all of it. Without ``serial``
  all of it is serial.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from multigpu.partition.exceptions import ClusterError
from multigpu.partition.inputs.validate import check_keys, check_name, check_number, check_number_fields

__all__ = [
    "HostSpec",
    "Relay",
    "TransferCpu",
    "hosts_from_dict",
    "is_inline",
    "relay_from_dict",
    "transfer_cpu_from_dict",
]

TRANSFER_CPU_KEYS_REQUIRED = ("fixed",)
TRANSFER_CPU_KEYS_OPTIONAL = ("per_byte", "receive_per_byte", "inline_fixed", "serial")
RELAY_KEYS_OPTIONAL = ("per_byte", "inline_fixed", "serial")
SERIAL_KEYS_OPTIONAL = ("per_byte", "receive_per_byte", "inline_fixed")
RELAY_SERIAL_KEYS_OPTIONAL = ("per_byte", "inline_fixed")
RELAY_KEYS_REQUIRED = ("device", "fixed")
HOST_KEYS_REQUIRED = ("cores",)


def is_inline(nbytes: Any, inline_bytes: float) -> Any:
    """True (elementwise for an array) for a transfer of ``nbytes`` that travels inside the
    engine's own message: at most the engine's ``inline_bytes``, where that is not 0 (0
    means no inline regime, as for the links' ``inline_latency``)."""
    return np.logical_and(inline_bytes > 0, np.asarray(nbytes) <= inline_bytes)


def _check_cpu(obj: Any, what: str) -> None:
    """Check the figures a transfer CPU and a relay share: fixed, per_byte, inline_fixed and
    the serial part."""
    check_number_fields(
        obj,
        what,
        fixed={"unit": "CPU seconds per transfer; 0 if negligible"},
        per_byte={"unit": "CPU seconds per byte moved; 0 if negligible"},
    )
    if obj.inline_fixed is not None:
        object.__setattr__(
            obj,
            "inline_fixed",
            check_number(
                obj.inline_fixed,
                f"{what}: inline_fixed",
                unit="CPU seconds per transfer of at most the engine's inline_bytes; leave it out to use fixed",
            ),
        )
    _check_serial_inline(obj, what)
    if obj.serial_fixed is None and obj.serial_per_byte is None:
        return
    if obj.serial_fixed is None:
        raise ClusterError(
            f"{what}: serial is missing the key 'fixed'; give \"serial\": "
            f'{{"fixed": s, "per_byte": s}} or leave "serial" out (all of it serial)'
        )
    for key, total in (("fixed", obj.fixed), ("per_byte", obj.per_byte)):
        attr = f"serial_{key}"
        value = check_number(
            0.0 if getattr(obj, attr) is None else getattr(obj, attr),
            f"{what}: serial: {key}",
            unit="CPU seconds on the computing thread; 0 if none",
        )
        if value > total:
            raise ClusterError(
                f"{what}: serial: {key} = {value!r} is more than the whole {key} = {total!r}; the "
                f"serial part is the share of the CPU spent on the computing thread, at most all of it"
            )
        object.__setattr__(obj, attr, value)


def _by_regime(nbytes: Any, inline_bytes: float, figure: Callable[[bool], float]) -> Any:
    """``figure(inline)`` for a transfer of ``nbytes``: a number for a number, else an array."""
    inline = is_inline(nbytes, inline_bytes)
    if np.ndim(inline) == 0:
        return figure(bool(inline))
    return np.where(inline, figure(True), figure(False))


class _CpuFigures:
    """``fixed + per_byte * bytes`` of CPU (``inline_fixed`` in place of ``fixed`` for a
    transfer of at most the engine's ``inline_bytes``), and its serial part."""

    fixed: float
    per_byte: float
    serial_fixed: float | None
    serial_per_byte: float | None
    inline_fixed: float | None
    serial_inline_fixed: float | None

    def fixed_of(self, inline: bool) -> float:
        """The fixed figure of a transfer inside the engine's message (``inline``:
        ``inline_fixed``, or ``fixed`` where none is given) or through its store (``fixed``)."""
        return self.inline_fixed if inline and self.inline_fixed is not None else self.fixed

    def serial_fixed_of(self, inline: bool) -> float:
        """The serial part of ``fixed_of`` (all of it without ``serial``)."""
        if self.serial_fixed is None:
            return self.fixed_of(inline)
        return self.serial_inline_fixed if inline and self.serial_inline_fixed is not None else self.serial_fixed

    def fixed_for(self, nbytes: Any, inline_bytes: float = 0.0) -> Any:
        """The fixed figure of a transfer of ``nbytes`` (a number, or an array: one figure
        each) in a cluster whose ``inline_bytes`` is given."""
        return _by_regime(nbytes, inline_bytes, self.fixed_of)

    def serial_fixed_for(self, nbytes: Any, inline_bytes: float = 0.0) -> Any:
        """The serial part of ``fixed_for`` (all of it without ``serial``)."""
        return _by_regime(nbytes, inline_bytes, self.serial_fixed_of)

    def cost(self, nbytes: Any, inline_bytes: float = 0.0) -> Any:
        """CPU seconds for one transfer of ``nbytes`` (``inline_bytes``: the cluster's; a
        number, or an array: one figure each)."""
        return self.fixed_for(nbytes, inline_bytes) + self.per_byte * nbytes

    def serial_cost(self, nbytes: Any, inline_bytes: float = 0.0) -> Any:
        """The part of ``cost`` on the computing thread (all of it without ``serial``)."""
        if self.serial_fixed is None:
            return self.cost(nbytes, inline_bytes)
        return self.serial_fixed_for(nbytes, inline_bytes) + (self.serial_per_byte or 0.0) * nbytes

    def _figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fixed": self.fixed, "per_byte": self.per_byte}
        if self.inline_fixed is not None:
            out["inline_fixed"] = self.inline_fixed
        if self.serial_fixed is not None:
            out["serial"] = {"fixed": self.serial_fixed, "per_byte": self.serial_per_byte or 0.0}
            if self.serial_inline_fixed is not None:
                out["serial"]["inline_fixed"] = self.serial_inline_fixed
        return out


def _check_serial_inline(obj: Any, what: str) -> None:
    """The serial part's inline_fixed: present exactly when both the whole has one and a
    serial part is given, and at most the whole's."""
    serial_inline = obj.serial_inline_fixed
    if obj.serial_fixed is None or obj.inline_fixed is None:
        if serial_inline is not None:
            missing = "'inline_fixed'" if obj.inline_fixed is None else '"serial": {"fixed": ...}'
            raise ClusterError(
                f"{what}: serial: inline_fixed = {serial_inline!r} needs {missing} as well; give "
                f"both or leave serial's inline_fixed out"
            )
        return
    if serial_inline is None:
        raise ClusterError(
            f"{what}: serial is missing the key 'inline_fixed' (the whole has one); give "
            f'"serial": {{"fixed": s, "per_byte": s, "inline_fixed": s}} or leave "serial" '
            f"out (all of it serial)"
        )
    value = check_number(
        serial_inline, f"{what}: serial: inline_fixed", unit="CPU seconds on the computing thread; 0 if none"
    )
    if value > obj.inline_fixed:
        raise ClusterError(
            f"{what}: serial: inline_fixed = {value!r} is more than the whole inline_fixed = "
            f"{obj.inline_fixed!r}; the serial part is the share of the CPU spent on the computing "
            f"thread, at most all of it"
        )
    object.__setattr__(obj, "serial_inline_fixed", value)


def _serial_from(value: Any, what: str, receive: bool = False) -> dict[str, float | None]:
    """The keyword arguments of ``value``'s serial part: serial_fixed, serial_per_byte,
    serial_inline_fixed and, with ``receive``, serial_receive_per_byte (None where absent)."""
    out: dict[str, float | None] = {"serial_fixed": None, "serial_per_byte": None, "serial_inline_fixed": None}
    if receive:
        out["serial_receive_per_byte"] = None
    if "serial" not in value:
        return out
    keys = SERIAL_KEYS_OPTIONAL if receive else RELAY_SERIAL_KEYS_OPTIONAL
    serial = check_keys(value["serial"], f"{what}: serial", TRANSFER_CPU_KEYS_REQUIRED, keys)
    out.update(
        serial_fixed=serial["fixed"],
        serial_per_byte=serial.get("per_byte", 0.0),
        serial_inline_fixed=serial.get("inline_fixed"),
    )
    if receive:
        out["serial_receive_per_byte"] = serial.get("receive_per_byte")
    return out


@dataclass(frozen=True)
class HostSpec:
    """A machine whose ``cores`` (CPU cores the devices on it may use) its devices share."""

    name: str
    cores: float

    def __post_init__(self) -> None:
        check_name(self.name, "host name")
        object.__setattr__(
            self,
            "cores",
            check_number(
                self.cores,
                f"host {self.name!r}: cores",
                strict=True,
                unit="CPU cores the devices on this host may use, e.g. 2",
            ),
        )


@dataclass(frozen=True)
class TransferCpu(_CpuFigures):
    """CPU seconds a device spends on each transfer it sends (``cost``: ``fixed + per_byte
    * bytes``) or receives (``receive_cost``: ``fixed + receive_per_byte * bytes``, with
    ``per_byte`` where ``receive_per_byte`` is None), of which ``serial_fixed +
    serial_per_byte * bytes`` (``serial_receive_per_byte`` for a receive) on the thread
    that computes its stages (None: all of it)."""

    fixed: float
    per_byte: float = 0.0
    serial_fixed: float | None = None
    serial_per_byte: float | None = None
    receive_per_byte: float | None = None
    serial_receive_per_byte: float | None = None
    inline_fixed: float | None = None
    serial_inline_fixed: float | None = None

    def __post_init__(self) -> None:
        what = "transfer_cpu"
        _check_cpu(self, what)
        receive = self.receive_per_byte
        if receive is not None:
            object.__setattr__(
                self,
                "receive_per_byte",
                check_number(
                    receive,
                    f"{what}: receive_per_byte",
                    unit="CPU seconds per byte received; leave it out to use per_byte",
                ),
            )
        serial_receive = self.serial_receive_per_byte
        if self.serial_fixed is None:
            if serial_receive is not None:
                raise ClusterError(
                    f"{what}: serial: receive_per_byte needs serial's 'fixed'; give \"serial\": "
                    f'{{"fixed": s, "per_byte": s, "receive_per_byte": s}}'
                )
            return
        if serial_receive is None:
            if receive is not None:
                raise ClusterError(
                    f"{what}: serial is missing the key 'receive_per_byte' (the whole has one); give "
                    f'"serial": {{"fixed": s, "per_byte": s, "receive_per_byte": s}} or '
                    f'leave "serial" out (all of it serial)'
                )
            return
        value = check_number(
            serial_receive,
            f"{what}: serial: receive_per_byte",
            unit="CPU seconds per byte received on the computing thread; 0 if none",
        )
        whole, name = (
            (self.per_byte, "per_byte (it has no receive_per_byte)")
            if receive is None
            else (receive, "receive_per_byte")
        )
        if value > whole:
            raise ClusterError(
                f"{what}: serial: receive_per_byte = {value!r} is more than the whole {name} "
                f"= {whole!r}; the serial part is the share of the CPU spent on the computing thread, "
                f"at most all of it"
            )
        object.__setattr__(self, "serial_receive_per_byte", value)

    def receive_cost(self, nbytes: float, inline_bytes: float = 0.0) -> float:
        """CPU seconds for receiving one transfer of ``nbytes`` (``inline_bytes``: the cluster's)."""
        per = self.per_byte if self.receive_per_byte is None else self.receive_per_byte
        return self.fixed_for(nbytes, inline_bytes) + per * nbytes

    def serial_receive_cost(self, nbytes: float, inline_bytes: float = 0.0) -> float:
        """The part of ``receive_cost`` on the computing thread (all of it without ``serial``)."""
        if self.serial_fixed is None:
            return self.receive_cost(nbytes, inline_bytes)
        per = self.serial_per_byte if self.serial_receive_per_byte is None else self.serial_receive_per_byte
        return self.serial_fixed_for(nbytes, inline_bytes) + (per or 0.0) * nbytes

    def to_dict(self) -> dict[str, Any]:
        """The file form."""
        out = self._figures()
        if self.receive_per_byte is not None:
            out["receive_per_byte"] = self.receive_per_byte
        if self.serial_receive_per_byte is not None and "serial" in out:
            out["serial"]["receive_per_byte"] = self.serial_receive_per_byte
        return out


@dataclass(frozen=True)
class Relay(_CpuFigures):
    """The device whose process every transfer between two other devices passes
    through, and the CPU seconds it spends on each: ``fixed + per_byte * bytes``, of
    which ``serial_fixed + serial_per_byte * bytes`` on its computing thread."""

    device: str
    fixed: float
    per_byte: float = 0.0
    serial_fixed: float | None = None
    serial_per_byte: float | None = None
    inline_fixed: float | None = None
    serial_inline_fixed: float | None = None

    def __post_init__(self) -> None:
        check_name(self.device, "relay: device")
        _check_cpu(self, "relay")

    def to_dict(self) -> dict[str, Any]:
        """The file form."""
        return {"device": self.device, **self._figures()}


def transfer_cpu_from_dict(value: Any, what: str) -> TransferCpu:
    """A device's ``transfer_cpu`` from the file; ClusterError naming the bad key or value."""
    if isinstance(value, TransferCpu):
        return value
    check_keys(value, f"{what}: transfer_cpu", TRANSFER_CPU_KEYS_REQUIRED, TRANSFER_CPU_KEYS_OPTIONAL)
    try:
        return TransferCpu(
            value["fixed"],
            value.get("per_byte", 0.0),
            receive_per_byte=value.get("receive_per_byte"),
            inline_fixed=value.get("inline_fixed"),
            **_serial_from(value, "transfer_cpu", receive=True),
        )
    except ClusterError as e:
        raise ClusterError(f"{what}: {e}") from None


def relay_from_dict(value: Any, what: str) -> Relay:
    """The cluster's ``relay`` from the file; ClusterError naming the bad key or value."""
    if isinstance(value, Relay):
        return value
    check_keys(value, f"{what}: relay", RELAY_KEYS_REQUIRED, RELAY_KEYS_OPTIONAL)
    return Relay(
        value["device"],
        value["fixed"],
        value.get("per_byte", 0.0),
        inline_fixed=value.get("inline_fixed"),
        **_serial_from(value, "relay"),
    )


def hosts_from_dict(value: Any, what: str) -> tuple[HostSpec, ...]:
    """The cluster's ``hosts`` (an object mapping each host name to ``{"cores": N}``)."""
    if not isinstance(value, Mapping) or not value:
        raise ClusterError(
            f'{what}: "hosts" must be a non-empty object mapping a host name to its '
            f'cores, e.g. {{"box": {{"cores": 8}}}}; got {value!r:.80}'
        )
    out = []
    for name, entry in value.items():
        check_name(name, f"{what}: a host name")
        check_keys(entry, f"{what}: hosts[{name!r}]", HOST_KEYS_REQUIRED)
        out.append(HostSpec(name, entry["cores"]))
    return tuple(out)
