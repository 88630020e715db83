"""The engine profile: what running a plan on one execution engine adds to the hardware.

A cluster file describes hardware (devices' compute, memory and power, links' bandwidth,
latency and power, the hosts' cores, an optional per-stage overhead). What an engine adds
on top of that lives in the file's optional ``"engine"`` section, read into an
``EngineProfile``; ``multigpu profile`` (``multigpu.execution``, which owns the figures for
its Ray engine) measures and writes it:

* ``inline_bytes``: the largest transfer the engine sends inside its own message (Ray's
  ``max_direct_call_object_size`` less its framing; 0: one regime), and ``inline_latency``
  (a list of ``{"between": [a, b], "latency": s}``) with ``default_inline_latency``: the
  latency of such a transfer on a link, where it differs from the link's ``latency``;
* ``message_bytes``: what the engine's messages add on the wire to a transfer;
* ``transfer_cpu``: per device name, the CPU it spends on each transfer (``hosts.py``);
* ``relay``: the device every transfer between two others passes through (``hosts.py``);
* ``warm_pass``: per device name, per graph name, the seconds of a whole pass when a plan
  with every layer there runs item after item.

The cost model reads these figures through the profile only: ``EngineVectors`` lays them
out in a cluster's device order for the arithmetic and the solvers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from multigpu.partition.exceptions import ClusterError
from multigpu.partition.inputs.hosts import Relay, TransferCpu, is_inline, relay_from_dict, transfer_cpu_from_dict
from multigpu.partition.inputs.validate import check_keys, check_name, check_number, check_number_map

__all__ = ["ENGINE_KEYS", "EngineProfile", "EngineVectors", "engine_from_flat_keys"]

ENGINE_KEYS = (
    "name",
    "inline_bytes",
    "inline_latency",
    "default_inline_latency",
    "message_bytes",
    "transfer_cpu",
    "relay",
    "warm_pass",
)
INLINE_LATENCY_KEYS = ("between", "latency")
# The keys older cluster files held outside "engine": (where, key).
FLAT_CLUSTER_KEYS = ("relay", "inline_bytes", "message_bytes")
FLAT_DEVICE_KEYS = ("transfer_cpu", "warm_pass")
FLAT_LINK_KEYS = ("inline_latency",)


@dataclass(frozen=True)
class EngineProfile:
    """The figures one execution engine adds to a cluster's hardware (see the module).

    ``inline_latency`` holds ``(a, b, seconds)`` per link (symmetric) and
    ``default_inline_latency`` the default link's; a pair with neither uses its latency.
    ``transfer_cpu`` and ``warm_pass`` are keyed by device name.
    """

    name: str = "ray"
    inline_bytes: int = 0
    inline_latency: tuple[tuple[str, str, float], ...] = ()
    default_inline_latency: float | None = None
    message_bytes: float | None = None
    transfer_cpu: Mapping[str, TransferCpu] = field(default_factory=dict, hash=False)
    relay: Relay | None = None
    warm_pass: Mapping[str, Mapping[str, float]] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        check_name(self.name, "engine: name")
        ib = self.inline_bytes
        if isinstance(ib, bool) or not isinstance(ib, (int, np.integer)) or ib < 0:
            raise ClusterError(
                f"engine: inline_bytes={ib!r} must be a whole number of bytes >= 0 (the largest "
                f"transfer the engine sends inside its own message, e.g. 102144 for Ray's default "
                f"max_direct_call_object_size less its framing); leave it out for one latency per link"
            )
        object.__setattr__(self, "inline_bytes", int(ib))
        lat = []
        for entry in self.inline_latency:
            if not isinstance(entry, Sequence) or len(entry) != 3:
                raise ClusterError(f"engine: inline_latency entry {entry!r} must be (device, device, seconds)")
            a, b, s = entry
            what = f"engine: inline_latency between [{a!r}, {b!r}]"
            lat.append((check_name(a, what), check_name(b, what), check_number(s, what, unit=_INLINE_UNIT)))
        object.__setattr__(self, "inline_latency", tuple(lat))
        if self.default_inline_latency is not None:
            object.__setattr__(
                self,
                "default_inline_latency",
                check_number(self.default_inline_latency, "engine: default_inline_latency", unit=_INLINE_UNIT),
            )
        if self.message_bytes is not None:
            object.__setattr__(
                self,
                "message_bytes",
                check_number(
                    self.message_bytes,
                    "engine: message_bytes",
                    unit="bytes the engine's messages add to a transfer on the wire, e.g. 2300; "
                    "leave it out to charge each transfer its hop time in the throughput bottleneck",
                ),
            )
        cpu = {}
        for device, fig in dict(self.transfer_cpu).items():
            check_name(device, "engine: a transfer_cpu device name")
            cpu[device] = transfer_cpu_from_dict(fig, f"engine: device {device!r}")
        object.__setattr__(self, "transfer_cpu", cpu)
        if self.relay is not None:
            object.__setattr__(self, "relay", relay_from_dict(self.relay, "engine"))
        warm = {}
        for device, passes in dict(self.warm_pass).items():
            what = f"engine: device {device!r}"
            check_name(device, "engine: a warm_pass device name")
            warm[device] = check_number_map(
                passes,
                what,
                "warm_pass",
                "a warm_pass graph name",
                f"{what}: warm_pass must be a non-empty object mapping a graph name such as "
                f'"lenet(batch=1)" to the seconds of a whole pass run one after another; re-profile with '
                f"multigpu profile, or leave the device out",
                unit="seconds of a whole pass; measured times are positive and finite",
            )
        object.__setattr__(self, "warm_pass", warm)
        self._check_inline_cpu()

    def _check_inline_cpu(self) -> None:
        """An ``inline_fixed`` transfer CPU figure needs the threshold it applies under."""
        if self.inline_bytes:
            return
        owners: list[tuple[str, TransferCpu | Relay | None]] = [
            (f"engine: device {d!r}: transfer_cpu", f) for d, f in self.transfer_cpu.items()
        ]
        owners.append(("engine: relay", self.relay))
        for what, fig in owners:
            if fig is not None and fig.inline_fixed is not None:
                raise ClusterError(
                    f"{what}: inline_fixed = {fig.inline_fixed!r} prices a transfer of at most the "
                    f'engine\'s inline_bytes, which is 0 (not given); give "inline_bytes" in "engine" '
                    f"(e.g. 102144 for Ray's default) or leave inline_fixed out"
                )

    def check_devices(self, names: Sequence[str], linked: Mapping[frozenset[str], Any]) -> None:
        """ClusterError unless every device the profile names is one of ``names``, and every
        ``inline_latency`` pair is a listed link (``linked``, keyed by the pair)."""
        known = ", ".join(names)
        named = [(f"transfer_cpu[{d!r}]", d) for d in self.transfer_cpu]
        named += [(f"warm_pass[{d!r}]", d) for d in self.warm_pass]
        if self.relay is not None:
            named.append(("relay device", self.relay.device))
        for what, device in named:
            if device not in names:
                raise ClusterError(
                    f"engine: {what} names {device!r}, which is not a device; choose one of: {known}"
                    + (" (the driver, for Ray's actor calls)" if what == "relay device" else "")
                )
        seen: set[frozenset[str]] = set()
        for a, b, _ in self.inline_latency:
            pair = frozenset((a, b))
            if pair not in linked:
                raise ClusterError(
                    f"engine: inline_latency between [{a!r}, {b!r}] is for no link of the cluster; list "
                    f'that link under "links", or give the default link\'s as "default_inline_latency"'
                )
            if pair in seen:
                raise ClusterError(f"engine: inline_latency between [{a!r}, {b!r}] is given twice; keep one")
            seen.add(pair)

    def link_inline_latency(self, a: str, b: str) -> float | None:
        """The inline latency of the link between ``a`` and ``b`` (a listed one), or None."""
        return next((s for x, y, s in self.inline_latency if {x, y} == {a, b}), None)

    # -- (de)serialisation ------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Any, what: str = "cluster") -> EngineProfile:
        """The ``"engine"`` section of a cluster file; ClusterError naming a bad key or value."""
        check_keys(data, f"{what}: engine", (), ENGINE_KEYS)
        lat = data.get("inline_latency", [])
        if not isinstance(lat, list):
            raise ClusterError(
                f'{what}: engine: inline_latency must be a list of {{"between": [a, b], "latency": s}}, got {lat!r:.80}'
            )
        pairs = []
        for i, entry in enumerate(lat):
            check_keys(entry, f"{what}: engine: inline_latency[{i}]", INLINE_LATENCY_KEYS)
            between = entry["between"]
            if isinstance(between, (str, bytes)) or not isinstance(between, Sequence) or len(between) != 2:
                raise ClusterError(
                    f"{what}: engine: inline_latency[{i}]: between={between!r} must list exactly two device names"
                )
            pairs.append((between[0], between[1], entry["latency"]))
        for key in ("transfer_cpu", "warm_pass"):
            if key in data and not isinstance(data[key], Mapping):
                raise ClusterError(
                    f"{what}: engine: {key} must be an object mapping a device name to its figures, "
                    f"got {data[key]!r:.80}"
                )
        return cls(
            name=data.get("name", "ray"),
            inline_bytes=data.get("inline_bytes", 0),
            inline_latency=tuple(pairs),
            default_inline_latency=data.get("default_inline_latency"),
            message_bytes=data.get("message_bytes"),
            transfer_cpu=dict(data.get("transfer_cpu", {})),
            relay=data.get("relay"),
            warm_pass=dict(data.get("warm_pass", {})),
        )

    def to_dict(self) -> dict[str, Any]:
        """The file form (round-trips through ``from_dict``)."""
        out: dict[str, Any] = {"name": self.name}
        if self.inline_bytes:
            out["inline_bytes"] = self.inline_bytes
        if self.inline_latency:
            out["inline_latency"] = [{"between": [a, b], "latency": s} for a, b, s in self.inline_latency]
        if self.default_inline_latency is not None:
            out["default_inline_latency"] = self.default_inline_latency
        if self.message_bytes is not None:
            out["message_bytes"] = self.message_bytes
        if self.transfer_cpu:
            out["transfer_cpu"] = {d: f.to_dict() for d, f in self.transfer_cpu.items()}
        if self.relay is not None:
            out["relay"] = self.relay.to_dict()
        if self.warm_pass:
            out["warm_pass"] = {d: dict(p) for d, p in self.warm_pass.items()}
        return out


_INLINE_UNIT = "seconds per transfer of at most the engine's inline_bytes; leave it out to use the link's latency"


def engine_from_flat_keys(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Move the engine keys an older cluster file held beside the hardware (``relay``,
    ``inline_bytes``, ``message_bytes``; a device's ``transfer_cpu`` and ``warm_pass``; a
    link's ``inline_latency``) into an ``"engine"`` section: (the new file structure,
    the keys moved, as "where: key"). ``data`` is left as it is."""
    out = dict(data)
    engine: dict[str, Any] = dict(out.get("engine", {})) if isinstance(out.get("engine"), Mapping) else {}
    moved: list[str] = []
    for key in FLAT_CLUSTER_KEYS:
        if key in out:
            engine[key] = out.pop(key)
            moved.append(key)
    devices = out.get("devices")
    if isinstance(devices, list):
        new_devices = []
        for d in devices:
            if isinstance(d, Mapping) and any(k in d for k in FLAT_DEVICE_KEYS):
                d = dict(d)
                for key in FLAT_DEVICE_KEYS:
                    if key in d:
                        value = d.pop(key)
                        engine.setdefault(key, {})[d.get("name")] = value
                        moved.append(f"devices[{d.get('name')!r}]: {key}")
            new_devices.append(d)
        out["devices"] = new_devices
    links = out.get("links")
    if isinstance(links, list):
        new_links = []
        for ln in links:
            if isinstance(ln, Mapping) and "inline_latency" in ln:
                ln = dict(ln)
                engine.setdefault("inline_latency", []).append(
                    {"between": ln.get("between"), "latency": ln.pop("inline_latency")}
                )
                moved.append(f"links between {ln.get('between')!r}: inline_latency")
            new_links.append(ln)
        out["links"] = new_links
    dl = out.get("default_link")
    if isinstance(dl, Mapping) and "inline_latency" in dl:
        dl = dict(dl)
        engine["default_inline_latency"] = dl.pop("inline_latency")
        out["default_link"] = dl
        moved.append("default_link: inline_latency")
    if moved:
        out["engine"] = engine
    return out, moved


