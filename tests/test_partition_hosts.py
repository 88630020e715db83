"""Hosts, transfer CPU and the relay: the cluster-file fields, checked on load, and the
host term of the throughput bottleneck on hand-computed examples. (The exact optimum
against brute force is in test_partition_oracle.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

from multigpu.partition import (
    Cluster,
    ClusterError,
    DeviceSpec,
    EngineProfile,
    Graph,
    LayerSpec,
    LinkSpec,
    autopartition,
    evaluate,
    format_report,
    load_cluster,
)
from multigpu.partition.inputs.hosts import HostSpec, Relay, TransferCpu

MS = 1e-3


def graph() -> Graph:
    """Two layers of 4 ms and 3 ms on a 1 GFLOP/s device; no bytes to move."""
    return Graph(layers=(LayerSpec("l0", 4e6, 0.0, 0.0), LayerSpec("l1", 3e6, 0.0, 0.0)), input_bytes=0.0, name="g")


def cluster(cores=None, relay=True, driver_flops=1e8) -> Cluster:
    """The driver ``d`` (the source, slow) and workers ``a``, ``b``; every transfer
    costs 1 ms of CPU at each end and 0.5 ms in the driver when it relays it."""
    host = "box" if cores is not None else None
    cpu = TransferCpu(fixed=1 * MS)
    devices = (
        DeviceSpec("d", driver_flops, 0.0, host=host),
        DeviceSpec("a", 1e9, 0.0, host=host),
        DeviceSpec("b", 1e9, 0.0, host=host),
    )
    return Cluster(
        devices=devices,
        source="d",
        default_link=LinkSpec(1e9, 1e-5),
        hosts=(HostSpec("box", cores),) if cores is not None else (),
        engine=EngineProfile(
            transfer_cpu={"d": cpu, "a": cpu, "b": cpu}, relay=Relay("d", 0.5 * MS) if relay else None
        ),
    )


def test_loads_by_hand():
    """[a, b]: transfers d -> a, a -> b (relayed by d), b -> d.
    a: 4 ms compute + 1 ms receive + 1 ms send = 6 ms; b: 3 + 1 + 1 = 5 ms;
    d: 1 ms send + 1 ms receive + 0.5 ms relay = 2.5 ms; the host's 2 cores: 13.5 / 2 = 6.75 ms."""
    bd = evaluate(graph(), cluster(cores=2), ["a", "b"])
    load = {d.name: d.load for d in bd.devices}
    assert load == pytest.approx({"d": 2.5 * MS, "a": 6 * MS, "b": 5 * MS})
    assert {d.name: d.transfer_cpu for d in bd.devices} == pytest.approx({"d": 2.5 * MS, "a": 2 * MS, "b": 2 * MS})
    assert bd.hosts[0].load == pytest.approx(13.5 * MS) and bd.hosts[0].share == pytest.approx(6.75 * MS)
    assert bd.bottleneck == pytest.approx(6.75 * MS) and bd.bottleneck_at == "host 'box' (2 cores)"
    # Three cores: the host no longer binds; device a does (6 ms).
    bd3 = evaluate(graph(), cluster(cores=3), ["a", "b"])
    assert bd3.bottleneck == pytest.approx(6 * MS) and bd3.bottleneck_at == "device 'a'"
    # No relay: the driver only sends and receives (2 ms), the host holds 13 ms.
    bd_nr = evaluate(graph(), cluster(cores=2, relay=False), ["a", "b"])
    assert bd_nr.device("d").load == pytest.approx(2 * MS) and bd_nr.hosts[0].load == pytest.approx(13 * MS)
    # Transfer CPU is in the bottleneck only: T is compute + link times, as before.
    plain = evaluate(
        graph(),
        Cluster(
            devices=tuple(DeviceSpec(n, f, 0.0) for n, f in (("d", 1e8), ("a", 1e9), ("b", 1e9))),
            source="d",
            default_link=LinkSpec(1e9, 1e-5),
        ),
        ["a", "b"],
    )
    assert bd.time == pytest.approx(plain.time) and plain.bottleneck == pytest.approx(4 * MS)


