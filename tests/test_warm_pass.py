"""A plan with every layer on one device runs its items one after another there: ``warm_pass``.

Every stage of a split plan waits while other devices compute, as the profile's layer
times were measured (the devices taking turns). The plan with every layer on the source
(which is also the sink) makes no Ray call at all and runs at the back-to-back speed the
profile measured for it (LeNet on an AMD EPYC machine: 0.42 ms back to back, 0.98 ms
after a Ray round trip); one with every layer on a worker calls it item after item with
only the hops in between (ResNet-18 at 64 x 64 on a torch worker of an Intel Xeon VM:
8.3 ms a pass so, 11.5 ms profiled with the devices taking turns). The oracle in
``test_partition_oracle.py`` draws ``warm_pass`` too; these are the file format, the
cost model's special case and the planner's choice, on fixed cases.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from multigpu.partition import Cluster, ClusterError, Graph, autopartition, evaluate

G = Graph.from_dict(
    {
        "input_bytes": 100.0,
        "layers": [{"name": f"l{i}", "flops": 4e6, "param_bytes": 1e3, "output_bytes": 1e3} for i in range(4)],
    }
)


def cluster_dict(warm: float | None = None, sink: str | None = None) -> dict:
    """A slow driver and a fast worker on a quick link: split plans are the cold optimum."""
    drv = {"name": "drv", "flops": 1e9, "power": 10.0, "stage_overhead": 1e-3}
    cd = {
        "devices": [drv, {"name": "gpu", "flops": 1e10, "power": 50.0, "stage_overhead": 1e-3}],
        "links": [{"between": ["drv", "gpu"], "bandwidth": 1e9, "latency": 1e-4}],
        "source": "drv",
        "engine": {"warm_pass": {}},
    }
    if warm is not None:
        cd["engine"]["warm_pass"]["drv"] = {G.name: warm}
    if sink is not None:
        cd["sink"] = sink
    return cd


LOCAL = ["drv"] * 4
COLD_LOCAL = 4 * 4e6 / 1e9 + 1e-3  # 17 ms: four layers and one stage overhead


@pytest.mark.parametrize(
    "value, match",
    [
        ([0.1], r"device 'drv': warm_pass must be a non-empty object mapping a graph name"),
        ({}, r"warm_pass must be a non-empty object"),
        ({"graph": -1.0}, r"device 'drv': warm_pass\['graph'\]"),
        ({"graph": float("inf")}, r"warm_pass\['graph'\]"),
        ({"": 0.1}, r"warm_pass graph name must be a non-empty string"),
    ],
)
def test_a_bad_warm_pass_names_the_device_and_the_fix(value, match):
    cd = cluster_dict()
    cd["engine"]["warm_pass"]["drv"] = value
    with pytest.raises(ClusterError, match=match):
        Cluster.from_dict(cd)


def test_warm_pass_round_trips_through_the_file():
    cl = Cluster.from_dict(cluster_dict(warm=4e-3))
    again = Cluster.from_dict(json.loads(json.dumps(cl.to_dict())))
    assert again.engine.warm_pass == {"drv": {G.name: 4e-3}} and again == cl


def test_only_the_plan_that_never_leaves_the_source_is_priced_warm():
    warm = Cluster.from_dict(cluster_dict(warm=4e-3))
    cold = Cluster.from_dict(cluster_dict())
    local = evaluate(G, warm, LOCAL, wt=1.0, we=0.5)
    assert local.compute_time + local.stage_time == pytest.approx(4e-3)
    assert local.time == pytest.approx(4e-3) and local.energy == pytest.approx(4e-3 * 10.0)
    assert evaluate(G, cold, LOCAL).time == pytest.approx(COLD_LOCAL)
    # The per-layer records add up to it, and the matrix form agrees.
    assert sum(x.time for x in local.layers) == pytest.approx(local.time)
    assert local.matrix.time() == pytest.approx(local.time) and local.matrix.energy() == pytest.approx(local.energy)
    assert local.bottleneck == pytest.approx(4e-3)
    # Any plan with a transfer is priced from the layer times, warm_pass or not ...
    for plan in (["drv", "drv", "gpu", "gpu"], ["gpu"] * 4, ["drv", "gpu", "drv", "drv"]):
        a, b = evaluate(G, warm, plan, wt=1.0, we=0.5), evaluate(G, cold, plan, wt=1.0, we=0.5)
        assert a.cost == b.cost and a.matrix.time() == pytest.approx(b.time)
    # ... but where a stream keeps the driver busy, its own load runs at the busy rate: its
    # warm pass over its layer times (4 of 17 ms), on two layers and a stage overhead.
    split = evaluate(G, warm, ["drv", "drv", "gpu", "gpu"])
    assert split.bottleneck == pytest.approx((2 * 4e-3 + 1e-3) * 4e-3 / COLD_LOCAL)
    assert evaluate(G, cold, ["drv", "drv", "gpu", "gpu"]).bottleneck == pytest.approx(2 * 4e-3 + 1e-3)


def test_a_warm_pass_never_prices_a_plan_up_and_needs_the_source_to_be_the_sink():
    slower = Cluster.from_dict(cluster_dict(warm=1.0))  # above the layers' sum: no effect
    assert evaluate(G, slower, LOCAL).time == pytest.approx(COLD_LOCAL)
    away = Cluster.from_dict(cluster_dict(warm=4e-3, sink="gpu"))  # the output leaves: the driver waits
    bd = evaluate(G, away, LOCAL)
    assert bd.compute_time + bd.stage_time == pytest.approx(COLD_LOCAL)


@pytest.mark.parametrize("objective", ["latency", "makespan", "throughput"])
def test_the_planner_compares_its_optimum_with_the_warm_local_plan(objective):
    # Cold, the split onto the fast worker wins (2.8 ms against 17 ms); warm at 1 ms, the local plan does.
    cold = autopartition(G, Cluster.from_dict(cluster_dict()), objective=objective)
    assert "gpu" in cold.assignment
    warm = autopartition(G, Cluster.from_dict(cluster_dict(warm=1e-3)), objective=objective)
    assert warm.assignment == LOCAL and warm.time == pytest.approx(1e-3)
    # A warm pass that does not beat the split changes nothing.
    same = autopartition(G, Cluster.from_dict(cluster_dict(warm=10e-3)), objective=objective)
    assert same.assignment == cold.assignment and same.cost == pytest.approx(cold.cost)


def test_the_warm_local_plan_still_meets_the_constraints():
    cd = cluster_dict(warm=1e-3)
    cd["devices"][0]["memory"] = 2.5e3  # the driver holds two layers' parameters, not four
    plan = autopartition(G, Cluster.from_dict(cd))
    assert plan.assignment != LOCAL
    # Pinned elsewhere: the local plan is not a candidate.
    pinned = autopartition(G, Cluster.from_dict(cluster_dict(warm=1e-3)), constraints={"pinned": {"l3": "gpu"}})
    assert pinned.assignment[3] == "gpu"
    assert np.isfinite(pinned.cost)


def test_a_workers_warm_pass_prices_the_plan_with_every_layer_on_it():
    cd = cluster_dict()
    cd["engine"]["warm_pass"]["gpu"] = {G.name: 1e-3}
    cl = Cluster.from_dict(cd)
    cold = Cluster.from_dict(cluster_dict())
    on_gpu = evaluate(G, cl, ["gpu"] * 4, wt=1.0, we=0.5)
    assert on_gpu.compute_time + on_gpu.stage_time == pytest.approx(1e-3)  # 2.6 ms cold
    assert on_gpu.energy == pytest.approx(1e-3 * 50.0 + sum(t.energy for t in on_gpu.transfers))
    assert on_gpu.matrix.time() == pytest.approx(on_gpu.time) and on_gpu.bottleneck == pytest.approx(1e-3)
    # The hops to and from it stay as they are; every other plan is priced from the layer times.
    assert on_gpu.time - 1e-3 == pytest.approx(evaluate(G, cold, ["gpu"] * 4).time - (4 * 4e6 / 1e10 + 1e-3))
    for plan in (["drv", "drv", "gpu", "gpu"], LOCAL, ["drv", "gpu", "drv", "drv"]):
        assert evaluate(G, cl, plan).cost == evaluate(G, cold, plan).cost


@pytest.mark.parametrize("objective", ["latency", "makespan", "throughput"])
def test_the_planner_weighs_each_devices_warm_plan(objective):
    """With a driver as fast as the worker, all on the worker is not the cold optimum (it
    adds two hops to the local plan; streamed, a split shares the work); the worker's warm
    pass makes it the optimum, and a driver's warmer one wins back."""
    cd = cluster_dict()
    cd["devices"][0]["flops"] = 1e10
    assert autopartition(G, Cluster.from_dict(cd), objective=objective).assignment != ["gpu"] * 4
    cd["engine"]["warm_pass"]["gpu"] = {G.name: 1e-4}
    plan = autopartition(G, Cluster.from_dict(cd), objective=objective)
    assert plan.assignment == ["gpu"] * 4
    assert plan.breakdown.compute_time + plan.breakdown.stage_time == pytest.approx(1e-4)
    cd["engine"]["warm_pass"]["drv"] = {G.name: 1e-5}
    assert autopartition(G, Cluster.from_dict(cd), objective=objective).assignment == LOCAL
    # A worker the links cannot reach is no candidate, warm or not.
    cut = cluster_dict()
    cut["devices"].append({"name": "far", "flops": 1e12, "power": 1.0})
    cut["engine"]["warm_pass"]["far"] = {G.name: 1e-9}
    assert "far" not in autopartition(G, Cluster.from_dict(cut), objective=objective).assignment
