"""The lab's design from a cluster file: hosts, addresses, shaped rates, CPU and memory limits.

Pure computation, no system calls: ``design(cluster, ...)`` says what ``Lab`` will
build, and what it cannot emulate, before anything is built (and without root).

* **Hosts.** Devices that name the same ``host`` share one; every other device is a
  host of its own. Each host is a network namespace with one address from
  198.18.0.0/15 (RFC 2544's range for benchmarking networks) and its own hostname.
* **Links.** Each ordered pair of hosts gets its own rate: the cluster's link between
  their devices (or its default link), times ``bandwidth_scale``. The rate is shaped
  on the sender's egress, one htb class and tbf per destination, so a WiFi pair and a
  LAN pair out of one host differ. The file's bandwidth is the rate a TCP stream carries, so
  the shaped rate adds the headers of a full-size segment (``WIRE_OVERHEAD``). A rate
  above ``MAX_SHAPED`` is left unshaped: this machine carries about that much between
  namespaces, so asking for more emulates nothing.
* **Latency is not emulated**: it takes the netem qdisc, which this kernel lacks. A
  transfer costs the machine's own few tens of microseconds plus the engine's work.
* **CPU.** A host's share of the machine is its fastest device's FLOP/s relative to the
  slowest device of the cluster: the slowest gets ``cpu_scale`` cores, the others in
  proportion, each at most ``max_cores``. A device faster than that (a GPU: 8873 GFLOP/s
  against a Pi's 38.4) cannot be emulated on CPU cores; its host gets ``max_cores`` and
  the design says so. A CFS quota gives a share of CPU time, not a slower core, sliced as
  finely as the kernel delivers it: the period is the shortest whose quota is at least 1 ms
  (the kernel's minimum) and that is at least one scheduler tick (``tick_us``). The kernel
  checks a quota at its ticks, so a shorter period gives less than its share: 0.456 cores at
  2193 us held a busy loop to 0.40 of a core and AlexNet's conv3..fc8 to 0.37-0.38 here
  (HZ=250); at 4000 us, 0.46 and 0.43-0.45. The profile measures what each host really
  computes.
* **Memory.** A host's limit is the sum of its devices' ``memory`` (unlimited when one
  has none). Everything on the host counts against it: the Ray node, the workers, the
  framework.
"""

from __future__ import annotations

import ipaddress
import math
import os
from dataclasses import dataclass, field

from multigpu.checks import check_number
from multigpu.errors import InputError
from multigpu.lab.system import DEFAULT_TICK_US  # a constant: nothing here calls the system
from multigpu.partition.inputs.cluster import Cluster

__all__ = ["MAX_SHAPED", "NETWORK", "WIRE_OVERHEAD", "HostPlan", "LabPlan", "LinkPlan", "design"]

#: The lab's addresses: RFC 2544's benchmarking range, a /24 of it.
NETWORK = ipaddress.ip_network("198.18.0.0/24")
#: A full TCP segment on the wire against its payload: 1514 bytes (Ethernet header, IP,
#: TCP with timestamps) carry 1448. The htb rate counts whole frames.
WIRE_OVERHEAD = 1514 / 1448
#: Bytes/s above which a link is left unshaped: a TCP stream between two of the lab's
#: namespaces runs at about 0.4 to 2 GB/s on this kind of machine (measured), so a rate
#: near that emulates nothing.
MAX_SHAPED = 400e6
#: The shortest CFS quota and period the kernel accepts (1 ms), and the longest period (1 s).
MIN_QUOTA_US = 1000
MIN_PERIOD_US = 1000
MAX_PERIOD_US = 1_000_000
#: Hosts get at most this many hosts' worth of addresses (the /24, less network and broadcast).
MAX_HOSTS = 250


@dataclass(frozen=True)
class HostPlan:
    """One emulated host: its devices, address, CPU share (cores) and memory limit (bytes)."""

    name: str
    devices: tuple[str, ...]
    address: str
    cores: float
    period_us: int
    quota_us: int
    memory: int | None
    flops: float
    capped: bool = False

    @property
    def speed_note(self) -> str:
        """How this host's share was chosen, for ``status``."""
        cap = " (capped: its FLOP/s ask for more than the lab gives one host)" if self.capped else ""
        return f"{self.cores:.3g} cores{cap}"


