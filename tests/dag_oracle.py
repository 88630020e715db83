"""An independent oracle for the cost model over DAGs, and random DAG instances.

Everything here works on the raw file dicts (``{"input_bytes", "layers": [{"name",
"flops", "param_bytes", "output_bytes", "inputs"?}]}`` and the cluster dict), straight
from issue #16's definitions, without the library's loader, tables, DP or MILP:

* ``ref_sum``: T and E, the report's sum of blocks over every edge: compute, a stage
  start where a layer consumes the input or an input from another device, one
  transfer per producer and distinct other device among its consumers (the sink for
  the last layer), parameter shipping;
* ``ref_bottleneck``: the largest device load (compute, stage starts, transfer CPU),
  link load or host share;
* ``ref_makespan``: devices run their layers one at a time in layer order, links carry
  one transfer at a time in producer order, the output's arrival at the sink;
* ``brute``: every k^n assignment priced by the three, for the solvers' tests.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from hypothesis import strategies as st
from test_partition_oracle import (
    Unusable,
    draw_inline,
    draw_shared,
    ref_compute_cores,
    ref_transfer,
    ref_transfer_loads,
)

INPUT = "input"


def producers(gd: dict) -> list[list[str]]:
    """Each layer's inputs by name (the previous layer, or the input, when not listed)."""
    out = []
    for i, layer in enumerate(gd["layers"]):
        out.append(list(layer.get("inputs") or ([gd["layers"][i - 1]["name"]] if i else [INPUT])))
    return out


def sends(gd: dict, cd: dict, dev: dict[str, str]) -> list[tuple[str, str, str, float]]:
    """(producer, from, to, bytes) of every transfer: once per producer and other device."""
    source = cd["source"]
    sink = cd.get("sink", source)
    layers = gd["layers"]
    where = {INPUT: source, **dev}
    size = {INPUT: gd["input_bytes"], **{x["name"]: x["output_bytes"] for x in layers}}
    targets: dict[str, set[str]] = {}
    for layer, ins in zip(layers, producers(gd)):
        for p in ins:
            targets.setdefault(p, set()).add(dev[layer["name"]])
    targets.setdefault(layers[-1]["name"], set()).add(sink)
    return [(p, where[p], v, size[p]) for p, vs in targets.items() for v in sorted(vs) if v != where[p]]


def starts(gd: dict, dev: dict[str, str]) -> dict[str, bool]:
    """Layer name -> whether it starts a stage."""
    return {
        x["name"]: any(p == INPUT or dev[p] != dev[x["name"]] for p in ins)
        for x, ins in zip(gd["layers"], producers(gd))
    }


def ref_sum(gd: dict, cd: dict, assignment: list[str], ship: bool = False) -> tuple[float, float]:
    """(T, E); Unusable when a transfer needs a pair with no link."""
    devs = {d["name"]: d for d in cd["devices"]}
    dev = {x["name"]: a for x, a in zip(gd["layers"], assignment)}
    st_ = starts(gd, dev)
    T = E = 0.0
    for x in gd["layers"]:
        d = devs[dev[x["name"]]]
        c = x["flops"] / d["flops"] + (d.get("stage_overhead", 0.0) if st_[x["name"]] else 0.0)
        T, E = T + c, E + c * d["power"]
        if ship and x["param_bytes"] > 0:
            t, e = ref_transfer(cd, x["param_bytes"], cd["source"], d["name"], params=True)
            T, E = T + t, E + e
    for _, u, v, b in sends(gd, cd, dev):
        t, e = ref_transfer(cd, b, u, v)
        T, E = T + t, E + e
    return T, E


def ref_bottleneck(gd: dict, cd: dict, assignment: list[str]) -> float:
    """The throughput objective over the DAG's transfers."""
    devs = {d["name"]: d for d in cd["devices"]}
    dev = {x["name"]: a for x, a in zip(gd["layers"], assignment)}
    st_ = starts(gd, dev)
    busy: dict[str, float] = {}
    work: dict[str, float] = {}
    link: dict[frozenset, float] = {}

    def add(name: str, own: float, host: float) -> None:
        busy[name] = busy.get(name, 0.0) + own
        work[name] = work.get(name, 0.0) + host

    for x in gd["layers"]:
        d = devs[dev[x["name"]]]
        c = x["flops"] / d["flops"] + (d.get("stage_overhead", 0.0) if st_[x["name"]] else 0.0)
        add(d["name"], c, c * ref_compute_cores(cd, d))
    ref_transfer_loads(cd, [(u, v, b) for _, u, v, b in sends(gd, cd, dev)], add, link)
    shares = [
        sum(work.get(d["name"], 0.0) for d in cd["devices"] if d.get("host") == h) / spec["cores"]
        for h, spec in cd.get("hosts", {}).items()
    ]
    return max(list(busy.values()) + list(link.values()) + shares)