def test_a_host_below_one_core_counts_compute_at_its_share_and_transfer_cpu_in_full():
    """On a host of half a core, a layer's time is wall time there (the quota is in it), so
    a second of compute is half a CPU-second; transfer CPU is CPU time. [a, b] on 0.5
    cores: a's 4 ms and b's 3 ms of compute are 3.5 CPU-ms, the 6 transfer-ms (d: 2,
    a: 2, b: 2) and the 0.5 ms relay, over 0.5 cores: (3.5 + 6.5) / 0.5 = 20 ms. Counting
    compute as CPU time too would charge the quota twice: (7 + 6.5) / 0.5 = 27 ms (the lab's
    AlexNet streamed on imac, 0.46 cores, was predicted at 130 ms an item that way, and
    measured at 66). The best plan keeps both layers on one worker: (3.5 + 4) / 0.5 = 15 ms."""
    g = Graph(layers=(LayerSpec("l0", 4e6, 0.0, 0.0), LayerSpec("l1", 3e6, 0.0, 0.0)), input_bytes=0.0, name="g")
    bd = evaluate(g, cluster(cores=0.5), ["a", "b"])
    assert bd.hosts[0].load == pytest.approx(10 * MS) and bd.hosts[0].share == pytest.approx(20 * MS)
    assert bd.bottleneck == pytest.approx(20 * MS) and bd.bottleneck_at == "host 'box' (0.5 cores)"
    # A whole core or more: a second of one thread's compute is a CPU-second, as before.
    assert evaluate(g, cluster(cores=1), ["a", "b"]).hosts[0].load == pytest.approx(13.5 * MS)
    # The solver prices it the same way (the MILP's host row).
    best = autopartition(g, cluster(cores=0.5), objective="throughput")
    assert best.assignment in (["a", "a"], ["b", "b"]) and best.bottleneck == pytest.approx(15 * MS)


def test_the_host_term_changes_the_throughput_plan():
    """Without a host, splitting over a and b gives 6 ms (a: 4 + 2); keeping both
    layers on a gives 9 ms (7 + 2). On one shared core every plan's host load is its
    total work: [a, a] costs 9 + 2 = 11 ms, [a, b] 13.5 ms, so the plan no longer splits."""
    free = autopartition(graph(), cluster(), objective="throughput")
    assert free.bottleneck == pytest.approx(6 * MS) and len(set(free.assignment)) == 2
    one = autopartition(graph(), cluster(cores=1), objective="throughput")
    assert one.assignment == ["a", "a"]
    assert one.bottleneck == pytest.approx(11 * MS) and one.breakdown.bottleneck_at == "host 'box' (1 cores)"
    assert evaluate(graph(), cluster(cores=1), ["a", "b"]).bottleneck == pytest.approx(13.5 * MS)
    text = format_report(one, graph(), cluster(cores=1))
    assert "Per host" in text and "at host 'box'" in text


def test_fields_round_trip_through_the_file(tmp_path):
    cl = cluster(cores=2)
    f = tmp_path / "c.json"
    f.write_text(json.dumps(cl.to_dict()))
    back = load_cluster(f)
    assert back == cl
    data = json.loads(f.read_text())
    assert data["hosts"] == {"box": {"cores": 2.0}} and data["engine"]["relay"] == {
        "device": "d",
        "fixed": 0.5 * MS,
        "per_byte": 0.0,
    }
    assert data["devices"][1] == {"name": "a", "flops": 1e9, "power": 0.0, "host": "box"}
    assert data["engine"]["transfer_cpu"]["a"] == {"fixed": MS, "per_byte": 0.0}


def base() -> dict:
    return {
        "devices": [
            {"name": "d", "flops": 1e9, "power": 0, "host": "box"},
            {"name": "a", "flops": 1e9, "power": 0, "host": "box"},
        ],
        "hosts": {"box": {"cores": 2}},
        "engine": {
            "transfer_cpu": {"a": {"fixed": 1e-4, "per_byte": 1e-9}},
            "relay": {"device": "d", "fixed": 1e-4},
        },
        "source": "d",
    }