@dataclass(frozen=True)
class LinkPlan:
    """The rate from host ``src`` to host ``dst``: ``bandwidth`` (bytes/s, as the file says,
    times the scale), shaped at ``rate_bits`` on the wire, or ``None`` when left unshaped;
    ``blocked`` when the cluster has no link between them."""

    src: str
    dst: str
    bandwidth: float
    latency: float
    rate_bits: int | None
    blocked: bool = False

    @property
    def shaped(self) -> bool:
        """True when an htb class limits this direction."""
        return self.rate_bits is not None and not self.blocked


@dataclass(frozen=True)
class LabPlan:
    """What a lab of ``cluster`` consists of, and what it cannot emulate (``notes``)."""

    cluster: Cluster
    hosts: tuple[HostPlan, ...]
    links: tuple[LinkPlan, ...]
    head: str
    cpu_scale: float
    bandwidth_scale: float
    max_cores: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    tick_us: int = DEFAULT_TICK_US

    def host(self, name: str) -> HostPlan:
        """The host called ``name``; InputError listing the hosts otherwise."""
        for h in self.hosts:
            if h.name == name:
                return h
        raise InputError(f"the lab has no host {name!r}; its hosts are: {', '.join(h.name for h in self.hosts)}")

    def host_of(self, device: str) -> HostPlan:
        """The host a device runs on."""
        for h in self.hosts:
            if device in h.devices:
                return h
        raise InputError(
            f"the lab has no device {device!r}; its devices are: {', '.join(d for h in self.hosts for d in h.devices)}"
        )

    def link(self, src: str, dst: str) -> LinkPlan:
        """The plan of the direction ``src`` -> ``dst`` (host names)."""
        for ln in self.links:
            if ln.src == src and ln.dst == dst:
                return ln
        raise InputError(f"no link from host {src!r} to host {dst!r} in the lab")

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {
            "cluster": self.cluster.name,
            "head": self.head,
            "cpu_scale": self.cpu_scale,
            "bandwidth_scale": self.bandwidth_scale,
            "max_cores": self.max_cores,
            "tick_us": self.tick_us,
            "hosts": [
                {
                    "name": h.name,
                    "devices": list(h.devices),
                    "address": h.address,
                    "cores": h.cores,
                    "cfs_period_us": h.period_us,
                    "cfs_quota_us": h.quota_us,
                    "memory": h.memory,
                    "flops": h.flops,
                    "capped": h.capped,
                }
                for h in self.hosts
            ],
            "links": [
                {
                    "src": ln.src,
                    "dst": ln.dst,
                    "bandwidth": ln.bandwidth,
                    "latency": ln.latency,
                    "rate_bits": ln.rate_bits,
                    "blocked": ln.blocked,
                }
                for ln in self.links
            ],
            "notes": list(self.notes),
        }


def _quota(cores: float, tick_us: int) -> tuple[int, int]:
    """(period, quota) in microseconds for ``cores``: the shortest period whose quota is at
    least the kernel's 1 ms and that is at least one scheduler tick. A short period slices
    CPU time finely, so a host with a quarter of a core runs a 1 ms layer in about 4 ms, as
    a slower core would, instead of at full speed inside one long quota and then not at all;
    but the kernel throttles a running task at its ticks, so a period shorter than a tick
    gives less than its share (see the module docstring)."""
    period = min(MAX_PERIOD_US, max(MIN_PERIOD_US, tick_us, math.ceil(MIN_QUOTA_US / cores)))
    return period, max(MIN_QUOTA_US, round(cores * period))