def ref_makespan(gd: dict, cd: dict, assignment: list[str]) -> float:
    """When the output is on the sink; devices in layer order, links in producer order."""
    devs = {d["name"]: d for d in cd["devices"]}
    dev = {x["name"]: a for x, a in zip(gd["layers"], assignment)}
    st_ = starts(gd, dev)
    source = cd["source"]
    order = [INPUT] + [x["name"] for x in gd["layers"]]
    by_producer: dict[str, list[tuple[str, str, float]]] = {}
    for p, u, v, b in sends(gd, cd, dev):
        by_producer.setdefault(p, []).append((u, v, b))
    here: dict[tuple[str, str], float] = {(INPUT, source): 0.0}  # (output, device) -> when it is there
    device_free: dict[str, float] = {}
    link_free: dict[frozenset, float] = {}
    for name, ins in zip(order, [None] + producers(gd)):
        if ins is not None:
            d = devs[dev[name]]
            begin = max([device_free.get(d["name"], 0.0)] + [here[(p, d["name"])] for p in ins])
            end = (
                begin
                + gd["layers"][order.index(name) - 1]["flops"] / d["flops"]
                + (d.get("stage_overhead", 0.0) if st_[name] else 0.0)
            )
            device_free[d["name"]] = end
            here[(name, d["name"])] = end
        for u, v, b in by_producer.get(name, []):
            key = frozenset((u, v))
            t0 = max(here[(name, u)], link_free.get(key, 0.0))
            here[(name, v)] = link_free[key] = t0 + ref_transfer(cd, b, u, v)[0]
    last = gd["layers"][-1]["name"]
    return here[(last, cd.get("sink", source))]


def ref_memory(gd: dict, assignment: list[str]) -> dict[str, float]:
    """Bytes per device: parameters plus the largest activation (max of a layer's summed
    inputs and its output)."""
    size = {INPUT: gd["input_bytes"], **{x["name"]: x["output_bytes"] for x in gd["layers"]}}
    params: dict[str, float] = {}
    act: dict[str, float] = {}
    for x, ins, a in zip(gd["layers"], producers(gd), assignment):
        params[a] = params.get(a, 0.0) + x["param_bytes"]
        act[a] = max(act.get(a, 0.0), max(sum(size[p] for p in ins), x["output_bytes"]))
    return {d: params[d] + act[d] for d in params}


def brute(
    gd: dict,
    cd: dict,
    wt: float,
    we: float,
    ship: bool = False,
    memory: dict[str, float] | None = None,
    busy: float | None = None,
    energy: float | None = None,
    pins: dict[str, str] | None = None,
) -> dict[str, float]:
    """The least cost, bottleneck and makespan over every assignment meeting the limits
    (each independently; +inf when none does)."""
    names = [d["name"] for d in cd["devices"]]
    layer_names = [x["name"] for x in gd["layers"]]
    best = {"cost": math.inf, "bottleneck": math.inf, "makespan": math.inf}
    for a in itertools.product(names, repeat=len(layer_names)):
        a = list(a)
        if pins and any(a[layer_names.index(k)] != v for k, v in pins.items()):
            continue
        if memory and any(used > memory.get(d, math.inf) * (1 + 1e-9) for d, used in ref_memory(gd, a).items()):
            continue
        if busy is not None:
            flops = {d["name"]: d["flops"] for d in cd["devices"]}
            per: dict[str, float] = {}
            for x, d in zip(gd["layers"], a):
                per[d] = per.get(d, 0.0) + x["flops"] / flops[d]
            if any(v > busy * (1 + 1e-9) for v in per.values()):
                continue
        try:
            T, E = ref_sum(gd, cd, a, ship)
        except Unusable:
            continue
        if energy is not None and E > energy * (1 + 1e-9):
            continue
        best["cost"] = min(best["cost"], wt * T + we * E)
        best["bottleneck"] = min(best["bottleneck"], ref_bottleneck(gd, cd, a))
        best["makespan"] = min(best["makespan"], ref_makespan(gd, cd, a))
    return best