@pytest.mark.parametrize(
    "edit, match",
    [
        (
            lambda c: c["devices"][0].update(host="bx"),
            "device 'd': host 'bx' is not in the cluster's \"hosts\" \\(hosts: box\\); add",
        ),
        (lambda c: c.pop("hosts"), "host 'box' is not in the cluster's \"hosts\" \\(hosts: none"),
        (lambda c: c["hosts"].update(spare={"cores": 4}), "host 'spare' in \"hosts\" has no device"),
        (lambda c: c["hosts"]["box"].update(cores=0), "host 'box': cores=0 must be greater than 0"),
        (lambda c: c["hosts"]["box"].update(cores=float("inf")), "host 'box': cores=inf must be a finite number"),
        (lambda c: c["hosts"]["box"].update(cores="two"), "host 'box': cores='two' must be a number"),
        (lambda c: c["hosts"]["box"].update(threads=2), "hosts\\['box'\\] has unknown key 'threads'"),
        (lambda c: c["hosts"].update(box={}), "hosts\\['box'\\] is missing the key 'cores'"),
        (lambda c: c.update(hosts={}), '"hosts" must be a non-empty object'),
        (lambda c: c.update(hosts=[{"cores": 2}]), '"hosts" must be a non-empty object'),
        (lambda c: c["devices"][0].update(host=""), "device 'd': host must be a non-empty string"),
        (
            lambda c: c["engine"]["transfer_cpu"]["a"].update(fixed=-1e-4),
            "device 'a': transfer_cpu: fixed=-0.0001 must be at least 0",
        ),
        (
            lambda c: c["engine"]["transfer_cpu"]["a"].update(per_byte=float("nan")),
            "device 'a': transfer_cpu: per_byte=nan must be a finite number",
        ),
        (
            lambda c: c["engine"]["transfer_cpu"]["a"].update(latency=1e-4),
            "device 'a': transfer_cpu has unknown key 'latency'",
        ),
        (lambda c: c["engine"]["transfer_cpu"].update(a=1e-4), "device 'a': transfer_cpu must be an object"),
        (lambda c: c["engine"].update(transfer_cpu=[]), "engine: transfer_cpu must be an object mapping a device"),
        (lambda c: c["engine"]["transfer_cpu"]["a"].pop("fixed"), "transfer_cpu is missing the key 'fixed'"),
        (
            lambda c: c["engine"]["relay"].update(device="driver"),
            "relay device names 'driver', which is not a device; choose one of: d, a",
        ),
        (lambda c: c["engine"]["relay"].update(fixed=-1.0), "relay: fixed=-1.0 must be at least 0"),
        (lambda c: c["engine"]["relay"].pop("device"), "relay is missing the key 'device'"),
        (lambda c: c["engine"]["relay"].update(cores=1), "relay has unknown key 'cores'"),
        (lambda c: c.update(host={"box": 2}), "cluster has unknown key 'host'"),
    ],
)
def test_bad_host_and_cpu_fields_are_rejected_on_load(edit, match, tmp_path):
    data = base()
    load_cluster(_write(tmp_path, data))  # the base file is fine
    edit(data)
    with pytest.raises(ClusterError, match=match):
        load_cluster(_write(tmp_path, data))


def _refused(tmp_path, data, cases):
    """Each (transfer_cpu extra keys, message) case, set on device 'a', is refused with the message."""
    for tc, match in cases:
        data["engine"]["transfer_cpu"]["a"] = {"fixed": 1e-4, "per_byte": 1e-9, **tc}
        with pytest.raises(ClusterError, match=match):
            load_cluster(_write(tmp_path, data))


def _write(tmp_path, data):
    f = tmp_path / "cluster.json"
    f.write_text(json.dumps(data))
    return f