def design(
    cluster: Cluster,
    *,
    cpu_scale: float = 0.25,
    bandwidth_scale: float = 1.0,
    max_cores: float | None = None,
    head: str | None = None,
    tick_us: int = DEFAULT_TICK_US,
) -> LabPlan:
    """The lab that emulates ``cluster``: hosts, addresses, per-pair rates, CPU shares and
    memory limits (see the module docstring for the rules).

    ``cpu_scale``: cores the slowest device gets; ``bandwidth_scale``: factor on every
    link's bandwidth (10 makes a 1 MB/s WiFi pair 10 MB/s, to run in a tenth of the time);
    ``max_cores``: most cores one host gets (default: the machine's); ``head``: the host
    of the Ray head (default: the host with the most memory, unlimited first, then the
    source's); ``tick_us``: the kernel's scheduler tick (``system.scheduler_tick_us()``), the
    shortest CFS period used. Raises InputError for a bad number or an unknown head.
    """
    cpu_scale = check_number(
        cpu_scale, "cpu_scale", minimum=0.0, strict=True, unit="cores the slowest device gets, e.g. 0.25"
    )
    bandwidth_scale = check_number(
        bandwidth_scale, "bandwidth_scale", minimum=0.0, strict=True, unit="factor on every link's bandwidth, e.g. 10"
    )
    tick_us = int(
        check_number(
            tick_us,
            "tick_us",
            minimum=0.0,
            strict=True,
            unit="microseconds of the kernel's scheduler tick, e.g. 4000 (HZ=250)",
        )
    )
    machine = float(os.cpu_count() or 1)
    max_cores = (
        machine
        if max_cores is None
        else check_number(max_cores, "max_cores", minimum=0.0, strict=True, unit="cores, e.g. 2")
    )
    # Hosts: devices naming one host share it; the others are hosts of their own.
    groups: dict[str, list[str]] = {}
    for d in cluster.devices:
        groups.setdefault(d.host or d.name, []).append(d.name)
    if len(groups) > MAX_HOSTS:
        raise InputError(f"the cluster has {len(groups)} hosts; the lab emulates at most {MAX_HOSTS}")
    slowest = float(min(cluster.flops))
    hosts: list[HostPlan] = []
    notes: list[str] = []
    for i, (name, devs) in enumerate(groups.items()):
        specs = [cluster.devices[cluster.index(d)] for d in devs]
        flops = max(s.flops for s in specs)
        want = cpu_scale * flops / slowest
        cores = min(want, max_cores)
        period, quota = _quota(cores, tick_us)
        known = [s.memory for s in specs if s.memory is not None]
        memory = int(sum(known)) if len(known) == len(specs) else None
        hosts.append(
            HostPlan(
                name,
                tuple(devs),
                str(NETWORK.network_address + i + 1),
                quota / period,
                period,
                quota,
                memory,
                flops,
                capped=want > max_cores,
            )
        )
        if want > max_cores:
            notes.append(
                f"host {name!r}: its {flops / 1e9:.4g} GFLOP/s would need {want:.3g} cores at this scale; "
                f"it gets {max_cores:g}, so it runs {want / max_cores:.3g}x slower relative to the others "
                f"than the file says"
                + (
                    " (a GPU's speed cannot be emulated on CPU cores)"
                    if any((s.device or "cpu").startswith("gpu") or "gpu" in s.name.lower() for s in specs)
                    else ""
                )
            )
    total = sum(h.cores for h in hosts)
    if total > machine:
        notes.append(
            f"the hosts' shares add up to {total:.3g} cores on this {machine:g}-core machine: hosts that "
            f"compute at the same time (a streamed plan's stages) slow each other beyond their shares"
        )
    notes.append(
        "link latency is not emulated (that takes the netem qdisc, which this kernel lacks): a transfer "
        "costs the machine's own tens of microseconds plus the engine's work, whatever the file's latency"
    )
    links: list[LinkPlan] = []
    host_of = {d: h.name for h in hosts for d in h.devices}
    fast: set[frozenset[str]] = set()
    for a in hosts:
        for b in hosts:
            if a.name == b.name:
                continue
            ln = cluster.link(a.devices[0], b.devices[0])
            if ln is None:
                links.append(LinkPlan(a.name, b.name, 0.0, 0.0, None, blocked=True))
                continue
            bw = ln.bandwidth * bandwidth_scale
            rate = None if bw > MAX_SHAPED else max(8, round(bw * 8 * WIRE_OVERHEAD))
            if rate is None:
                fast.add(frozenset((a.name, b.name)))
            links.append(LinkPlan(a.name, b.name, bw, ln.latency, rate))
    for pair in sorted(fast, key=sorted):
        x, y = sorted(pair)
        speed = next(ln.bandwidth for ln in links if {ln.src, ln.dst} == {x, y})
        notes.append(
            f"link {x} <-> {y}: {speed / 1e6:.4g} MB/s is more than this machine carries between "
            f"namespaces; left unshaped"
        )
    blocked = sorted({frozenset((ln.src, ln.dst)) for ln in links if ln.blocked}, key=sorted)
    for pair in blocked:
        x, y = sorted(pair)
        notes.append(
            f"hosts {x} and {y} have no link in the cluster (and it has no default link): "
            f"traffic between them is dropped"
        )
    names = [h.name for h in hosts]
    if head is None:
        head = min(
            hosts,
            key=lambda h: (
                h.memory is not None,
                -(h.memory or 0),
                h.name != host_of[cluster.source],
                names.index(h.name),
            ),
        ).name
    elif head not in names:
        raise InputError(f"head={head!r} is not a host of the lab; choose one of: {', '.join(names)}")
    return LabPlan(
        cluster, tuple(hosts), tuple(links), head, cpu_scale, bandwidth_scale, max_cores, tuple(notes), tick_us
    )
