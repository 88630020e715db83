"""The lab's network: a switch namespace with a bridge, one namespace per host joined to
it by a veth pair, and per-destination shaping on each host's egress.

Nothing is created in the machine's own network namespace: the bridge lives in the
lab's switch namespace, so the hosts reach each other and nothing else (no route
leaves the lab, and the machine's interfaces never see its traffic).

Shaping: each host's ``eth0`` gets an htb qdisc that sorts its packets by destination
(a u32 filter on the destination address per other host, into a class of its own),
and under each class a tbf qdisc at that link's rate, so the rate differs per pair of
hosts. Traffic in the other direction is shaped on the other host's egress by its own
class for this host. tbf, not htb, does the shaping because it cuts the 64 KB
super-packets of segmentation offload (GSO) to its bucket: an htb class lets one whole
through when it has any tokens left, so a transfer of up to 64 KB would not be shaped
at all. Unclassified traffic (ARP) passes unshaped; a pair with no link gets a filter
that drops.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from multigpu.lab.plan import NETWORK, LabPlan, LinkPlan
from multigpu.lab.system import run

__all__ = ["IFACE", "build_network", "class_stats", "delete_namespace", "namespaces", "set_link"]

#: The host's interface name inside its namespace.
IFACE = "eth0"
NETNS_DIR = Path("/run/netns")


def namespaces(prefix: str) -> list[str]:
    """Names of the network namespaces that start with ``prefix``."""
    try:
        return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(prefix))
    except OSError:
        return []


def ns_pids(ns: str) -> set[int]:
    """Processes in network namespace ``ns``."""
    got = run(["ip", "netns", "pids", ns], f"namespace {ns}", check=False)
    return {int(x) for x in got.stdout.split()} if got.returncode == 0 else set()


def delete_namespace(ns: str) -> None:
    """Delete namespace ``ns`` (its interfaces and qdiscs go with it)."""
    run(["ip", "netns", "del", ns], f"deleting namespace {ns}", check=False)


#: The rate of the sorting htb classes: far above any shaped link, so only their tbf limits.
SORT_RATE = "10gbit"
#: tbf's bucket: two full frames, or a millisecond at the link's rate if that is more.
#: tbf sends a queued packet when its timer fires; tokens that arrive while the bucket is
#: full are lost, so a timer that fires late costs rate whenever the lateness exceeds the
#: bucket's time less a frame's. With half a millisecond a CI machine's late timers cost
#: the WiFi pairs 12% (4.40 MB/s of 5) and the LAN 4%, where this machine lost under 1%;
#: a millisecond lets a burst of at most that much pass at once (5 KB on the scaled WiFi).
MIN_BURST = 2 * 1514
BURST_SECONDS = 1e-3
#: How long a packet may wait in a tbf queue before it is dropped (TCP then slows down).
QUEUE_SECONDS = "2s"


def _burst(rate_bits: int) -> int:
    return int(max(MIN_BURST, rate_bits / 8 * BURST_SECONDS))


def _shape(ns: str, links: Sequence[LinkPlan], address_of: dict[str, str]) -> None:
    what = f"shaping the links of namespace {ns}"
    run(["tc", "-n", ns, "qdisc", "add", "dev", IFACE, "root", "handle", "1:", "htb", "default", "0"], what)
    for i, ln in enumerate(links, start=1):
        dst = address_of[ln.dst] + "/32"
        match = ["match", "ip", "dst", dst]
        if ln.blocked:
            run(
                [
                    "tc",
                    "-n",
                    ns,
                    "filter",
                    "add",
                    "dev",
                    IFACE,
                    "parent",
                    "1:",
                    "protocol",
                    "ip",
                    "prio",
                    "1",
                    "u32",
                    *match,
                    "action",
                    "drop",
                ],
                what,
            )
            continue
        if ln.rate_bits is None:
            continue
        minor = f"{i + 10:x}"
        classid = f"1:{minor}"
        run(
            [
                "tc",
                "-n",
                ns,
                "class",
                "add",
                "dev",
                IFACE,
                "parent",
                "1:",
                "classid",
                classid,
                "htb",
                "rate",
                SORT_RATE,
                "ceil",
                SORT_RATE,
                "quantum",
                "200000",
            ],
            what,
        )
        run(
            [
                "tc",
                "-n",
                ns,
                "qdisc",
                "add",
                "dev",
                IFACE,
                "parent",
                classid,
                "handle",
                f"{minor}:",
                "tbf",
                "rate",
                f"{ln.rate_bits}bit",
                "burst",
                str(_burst(ln.rate_bits)),
                "latency",
                QUEUE_SECONDS,
            ],
            what,
        )
        run(
            [
                "tc",
                "-n",
                ns,
                "filter",
                "add",
                "dev",
                IFACE,
                "parent",
                "1:",
                "protocol",
                "ip",
                "prio",
                "1",
                "u32",
                *match,
                "flowid",
                classid,
            ],
            what,
        )


def build_network(plan: LabPlan, netns: dict[str, str], switch: str, veth_prefix: str) -> None:
    """Create the switch, every host's namespace, veth pair, address and shaping.

    ``netns`` maps each host to its namespace name; ``veth_prefix`` names the switch
    ends (``<prefix><i>``, at most 15 characters). Raises LabError on the first failure
    (the caller tears down what was made).
    """
    run(["ip", "netns", "add", switch], "creating the lab's switch namespace")
    run(["ip", "-n", switch, "link", "add", "br0", "type", "bridge"], "creating the lab's bridge")
    run(["ip", "-n", switch, "link", "set", "br0", "up"], "starting the lab's bridge")
    prefix_len = NETWORK.prefixlen
    for i, h in enumerate(plan.hosts):
        ns = netns[h.name]
        what = f"host {h.name!r}"
        run(["ip", "netns", "add", ns], what)
        end = f"{veth_prefix}{i}"
        run(["ip", "link", "add", end, "netns", switch, "type", "veth", "peer", "name", IFACE, "netns", ns], what)
        run(["ip", "-n", switch, "link", "set", end, "master", "br0", "up"], what)
        run(["ip", "-n", ns, "addr", "add", f"{h.address}/{prefix_len}", "dev", IFACE], what)
        run(["ip", "-n", ns, "link", "set", IFACE, "up"], what)
        run(["ip", "-n", ns, "link", "set", "lo", "up"], what)
    address_of = {h.name: h.address for h in plan.hosts}
    for h in plan.hosts:
        _shape(netns[h.name], [ln for ln in plan.links if ln.src == h.name], address_of)


def set_link(ns: str, up: bool) -> None:
    """Take a host's interface down (a cable pulled, a radio off) or bring it back up."""
    run(
        ["ip", "-n", ns, "link", "set", IFACE, "up" if up else "down"],
        f"setting {IFACE} of {ns} {'up' if up else 'down'}",
    )


def class_stats(ns: str) -> dict[str, int]:
    """Bytes each link's tbf of a host has sent (``handle -> bytes``)."""
    got = run(["tc", "-n", ns, "-s", "qdisc", "show", "dev", IFACE], f"reading the shaping of {ns}", check=False)
    out: dict[str, int] = {}
    current = None
    for line in got.stdout.splitlines():
        parts = line.split()
        if parts[:2] == ["qdisc", "tbf"]:
            current = parts[2]
        elif parts[:1] == ["Sent"] and current is not None:
            out[current] = int(parts[1])
            current = None
    return out
