"""``multigpu bench plans``: the candidates of a setting (the planner's choice, its runners-up,
single devices, baselines), the figures a user choosing among them needs (regret, Kendall tau,
per-part errors, spread), and the runners-up against brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from test_partition_oracle import SETTINGS, Brute, build, instances, weights

import multigpu
from multigpu.benchmarks import plans
from multigpu.errors import InputError
from multigpu.partition import Constraints, PartitionInputError, autopartition, graph_from_model, load_cluster
from multigpu.partition.solvers.runners_up import plan_value, runners_up


@settings(max_examples=30, **SETTINGS)
@given(instances(max_n=5, max_k=3), weights)
def test_runners_up_are_the_next_best_plans_by_brute_force(inst, w):
    gd, cd = inst
    graph, cluster = build(gd, cd)
    costs = Brute(gd, cd).cost(*w)
    finite = np.sort(costs[np.isfinite(costs)])
    assume(len(finite) >= 1)
    cons = Constraints(memory=False)
    first = autopartition(graph, cluster, *w, constraints=cons, gap=0)
    ranked = runners_up(graph, cluster, 4, "latency", cons, first=first, wt=w[0], we=w[1], gap=0)
    got = [first.cost] + [p.cost for p in ranked]
    want = finite[: len(got)]
    # As many as there are plans (up to 4 more), distinct, and the next best values in order.
    assert len(got) == min(5, len(finite))
    assert len({tuple(p.assignment) for p in [first, *ranked]}) == len(got)
    assert np.allclose(got, want, rtol=1e-7, atol=1e-12), (got, want)


def test_runners_up_honour_exclusions_and_rank_by_the_objective():
    cluster = load_cluster("lab")
    graph = graph_from_model(multigpu.models.lenet(), 1)
    cons = Constraints(excluded=[cluster.source])
    ranked = runners_up(graph, cluster, 3, "latency", cons)
    first = autopartition(graph, cluster, constraints=cons)
    values = [plan_value(p) for p in [first, *ranked]]
    assert len(ranked) == 3 and values == sorted(values)
    assert all(cluster.source not in p.assignment for p in ranked)
    assert first.assignment not in [p.assignment for p in ranked]


def test_runners_up_refuse_a_bad_count_and_a_first_plan_of_another_objective():
    cluster = load_cluster("lab")
    graph = graph_from_model(multigpu.models.lenet(), 1)
    with pytest.raises(PartitionInputError, match="count=-1"):
        runners_up(graph, cluster, -1)
    with pytest.raises(PartitionInputError, match="objective='fastest'"):
        runners_up(graph, cluster, 1, "fastest")
    first = autopartition(graph, cluster)
    with pytest.raises(PartitionInputError, match="objective='latency', not 'makespan'"):
        runners_up(graph, cluster, 1, "makespan", first=first)
    assert runners_up(graph, cluster, 0, first=first) == []


def test_a_setting_runs_the_planners_choice_first_then_distinct_candidates_of_every_kind():
    cluster = load_cluster("lab")
    workers = ["pi2", "desk-cpu", "imac"]
    graph = graph_from_model(plans._model("lenet"), 1)
    hand = {"label": "hand-made: pi2 only", "plan": ["pi2"] * graph.n}
    cands, left_out = plans.candidates("lenet", "latency", graph, cluster, workers, [hand])
    assert left_out == [] and len(cands) >= plans.MIN_CANDIDATES
    assert "planner" in cands[0]["roles"] and sum("planner" in c["roles"] for c in cands) == 1
    assert len({tuple(c["plan"]) for c in cands}) == len(cands)  # each plan once
    roles = [r for c in cands for r in c["roles"]]
    assert sum(r.startswith("runner-up") for r in roles) >= plans.RUNNERS_UP
    assert roles.count("single device") == len(workers)
    assert {"baseline uniform", "baseline balanced", "hand-made"} <= set(roles)
    # The hand-made plan is a single-device plan too: one candidate, both roles.
    (pi2,) = [c for c in cands if c["plan"] == ["pi2"] * graph.n]
    assert {"single device", "hand-made"} <= set(pi2["roles"])
    assert all(set(c["plan"]) <= set(workers) and len(c["plan"]) == graph.n for c in cands)
    assert all(c["setting"] == "lenet, latency" and not c["stream"] for c in cands)


def _cand(label: str, roles: list[str], pred: list[float], meas: list[float]) -> dict:
    return {
        "label": label,
        "roles": roles,
        "cycle_predicted": pred,
        "cycle_measured": meas,
        "parts": [
            {"kind": "stage", "error": 0.1},
            {"kind": "hop", "error": -0.2},
            {"kind": "end_to_end", "error": (pred[0] - meas[0]) / meas[0]},
        ],
    }


def test_fidelity_gives_regret_tau_per_part_errors_and_spread():
    cands = [
        _cand("planner", ["planner"], [1.0, 1.0, 1.0], [1.2, 1.1, 1.3]),
        _cand("b", ["runner-up 2"], [2.0, 2.0, 2.0], [1.0, 1.0, 1.0]),
        _cand("c", ["single device"], [3.0, 3.0, 3.0], [3.0, 2.5, 3.5]),
        _cand("d", ["baseline uniform"], [4.0, 4.0, 4.0], [4.0, 4.0, 4.0]),
    ]
    f = plans.fidelity(cands)
    assert f["candidates"] == 4 and f["planner"] == "planner" and f["best"] == "b"
    assert math.isclose(f["regret"], 1.2) and f["regret"] >= 1.0
    assert np.allclose(f["regret_by_cycle"], [1.2, 1.1, 1.3])
    # One pair of the six swapped: tau = (5 - 1) / 6.
    assert math.isclose(f["tau"], 4 / 6) and all(-1.0 <= t <= 1.0 for t in f["tau_by_cycle"])
    assert f["predicted_rank"] == [1, 2, 3, 4] and f["measured_rank"] == [2, 1, 3, 4]
    assert set(f["part_errors"]) == {"stage", "hop", "end to end"} and math.isclose(f["part_errors"]["hop"], 0.2)
    assert np.allclose(f["spread"], [0.2 / 1.2, 0.0, 1.0 / 3.0, 0.0])
    # The best candidate is the planner's choice: regret 1.
    assert plans.fidelity([cands[1] | {"roles": ["planner"]}, cands[2]])["regret"] == 1.0
    # One cycle: no spread (nan), not a spread of 0.
    one = plans.fidelity([c | {"cycle_measured": c["cycle_measured"][:1]} for c in cands])
    assert all(math.isnan(s) for s in one["spread"]) and math.isclose(one["regret"], 1.2)
    with pytest.raises(InputError, match="planner"):
        plans.fidelity(cands[1:])


def test_choosing_reports_every_setting_with_per_part_columns_and_none_without_settings():
    data = []
    for setting in ("lenet, latency", "lenet, throughput"):
        for c in (
            _cand("planner", ["planner"], [1.0, 1.0], [1.0, 1.1]),
            _cand("b", ["runner-up 2"], [2.0, 2.0], [2.0, 2.2]),
        ):
            data.append(c | {"setting": setting, "model": "lenet", "plan": ["w"] * 10})
    tables, notes, figures = plans._choosing(data, [])
    summary, ranks = tables
    assert [r[0] for r in summary.rows] == ["lenet, latency", "lenet, throughput"]
    for column in ("regret", "Kendall tau", "|error| end to end", "|error| stage", "|error| hop", "spread"):
        assert column in summary.columns
    assert len(ranks.rows) == 4 and figures["lenet, latency"]["regret"] == 1.0
    assert "regret lenet, latency 1.000" in notes[0] and "met" in notes[0]
    assert plans._choosing([{"label": "hand-made"}], []) == ([], [], {})


def test_the_plot_has_a_panel_per_setting_titled_with_its_regret_and_tau():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = [
        _cand("planner", ["planner"], [1.0, 1.0], [1.0, 1.1]) | {"setting": s}
        for s in ("lenet, latency", "alexnet, latency")
    ] + [_cand("b", ["runner-up 2"], [2.0, 2.0], [2.5, 2.2]) | {"setting": "lenet, latency"}]
    fig = plt.figure()
    try:
        plans._plot_settings(data)(fig)
        titles = [ax.get_title() for ax in fig.axes]
    finally:
        plt.close(fig)
    assert titles == ["lenet, latency: regret 1.000, tau 1.00", "alexnet, latency: regret 1.000, tau nan"]