def test_a_link_inside_one_host_with_transfer_cpu_is_no_resource():
    """A 5 ms link latency each way puts 10 ms on link d <-> a for [a, a]. Between two
    processes of one host that both have transfer CPU, that time is their CPU work
    (already in their loads) plus waiting, so only the loads count: a = 7 + 0.2 ms.
    With a device on another host, or without transfer_cpu, the link's 10 ms binds."""

    def two(host_a, cpu_a, d_flops=1e9):
        return Cluster(
            devices=(
                DeviceSpec("d", d_flops, 0.0, host="box"),
                DeviceSpec("a", 1e9, 0.0, host=host_a),
            ),
            source="d",
            default_link=LinkSpec(1e9, 5 * MS),
            hosts=(HostSpec("box", 4),) + ((HostSpec("other", 4),) if host_a == "other" else ()),
            engine=EngineProfile(
                transfer_cpu={"d": TransferCpu(0.1 * MS)} | ({"a": TransferCpu(0.1 * MS)} if cpu_a else {})
            ),
        )

    g = graph()
    inside = evaluate(g, two("box", True), ["a", "a"])
    assert inside.bottleneck == pytest.approx(7.2 * MS) and inside.bottleneck_at == "device 'a'"
    assert inside.links[0].cpu_work and inside.links[0].load == pytest.approx(10 * MS)
    for other in (two("other", True), two("box", False)):
        bd = evaluate(g, other, ["a", "a"])
        assert bd.bottleneck == pytest.approx(10 * MS) and bd.bottleneck_at == "link d <-> a"
        assert not bd.links[0].cpu_work
    # The planner agrees. d computes both layers in 8 ms: inside one host, handing work
    # to a pays; across hosts every hand-off costs the link's 10 ms, so d keeps it all.
    slow = 7e6 / 8e-3
    plan = autopartition(g, two("box", True, slow), objective="throughput")
    assert "a" in plan.assignment and plan.bottleneck < 8 * MS
    plan = autopartition(g, two("other", True, slow), objective="throughput")
    assert plan.assignment == ["d", "d"] and plan.bottleneck == pytest.approx(8 * MS)


def test_a_host_of_one_device_counts_the_cpu_off_its_computing_thread():
    """d1's transfer CPU is all off its computing thread (serial 0): its own load misses
    it, but its host's single core does not. Sending l0's 100 B to d0 and receiving the
    10 MB output back costs d1 1 us + 0.1 s of CPU, so the optimum keeps the last layer
    on d1 (10 ms) instead."""
    g = Graph(layers=(LayerSpec("l0", 0.0, 0.0, 100.0), LayerSpec("l1", 1e7, 0.0, 1e7)), input_bytes=0.0, name="g2")
    cl = Cluster(
        devices=(
            DeviceSpec("d0", 1e12, 0.0),
            DeviceSpec("d1", 1e9, 0.0, host="h0"),
        ),
        source="d1",
        default_link=LinkSpec(1e10, 0.0),
        hosts=(HostSpec("h0", 1),),
        engine=EngineProfile(transfer_cpu={"d1": TransferCpu(0.0, 1e-8, serial_fixed=0.0, serial_per_byte=0.0)}),
    )
    away = evaluate(g, cl, ["d1", "d0"])
    assert away.device("d1").load == 0.0 and away.device("d1").transfer_cpu == pytest.approx(0.100001)
    assert away.bottleneck == pytest.approx(0.100001) and away.bottleneck_at == "host 'h0' (1 cores)"
    plan = autopartition(g, cl, objective="throughput")
    assert plan.assignment[-1] == "d1" and plan.bottleneck == pytest.approx(0.01)


def test_serial_part_round_trips_and_is_checked(tmp_path):
    data = base()
    data["engine"]["transfer_cpu"]["a"]["serial"] = {"fixed": 5e-5, "per_byte": 5e-10}
    data["engine"]["relay"]["serial"] = {"fixed": 2e-5}
    cl = load_cluster(_write(tmp_path, data))
    a = cl.engine.transfer_cpu["a"]
    assert (a.serial_fixed, a.serial_per_byte) == (5e-5, 5e-10) and cl.engine.relay.serial_cost(0) == 2e-5
    assert load_cluster(_write(tmp_path, cl.to_dict())) == cl
    for serial, match in (
        ({"fixed": 2e-4}, "serial: fixed = 0.0002 is more than the whole fixed = 0.0001"),
        ({"per_byte": 1e-10}, "serial is missing the key 'fixed'"),
        ({"fixed": 1e-5, "share": 1}, "serial has unknown key 'share'"),
        ({"fixed": -1e-5}, "serial: fixed=-1e-05 must be at least 0"),
    ):
        data["engine"]["transfer_cpu"]["a"]["serial"] = serial
        with pytest.raises(ClusterError, match=match):
            load_cluster(_write(tmp_path, data))


