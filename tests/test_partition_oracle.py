"""The cost model and AutoPartition against an independent oracle.

The oracle below re-implements the issue's definition from the raw file dicts (it
does not use the library's loader, tables, DP or MILP). ``ref_evaluate`` is a plain
loop over one assignment; ``Brute`` prices all k^n assignments at once with numpy.
Hypothesis draws instances with n <= 8 layers and k <= 4 devices, random links
(sometimes missing, with or without a default link), sometimes a different sink, and
sometimes what a pipelined run shares: stage overheads, each device's transfer CPU,
a relay, and hosts (with fractional or whole cores) that some devices share.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from multigpu.partition import Cluster, Constraints, Graph, InfeasibleError, UnusableLinkError, autopartition, evaluate

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# -- the oracle --------------------------------------------------------------------------
def eng(cd: dict) -> dict:
    """The cluster's engine section (what the engine adds to the hardware; {} without one)."""
    return cd.get("engine", {})


def ref_link(cd: dict, u: str, v: str, b: float | None = None) -> tuple[float, float, float] | None:
    """(bandwidth, latency, power) between u != v for a transfer of ``b`` bytes (the
    inline latency when b <= the cluster's inline_bytes; None: a parameter shipment,
    always the plain latency), or None when the pair is unusable."""
    inline = b is not None and b <= eng(cd).get("inline_bytes", 0)
    for ln in cd.get("links", []):
        if set(ln["between"]) == {u, v}:
            own = [x["latency"] for x in eng(cd).get("inline_latency", []) if set(x["between"]) == {u, v}]
            return (
                ln["bandwidth"],
                (own or [ln["latency"]])[0] if inline else ln["latency"],
                ln.get("power", 0.0),
            )
    dl = cd.get("default_link")
    if dl is not None:
        return (
            dl["bandwidth"],
            eng(cd).get("default_inline_latency", dl["latency"]) if inline else dl["latency"],
            dl.get("power", 0.0),
        )
    return None


class Unusable(Exception):
    pass


def ref_transfer(cd: dict, b: float, u: str, v: str, params: bool = False) -> tuple[float, float]:
    """(time, energy) of moving b bytes from u to v, per the definition (``params``: a
    parameter shipment, which always takes the object store's plain latency)."""
    if u == v:
        return 0.0, 0.0
    link = ref_link(cd, u, v, None if params else b)
    if link is None:
        raise Unusable((u, v))
    t = b / link[0] + link[1]
    return t, t * link[2]


def ref_local_scale(gd: dict, cd: dict, assignment: list[str], compute: float) -> float:
    """The factor on compute and stage overheads: when every layer is on one device, that
    device's ``warm_pass`` over ``compute`` (at most 1; the source's only when it is also
    the sink), else 1."""
    source = cd["source"]
    only = assignment[0]
    warm = eng(cd).get("warm_pass", {}).get(only, {}).get(GRAPH_NAME)
    if (
        warm is None
        or any(a != only for a in assignment)
        or compute <= 0
        or (only == source and cd.get("sink", source) != source)
    ):
        return 1.0
    return min(1.0, warm / compute)


def ref_evaluate(
    gd: dict, cd: dict, assignment: list[str], wt: float = 1.0, we: float = 0.0, ship: bool = False
) -> tuple[float, float, float]:
    """(T, E, cost) of one assignment, straight from the issue's definition."""
    dev = {d["name"]: d for d in cd["devices"]}
    source = cd["source"]
    sink = cd.get("sink", source)
    layers = gd["layers"]
    T = E = 0.0
    Tc = Ec = 0.0  # compute and stage overheads (what a warm pass scales)
    prev, nbytes = source, gd["input_bytes"]
    for i, (layer, a) in enumerate(zip(layers, assignment)):
        t, e = ref_transfer(cd, nbytes, prev, a)
        T, E = T + t, E + e
        if i == 0 or assignment[i - 1] != a:  # a stage starts
            oh = dev[a].get("stage_overhead", 0.0)
            Tc, Ec = Tc + oh, Ec + oh * dev[a]["power"]
        if ship and layer["param_bytes"] > 0:
            t, e = ref_transfer(cd, layer["param_bytes"], source, a, params=True)
            T, E = T + t, E + e
        c = layer["flops"] / dev[a]["flops"]
        Tc, Ec = Tc + c, Ec + c * dev[a]["power"]
        prev, nbytes = a, layer["output_bytes"]
    t, e = ref_transfer(cd, nbytes, prev, sink)
    scale = ref_local_scale(gd, cd, assignment, Tc)
    T, E = T + t + scale * Tc, E + e + scale * Ec
    return T, E, wt * T + we * E


