"""Constrained AutoPartition: the MILP optimum equals brute force over the feasible
assignments, and an infeasible problem names its binding constraint."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st
from test_partition_oracle import SETTINGS, Brute, build, close, instances, ref_evaluate, weights

from multigpu.partition import (
    Cluster,
    Constraints,
    DeviceSpec,
    Graph,
    InfeasibleError,
    LayerSpec,
    Link,
    LinkSpec,
    PartitionInputError,
    UnusableLinkError,
    autopartition,
    evaluate,
    load_cluster,
    load_graph,
)

TOL = 1e-6  # the library honours limits to this relative tolerance


def _row(assignment: list[str], names: list[str]) -> int:
    k = len(names)
    return sum(names.index(a) * k ** (len(assignment) - 1 - i) for i, a in enumerate(assignment))


@settings(max_examples=70, **SETTINGS)
@given(
    instances(max_n=6, max_k=4),
    weights,
    st.booleans(),
    st.sampled_from(["latency", "throughput"]),
    st.sampled_from(["auto", "milp"]),
    st.data(),
)
def test_constrained_optimum_equals_bruteforce(inst, w, ship, objective, solver, data):
    gd, cd = inst
    cd = copy.deepcopy(cd)
    bf0 = Brute(gd, cd, ship)
    assume(bf0.valid.any())
    k, names = bf0.k, bf0.names
    q = st.floats(0.0, 1.0)

    def quantile(values: np.ndarray) -> float:
        return float(np.quantile(values[bf0.valid], data.draw(q)))

    # Memory goes into the cluster file; busy time, energy, pins and exclusions into Constraints.
    mem = np.full(k, np.inf)
    for d in range(k):
        if data.draw(st.booleans()):
            mem[d] = max(quantile(bf0.memory[:, d]), 1.0)
            cd["devices"][d]["memory"] = mem[d]
    busy = np.full(k, np.inf)
    busy_map = {}
    for d in range(k):
        if data.draw(st.integers(0, 3)) == 0:
            busy[d] = busy_map[names[d]] = max(quantile(bf0.busy[:, d]), 1e-12)
    budget = math.inf
    if data.draw(st.booleans()):
        budget = max(quantile(bf0.E_constrained), 1e-12)
    pins = {}
    if data.draw(st.integers(0, 3)) == 0:
        pins[f"l{data.draw(st.integers(0, bf0.n - 1))}"] = data.draw(st.sampled_from(names))
    excluded = []
    if k > 1 and data.draw(st.integers(0, 3)) == 0:
        excluded = [data.draw(st.sampled_from(names))]
    cons = Constraints(
        busy_time=busy_map or None, energy_budget=None if math.isinf(budget) else budget, pinned=pins, excluded=excluded
    )

    A = bf0.A
    fixed = bf0.valid.copy()
    for layer, dev in pins.items():
        fixed &= A[:, int(layer[1:])] == names.index(dev)
    for dev in excluded:
        fixed &= ~(A == names.index(dev)).any(axis=1)

    def feasible(f: float) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return (
                fixed
                & (bf0.memory <= mem * f).all(1)
                & (bf0.busy <= busy * f).all(1)
                & (bf0.E_constrained <= budget * f)
            )

    strict, loose = feasible(1 - TOL), feasible(1 + TOL)
    graph, cluster = build(gd, cd)
    if not loose.any():
        event("infeasible")
        with pytest.raises(InfeasibleError, match="infeasible|excluded|pinned"):
            autopartition(
                graph, cluster, *w, objective=objective, constraints=cons, ship_params=ship, solver=solver, gap=0
            )
        return
    assume(strict.any())  # a limit sitting within 1e-6 of every candidate is a tie, not a test
    plan = autopartition(
        graph, cluster, *w, objective=objective, constraints=cons, ship_params=ship, solver=solver, gap=0
    )
    event(f"{objective} solved by {plan.solver}")
    row = _row(plan.assignment, names)
    assert loose[row], "the plan breaks a constraint"
    if objective == "latency":
        cost = bf0.cost(*w)
        lo, hi = cost[loose].min(), cost[strict].min()
        assert lo * (1 - 1e-7) - 1e-12 <= plan.cost <= hi * (1 + 1e-7) + 1e-12, (plan.cost, lo, hi)
    else:
        b = bf0.bottleneck
        lo, hi = b[loose].min(), b[strict].min()
        assert lo * (1 - 1e-6) - 1e-15 <= plan.bottleneck <= hi * (1 + 1e-6) + 1e-15, (plan.bottleneck, lo, hi)
    T, E, cost = ref_evaluate(gd, cd, plan.assignment, *w, ship=ship)
    assert close(plan.time, T) and close(plan.energy, E) and close(plan.cost, cost)
    for layer, dev in pins.items():
        assert plan.assignment[int(layer[1:])] == dev
    assert not set(excluded) & set(plan.assignment)


# -- hand-built cases -------------------------------------------------------------------------
def two_device_cluster(mem_slow=None, mem_fast=None, power_fast=100.0) -> Cluster:
    return Cluster(
        devices=(DeviceSpec("slow", 1e9, 2.0, mem_slow), DeviceSpec("fast", 1e11, power_fast, mem_fast)),
        links=(Link(("slow", "fast"), 1e9, 0.0),),
        source="slow",
    )


def chain(n=4, params=100.0, flops=1e9, out=10.0) -> Graph:
    return Graph(tuple(LayerSpec(f"l{i}", flops, params, out) for i in range(n)), input_bytes=10.0)


def test_dp_fast_path_when_memory_does_not_bind():
    plan = autopartition(load_graph("alexnet"), load_cluster("lab"))
    assert plan.solver == "dp" and plan.assignment == ["pi1"] * 19


def test_memory_binds_and_milp_respects_it():
    g = chain(4, params=100.0)
    free = autopartition(g, two_device_cluster(), constraints={"memory": False})
    assert free.assignment == ["fast"] * 4
    # fast holds at most two layers' parameters (+ the activation): the rest must stay on slow.
    plan = autopartition(g, two_device_cluster(mem_fast=215.0))
    assert plan.solver in ("milp", "bound", "ideal dp")
    assert plan.assignment.count("fast") == 2
    fast = plan.breakdown.device("fast")
    assert fast.memory <= 215.0 and fast.memory_limit == 215.0


def test_energy_budget_below_minimum_names_it():
    g, c = chain(), two_device_cluster()
    e_min = autopartition(g, c, wt=0.0, we=1.0).energy
    with pytest.raises(InfeasibleError, match=r"energy budget.*least energy") as exc:
        autopartition(g, c, constraints={"energy_budget": e_min * 0.5})
    assert f"{e_min:.6g}" in str(exc.value)
    plan = autopartition(g, c, constraints={"energy_budget": e_min * 1.0001})
    assert plan.energy <= e_min * 1.0001


def test_layer_that_fits_nowhere_names_layer_and_memory():
    g = Graph((LayerSpec("small", 1e6, 10, 10), LayerSpec("huge", 1e6, 1e6, 10)), input_bytes=10)
    with pytest.raises(InfeasibleError, match=r"memory.*'huge'.*--ignore-memory"):
        autopartition(g, two_device_cluster(mem_slow=1e3, mem_fast=1e3))


def test_memory_spread_infeasible_names_memory():
    # Each layer fits somewhere, but all four do not fit on both devices together.
    with pytest.raises(InfeasibleError, match=r"\(memory\)"):
        autopartition(chain(4, params=100.0), two_device_cluster(mem_slow=120.0, mem_fast=120.0))


def test_busy_time_infeasible_names_busy():
    with pytest.raises(InfeasibleError, match="busy"):
        autopartition(chain(4, flops=1e9), two_device_cluster(), constraints={"busy_time": 0.015})
    plan = autopartition(chain(4, flops=1e9), two_device_cluster(), constraints={"busy_time": {"fast": 0.015}})
    assert plan.breakdown.device("fast").compute_time <= 0.015 * (1 + 1e-9)


def test_constraints_together_but_not_alone():
    # memory forces a layer onto 'fast'; the budget only allows 'slow' (fast burns 1e5 W).
    g = chain(2, params=100.0)
    c = two_device_cluster(mem_slow=150.0, power_fast=1e5)
    e_all_slow = evaluate(g, c, ["slow", "slow"]).energy
    with pytest.raises(InfeasibleError, match="memory and energy-budget constraints can each be met alone"):
        autopartition(g, c, constraints={"energy_budget": e_all_slow * 1.5})


def test_pins_and_exclusions():
    g, c = chain(), two_device_cluster()
    plan = autopartition(g, c, constraints={"pinned": {"l1": "slow", 3: "slow"}})
    assert plan.assignment[1] == "slow" and plan.assignment[3] == "slow" and plan.solver == "dp"
    assert autopartition(g, c, constraints={"excluded": ["fast"]}).assignment == ["slow"] * 4
    with pytest.raises(InfeasibleError, match="pinned to 'fast', which is excluded"):
        autopartition(g, c, constraints={"pinned": {"l0": "fast"}, "excluded": ["fast"]})
    with pytest.raises(InfeasibleError, match="every device is excluded"):
        autopartition(g, c, constraints={"excluded": ["fast", "slow"]})
    with pytest.raises(PartitionInputError, match="'gpu' is not a device"):
        autopartition(g, c, constraints={"pinned": {"l0": "gpu"}})
    with pytest.raises(PartitionInputError, match="unknown layer 'conv9'"):
        autopartition(g, c, constraints={"pinned": {"conv9": "fast"}})
    with pytest.raises(PartitionInputError, match="unknown constraint 'memroy'"):
        autopartition(g, c, constraints={"memroy": False})
    with pytest.raises(PartitionInputError, match="busy_time.*must be greater than 0"):
        autopartition(g, c, constraints={"busy_time": -1})


def test_missing_link_is_avoided_and_evaluate_raises():
    # src -- mid -- gpu, no src--gpu link and no default link.
    c = Cluster(
        devices=(DeviceSpec("src", 1e9, 1.0), DeviceSpec("mid", 1e9, 1.0), DeviceSpec("gpu", 1e13, 1.0)),
        links=(Link(("src", "mid"), 1e9, 0.0), Link(("mid", "gpu"), 1e9, 0.0)),
        source="src",
    )
    g = chain(3, flops=1e10)
    with pytest.raises(UnusableLinkError, match="no link joins 'src' and 'gpu'.*default_link"):
        evaluate(g, c, ["gpu", "gpu", "gpu"])
    plan = autopartition(g, c)
    a = plan.assignment
    for u, v in zip(["src"] + a, a + ["src"]):
        assert {u, v} != {"src", "gpu"}
    # Pinning a layer where it cannot be reached names the gap.
    with pytest.raises(InfeasibleError, match="link"):
        autopartition(g, c, constraints={"pinned": {"l0": "gpu"}})


def test_unreachable_sink_is_infeasible():
    c = Cluster(devices=(DeviceSpec("a", 1e9, 1.0), DeviceSpec("b", 1e9, 1.0)), source="a", sink="b")
    with pytest.raises(InfeasibleError, match="sink 'b'"):
        autopartition(chain(2), c)


def test_solver_and_objective_arguments():
    g, c = chain(), two_device_cluster(mem_fast=1e9)
    with pytest.raises(PartitionInputError, match="solver='dp' cannot enforce.*memory"):
        autopartition(g, c, solver="dp")
    with pytest.raises(PartitionInputError, match="throughput objective needs"):
        autopartition(g, c, objective="throughput", solver="dp")
    with pytest.raises(PartitionInputError, match="objective='fastest' is unknown"):
        autopartition(g, c, objective="fastest")
    with pytest.raises(PartitionInputError, match="wt=0 and we=0"):
        autopartition(g, c, wt=0, we=0)
    with pytest.raises(PartitionInputError, match="we=nan"):
        autopartition(g, c, we=float("nan"))
    with pytest.raises(PartitionInputError, match="wt=-1"):
        evaluate(g, c, ["slow"] * 4, wt=-1)
    with pytest.raises(PartitionInputError, match="3 entries but the graph has 4"):
        evaluate(g, c, ["slow"] * 3)
    with pytest.raises(PartitionInputError, match=r"assignment\[2\].*'tpu' is not a device"):
        evaluate(g, c, ["slow", "slow", "tpu", "slow"])


def test_default_link_covers_unlisted_pairs():
    c = Cluster(
        devices=(DeviceSpec("a", 1e9, 1.0), DeviceSpec("b", 2e9, 1.0)), source="a", default_link=LinkSpec(1e6, 0.001)
    )
    bd = evaluate(chain(1, flops=1e9, out=1000.0), c, ["b"])
    assert close(bd.time, 10.0 / 1e6 + 0.001 + 0.5 + 1000.0 / 1e6 + 0.001)