def test_a_receive_figure_prices_what_a_device_receives_and_round_trips(tmp_path):
    """d1 receives l0's 1 MB from d0 and sends its 100 B output back: with a receive figure
    of 1e-8 s/B it spends 10 ms + 2 fixed on the receive, with per_byte 1e-10 only 0.1 ms on
    the send; d0's figures (no receive_per_byte) price both directions at its per_byte."""
    g = Graph(layers=(LayerSpec("l0", 0.0, 0.0, 1e6), LayerSpec("l1", 0.0, 0.0, 100.0)), input_bytes=0.0, name="g2")
    cl = Cluster(
        devices=(
            DeviceSpec("d0", 1e12, 0.0),
            DeviceSpec("d1", 1e9, 0.0),
        ),
        source="d0",
        default_link=LinkSpec(1e10, 0.0),
        engine=EngineProfile(
            transfer_cpu={"d0": TransferCpu(1e-4, 2e-9), "d1": TransferCpu(1e-4, 1e-10, receive_per_byte=1e-8)}
        ),
    )
    r = evaluate(g, cl, ["d0", "d1"])
    assert r.device("d1").transfer_cpu == pytest.approx((1e-4 + 1e-8 * 1e6) + (1e-4 + 1e-10 * 100))
    assert r.device("d0").transfer_cpu == pytest.approx((1e-4 + 2e-9 * 1e6) + (1e-4 + 2e-9 * 100))
    # The file form: the key, its serial part, and what is refused.
    data = base()
    data["engine"]["transfer_cpu"]["a"].update(
        receive_per_byte=4e-9, serial={"fixed": 5e-5, "per_byte": 5e-10, "receive_per_byte": 1e-9}
    )
    back = load_cluster(_write(tmp_path, data))
    a = back.engine.transfer_cpu["a"]
    assert (a.receive_per_byte, a.serial_receive_per_byte) == (4e-9, 1e-9)
    assert a.receive_cost(1000) == pytest.approx(1e-4 + 4e-6) and a.serial_receive_cost(1000) == pytest.approx(
        5e-5 + 1e-6
    )
    assert load_cluster(_write(tmp_path, back.to_dict())) == back
    _refused(
        tmp_path,
        data,
        (
            ({"receive_per_byte": -1.0}, "transfer_cpu: receive_per_byte=-1.0 must be at least 0"),
            (
                {"receive_per_byte": 4e-9, "serial": {"fixed": 0.0}},
                "serial is missing the key 'receive_per_byte' \\(the whole has one\\)",
            ),
            (
                {"serial": {"fixed": 0.0, "receive_per_byte": 2e-9}},
                "serial: receive_per_byte = 2e-09 is more than the whole per_byte \\(it has no "
                "receive_per_byte\\) = 1e-09",
            ),
            (
                {"receive_per_byte": 4e-9, "serial": {"fixed": 0.0, "receive_per_byte": 5e-9}},
                "serial: receive_per_byte = 5e-09 is more than the whole receive_per_byte = 4e-09",
            ),
        ),
    )
    data["engine"]["transfer_cpu"]["a"] = {"fixed": 1e-4, "per_byte": 1e-9}
    data["engine"]["relay"]["receive_per_byte"] = 1e-9
    with pytest.raises(ClusterError, match="relay has unknown key 'receive_per_byte'"):
        load_cluster(_write(tmp_path, data))