GRAPH_NAME = "graph"  # what Graph.from_dict names a graph


def ref_figures(fig: dict | None, b: float, receive: bool = False, inline_bytes: float = 0) -> tuple[float, float]:
    """(all, serial) CPU seconds of a transfer_cpu or relay entry for b bytes (with
    ``receive``, received: its receive_per_byte where it has one); a transfer of at most
    the cluster's ``inline_bytes`` (when not 0) costs its inline_fixed where it has one."""
    if fig is None:
        return 0.0, 0.0

    def per(f: dict) -> float:
        return f.get("receive_per_byte", f.get("per_byte", 0.0)) if receive else f.get("per_byte", 0.0)

    def fixed(f: dict) -> float:
        return f["inline_fixed"] if "inline_fixed" in f and inline_bytes and b <= inline_bytes else f["fixed"]

    total = fixed(fig) + per(fig) * b
    ser = fig.get("serial")
    return total, total if ser is None else fixed(ser) + per(ser) * b


def ref_cpu(cd: dict, name: str, b: float, receive: bool) -> tuple[float, float]:
    """(all, serial) CPU seconds device ``name`` spends on one transfer of b bytes it
    sends (or, with ``receive``, receives)."""
    return ref_figures(eng(cd).get("transfer_cpu", {}).get(name), b, receive, eng(cd).get("inline_bytes", 0))


def ref_cpu_link(cd: dict, u: str, v: str) -> bool:
    """True when u and v are on one host and both have transfer_cpu: their transfers are
    CPU work of that host, not a load on the link."""
    du, dv = (next(d for d in cd["devices"] if d["name"] == x) for x in (u, v))
    cpu = eng(cd).get("transfer_cpu", {})
    return du.get("host") is not None and du.get("host") == dv.get("host") and u in cpu and v in cpu


def ref_compute_cores(cd: dict, device: dict) -> float:
    """CPU-seconds a second of ``device``'s compute puts on its host: one thread's core,
    or the host's whole share where that is below one core (the time, measured there,
    already holds the quota)."""
    host = device.get("host")
    return 1.0 if host is None else min(1.0, cd["hosts"][host]["cores"])


def ref_busy_ratio(gd: dict, cd: dict, name: str) -> float:
    """A device's compute and stage overheads in its own stream load are at the busy rate:
    the factor its warm pass gives the plan with every layer on it (1 without one)."""
    d = next(x for x in cd["devices"] if x["name"] == name)
    whole = sum(x["flops"] for x in gd["layers"]) / d["flops"] + d.get("stage_overhead", 0.0)
    return ref_local_scale(gd, cd, [name] * len(gd["layers"]), whole)


def ref_bottleneck(gd: dict, cd: dict, assignment: list[str]) -> float:
    """The largest of: a device's load per item (compute and stage overheads at its busy
    rate, the CPU of the transfers it sends, receives or relays), a link's activation
    transfer time, and a host's summed device loads (compute in CPU-seconds at the layer
    times: ``ref_compute_cores``) over its cores."""
    dev = {d["name"]: d for d in cd["devices"]}
    source = cd["source"]
    sink = cd.get("sink", source)
    busy: dict[str, float] = {}  # a device's own load (serial transfer CPU)
    work: dict[str, float] = {}  # what it puts on its host (all its transfer CPU)
    load: dict[frozenset, float] = {}

    def add(name: str, own: float, host: float) -> None:
        busy[name] = busy.get(name, 0.0) + own
        work[name] = work.get(name, 0.0) + host

    prev, nbytes = source, gd["input_bytes"]
    hops = []
    cs = []
    for i, (layer, a) in enumerate(zip(gd["layers"], assignment)):
        c = layer["flops"] / dev[a]["flops"]
        if i == 0 or assignment[i - 1] != a:
            c += dev[a].get("stage_overhead", 0.0)
        cs.append(c)
    scale = ref_local_scale(gd, cd, assignment, sum(cs))
    for i, (layer, a) in enumerate(zip(gd["layers"], assignment)):
        own = scale if scale != 1.0 else ref_busy_ratio(gd, cd, a)
        add(a, own * cs[i], scale * cs[i] * ref_compute_cores(cd, dev[a]))
        hops.append((prev, a, nbytes))
        prev, nbytes = a, layer["output_bytes"]
    hops.append((prev, sink, nbytes))
    ref_transfer_loads(cd, [(u, v, b) for u, v, b in hops if u != v], add, load)
    shares = [
        sum(work.get(d["name"], 0.0) for d in cd["devices"] if d.get("host") == h) / spec["cores"]
        for h, spec in cd.get("hosts", {}).items()
    ]
    return max(list(busy.values()) + list(load.values()) + shares)


