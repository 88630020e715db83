"""Clusters: devices, the links between them, and where the input starts and ends.

A cluster is read from JSON or TOML with exactly the keys ``devices``, ``links``,
``default_link``, ``source`` and ``sink`` (only ``devices`` and ``source`` are
required). Shipped examples live in ``multigpu/partition/inputs/clusters/`` and can be named
without a path (``load_cluster("lab")``).

A device may also say how to run a stage on it (``backend``, ``device``,
``threads``, ``resources``: read by ``multigpu run``) and carry measured figures
(``layer_times`` and ``stage_overhead``: written by ``multigpu profile``, read by the
cost model, where a measured time overrides ``flops``). A device's ``host`` names an
entry of ``hosts``, the machines whose cores devices share (``hosts.py``).

What an execution engine adds to this hardware (the inline threshold, transfer CPU, the
relay, warm passes, message bytes) is the optional ``engine`` section, an
``EngineProfile`` (``engine.py``). Older files held those keys beside the hardware; they
are still read, moved into ``engine``, with a DeprecationWarning naming them.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from multigpu.checks import check_count
from multigpu.partition.exceptions import ClusterError
from multigpu.partition.inputs.engine import EngineProfile, EngineVectors, engine_from_flat_keys
from multigpu.partition.inputs.files import read_structured_file
from multigpu.partition.inputs.hosts import HostSpec, Relay, TransferCpu, hosts_from_dict, is_inline
from multigpu.partition.inputs.validate import (
    check_keys,
    check_name,
    check_number,
    check_number_fields,
    check_number_map,
)

__all__ = [
    "Cluster",
    "DeviceSpec",
    "EngineProfile",
    "HostSpec",
    "Link",
    "LinkSpec",
    "LinkTables",
    "Relay",
    "TransferCpu",
    "as_cluster",
    "load_cluster",
    "shipped_clusters",
    "transfer_latency",
]

CLUSTER_KEYS_REQUIRED = ("devices", "source")
CLUSTER_KEYS_OPTIONAL = ("links", "default_link", "sink", "hosts", "engine")
DEVICE_KEYS_REQUIRED = ("name", "flops", "power")
DEVICE_KEYS_OPTIONAL = (
    "memory",
    "backend",
    "device",
    "threads",
    "resources",
    "layer_times",
    "stage_overhead",
    "host",
)
FRAMEWORK_DEVICE = re.compile(r"cpu|(?:gpu|cuda):\d+")
LINK_KEYS_REQUIRED = ("between", "bandwidth", "latency")
LINK_KEYS_OPTIONAL = ("power",)
DEFAULT_LINK_KEYS_REQUIRED = ("bandwidth", "latency")


@dataclass(frozen=True)
class DeviceSpec:
    """One device: ``flops`` (FLOP/s), ``power`` (W while computing), optional
    ``memory`` (bytes; ``None`` means unlimited).

    How ``multigpu run`` runs a stage here (all optional): ``backend`` (an adapter
    name such as "torch"), ``device`` (the framework device, "cpu" or "gpu:0";
    default "cpu"), ``threads`` (math threads of the worker process) and
    ``resources`` (Ray resources that pin the worker to a node, e.g. {"pi1": 1};
    "CPU" and "GPU" are Ray's CPU and GPU counts).

    Measured figures (``multigpu profile`` writes them): ``layer_times`` maps a graph
    name (such as "lenet(batch=1)") to each of its layers' forward time in seconds on
    this device; for that graph they replace ``flops``. ``stage_overhead`` (seconds,
    default 0) is what starting a stage here costs beyond its layers' times: the
    first layer of a call runs slower than the same layer in the middle of a pass
    (a worker woken from waiting has cold caches); the cost model adds it once per
    stage. ``host`` names the entry of the cluster's ``hosts`` whose cores this device's
    worker shares with the other devices there (the throughput bottleneck counts it).
    """

    name: str
    flops: float
    power: float
    memory: float | None = None
    backend: str | None = None
    device: str | None = None
    threads: int | None = None
    resources: Mapping[str, float] | None = field(default=None, hash=False)
    layer_times: Mapping[str, Mapping[str, float]] | None = field(default=None, hash=False)
    stage_overhead: float = 0.0
    host: str | None = None

    def __post_init__(self) -> None:
        check_name(self.name, "device name")
        what = f"device {self.name!r}"
        check_number_fields(
            self,
            what,
            flops={"strict": True, "unit": "FLOP/s, e.g. 38.4e9"},
            power={"unit": "W while computing; 0 if unknown"},
        )
        if self.memory is not None:
            object.__setattr__(
                self,
                "memory",
                check_number(
                    self.memory, f"{what}: memory", strict=True, unit="bytes; leave the key out for unlimited memory"
                ),
            )
        if self.backend is not None:
            check_name(self.backend, f"{what}: backend")
        if self.device is not None:
            if not isinstance(self.device, str) or not FRAMEWORK_DEVICE.fullmatch(self.device.strip().lower()):
                raise ClusterError(
                    f'{what}: device={self.device!r} is not a framework device; write "cpu" or "gpu:0" (a GPU index)'
                )
            object.__setattr__(self, "device", self.device.strip().lower().replace("cuda", "gpu"))
        if self.threads is not None:
            check_count(
                self.threads, f"{what}: threads", example="1 (math threads of the worker process)", error=ClusterError
            )
        if self.resources is not None:
            object.__setattr__(self, "resources", _check_resources(self.resources, what))
        if self.layer_times is not None:
            object.__setattr__(self, "layer_times", _check_layer_times(self.layer_times, what))
        object.__setattr__(
            self,
            "stage_overhead",
            check_number(self.stage_overhead, f"{what}: stage_overhead", unit="seconds per stage; 0 if not measured"),
        )
        if self.host is not None:
            check_name(self.host, f"{what}: host")

    def measured(self, graph_name: str) -> Mapping[str, float] | None:
        """The measured per-layer times of graph ``graph_name`` on this device, or None."""
        return None if self.layer_times is None else self.layer_times.get(graph_name)


def _check_resources(value: Any, what: str) -> dict[str, float]:
    return check_number_map(
        value,
        what,
        "resources",
        "a resource name",
        f"{what}: resources must be a non-empty object of Ray resource amounts, "
        f'e.g. {{"pi1": 1}} or {{"GPU": 1}}; got {value!r:.80}',
        unit="an amount of the Ray resource, e.g. 1",
    )


def _check_layer_times(value: Any, what: str) -> dict[str, dict[str, float]]:
    fix = 're-profile with multigpu profile, or write {"GRAPH": {"LAYER": seconds}}'
    if not isinstance(value, Mapping) or not value:
        raise ClusterError(
            f"{what}: layer_times must be a non-empty object mapping a graph name "
            f'such as "lenet(batch=1)" to per-layer seconds; {fix}'
        )
    out: dict[str, dict[str, float]] = {}
    for graph, times in value.items():
        check_name(graph, f"{what}: a layer_times graph name")
        out[graph] = check_number_map(
            times,
            what,
            f"layer_times[{graph!r}]",
            f"a layer name in layer_times[{graph!r}]",
            f"{what}: layer_times[{graph!r}] must be a non-empty object mapping layer names to seconds; {fix}",
            unit="seconds; measured times are positive and finite",
        )
    return out


def _check_link_numbers(obj: Any, what: str) -> None:
    check_number_fields(
        obj,
        what,
        bandwidth={"strict": True, "unit": "bytes/s, e.g. 1e6 for 1 MB/s"},
        latency={"unit": "seconds per transfer; 0 if negligible"},
        power={"unit": "W while transferring; 0 if not modelled"},
    )


@dataclass(frozen=True)
class LinkSpec:
    """Parameters of the default link: ``bandwidth`` (bytes/s), ``latency`` (s per
    transfer) and ``power`` (W while transferring)."""

    bandwidth: float
    latency: float
    power: float = 0.0

    def __post_init__(self) -> None:
        _check_link_numbers(self, "default_link")


@dataclass(frozen=True)
class Link:
    """A symmetric link ``between`` two named devices, with ``bandwidth`` (bytes/s),
    ``latency`` (s per transfer) and ``power`` (W while transferring)."""

    between: tuple[str, str]
    bandwidth: float
    latency: float
    power: float = 0.0

    def __post_init__(self) -> None:
        pair = self.between
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise ClusterError(
                f'link between={pair!r} must list exactly two device names, e.g. "between": ["pi1", "desk"]'
            )
        a = check_name(pair[0], f"link between={list(pair)!r}: first device")
        b = check_name(pair[1], f"link between={list(pair)!r}: second device")
        if a == b:
            raise ClusterError(
                f"link between [{a!r}, {b!r}] joins a device to itself; "
                f"remove it: a device needs no link to itself (transfers on it cost 0)"
            )
        object.__setattr__(self, "between", (a, b))
        _check_link_numbers(self, f"link between [{a!r}, {b!r}]")


def transfer_latency(nbytes: Any, latency: Any, inline_latency: Any, inline_bytes: float) -> Any:
    """The latency of a transfer of ``nbytes``: ``inline_latency`` for at most ``inline_bytes``
    (the engine profile's: Ray's replies carry those inline), ``latency`` otherwise or when
    ``inline_latency`` is None. Numbers or numpy arrays that broadcast; the one place the two latency regimes are
    chosen, by the test the transfer CPU uses too (``is_inline``: 0 means no inline regime)."""
    if inline_latency is None:
        return latency
    return np.where(is_inline(nbytes, inline_bytes), inline_latency, latency)


@dataclass(frozen=True)
class LinkTables:
    """Dense k x k link matrices in cluster device order.

    ``usable[u, v]`` is True on the diagonal and where a link or the default link
    exists. ``inv_bandwidth``, ``latency`` and ``power`` are 0 on the diagonal and on
    unusable pairs, so arithmetic on them never meets inf/NaN; callers mask with
    ``usable``.
    """

    usable: np.ndarray
    inv_bandwidth: np.ndarray
    latency: np.ndarray
    power: np.ndarray
    # From the engine profile: transfers of at most ``inline_bytes`` cost ``inline_latency``
    # instead of ``latency`` (Ray sends them inside its own reply, not through its store).
    inline_latency: np.ndarray | None = None
    inline_bytes: float = 0.0
    # What the engine's messages add on the wire to a transfer (None: unknown; the
    # bottleneck then charges the whole hop time).
    message_bytes: float | None = None

    def latency_for(self, nbytes: Any) -> np.ndarray:
        """The latency of a transfer of ``nbytes``: k x k for a number, (m, k, k) for m sizes."""
        shape = np.shape(nbytes)
        b = np.asarray(nbytes, dtype=float).reshape(shape + (1, 1))  # one k x k table per size
        got = transfer_latency(b, self.latency, self.inline_latency, self.inline_bytes)
        return np.broadcast_to(got, shape + self.latency.shape).copy()

    def latency_at(self, nbytes: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Latency of each transfer ``nbytes[i]`` from device ``u[i]`` to ``v[i]``."""
        inline = None if self.inline_latency is None else self.inline_latency[u, v]
        return transfer_latency(nbytes, self.latency[u, v], inline, self.inline_bytes)

    def hop_seconds(self, nbytes: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Seconds of each transfer ``nbytes[i]`` from ``u[i]`` to ``v[i]`` (where usable)."""
        return nbytes * self.inv_bandwidth[u, v] + self.latency_at(nbytes, u, v)

    def occupancy_seconds(self, nbytes: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Seconds each transfer ``nbytes[i]`` from ``u[i]`` to ``v[i]`` keeps its link busy in a
        stream: ``(bytes + message_bytes) / bandwidth`` when ``message_bytes`` is known, else
        the hop time (``hop_seconds``)."""
        if self.message_bytes is None:
            return self.hop_seconds(nbytes, u, v)
        return (np.asarray(nbytes, dtype=float) + self.message_bytes) * self.inv_bandwidth[u, v]

    @property
    def max_latency(self) -> float:
        """The largest latency of any pair, in either regime."""
        top = float(self.latency.max(initial=0.0))
        return top if self.inline_latency is None else max(top, float(self.inline_latency.max(initial=0.0)))

    def transfer_time(self, nbytes: float) -> np.ndarray:
        """k x k seconds to move ``nbytes`` between each pair (0 on the diagonal;
        meaningless where ``usable`` is False)."""
        t = nbytes * self.inv_bandwidth + self.latency_for(nbytes)
        np.fill_diagonal(t, 0.0)
        return t


@dataclass(frozen=True)
class Cluster:
    """Devices, symmetric links, an optional default link, and the ``source``
    (holds the input) and ``sink`` (receives the output; defaults to ``source``).

    ``hosts`` are the machines whose cores devices share (a device names its own with
    ``host``; see ``hosts.py``). ``engine`` (optional) is what an execution engine adds
    to this hardware (``EngineProfile``): the cost model reads it through
    ``engine_vectors`` and ``tables`` only.
    """

    devices: tuple[DeviceSpec, ...]
    source: str
    links: tuple[Link, ...] = ()
    default_link: LinkSpec | None = None
    sink: str | None = None
    hosts: tuple[HostSpec, ...] = ()
    engine: EngineProfile | None = None
    name: str = field(default="cluster", compare=False)

    def __post_init__(self) -> None:
        devices = tuple(self.devices)
        if not devices:
            raise ClusterError('cluster has no devices; list at least one under "devices"')
        for i, d in enumerate(devices):
            if not isinstance(d, DeviceSpec):
                raise ClusterError(f"devices[{i}] must be a DeviceSpec, got {type(d).__name__}")
        names = [d.name for d in devices]
        seen: set[str] = set()
        for nm in names:
            if nm in seen:
                raise ClusterError(f"duplicate device name {nm!r}; every device needs a unique name")
            seen.add(nm)
        object.__setattr__(self, "devices", devices)
        links = tuple(self.links)
        pairs: set[frozenset[str]] = set()
        for ln in links:
            if not isinstance(ln, Link):
                raise ClusterError(f"links must hold Link objects, got {type(ln).__name__}")
            for end in ln.between:
                if end not in seen:
                    raise ClusterError(
                        f"link between {list(ln.between)!r} names unknown device "
                        f"{end!r}; known devices: {', '.join(names)}"
                    )
            key = frozenset(ln.between)
            if key in pairs:
                raise ClusterError(
                    f"link between {list(ln.between)!r} is listed twice (links are "
                    f"symmetric, so [a, b] and [b, a] are the same link); keep one"
                )
            pairs.add(key)
        object.__setattr__(self, "links", links)
        if self.default_link is not None and not isinstance(self.default_link, LinkSpec):
            raise ClusterError(f"default_link must be a LinkSpec, got {type(self.default_link).__name__}")
        check_name(self.source, "source")
        if self.source not in seen:
            raise ClusterError(f"source {self.source!r} is not a device; choose one of: {', '.join(names)}")
        sink = self.source if self.sink is None else self.sink
        check_name(sink, "sink")
        if sink not in seen:
            raise ClusterError(
                f"sink {sink!r} is not a device; choose one of: {', '.join(names)} (or leave it out to use the source)"
            )
        object.__setattr__(self, "sink", sink)
        self._check_hosts(names)
        if self.engine is not None:
            if not isinstance(self.engine, EngineProfile):
                raise ClusterError(
                    f"engine must be an EngineProfile, got {type(self.engine).__name__}; a dict goes "
                    f"through EngineProfile.from_dict"
                )
            self.engine.check_devices(names, self._pair_links)

    def _check_hosts(self, names: list[str]) -> None:
        hosts = self.hosts
        if isinstance(hosts, Mapping):
            hosts = hosts_from_dict(hosts, self.name)
        hosts = tuple(hosts)
        for h in hosts:
            if not isinstance(h, HostSpec):
                raise ClusterError(f"hosts must hold HostSpec objects, got {type(h).__name__}")
        host_names = [h.name for h in hosts]
        dup = next((h for i, h in enumerate(host_names) if h in host_names[:i]), None)
        if dup is not None:
            raise ClusterError(f"duplicate host name {dup!r}; every host needs a unique name")
        object.__setattr__(self, "hosts", hosts)
        for d in self.devices:
            if d.host is not None and d.host not in host_names:
                listed = ", ".join(host_names) if host_names else 'none (the cluster has no "hosts")'
                raise ClusterError(
                    f'device {d.name!r}: host {d.host!r} is not in the cluster\'s "hosts" '
                    f'(hosts: {listed}); add {{"{d.host}": {{"cores": N}}}} to "hosts" '
                    f"or fix the name"
                )
        used = {d.host for d in self.devices}
        idle = [h for h in host_names if h not in used]
        if idle:
            raise ClusterError(
                f'host {idle[0]!r} in "hosts" has no device; set "host": "{idle[0]}" on '
                f"the devices it runs, or remove it"
            )

    # -- lookups ---------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        """Device names in file order (the column order of every k-sized array)."""
        return [d.name for d in self.devices]

    @property
    def k(self) -> int:
        """Number of devices."""
        return len(self.devices)

    @cached_property
    def _index(self) -> dict[str, int]:
        return {d.name: i for i, d in enumerate(self.devices)}

    def index(self, name: str) -> int:
        """Column of device ``name``; ClusterError listing the devices if unknown."""
        try:
            return self._index[name]
        except (KeyError, TypeError):
            raise ClusterError(f"unknown device {name!r}; devices are: {', '.join(self.names)}") from None

    def link(self, a: str, b: str) -> Link | LinkSpec | None:
        """The link used between devices ``a`` and ``b`` (the listed one, else the
        default link), or None when the pair cannot communicate. None also for a == b."""
        ia, ib = self.index(a), self.index(b)
        if ia == ib:
            return None
        return self._pair_links.get(frozenset((a, b)), self.default_link)

    @cached_property
    def _pair_links(self) -> dict[frozenset[str], Link]:
        return {frozenset(ln.between): ln for ln in self.links}

    @cached_property
    def source_index(self) -> int:
        """Column of the source device."""
        return self.index(self.source)

    @cached_property
    def sink_index(self) -> int:
        """Column of the sink device."""
        return self.index(self.source if self.sink is None else self.sink)  # as __post_init__ reads it

    @cached_property
    def flops(self) -> np.ndarray:
        """FLOP/s per device, shape (k,)."""
        return np.array([d.flops for d in self.devices], dtype=float)

    @cached_property
    def power(self) -> np.ndarray:
        """Compute power (W) per device, shape (k,)."""
        return np.array([d.power for d in self.devices], dtype=float)

    @cached_property
    def stage_overhead(self) -> np.ndarray:
        """Seconds each device adds per stage it starts, shape (k,)."""
        return np.array([d.stage_overhead for d in self.devices], dtype=float)

    @cached_property
    def host_index(self) -> np.ndarray:
        """Index into ``hosts`` of each device's host, -1 where it names none; shape (k,)."""
        where = {h.name: i for i, h in enumerate(self.hosts)}
        return np.array([where.get(d.host, -1) if d.host is not None else -1 for d in self.devices], dtype=np.intp)

    @cached_property
    def host_cores(self) -> np.ndarray:
        """Cores of each host, in ``hosts`` order."""
        return np.array([h.cores for h in self.hosts], dtype=float)

    @cached_property
    def compute_cores(self) -> np.ndarray:
        """Cores of its host that each device's compute holds per second of it, shape (k,):
        one math thread holds one core, or the host's whole share where that is less. A
        layer's time is wall time on its host, so on a host held below one core by a CPU
        quota (the lab's, or a container's) it already holds the quota: a second there is
        ``cores`` CPU-seconds, not one, and counting one would charge the quota twice."""
        cores = np.append(self.host_cores, 1.0)[self.host_index]  # index -1: no host, one core
        return np.minimum(cores, 1.0)

    @cached_property
    def engine_vectors(self) -> EngineVectors:
        """The engine profile's transfer figures in device order (an engine that adds
        nothing without a profile): what the cost model reads of the engine."""
        return EngineVectors.build(self.engine, self.names, self.host_index)

    @cached_property
    def memory(self) -> np.ndarray:
        """Memory (bytes) per device, +inf where none is declared, shape (k,)."""
        return np.array([np.inf if d.memory is None else d.memory for d in self.devices], dtype=float)

    @cached_property
    def tables(self) -> LinkTables:
        """The link matrices (built once per cluster)."""
        k = self.k
        usable = np.eye(k, dtype=bool)
        inv_bw = np.zeros((k, k))
        lat = np.zeros((k, k))
        pw = np.zeros((k, k))
        inline = np.zeros((k, k))
        eng = self.engine if self.engine is not None else EngineProfile()
        if self.default_link is not None:
            off = ~np.eye(k, dtype=bool)
            dl = self.default_link
            usable[off] = True
            inv_bw[off] = 1.0 / dl.bandwidth
            lat[off] = dl.latency
            pw[off] = dl.power
            inline[off] = dl.latency if eng.default_inline_latency is None else eng.default_inline_latency
        for ln in self.links:
            a, b = self.index(ln.between[0]), self.index(ln.between[1])
            for u, v in ((a, b), (b, a)):
                usable[u, v] = True
                inv_bw[u, v] = 1.0 / ln.bandwidth
                lat[u, v] = ln.latency
                pw[u, v] = ln.power
                own = eng.link_inline_latency(*ln.between)
                inline[u, v] = ln.latency if own is None else own
        two_regimes = eng.inline_bytes > 0 and not np.array_equal(inline, lat)
        for arr in (usable, inv_bw, lat, pw, inline):
            arr.flags.writeable = False
        return LinkTables(
            usable, inv_bw, lat, pw, inline if two_regimes else None, float(eng.inline_bytes), eng.message_bytes
        )

    # -- (de)serialisation ------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Any, name: str = "cluster") -> Cluster:
        """Build a cluster from the parsed file structure; ClusterError on any bad key or value.

        The engine keys older files held beside the hardware are moved into ``engine``
        with a DeprecationWarning that names them."""
        if isinstance(data, Mapping):
            data, moved = engine_from_flat_keys(data)
            if moved:
                warnings.warn(
                    f'{name}: {", ".join(moved)} belong in the cluster\'s "engine" section now (they are '
                    f"what the execution engine adds to the hardware); move them there, e.g. "
                    f'"engine": {{"inline_bytes": ..., "transfer_cpu": {{"DEVICE": {{...}}}}}}, or rewrite the '
                    f"file with Cluster.to_dict (multigpu profile writes the new form)",
                    DeprecationWarning,
                    stacklevel=2,
                )
        check_keys(data, f"{name}: cluster", CLUSTER_KEYS_REQUIRED, CLUSTER_KEYS_OPTIONAL)
        raw_devices = data["devices"]
        if not isinstance(raw_devices, list):
            raise ClusterError(f'{name}: "devices" must be a list of device objects, got {type(raw_devices).__name__}')
        if not raw_devices:
            raise ClusterError(f'{name}: "devices" is empty; list at least one device')
        devices = []
        for i, d in enumerate(raw_devices):
            check_keys(d, f"{name}: devices[{i}]", DEVICE_KEYS_REQUIRED, DEVICE_KEYS_OPTIONAL)
            devices.append(
                DeviceSpec(
                    name=d["name"],
                    flops=d["flops"],
                    power=d["power"],
                    memory=d.get("memory"),
                    backend=d.get("backend"),
                    device=d.get("device"),
                    threads=d.get("threads"),
                    resources=d.get("resources"),
                    layer_times=d.get("layer_times"),
                    stage_overhead=d.get("stage_overhead", 0.0),
                    host=d.get("host"),
                )
            )
        raw_links = data.get("links", [])
        if not isinstance(raw_links, list):
            raise ClusterError(f'{name}: "links" must be a list of link objects, got {type(raw_links).__name__}')
        links = []
        for i, ln in enumerate(raw_links):
            check_keys(ln, f"{name}: links[{i}]", LINK_KEYS_REQUIRED, LINK_KEYS_OPTIONAL)
            links.append(
                Link(
                    between=ln["between"],
                    bandwidth=ln["bandwidth"],
                    latency=ln["latency"],
                    power=ln.get("power", 0.0),
                )
            )
        default = None
        if "default_link" in data:
            dl = check_keys(
                data["default_link"], f"{name}: default_link", DEFAULT_LINK_KEYS_REQUIRED, LINK_KEYS_OPTIONAL
            )
            default = LinkSpec(
                bandwidth=dl["bandwidth"],
                latency=dl["latency"],
                power=dl.get("power", 0.0),
            )
        hosts = hosts_from_dict(data["hosts"], name) if "hosts" in data else ()
        engine = EngineProfile.from_dict(data["engine"], name) if "engine" in data else None
        return cls(
            devices=tuple(devices),
            links=tuple(links),
            default_link=default,
            source=data["source"],
            sink=data.get("sink"),
            hosts=hosts,
            engine=engine,
            name=name,
        )

    def to_dict(self) -> dict[str, Any]:
        """The file structure of this cluster (round-trips through ``from_dict``)."""
        out: dict[str, Any] = {"devices": [], "links": []}
        for d in self.devices:
            dev: dict[str, Any] = {"name": d.name, "flops": d.flops, "power": d.power}
            if d.memory is not None:
                dev["memory"] = d.memory
            for key in ("backend", "device", "threads"):
                if getattr(d, key) is not None:
                    dev[key] = getattr(d, key)
            if d.resources is not None:
                dev["resources"] = dict(d.resources)
            if d.stage_overhead:
                dev["stage_overhead"] = d.stage_overhead
            if d.layer_times is not None:
                dev["layer_times"] = {g: dict(t) for g, t in d.layer_times.items()}
            if d.host is not None:
                dev["host"] = d.host
            out["devices"].append(dev)
        for ln in self.links:
            out["links"].append(
                {"between": list(ln.between), "bandwidth": ln.bandwidth, "latency": ln.latency, "power": ln.power}
            )
        if self.default_link is not None:
            dl = self.default_link
            out["default_link"] = {"bandwidth": dl.bandwidth, "latency": dl.latency, "power": dl.power}
        out["source"] = self.source
        out["sink"] = self.sink
        if self.hosts:
            out["hosts"] = {h.name: {"cores": h.cores} for h in self.hosts}
        if self.engine is not None:
            out["engine"] = self.engine.to_dict()
        return out


# -- files ---------------------------------------------------------------------
def _clusters_dir() -> Path:
    return Path(str(resources.files("multigpu.partition.inputs").joinpath("clusters")))


def shipped_clusters() -> list[str]:
    """Names of the example clusters shipped with the package (``load_cluster(name)``)."""
    d = _clusters_dir()
    if not d.is_dir():
        return []
    return sorted(p.stem for p in d.iterdir() if p.suffix in (".json", ".toml"))


def load_cluster(path: str | os.PathLike[str]) -> Cluster:
    """Read a cluster from a ``.json``/``.toml`` file, or a shipped example by name
    (``shipped_clusters()``); an existing path wins over a shipped name.

    Raises ClusterError for a missing or malformed file and for any bad key or value.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ClusterError(
            f"a cluster file must be given as a path or a shipped name ({', '.join(shipped_clusters()) or 'none'}), "
            f"got {type(path).__name__}; a cluster built in code goes to as_cluster or Cluster.from_dict"
        )
    p = Path(path)
    if not p.exists():
        name = str(path)
        shipped = shipped_clusters()
        if name in shipped:
            d = _clusters_dir()
            p = next(d / f"{name}{ext}" for ext in (".json", ".toml") if (d / f"{name}{ext}").exists())
        else:
            raise ClusterError(
                f"no cluster file {name!r}, and no shipped cluster of that name; "
                f"give a path to a .json/.toml file or one of: {', '.join(shipped) or 'none'}"
            )
    if p.is_dir():
        raise ClusterError(f"cluster path {str(p)!r} is a directory; give a .json or .toml file")
    data = read_structured_file(p, "cluster")
    return Cluster.from_dict(data, name=p.stem)


def as_cluster(cluster: Cluster | Mapping[str, Any] | str | os.PathLike[str], name: str = "cluster") -> Cluster:
    """Return ``cluster`` as a ``Cluster``: a Cluster as it is; a dict as a cluster file's contents
    (``{"devices": [...], "source": ...}``, with the same checks as a file, ``Cluster.from_dict``,
    its messages naming ``name``); a path or a shipped cluster's name read by ``load_cluster``.

    Raises ClusterError for any other type, naming it, and for any bad key or value.
    """
    if isinstance(cluster, Cluster):
        return cluster
    if isinstance(cluster, Mapping):
        return Cluster.from_dict(cluster, name=name)
    if isinstance(cluster, (str, os.PathLike)):
        return load_cluster(cluster)
    raise ClusterError(
        f"cluster must be a Cluster, a dict laid out as a cluster file (devices, source, links, ...) or "
        f"the path of a .json/.toml cluster file, got {type(cluster).__name__} {cluster!r:.80}"
    )