@dataclass(frozen=True)
class EngineVectors:
    """An engine profile's transfer figures laid out in a cluster's device order (shape (k,)
    each; 0 where a device has no ``transfer_cpu``): the one place the cost model and the
    solvers read them.

    ``cpu_fixed``/``cpu_inline_fixed``: CPU seconds per transfer a device sends or
    receives, through the engine's store or inside its message; ``cpu_per_byte`` per byte
    sent, ``cpu_receive_per_byte`` per byte received; each ``cpu_serial_*`` the part on the
    device's computing thread. ``relay_index``: the relay's column (-1: none).
    ``cpu_links`` (k, k): a pair on one host whose devices both have ``transfer_cpu``
    (moving data between them is CPU work of that host, no link load).
    """

    cpu_fixed: np.ndarray
    cpu_inline_fixed: np.ndarray
    cpu_serial_fixed: np.ndarray
    cpu_serial_inline_fixed: np.ndarray
    cpu_per_byte: np.ndarray
    cpu_receive_per_byte: np.ndarray
    cpu_serial_per_byte: np.ndarray
    cpu_serial_receive_per_byte: np.ndarray
    cpu_links: np.ndarray
    relay_index: int
    relay: Relay | None
    inline_bytes: int

    @classmethod
    def build(cls, profile: EngineProfile | None, names: Sequence[str], host_index: np.ndarray) -> EngineVectors:
        """The vectors of ``profile`` (None: an engine that adds nothing) for devices ``names``
        with hosts ``host_index`` (-1: none)."""
        prof = profile if profile is not None else EngineProfile()
        figs = [prof.transfer_cpu.get(n) for n in names]

        def vec(f: Any) -> np.ndarray:
            out = np.array([0.0 if t is None else f(t) for t in figs], dtype=float)
            out.flags.writeable = False
            return out

        has = np.array([t is not None for t in figs], dtype=bool)
        h = np.asarray(host_index)
        links = (h[:, None] == h[None, :]) & (h[:, None] >= 0) & has[:, None] & has[None, :]
        np.fill_diagonal(links, False)
        links.flags.writeable = False
        relay = prof.relay
        return cls(
            cpu_fixed=vec(lambda t: t.fixed),
            cpu_inline_fixed=vec(lambda t: t.fixed_of(True)),
            cpu_serial_fixed=vec(lambda t: t.serial_cost(0.0)),
            cpu_serial_inline_fixed=vec(lambda t: t.serial_fixed_of(True)),
            cpu_per_byte=vec(lambda t: t.per_byte),
            cpu_receive_per_byte=vec(lambda t: t.receive_cost(1.0) - t.fixed),
            cpu_serial_per_byte=vec(lambda t: t.serial_cost(1.0) - t.serial_cost(0.0)),
            cpu_serial_receive_per_byte=vec(lambda t: t.serial_receive_cost(1.0) - t.serial_receive_cost(0.0)),
            cpu_links=links,
            relay_index=-1 if relay is None else list(names).index(relay.device),
            relay=relay,
            inline_bytes=prof.inline_bytes,
        )

    def transfer_cpu_terms(
        self, u: np.ndarray, v: np.ndarray, b: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """What the engine charges in CPU for transfers u[j] -> v[j] of b[j] bytes (u != v), as
        (j, device, seconds, serial seconds) terms: the sender's send figure, the receiver's
        receive figure, and the relay's figure where the relay is neither end; the serial
        seconds are the part on the device's computing thread. Empty when no transfer costs CPU."""
        u, v, b = np.asarray(u, dtype=np.intp), np.asarray(v, dtype=np.intp), np.asarray(b, dtype=float)
        if not self.has_transfer_cpu or len(u) == 0:
            empty = np.zeros(0, dtype=np.intp)
            return empty, empty, np.zeros(0), np.zeros(0)
        # A transfer of at most inline_bytes travels inside the engine's own message: its
        # fixed figures are the inline ones (``fixed`` where a device gives none).
        inline = is_inline(b, self.inline_bytes)

        def fixed(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return (
                np.where(inline, self.cpu_inline_fixed[d], self.cpu_fixed[d]),
                np.where(inline, self.cpu_serial_inline_fixed[d], self.cpu_serial_fixed[d]),
            )

        (fu, sfu), (fv, sfv) = fixed(u), fixed(v)
        c, cr = self.cpu_per_byte, self.cpu_receive_per_byte
        sc, scr = self.cpu_serial_per_byte, self.cpu_serial_receive_per_byte
        j = np.arange(len(u))
        parts = [(j, u, fu + c[u] * b, sfu + sc[u] * b), (j, v, fv + cr[v] * b, sfv + scr[v] * b)]
        r = self.relay_index
        if r >= 0 and self.relay is not None:
            via = (u != r) & (v != r)
            bv, ib = b[via], self.inline_bytes
            parts.append((j[via], np.full(int(via.sum()), r), self.relay.cost(bv, ib), self.relay.serial_cost(bv, ib)))
        index, device, seconds, serial = (np.concatenate([p[i] for p in parts]) for i in range(4))
        return index, device, seconds, serial

    @property
    def has_transfer_cpu(self) -> bool:
        """True when some transfer costs CPU (a device's transfer_cpu or a relay)."""
        some = bool(self.cpu_fixed.any() or self.cpu_per_byte.any() or self.cpu_receive_per_byte.any())
        return some or (self.relay is not None and (self.relay.fixed > 0 or self.relay.per_byte > 0))