def ref_occupancy(cd: dict, b: float, u: str, v: str) -> float:
    """Seconds a transfer of b bytes keeps link (u, v) busy in a stream: (b + message_bytes) /
    bandwidth when the cluster has message_bytes, else its hop time."""
    m = eng(cd).get("message_bytes")
    if m is None:
        return ref_transfer(cd, b, u, v)[0]
    return (b + m) / ref_link(cd, u, v, b)[0]


def ref_transfer_loads(cd: dict, transfers: list, add: Any, load: dict) -> None:
    """For transfers (u, v, bytes), u != v: add each one's time to its link's ``load`` (unless
    it is CPU work of one host) and its CPU at both ends and at the relay through ``add``."""
    relay = eng(cd).get("relay")
    for u, v, b in transfers:
        if not ref_cpu_link(cd, u, v):
            load[frozenset((u, v))] = load.get(frozenset((u, v)), 0.0) + ref_occupancy(cd, b, u, v)
        for end, receive in ((u, False), (v, True)):
            total, ser = ref_cpu(cd, end, b, receive)
            add(end, ser, total)
        if relay is not None and relay["device"] not in (u, v):
            total, ser = ref_figures(relay, b, inline_bytes=eng(cd).get("inline_bytes", 0))
            add(relay["device"], ser, total)