# -- instances ----------------------------------------------------------------------------
def _layer(draw: Any, i: int, inputs: list[str] | None) -> dict:
    mag = st.floats(0.0, 1.0)
    x = {
        "name": f"l{i}",
        "flops": draw(st.sampled_from([0.0, 1.0])) * 10 ** (7 + 3 * draw(mag)),
        "param_bytes": draw(st.sampled_from([0.0, 1.0])) * 10 ** (3 + 4 * draw(mag)),
        "output_bytes": 10 ** (2 + 5 * draw(mag)),
    }
    if inputs is not None:
        x["inputs"] = inputs
    return x


@st.composite
def dags(draw: Any, max_n: int = 6) -> dict:
    """Any DAG: each layer consumes one to three earlier layers or the input; a layer
    nothing consumes feeds the last one."""
    n = draw(st.integers(2, max_n))
    layers: list[dict] = []
    for i in range(n):
        pool = [INPUT] + [x["name"] for x in layers]
        ins = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True))
        layers.append(_layer(draw, i, ins))
    used = {p for x in layers for p in x["inputs"]}
    layers[-1]["inputs"] += [x["name"] for x in layers[:-1] if x["name"] not in used]
    return {"input_bytes": 10 ** (2 + 5 * draw(st.floats(0.0, 1.0))), "layers": layers}


@st.composite
def fork_joins(draw: Any, max_n: int = 6) -> dict:
    """Series-parallel graphs of 2 to ``max_n`` layers: chains with forks whose branches
    (some of them the direct edge, like a ResNet shortcut) meet at one join, nested."""
    layers: list[dict] = []

    def add(inputs: list[str]) -> str:
        layers.append(_layer(draw, len(layers), inputs))
        return layers[-1]["name"]

    def series(prev: str, depth: int, budget: int) -> str:
        """Add at most ``budget`` (>= 1) layers after ``prev``; return the last."""
        end = len(layers) + budget
        for _ in range(draw(st.integers(1, 3))):
            room = end - len(layers)
            if room < 1:
                break
            if depth < 2 and room >= 3 and draw(st.booleans()):
                tails = []
                for _ in range(draw(st.integers(2, 3))):
                    left = end - len(layers) - 1  # keep one for the join
                    if left >= 1 and draw(st.integers(0, 3)):
                        tails.append(
                            series(add([prev]), depth + 1, draw(st.integers(1, left)) - 1) if left > 1 else add([prev])
                        )
                    else:
                        tails.append(prev)
                prev = add(list(dict.fromkeys(tails)))
            else:
                prev = add([prev])
        return prev

    series(INPUT, 0, draw(st.integers(2, max_n)))
    return {"input_bytes": 10 ** (2 + 5 * draw(st.floats(0.0, 1.0))), "layers": layers}


@st.composite
def clusters(draw: Any, max_k: int = 3, shared: bool = False) -> dict:
    """Devices, random links (some pairs without), sometimes a default link and another
    sink, sometimes stage overheads (and, with ``shared``, transfer CPU, a relay, hosts)."""
    k = draw(st.integers(1, max_k))
    names = [f"d{i}" for i in range(k)]
    mag = st.floats(0.0, 1.0)
    devices = [{"name": nm, "flops": 10 ** (9 + 3 * draw(mag)), "power": draw(st.floats(0, 300))} for nm in names]
    links = [
        {
            "between": [u, v],
            "bandwidth": 10 ** (5 + 5 * draw(mag)),
            "latency": draw(st.sampled_from([0.0, 1e-4, 5e-3])) * draw(mag),
            "power": draw(st.sampled_from([0.0, 2.0, 20.0])),
        }
        for u, v in itertools.combinations(names, 2)
        if draw(st.integers(0, 5))
    ]
    cd: dict[str, Any] = {"devices": devices, "links": links, "source": draw(st.sampled_from(names))}
    if draw(st.integers(0, 2)):
        cd["default_link"] = {
            "bandwidth": 10 ** (5 + 5 * draw(mag)),
            "latency": 1e-3 * draw(mag),
            "power": draw(st.sampled_from([0.0, 5.0])),
        }
    if draw(st.booleans()):
        cd["sink"] = draw(st.sampled_from(names))
    draw_inline(draw, cd)
    if shared:
        draw_shared(draw, cd)
    else:
        for d in devices:
            if draw(st.integers(0, 2)) == 0:
                d["stage_overhead"] = draw(st.sampled_from([1e-5, 3e-4, 3e-3]))
    return cd
