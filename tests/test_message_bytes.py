"""What a transfer keeps its link busy for in a stream: the cluster's ``message_bytes``.

A hop's latency holds round trips that overlap in a stream; the engine's messages still
take the wire. With ``message_bytes``, the throughput bottleneck charges a transfer
``(bytes + message_bytes) / bandwidth`` of its link, and the profiler fits it from
streams that fill a link. The oracle in ``test_partition_oracle.py`` draws
``message_bytes`` too; these are the format, fixed cases, and the fit.
"""

from __future__ import annotations

import json

import pytest

from multigpu.execution.link_fitting import LinkFit
from multigpu.execution.stream_fitting import MAX_STREAM_PROBE, StreamSample, fit_message_bytes, stream_probe_size
from multigpu.partition import Cluster, ClusterError, Graph, autopartition, evaluate

WIFI = 1e6  # bytes/s


def graph(out_bytes: float) -> Graph:
    return Graph.from_dict(
        {
            "input_bytes": 100.0,
            "layers": [
                {"name": "a", "flops": 2e7, "param_bytes": 0.0, "output_bytes": out_bytes},
                {"name": "b", "flops": 2e7, "param_bytes": 0.0, "output_bytes": 40.0},
            ],
        }
    )


def cluster(message_bytes: float | None = None) -> Cluster:
    cd = {
        "devices": [{"name": "drv", "flops": 1e9, "power": 5.0}, {"name": "pi", "flops": 1e9, "power": 5.0}],
        "links": [{"between": ["drv", "pi"], "bandwidth": WIFI, "latency": 16e-3}],
        "source": "drv",
        "engine": {"inline_bytes": 1000, "inline_latency": [{"between": ["drv", "pi"], "latency": 2e-3}]},
    }
    if message_bytes is not None:
        cd["engine"]["message_bytes"] = message_bytes
    return Cluster.from_dict(cd)


@pytest.mark.parametrize("value, match", [(-1.0, r"message_bytes=-1\.0 must be"), ("x", r"message_bytes='x'")])
def test_bad_message_bytes_names_the_value_and_the_fix(value, match):
    cd = cluster().to_dict()
    cd["engine"]["message_bytes"] = value
    with pytest.raises(ClusterError, match=match):
        Cluster.from_dict(cd)


def test_message_bytes_round_trip():
    cl = cluster(4500.0)
    assert Cluster.from_dict(json.loads(json.dumps(cl.to_dict()))).engine.message_bytes == 4500.0
    assert "message_bytes" not in cluster().to_dict()["engine"]


def test_a_stream_charges_the_payload_and_the_messages_not_the_latency():
    g = graph(16200.0)
    split = ["drv", "pi"]
    old, new = evaluate(g, cluster(), split), evaluate(g, cluster(4500.0), split)
    # One at a time nothing changes: a hop still costs bytes / bandwidth + its latency.
    assert old.time == new.time and old.makespan == new.makespan
    # Streamed: 16.2 KB takes (16200 + 4500) / 1 MB/s of the link, the 40 B result (40 + 4500) / 1 MB/s,
    # where their hop times were 16.2 + 16 ms and 2 ms + 40 us.
    assert old.bottleneck == pytest.approx(16.2e-3 + 16e-3 + 2.04e-3)
    assert new.bottleneck == pytest.approx(20.7e-3 + 4.54e-3)
    assert new.bottleneck_at == "link drv <-> pi"
    assert [ln.load for ln in new.links] == [pytest.approx(new.bottleneck)]


def test_the_throughput_planner_splits_once_the_link_is_priced_by_its_bytes():
    # Each layer takes 15 ms. Charged its latency, the link (34.2 ms an item) is worse than one device doing
    # both layers (30 ms); charged its bytes and messages (25.2 ms), the split is better.
    g = Graph.from_dict(
        {
            "input_bytes": 100.0,
            "layers": [
                {"name": "a", "flops": 1.5e7, "param_bytes": 0.0, "output_bytes": 16200.0},
                {"name": "b", "flops": 1.5e7, "param_bytes": 0.0, "output_bytes": 40.0},
            ],
        }
    )
    old = autopartition(g, cluster(), objective="throughput", constraints={"memory": False})
    new = autopartition(g, cluster(4500.0), objective="throughput", constraints={"memory": False})
    assert old.assignment == ["drv", "drv"] and old.bottleneck == pytest.approx(30e-3)
    assert new.assignment == ["drv", "pi"] and new.bottleneck == pytest.approx(25.24e-3)


def fit(latency: float = 16e-3, inline: float | None = 2e-3) -> LinkFit:
    return LinkFit(("drv", "pi"), latency, WIFI, [(65536, latency + 65536 / WIFI, 4)], inline, 1000.0)


def test_the_fit_solves_the_model_a_stream_is_priced_by():
    # A stream of 64 KB payloads, each answered with 4 bytes: (b + m) / bw + (4 + m) / bw an item.
    m = 2300.0
    per_item = (65536 + 4 + 2 * m) / WIFI
    got, per_link = fit_message_bytes([StreamSample("pi", 65536, 24, per_item)], [fit()], "drv")
    assert got == pytest.approx(m) and per_link == {"pi": pytest.approx(m)}
    # A cluster with that figure prices the same stream at the time it took.
    cd = {
        "devices": [{"name": "drv", "flops": 1e12, "power": 0.0}, {"name": "pi", "flops": 1e12, "power": 0.0}],
        "links": [{"between": ["drv", "pi"], "bandwidth": WIFI, "latency": 16e-3}],
        "source": "drv",
        "message_bytes": got,
    }
    g = Graph.from_dict(
        {
            "input_bytes": 4.0,
            "layers": [
                {"name": "echo", "flops": 0.0, "param_bytes": 0.0, "output_bytes": 65536.0},
                {"name": "reply", "flops": 0.0, "param_bytes": 0.0, "output_bytes": 4.0},
            ],
        }
    )
    assert evaluate(g, Cluster.from_dict(cd), ["drv", "pi"]).bottleneck == pytest.approx(per_item)


def test_no_fit_where_the_hosts_not_the_link_set_the_rate():
    # A loopback link at 300 MB/s: 64 KB take 0.2 ms of wire, the stream 1.5 ms an item (CPU).
    fast = LinkFit(("drv", "pi"), 6e-3, 3e8, [(65536, 6.2e-3, 4)], 1e-3, 1000.0)
    got, per_link = fit_message_bytes([StreamSample("pi", 65536, 24, 1.5e-3)], [fast], "drv")
    assert got is None and per_link == {"pi": None}
    # A link that carried more than its whole hop time per item is held to that (never above the hop).
    got, _ = fit_message_bytes([StreamSample("pi", 65536, 24, 0.1)], [fit()], "drv")
    assert got == pytest.approx(16e-3 * WIFI)
    # The median over the links a stream filled.
    many = [
        StreamSample(w, 65536, 24, (65536 + 4 + 2 * m) / WIFI)
        for w, m in (("p1", 3000.0), ("p2", 5000.0), ("p3", 7000.0))
    ]
    fits = [LinkFit(("drv", w), 16e-3, WIFI, [], 2e-3, 1000.0) for w in ("p1", "p2", "p3")]
    assert fit_message_bytes(many, fits, "drv")[0] == pytest.approx(5000.0)


def test_the_streamed_payload_goes_through_the_object_store():
    assert stream_probe_size([64, 384, 4096, 65536, 655360], 1024) == 65536
    assert stream_probe_size([256, 4096], 100 * 1024) is None  # under Ray's default threshold: all inline
    assert stream_probe_size([2 * MAX_STREAM_PROBE], 0) is None