class Brute:
    """All k^n assignments priced at once (numpy, from the raw dicts)."""

    def __init__(self, gd: dict, cd: dict, ship: bool = False):
        names = [d["name"] for d in cd["devices"]]
        k, n = len(names), len(gd["layers"])
        self.names, self.k, self.n = names, k, n
        src = names.index(cd["source"])
        sink = names.index(cd.get("sink", cd["source"]))
        bw = np.full((k, k), np.nan)
        lat = np.zeros((k, k))
        lat_small = np.zeros((k, k))
        pw = np.zeros((k, k))
        ok = np.eye(k, dtype=bool)
        for u, v in itertools.permutations(range(k), 2):
            link = ref_link(cd, names[u], names[v])
            if link is not None:
                bw[u, v], lat[u, v], pw[u, v] = link
                lat_small[u, v] = ref_link(cd, names[u], names[v], 0.0)[1]
                ok[u, v] = True
        small = eng(cd).get("inline_bytes", 0)

        def lat_of(b: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
            return np.where(b <= small, lat_small[u, v], lat[u, v])

        F = np.array([d["flops"] for d in cd["devices"]], float)
        P = np.array([d["power"] for d in cd["devices"]], float)
        OH = np.array([d.get("stage_overhead", 0.0) for d in cd["devices"]], float)
        tc = [eng(cd).get("transfer_cpu", {}).get(nm) or {"fixed": 0.0} for nm in names]
        CF = np.array([t["fixed"] for t in tc], float)
        CI = np.array([t.get("inline_fixed", t["fixed"]) for t in tc], float)
        CB = np.array([t.get("per_byte", 0.0) for t in tc], float)
        CR = np.array([t.get("receive_per_byte", t.get("per_byte", 0.0)) for t in tc], float)
        SF = np.array([t.get("serial", t)["fixed"] for t in tc], float)
        SI = np.array([t.get("serial", t).get("inline_fixed", t.get("serial", t)["fixed"]) for t in tc], float)
        SB = np.array([t.get("serial", t).get("per_byte", 0.0) for t in tc], float)
        SR = np.array(
            [t.get("serial", t).get("receive_per_byte", t.get("serial", t).get("per_byte", 0.0)) for t in tc], float
        )
        flops = np.array([x["flops"] for x in gd["layers"]], float)
        params = np.array([x["param_bytes"] for x in gd["layers"]], float)
        out = np.array([x["output_bytes"] for x in gd["layers"]], float)
        b_in = np.concatenate([[gd["input_bytes"]], out[:-1]])
        A = np.array(list(itertools.product(range(k), repeat=n)), dtype=np.intp).reshape(-1, n)
        prev = np.concatenate([np.full((len(A), 1), src), A[:, :-1]], axis=1)
        last = A[:, -1]
        with np.errstate(invalid="ignore", divide="ignore"):
            comp = flops[None, :] / F[A]
            moved = prev != A
            t_in = np.where(moved, b_in[None, :] / bw[prev, A] + lat_of(b_in[None, :], prev, A), 0.0)
            t_out = np.where(last != sink, out[-1] / bw[last, sink] + lat_of(out[-1], last, sink), 0.0)
            valid = (ok[prev, A] | ~moved).all(axis=1) & ok[last, sink]
            # What a stream keeps each link busy for (the bottleneck's link loads).
            msg = eng(cd).get("message_bytes")
            if msg is None:
                o_in, o_out = t_in, t_out
            else:
                o_in = np.where(moved, (b_in[None, :] + msg) / bw[prev, A], 0.0)
                o_out = np.where(last != sink, (out[-1] + msg) / bw[last, sink], 0.0)
            if ship:
                ships = (A != src) & (params[None, :] > 0)
                t_par = np.where(ships, params[None, :] / bw[src, A] + lat[src, A], 0.0)
                valid &= (ok[src, A] | ~ships).all(axis=1)
                e_par = (t_par * pw[src, A]).sum(axis=1)
            else:
                t_par = np.zeros_like(comp)
                e_par = 0.0
        self.valid = valid
        self.A = A
        starts = np.concatenate([np.ones((len(A), 1), bool), A[:, 1:] != A[:, :-1]], axis=1)
        stage = np.where(starts, OH[A], 0.0)
        self.T = comp.sum(1) + stage.sum(1) + t_in.sum(1) + t_par.sum(1) + t_out
        self.E = (P[A] * (comp + stage)).sum(1) + (t_in * pw[prev, A]).sum(1) + e_par + t_out * pw[last, sink]
        # Per-device compute and memory; per-pair activation load.
        self.busy = np.stack([np.where(A == d, comp, 0.0).sum(1) for d in range(k)], axis=1)
        # Per-device load when pipelined: compute, stage overheads, transfer CPU.
        out_moved = last != sink
        relay = eng(cd).get("relay")
        r = names.index(relay["device"]) if relay is not None else -1

        def device_load(
            d: int,
            fixed: float,
            inline_fixed: float,
            per_byte: float,
            receive: float,
            rel: dict | None,
            cores: float,
        ) -> np.ndarray:
            # A transfer of at most inline_bytes (when set) pays the inline fixed figure.
            def fx(b: Any, big: float, little: float) -> Any:
                return np.where((small > 0) & (b <= small), little, big)

            f_in, f_out = fx(b_in[None, :], fixed, inline_fixed), fx(out[-1], fixed, inline_fixed)
            l_ = cores * np.where(A == d, comp + stage, 0.0).sum(1)
            l_ += np.where(moved & (prev == d), f_in + per_byte * b_in[None, :], 0.0).sum(1)
            l_ += np.where(moved & (A == d), f_in + receive * b_in[None, :], 0.0).sum(1)
            l_ += np.where(out_moved & (last == d), f_out + per_byte * out[-1], 0.0)
            l_ += np.where(out_moved & (sink == d), f_out + receive * out[-1], 0.0)
            if d == r:
                rf, rb = rel["fixed"], rel.get("per_byte", 0.0)
                ri = rel.get("inline_fixed", rf)
                via = moved & (prev != r) & (A != r)
                l_ += np.where(via, fx(b_in[None, :], rf, ri) + rb * b_in[None, :], 0.0).sum(1)
                l_ += np.where(out_moved & (last != r) & (sink != r), fx(out[-1], rf, ri) + rb * out[-1], 0.0)
            return l_

        rser = None if relay is None else relay.get("serial", relay)
        # A device's own load counts the serial part of its transfer CPU; its host all of it,
        # and its compute in CPU-seconds.
        # ... and its compute at its busy rate (``ref_busy_ratio``), its host at the layer times.
        self.load = np.stack(
            [device_load(d, SF[d], SI[d], SB[d], SR[d], rser, ref_busy_ratio(gd, cd, names[d])) for d in range(k)],
            axis=1,
        )
        work = np.stack(
            [
                device_load(d, CF[d], CI[d], CB[d], CR[d], relay, ref_compute_cores(cd, cd["devices"][d]))
                for d in range(k)
            ],
            axis=1,
        )
        host_of = [d.get("host") for d in cd["devices"]]
        shares = [
            work[:, [d for d in range(k) if host_of[d] == h]].sum(1) / spec["cores"]
            for h, spec in cd.get("hosts", {}).items()
        ]
        act = np.maximum(b_in, out)
        self.memory = np.stack(
            [
                np.where(A == d, params[None, :], 0.0).sum(1) + np.where(A == d, act[None, :], 0.0).max(1)
                for d in range(k)
            ],
            axis=1,
        )
        loads = []
        for u, v in itertools.combinations(range(k), 2):
            if ref_cpu_link(cd, names[u], names[v]):
                continue
            on = ((prev == u) & (A == v)) | ((prev == v) & (A == u))
            l_ = np.where(on, o_in, 0.0).sum(1)
            l_ += np.where(((last == u) & (sink == v)) | ((last == v) & (sink == u)), o_out, 0.0)
            loads.append(l_)
        link_max = np.max(np.stack(loads, 1), axis=1) if loads else np.zeros(len(A))
        host_max = np.max(np.stack(shares, 1), axis=1) if shares else np.zeros(len(A))
        self.bottleneck = np.maximum(np.maximum(self.load.max(1), np.nan_to_num(link_max)), host_max)
        # Constraints are checked on the per-layer prices (never less than a warm pass's):
        # the energy a budget is held against, before the warm passes below.
        self.E_constrained = self.E.copy()
        # A plan with every layer on one device runs at that device's warm pass: the loop
        # oracle prices each (where the links let it run).
        for d in range(k):
            local = int(np.flatnonzero((A == d).all(axis=1))[0])
            if not self.valid[local]:
                continue
            self.T[local], self.E[local], _ = ref_evaluate(gd, cd, self.names_of(local), ship=ship)
            self.bottleneck[local] = ref_bottleneck(gd, cd, self.names_of(local))

    def cost(self, wt: float, we: float) -> np.ndarray:
        return np.where(self.valid, wt * self.T + we * self.E, np.inf)

    def names_of(self, row: int) -> list[str]:
        return [self.names[d] for d in self.A[row]]


# -- instances ----------------------------------------------------------------------------
def draw_serial(draw: Any, fig: dict) -> None:
    """Sometimes say which share of a CPU figure is on the computing thread."""
    if draw(st.booleans()):
        share = draw(st.sampled_from([0.0, 0.4, 1.0]))
        fig["serial"] = {
            "fixed": share * fig["fixed"],
            "per_byte": draw(st.sampled_from([0.0, share])) * fig["per_byte"],
        }
        if "receive_per_byte" in fig:
            fig["serial"]["receive_per_byte"] = draw(st.sampled_from([0.0, share])) * fig["receive_per_byte"]
        if "inline_fixed" in fig:
            fig["serial"]["inline_fixed"] = draw(st.sampled_from([0.0, share])) * fig["inline_fixed"]


def draw_inline_cpu(draw: Any, cd: dict, fig: dict) -> None:
    """Sometimes give a CPU figure a fixed cost of its own for transfers of at most the
    cluster's inline_bytes (only where it has one), below or above its other fixed cost."""
    if eng(cd).get("inline_bytes") and draw(st.booleans()):
        fig["inline_fixed"] = draw(st.sampled_from([0.0, 0.2, 3.0])) * fig["fixed"] + draw(st.sampled_from([0.0, 1e-4]))


def draw_shared(draw: Any, cd: dict) -> None:
    """Sometimes add what a pipelined run shares: stage overheads, transfer CPU per
    device, a relay, and hosts (some devices on none)."""
    devices = cd["devices"]
    names = [d["name"] for d in devices]
    cpu = st.sampled_from([0.0, 1e-5, 3e-4, 2e-3])
    for d in devices:
        if draw(st.integers(0, 2)) == 0:
            d["stage_overhead"] = draw(st.sampled_from([1e-5, 3e-4, 3e-3]))
        if draw(st.booleans()):
            fig = {"fixed": draw(cpu), "per_byte": draw(st.sampled_from([0.0, 1e-10, 1e-8]))}
            if draw(st.booleans()):  # receiving priced apart from sending
                fig["receive_per_byte"] = draw(st.sampled_from([0.0, 1e-9, 3e-8]))
            draw_inline_cpu(draw, cd, fig)
            draw_serial(draw, fig)
            cd.setdefault("engine", {}).setdefault("transfer_cpu", {})[d["name"]] = fig
    if draw(st.integers(0, 2)) == 0:
        relay = {
            "device": draw(st.sampled_from(names)),
            "fixed": draw(cpu),
            "per_byte": draw(st.sampled_from([0.0, 1e-9])),
        }
        draw_inline_cpu(draw, cd, relay)
        draw_serial(draw, relay)
        cd.setdefault("engine", {})["relay"] = relay
    if draw(st.booleans()):
        hosts = draw(st.integers(1, len(names)))
        used = set()
        for d in devices:
            h = draw(st.integers(-1, hosts - 1))
            if h >= 0:
                d["host"] = f"h{h}"
                used.add(h)
        if used:
            cd["hosts"] = {f"h{h}": {"cores": draw(st.sampled_from([0.5, 1, 2, 3]))} for h in sorted(used)}


def draw_inline(draw: Any, cd: dict) -> None:
    """Sometimes price small transfers apart: an ``inline_bytes`` threshold inside the
    layers' range of sizes, and an ``inline_latency`` on some links (and the default)."""
    if draw(st.integers(0, 2)):
        return
    engine = cd.setdefault("engine", {})
    engine["inline_bytes"] = draw(st.sampled_from([1000, 30000]))
    for ln in cd["links"]:
        if draw(st.booleans()):
            seconds = draw(st.sampled_from([0.0, 1e-4, 1e-2])) * draw(st.floats(0.0, 1.0))
            engine.setdefault("inline_latency", []).append({"between": ln["between"], "latency": seconds})
    if "default_link" in cd and draw(st.booleans()):
        engine["default_inline_latency"] = draw(st.sampled_from([0.0, 1e-4, 1e-2])) * draw(st.floats(0.0, 1.0))


def draw_warm(draw: Any, gd: dict, cd: dict) -> None:
    """Sometimes give the source, and sometimes another device, a ``warm_pass`` for the
    graph: a fraction of its all-on-it compute and stage overhead (above 1: no effect, the
    pass is never priced up)."""
    for dev in cd["devices"]:
        if draw(st.integers(0, 2 if dev["name"] == cd["source"] else 4)):
            continue
        cold = sum(x["flops"] for x in gd["layers"]) / dev["flops"] + dev.get("stage_overhead", 0.0)
        warm = draw(st.sampled_from([0.05, 0.3, 0.7, 1.5])) * cold
        if warm > 0:
            cd.setdefault("engine", {}).setdefault("warm_pass", {})[dev["name"]] = {GRAPH_NAME: warm}


@st.composite
def instances(
    draw: Any, max_n: int = 8, max_k: int = 4, shared: bool = True, always_shared: bool = False
) -> tuple[dict, dict]:
    """(graph dict, cluster dict) with random sizes, speeds, links and endpoints (and,
    with ``shared``, sometimes hosts, transfer CPU, a relay and stage overheads)."""
    k = draw(st.integers(1, max_k))
    n = draw(st.integers(1, max_n))
    names = [f"d{i}" for i in range(k)]
    mag = st.floats(0.0, 1.0)
    devices = [{"name": nm, "flops": 10 ** (9 + 3 * draw(mag)), "power": draw(st.floats(0, 300))} for nm in names]
    pairs = list(itertools.combinations(names, 2))
    links = []
    for u, v in pairs:
        if draw(st.booleans()):
            links.append(
                {
                    "between": [u, v],
                    "bandwidth": 10 ** (5 + 5 * draw(mag)),
                    "latency": draw(st.sampled_from([0.0, 1e-4, 5e-3])) * draw(mag),
                    "power": draw(st.sampled_from([0.0, 2.0, 20.0])),
                }
            )
    cd: dict[str, Any] = {"devices": devices, "links": links, "source": draw(st.sampled_from(names))}
    if draw(st.booleans()):
        cd["default_link"] = {
            "bandwidth": 10 ** (5 + 5 * draw(mag)),
            "latency": 1e-3 * draw(mag),
            "power": draw(st.sampled_from([0.0, 5.0])),
        }
    if draw(st.booleans()):
        cd["sink"] = draw(st.sampled_from(names))
    draw_inline(draw, cd)
    if draw(st.integers(0, 2)) == 0:  # sometimes: the engine's message bytes per object-store transfer
        cd.setdefault("engine", {})["message_bytes"] = draw(st.sampled_from([0.0, 300.0, 5000.0]))
    layers = [
        {
            "name": f"l{i}",
            "flops": draw(st.sampled_from([0.0, 1.0])) * 10 ** (7 + 3 * draw(mag)),
            "param_bytes": draw(st.sampled_from([0.0, 1.0])) * 10 ** (3 + 4 * draw(mag)),
            "output_bytes": 10 ** (2 + 5 * draw(mag)),
        }
        for i in range(n)
    ]
    gd = {"input_bytes": draw(st.sampled_from([0.0, 1.0])) * 10 ** (2 + 5 * draw(mag)), "layers": layers}
    if always_shared or (shared and draw(st.booleans())):
        draw_shared(draw, cd)
    draw_warm(draw, gd, cd)
    return gd, cd


weights = st.sampled_from([(1.0, 0.0), (0.0, 1.0), (1.0, 0.01), (0.3, 1.0)])


def build(gd: dict, cd: dict) -> tuple[Graph, Cluster]:
    return Graph.from_dict(gd), Cluster.from_dict(cd)


def close(a: float, b: float, rel: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-15)


# -- tests --------------------------------------------------------------------------------
@settings(max_examples=60, **SETTINGS)
@given(instances(), weights, st.booleans(), st.data())
def test_evaluate_equals_definition_and_matrix_form(inst, w, ship, data):
    gd, cd = inst
    graph, cluster = build(gd, cd)
    a = [data.draw(st.sampled_from(cluster.names)) for _ in range(graph.n)]
    try:
        ref = ref_evaluate(gd, cd, a, *w, ship=ship)
    except Unusable:
        with pytest.raises(UnusableLinkError):
            evaluate(graph, cluster, a, *w, ship_params=ship)
        return
    bd = evaluate(graph, cluster, a, *w, ship_params=ship)
    assert close(bd.time, ref[0]) and close(bd.energy, ref[1]) and close(bd.cost, ref[2])
    assert close(bd.bottleneck, ref_bottleneck(gd, cd, a))
    # The breakdowns add up to the totals.
    assert close(sum(x.time for x in bd.layers) + bd.output_time, bd.time)
    assert close(sum(x.energy for x in bd.layers) + bd.output_energy, bd.energy)
    assert close(sum(d.compute_energy for d in bd.devices) + sum(ln.energy for ln in bd.links), bd.energy)
    # The document's matrix form gives the same numbers.
    m = bd.matrix
    assert m.A.shape == (graph.n, cluster.k) and m.L.shape == (graph.n + 1, cluster.k, cluster.k)
    assert np.array_equal(m.A.sum(1), np.ones(graph.n)) and np.array_equal(m.L.sum((1, 2)), np.ones(graph.n + 1))
    assert close(m.time(), ref[0]) and close(m.energy(), ref[1]) and close(m.cost(*w), ref[2])


@settings(max_examples=40, **SETTINGS)
@given(instances(), weights, st.booleans())
def test_oracle_vectorized_matches_loop(inst, w, ship):
    gd, cd = inst
    bf = Brute(gd, cd, ship)
    for row in np.random.default_rng(0).integers(0, len(bf.A), size=5):
        a = bf.names_of(int(row))
        try:
            ref = ref_evaluate(gd, cd, a, *w, ship=ship)
        except Unusable:
            assert not bf.valid[row]
            continue
        assert bf.valid[row]
        assert close(bf.cost(*w)[row], ref[2])
        assert close(bf.bottleneck[row], ref_bottleneck(gd, cd, a))


@settings(max_examples=80, **SETTINGS)
@given(instances(), weights, st.booleans(), st.sampled_from(["auto", "dp", "milp"]))
def test_autopartition_reaches_bruteforce_minimum(inst, w, ship, solver):
    gd, cd = inst
    graph, cluster = build(gd, cd)
    bf = Brute(gd, cd, ship)
    best = bf.cost(*w).min()
    cons = Constraints(memory=False)
    if not np.isfinite(best):
        with pytest.raises(InfeasibleError, match="link"):
            autopartition(graph, cluster, *w, constraints=cons, ship_params=ship, solver=solver, gap=0)
        return
    plan = autopartition(graph, cluster, *w, constraints=cons, ship_params=ship, solver=solver, gap=0)
    assert plan.solver == ("milp" if solver == "milp" else "dp")
    assert plan.proof == "optimal" and plan.bound <= best * (1 + 1e-7) + 1e-12
    assert close(plan.cost, best, rel=1e-9 if plan.solver == "dp" else 1e-7), (plan.cost, best)
    T, E, cost = ref_evaluate(gd, cd, plan.assignment, *w, ship=ship)
    assert close(plan.time, T) and close(plan.energy, E) and close(plan.cost, cost)
    assert plan.assignment == plan.breakdown.assignment and len(plan.assignment) == graph.n


@settings(max_examples=40, **SETTINGS)
@given(instances(max_n=7, max_k=3), weights)
def test_throughput_reaches_bruteforce_bottleneck(inst, w):
    gd, cd = inst
    if "hosts" in cd:
        event("with hosts")
    for key in ("relay", "transfer_cpu"):
        if key in eng(cd):
            event(f"with {key}")
    graph, cluster = build(gd, cd)
    bf = Brute(gd, cd)
    b = np.where(bf.valid, bf.bottleneck, np.inf)
    if not np.isfinite(b.min()):
        with pytest.raises(InfeasibleError):
            autopartition(graph, cluster, *w, objective="throughput", constraints={"memory": False}, gap=0)
        return
    plan = autopartition(graph, cluster, *w, objective="throughput", constraints={"memory": False}, gap=0)
    assert plan.solver == "milp"
    assert close(plan.bottleneck, b.min(), rel=1e-6), (plan.bottleneck, b.min())
    assert close(plan.bottleneck, ref_bottleneck(gd, cd, plan.assignment))
    # Among the bottleneck-optimal assignments the plan also has the least cost (the
    # library keeps every plan within 1e-7 of the optimum; compare with a subset).
    tied = b <= b.min() * (1 + 1e-8)
    assert plan.cost <= bf.cost(*w)[tied].min() * (1 + 1e-6) + 1e-12


@settings(max_examples=120, **SETTINGS)
@given(instances(max_n=6, max_k=4, always_shared=True), weights)
def test_throughput_with_hosts_transfer_cpu_and_relay_reaches_bruteforce(inst, w):
    """The host term, transfer CPU, the relay and stage overheads in every instance:
    the MILP's bottleneck is still the brute-force minimum over all k^n assignments."""
    gd, cd = inst
    graph, cluster = build(gd, cd)
    bf = Brute(gd, cd)
    b = np.where(bf.valid, bf.bottleneck, np.inf)
    if not np.isfinite(b.min()):
        return
    if "hosts" in cd and any(sum(d.get("host") == h for d in cd["devices"]) > 1 for h in cd["hosts"]):
        event("a host shared by two or more devices")
    plan = autopartition(graph, cluster, *w, objective="throughput", constraints={"memory": False}, gap=0)
    assert close(plan.bottleneck, b.min(), rel=1e-6), (plan.bottleneck, b.min())
    assert close(plan.bottleneck, ref_bottleneck(gd, cd, plan.assignment))
    tied = b <= b.min() * (1 + 1e-8)
    assert plan.cost <= bf.cost(*w)[tied].min() * (1 + 1e-6) + 1e-12


def test_matrix_form_on_alexnet_lab():
    from multigpu.partition import load_cluster, load_graph

    graph, cluster = load_graph("alexnet"), load_cluster("lab")
    split = ["pi1"] * 6 + ["pi2"] * 7 + ["desk-gpu"] * 6
    for ship in (False, True):
        bd = evaluate(graph, cluster, split, wt=1.0, we=0.5, ship_params=ship)
        assert close(bd.matrix.time(), bd.time) and close(bd.matrix.energy(), bd.energy)
        assert close(bd.matrix.cost(1.0, 0.5), bd.cost)
        # L_i is the outer product of consecutive one-hot rows (the document's transition).
        assert np.array_equal(bd.matrix.L[6], np.outer(bd.matrix.A[5], bd.matrix.A[6]))