def test_an_inline_figure_prices_the_transfers_inside_the_engines_message_and_round_trips(tmp_path):
    """With inline_bytes = 1000, d1's 100 B output travels inside Ray's message and costs
    each end its inline_fixed; the 1 MB input goes through the store and costs fixed. The
    relay prices each hop the same way. The file form round-trips; what is refused names
    the key and the fix."""
    g = Graph(layers=(LayerSpec("l0", 0.0, 0.0, 1e6), LayerSpec("l1", 0.0, 0.0, 100.0)), input_bytes=0.0, name="g2")
    cl = Cluster(
        devices=(
            DeviceSpec("d0", 1e12, 0.0),
            DeviceSpec("d1", 1e9, 0.0),
            DeviceSpec("d2", 1e9, 0.0),
        ),
        source="d0",
        sink="d2",
        default_link=LinkSpec(1e10, 0.0),
        engine=EngineProfile(
            inline_bytes=1000,
            transfer_cpu={"d0": TransferCpu(3e-3, 1e-9, inline_fixed=4e-4), "d1": TransferCpu(2e-3, 1e-9)},
            relay=Relay("d0", 1e-3, 0.0, inline_fixed=1e-4),
        ),
    )
    r = evaluate(g, cl, ["d0", "d1"])
    # d0 sends the 1 MB (store); d1 receives it and sends 100 B to d2 (inline: d1 has no
    # inline figure, so its fixed); d0 relays that hop at its inline figure.
    assert r.device("d0").transfer_cpu == pytest.approx((3e-3 + 1e-9 * 1e6) + 1e-4)
    assert r.device("d1").transfer_cpu == pytest.approx((2e-3 + 1e-9 * 1e6) + (2e-3 + 1e-9 * 100))
    assert load_cluster(_write(tmp_path, cl.to_dict())) == cl
    data = base()
    data["engine"]["inline_bytes"] = 1000
    data["engine"]["transfer_cpu"]["a"].update(
        inline_fixed=2e-5, serial={"fixed": 5e-5, "per_byte": 0.0, "inline_fixed": 1e-5}
    )
    data["engine"]["relay"].update(inline_fixed=3e-5, serial={"fixed": 1e-5, "inline_fixed": 1e-5})
    back = load_cluster(_write(tmp_path, data))
    a = back.engine.transfer_cpu["a"]
    assert (a.inline_fixed, a.serial_inline_fixed) == (2e-5, 1e-5)
    assert a.cost(1000, 1000) == pytest.approx(2e-5 + 1e-6) and a.cost(1001, 1000) == pytest.approx(1e-4 + 1.001e-6)
    assert a.serial_cost(10, 1000) == pytest.approx(1e-5) and a.cost(10) == pytest.approx(1e-4 + 1e-8)
    assert load_cluster(_write(tmp_path, back.to_dict())) == back
    _refused(
        tmp_path,
        data,
        (
            ({"inline_fixed": -1.0}, "transfer_cpu: inline_fixed=-1.0 must be at least 0"),
            (
                {"inline_fixed": 2e-5, "serial": {"fixed": 0.0}},
                "serial is missing the key 'inline_fixed' \\(the whole has one\\)",
            ),
            (
                {"serial": {"fixed": 0.0, "inline_fixed": 1e-5}},
                "serial: inline_fixed = 1e-05 needs 'inline_fixed' as well",
            ),
            (
                {"inline_fixed": 2e-5, "serial": {"fixed": 0.0, "inline_fixed": 3e-5}},
                "serial: inline_fixed = 3e-05 is more than the whole inline_fixed = 2e-05",
            ),
        ),
    )
    data["engine"]["transfer_cpu"]["a"] = {"fixed": 1e-4, "inline_fixed": 2e-5}
    data["engine"].pop("inline_bytes")
    data["engine"]["relay"] = {"device": "d", "fixed": 1e-4}
    with pytest.raises(
        ClusterError,
        match="device 'a': transfer_cpu: inline_fixed = 2e-05 prices a transfer of at "
        "most the engine's inline_bytes, which is 0 \\(not given\\); give "
        '"inline_bytes" in "engine"',
    ):
        load_cluster(_write(tmp_path, data))


def test_latency_and_transfer_cpu_choose_the_inline_regime_by_one_rule():
    """At most inline_bytes (and inline_bytes > 0) is inline, for the links' latency as for
    the transfer CPU; inline_bytes = 0 means no inline regime, even for an empty transfer."""
    from multigpu.partition.inputs.cluster import transfer_latency

    cpu = TransferCpu(3e-3, 0.0, inline_fixed=4e-4)
    for nbytes, limit, inline in ((0, 0, False), (768, 768, True), (769, 768, False), (0, 768, True)):
        assert transfer_latency(nbytes, 1e-3, 5e-4, limit) == (5e-4 if inline else 1e-3), (nbytes, limit)
        assert cpu.cost(nbytes, limit) == pytest.approx(4e-4 if inline else 3e-3), (nbytes, limit)
    sizes = np.array([0.0, 500.0, 2000.0])
    assert np.array_equal(transfer_latency(sizes, 1e-3, 5e-4, 1000), [5e-4, 5e-4, 1e-3])
