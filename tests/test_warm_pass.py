"""A plan that never leaves the source runs its items back to back: ``warm_pass``.

Every stage of a split plan starts after a wait (an item arriving), as the profile's
layer times were measured; the plan with every layer on the source (which is also the
sink) makes no Ray call at all, and runs at the back-to-back speed the profile measured
for it (LeNet on this machine: 0.42 ms back to back, 0.98 ms after a Ray round trip).
The oracle in ``test_partition_oracle.py`` draws ``warm_pass`` too; these are the
file format, the cost model's special case and the planner's choice, on fixed cases.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from multigpu.partition import Cluster, ClusterError, Graph, autopartition, evaluate

G = Graph.from_dict({"input_bytes": 100.0, "layers": [
    {"name": f"l{i}", "flops": 4e6, "param_bytes": 1e3, "output_bytes": 1e3} for i in range(4)]})


def cluster_dict(warm: float | None = None, sink: str | None = None) -> dict:
    """A slow driver and a fast worker on a quick link: split plans are the cold optimum."""
    drv = {"name": "drv", "flops": 1e9, "power": 10.0, "stage_overhead": 1e-3}
    if warm is not None:
        drv["warm_pass"] = {G.name: warm}
    cd = {"devices": [drv, {"name": "gpu", "flops": 1e10, "power": 50.0, "stage_overhead": 1e-3}],
          "links": [{"between": ["drv", "gpu"], "bandwidth": 1e9, "latency": 1e-4}], "source": "drv"}
    if sink is not None:
        cd["sink"] = sink
    return cd


LOCAL = ["drv"] * 4
COLD_LOCAL = 4 * 4e6 / 1e9 + 1e-3   # 17 ms: four layers and one stage overhead


@pytest.mark.parametrize("value, match", [
    ([0.1], r"device 'drv': warm_pass must be a non-empty object mapping a graph name"),
    ({}, r"warm_pass must be a non-empty object"),
    ({"graph": -1.0}, r"device 'drv': warm_pass\['graph'\]"),
    ({"graph": float("inf")}, r"warm_pass\['graph'\]"),
    ({"": 0.1}, r"warm_pass graph name must be a non-empty string"),
])
def test_a_bad_warm_pass_names_the_device_and_the_fix(value, match):
    cd = cluster_dict()
    cd["devices"][0]["warm_pass"] = value
    with pytest.raises(ClusterError, match=match):
        Cluster.from_dict(cd)


def test_warm_pass_round_trips_through_the_file():
    cl = Cluster.from_dict(cluster_dict(warm=4e-3))
    again = Cluster.from_dict(json.loads(json.dumps(cl.to_dict())))
    assert again.devices[0].warm_pass == {G.name: 4e-3} and again.devices[1].warm_pass is None


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
    # Any plan with a transfer is priced from the layer times, warm_pass or not.
    for plan in (["drv", "drv", "gpu", "gpu"], ["gpu"] * 4, ["drv", "gpu", "drv", "drv"]):
        a, b = evaluate(G, warm, plan, wt=1.0, we=0.5), evaluate(G, cold, plan, wt=1.0, we=0.5)
        assert a.cost == b.cost and a.bottleneck == b.bottleneck and a.matrix.time() == pytest.approx(b.time)


def test_a_warm_pass_never_prices_a_plan_up_and_needs_the_source_to_be_the_sink():
    slower = Cluster.from_dict(cluster_dict(warm=1.0))   # above the layers' sum: no effect
    assert evaluate(G, slower, LOCAL).time == pytest.approx(COLD_LOCAL)
    away = Cluster.from_dict(cluster_dict(warm=4e-3, sink="gpu"))   # the output leaves: the driver waits
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
    cd["devices"][0]["memory"] = 2.5e3   # the driver holds two layers' parameters, not four
    plan = autopartition(G, Cluster.from_dict(cd))
    assert plan.assignment != LOCAL
    # Pinned elsewhere: the local plan is not a candidate.
    pinned = autopartition(G, Cluster.from_dict(cluster_dict(warm=1e-3)), constraints={"pinned": {"l3": "gpu"}})
    assert pinned.assignment[3] == "gpu"
    assert np.isfinite(pinned.cost)
