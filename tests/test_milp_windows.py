"""The window rows (``solvers.windows``) and the rounds of rising cutoffs
(``solvers.cutoff``): the rows hold for every plan that fits in memory, they tighten the
LP where it time-shares a device, and reduced-cost fixing never removes an optimal
choice. (``test_partition_constraints.py`` checks the planner's optima, which go through
these rounds, against brute force.)"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any

import numpy as np
import pytest
from dag_oracle import clusters, dags, ref_memory, ref_sum
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from test_milp_cuts import memory_instance
from test_partition_oracle import SETTINGS, Unusable

from multigpu.partition import Cluster, Graph, LayerSpec, autopartition, load_cluster, load_graph
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.inputs.cluster import DeviceSpec, Link
from multigpu.partition.solvers.constraints import Constraints
from multigpu.partition.solvers.cutoff import fixable, rooms, solve_in_rounds, tighten
from multigpu.partition.solvers.makespan_bound import makespan_floor, path_bound
from multigpu.partition.solvers.milp import build_model, solve_milp, solve_model
from multigpu.partition.solvers.solver import Budget
from multigpu.partition.solvers.windows import separate, windows

FILTERING = {**SETTINGS, "suppress_health_check": [*SETTINGS["suppress_health_check"], HealthCheck.filter_too_much]}


def _feasible_plans(gd: dict, cd: dict) -> list[tuple[int, ...]]:
    names = [d["name"] for d in cd["devices"]]
    mem = {d["name"]: d["memory"] for d in cd["devices"]}
    plans = []
    for a in itertools.product(range(len(names)), repeat=len(gd["layers"])):
        used = ref_memory(gd, [names[i] for i in a])
        if all(v <= mem[d] * (1 + 1e-9) for d, v in used.items()):
            plans.append(a)
    return plans


@settings(max_examples=40, **SETTINGS)
@given(dags(max_n=5), clusters(max_k=3), st.sampled_from([0.3, 0.5, 0.8]))
def test_every_window_row_holds_for_every_plan_that_fits(gd: dict, cd: dict, share: float) -> None:
    cd, graph, cluster, tables, cons = memory_instance(gd, cd, share)
    room = rooms(tables, cons)
    wins = windows(graph, room)
    assume(wins)
    n, k = graph.n, cluster.k
    # Number the columns as the model does: x[i, d] = i*k + d, then y[e, u, v].
    xi = np.arange(n * k).reshape(n, k)
    ne = len(graph.edge_src)
    yi = n * k + np.arange(ne * k * k).reshape(ne, k, k)
    diag = yi[:, np.arange(k), np.arange(k)]
    # An LP point that breaks every row (x everywhere, no edge with one end off a device): one row
    # per (window, device), for the layer the row is written for.
    r, c, v, count = separate(graph, wins, room, np.ones((n, k)), np.ones((ne, k)), xi, diag, limit=10**6)
    assert count == sum(int((room == w.room).sum()) for w in wins)
    rows = np.zeros((count, n * k + ne * k * k))
    np.add.at(rows, (r, c), v)
    plans = _feasible_plans(gd, cd)
    for a in plans:
        point = np.zeros(rows.shape[1])
        point[xi[np.arange(n), list(a)]] = 1.0
        point[yi[np.arange(ne), np.array(a)[graph.edge_src], np.array(a)[graph.edge_dst]]] = 1.0
        assert (rows @ point <= 1e-9).all(), (a, rows @ point)
    event(f"rows: {min(count, 10)}{'+' if count >= 10 else ''}, plans: {min(len(plans), 10)}")


def _time_shared() -> tuple[Graph, Cluster]:
    # Two fast devices far from the source, a fast link between them, each holding 60% of
    # the parameters: the LP runs 60% of every layer on one and 40% on the other and pays
    # for no transfer between them; every real plan sends an activation across.
    layers = tuple(LayerSpec(f"l{i}", 1e9, 1e6, 1e6) for i in range(6))
    graph = Graph(layers, input_bytes=1e3)
    mem = 0.6 * 6e6 + 1e6
    devs = (DeviceSpec("src", 1e6, 1.0), DeviceSpec("a", 1e12, 1.0, mem), DeviceSpec("b", 1e12, 1.0, mem))
    cluster = Cluster(
        devs,
        source="src",
        links=(Link(("a", "b"), 1e8, 1e-3), Link(("src", "a"), 1e9, 0.0), Link(("src", "b"), 1e9, 0.0)),
    )
    return graph, cluster


def _time_shared_model() -> tuple[CostTables, Any, float, Any]:
    """The time-shared pair's tables, constraints, optimum and MILP (scaled to its optimum)."""
    graph, cluster = _time_shared()
    tables = CostTables.build(graph, cluster, False)
    cons = Constraints().resolve(graph, cluster)
    best = solve_milp(tables, cons, 1.0, 0.0).value
    return tables, cons, best, build_model(tables, cons, 1.0, 0.0, scale=1.0 / best)


def test_window_rows_tighten_a_time_shared_pair() -> None:
    tables, cons, best, model = _time_shared_model()
    loose = tighten(model, tables, cons, max_rounds=0)
    tight = tighten(model, tables, cons)
    assert loose is not None and tight is not None and tight.cuts > 0
    # Without the rows the LP pays no transfer between a and b; with them at least one.
    assert loose.bound < tight.bound - 0.5 * 1e-3
    assert tight.bound <= best * (1 + 1e-9)


@settings(max_examples=30, **FILTERING)
@given(dags(max_n=5), clusters(max_k=3), st.sampled_from([0.3, 0.5, 0.8]))
def test_reduced_cost_fixing_never_removes_an_optimal_choice(gd: dict, cd: dict, share: float) -> None:
    cd, graph, cluster, tables, cons = memory_instance(gd, cd, share)
    names = [d["name"] for d in cd["devices"]]
    costs = {}
    for a in _feasible_plans(gd, cd):
        try:
            costs[a] = ref_sum(gd, cd, [names[i] for i in a])[0]
        except Unusable:
            continue
    assume(costs)
    best = min(costs.values())
    assume(best > 0)
    model = build_model(tables, cons, 1.0, 0.0, scale=1.0 / best)
    t = tighten(model, tables, cons)
    assert t is not None and t.bound <= best * (1 + 1e-7)
    fixed = fixable(t, best)
    lay = model.lay
    for a, cost in costs.items():
        if cost > best * (1 + 1e-9):
            continue
        a_ = np.array(a)
        assert not fixed[lay.xi[np.arange(graph.n), a_]].any(), a
        assert not fixed[lay.yi[np.arange(lay.ne), a_[graph.edge_src], a_[graph.edge_dst]]].any(), a
    # The rounds find that optimum whatever plan is known.
    cost_of = lambda a: ref_sum(gd, cd, [names[i] for i in a])[0]  # noqa: E731
    plan = solve_in_rounds(model, t, np.inf, None, cost_of, Budget(gap=0)).plan
    assert plan is not None
    assert np.isclose(cost_of(plan), best, rtol=1e-6, atol=1e-12)
    # ... and from the dearest plan that fits (whose cost lets the rounds skip some cutoffs).
    worst = max(costs, key=costs.get)
    plan = solve_in_rounds(model, t, costs[worst], np.array(worst), cost_of, Budget(gap=0)).plan
    assert plan is not None
    assert np.isclose(cost_of(plan), best, rtol=1e-6, atol=1e-12)
    event(f"fixed {int(fixed.sum())} of {int((model.ub > 0).sum())} columns")


def _cutoffs_tried(
    monkeypatch: pytest.MonkeyPatch,
    known_factor: float,
    found: float | None = None,
    heard: float | None = None,
    budget: Budget | None = None,
) -> list[float]:
    """The cutoffs (as factors of the tightened bound) of the rounds run with a starting plan
    known at ``known_factor`` times that bound; the first round finds a plan at ``found`` times
    it (None: no round finds a plan); a search beside them has a plan at ``heard`` times it from
    the start (None: no search). ``budget`` defaults to a proof without a time limit."""
    import multigpu.partition.solvers.cutoff as cutoff

    tables, cons, best, model = _time_shared_model()
    t = tighten(model, tables, cons)
    assert t is not None
    tried: list[float] = []
    start, other = np.zeros(tables.graph.n, dtype=np.intp), np.ones(tables.graph.n, dtype=np.intp)
    searched = np.full(tables.graph.n, 2, dtype=np.intp)  # only priced by the cost function below
    factor_of = {0: known_factor, 1: found, 2: heard}

    def rounds(m: Any, verbose: bool = False, options: Any = None) -> Any:
        tried.append(options["objective_bound"] / model.scale / t.bound)
        if found is not None and len(tried) == 1:  # a plan above the cutoff, all that is left
            return cutoff.MilpResult(0, "optimal", other, found * t.bound)
        return cutoff.MilpResult(2, "infeasible", None, np.inf)

    monkeypatch.setattr(cutoff, "solve_model", rounds)
    best_factor = min(known_factor, found or np.inf, heard or np.inf)
    out = solve_in_rounds(
        model,
        t,
        known_factor * t.bound,
        start,
        lambda a: factor_of[int(a[0])] * t.bound,
        Budget(gap=0) if budget is None else budget,
        hear=None if heard is None else lambda: (searched, heard * t.bound),
    )
    assert out.plan is not None and np.isclose(out.cost, best_factor * t.bound)
    if heard is not None and heard < min(known_factor, found or np.inf):
        assert out.plan is searched
    assert np.isclose(out.bound, best_factor * t.bound)
    return tried


def test_the_rounds_skip_a_cutoff_just_below_the_best_known_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    # With a plan known at 1.15 times the bound, the round at 1.14 would only repeat the
    # final round's proof (its next cutoff, 1.2, already reaches the plan): it is skipped,
    # and the last round is at the plan's cost.
    import multigpu.partition.solvers.cutoff as cutoff

    tried = _cutoffs_tried(monkeypatch, 1.15)
    expected = [f for f in cutoff.CUTOFF_FACTORS if f < 1.14] + [1.15]
    assert np.allclose(tried, expected, rtol=1e-6), tried


def test_the_rounds_jump_to_the_final_one_once_a_round_found_a_close_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    # The first round (1.02) finds a plan at 1.3 times the bound (a starting plan is at 2):
    # every later round whose cutoff is within JUMP (15%) below it goes (1.14 and 1.2; 1.1 *
    # 1.15 = 1.265 stays), then the final round at the plan's cost.
    import multigpu.partition.solvers.cutoff as cutoff

    tried = _cutoffs_tried(monkeypatch, 2.0, found=1.3)
    expected = [f for f in cutoff.CUTOFF_FACTORS if f * cutoff.JUMP < 1.3] + [1.3]
    assert np.allclose(tried, expected, rtol=1e-6), tried
    assert np.allclose(tried, [1.02, 1.04, 1.07, 1.1, 1.3], rtol=1e-6), tried
    # A starting plan as close does not jump: the rounds run up to the skip rule's.
    assert np.allclose(_cutoffs_tried(monkeypatch, 1.3), [1.02, 1.04, 1.07, 1.1, 1.14, 1.3], rtol=1e-6)


def test_a_plan_heard_from_the_search_makes_the_rounds_jump(monkeypatch: pytest.MonkeyPatch) -> None:
    # The local search beside the rounds (``cost_search``) reaches the optimum on the 16-device
    # benchmark: its plan jumps as a round's does, heard before the first round or known already.
    assert np.allclose(_cutoffs_tried(monkeypatch, 2.0, heard=1.3), [1.02, 1.04, 1.07, 1.1, 1.3], rtol=1e-6)
    assert np.allclose(_cutoffs_tried(monkeypatch, 1.3, heard=1.3), [1.02, 1.04, 1.07, 1.1, 1.3], rtol=1e-6)
    # With less time left than spent, the rounds go on as from a starting plan: a final round cut
    # short by the limit would prove less than they do.
    late = Budget(gap=0, time_limit=1000.0, start=time.perf_counter() - 900.0)
    tried = _cutoffs_tried(monkeypatch, 2.0, heard=1.3, budget=late)
    assert np.allclose(tried, [1.02, 1.04, 1.07, 1.1, 1.14, 1.3], rtol=1e-6)


def test_a_cutoff_below_the_optimum_finds_no_plan_below_it() -> None:
    # Under a cutoff below the optimum HiGHS reports no plan (or stops at one above the
    # cutoff: the bound prunes, it does not always forbid); either way the rounds raise it.
    tables, cons, best, model = _time_shared_model()
    below = solve_model(model, options={"objective_bound": 0.99})
    assert (below.a is None and below.status == 2) or below.value >= best * (1 - 1e-6), below
    above = solve_model(model, options={"objective_bound": 1.01})
    assert above.status == 0 and np.isclose(above.value, best, rtol=1e-9)


def test_the_planner_proves_a_time_shared_pair() -> None:
    graph, cluster = _time_shared()
    plan = autopartition(graph, cluster)
    assert plan.solver in ("milp", "bound", "ideal dp")
    assert {"a", "b"} <= set(plan.assignment)
    exact = solve_milp(CostTables.build(graph, cluster, False), Constraints().resolve(graph, cluster), 1.0, 0.0)
    assert np.isclose(plan.cost, exact.value, rtol=1e-9)


def test_a_time_limit_in_a_round_returns_the_best_plan_with_its_bound() -> None:
    # ResNet-18 on the lab with every device holding 40% of its parameters needs the rounds;
    # a round stopped by the time limit hands back the best plan so far, with a proven
    # bound no lower than the tightened LP's and no higher than the optimum.
    from multigpu.partition.solvers.fill import fill_plan
    from multigpu.partition.solvers.lagrange import cost_if_feasible

    graph = load_graph("resnet18")
    lab = load_cluster("lab")
    mem = 0.4 * float(graph.param_bytes.sum()) + float(graph.activation_bytes.max())
    cluster = dataclasses.replace(lab, devices=tuple(dataclasses.replace(d, memory=mem) for d in lab.devices))
    best = autopartition(graph, cluster, gap=0)
    assert best.proof == "optimal" and best.gap <= 1e-9
    tables = CostTables.build(graph, cluster, False)
    cons = Constraints().resolve(graph, cluster)
    base = build_model(tables, cons, 1.0, 0.0, scale=1e3 / best.cost)
    t = tighten(base, tables, cons)
    start = fill_plan(tables, cons)
    assert t is not None and start is not None
    known = cost_if_feasible(tables, cons, 1.0, 0.0, start)[0]
    assert known > best.cost * 1.01  # the fill is no optimum: the rounds have work to do

    def cost_of(a: np.ndarray) -> float:
        return cost_if_feasible(tables, cons, 1.0, 0.0, a)[0]

    spent = Budget(time_limit=0.0, gap=0.0)  # the first round starts past its deadline
    out = solve_in_rounds(base, t, known, start, cost_of, spent)
    assert out.plan is start and out.cost == known and out.res is not None and out.res.status == 1
    assert 0.8 * best.cost < t.bound <= out.bound <= best.cost * (1 + 1e-6)
    # Through the planner: a spent limit returns a plan and a bound that holds.
    stopped = autopartition(graph, cluster, time_limit=1e-4, gap=0)
    assert stopped.cost >= best.cost * (1 - 1e-9) and stopped.bound <= best.cost * (1 + 1e-6)
    assert np.isclose(stopped.gap, (stopped.cost - stopped.bound) / stopped.cost)


def test_the_window_rounds_stop_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    # Once the planner holds a plan, the tightening stops at the time limit with the last LP it
    # solved (a bound all the same); a first LP cut short bounds nothing, so that is raised.
    import time

    from multigpu.partition.solvers import milp

    tables, cons, _, model = _time_shared_model()
    loose = tighten(model, tables, cons, max_rounds=0)
    assert loose is not None
    deadline = time.perf_counter() + 3600.0
    seen: list[float | None] = []
    solve = milp.LpSession.solve

    def second_runs_out(self: Any, until: float | None = None) -> Any:
        seen.append(until)
        if len(seen) > 1:
            raise milp.LpTimeLimit("the test's deadline")
        return solve(self, until)

    monkeypatch.setattr(milp.LpSession, "solve", second_runs_out)
    cut_short = tighten(model, tables, cons, deadline=deadline)
    assert cut_short is not None and cut_short.cuts == 0 and seen == [deadline, deadline]
    assert cut_short.bound == pytest.approx(loose.bound, rel=1e-12)
    seen.append(None)  # from now on every LP runs out, the first included
    with pytest.raises(milp.LpTimeLimit):
        tighten(model, tables, cons, deadline=deadline)


def test_a_spent_deadline_skips_highs_and_stops_the_makespan_build() -> None:
    # Handing a large model to HiGHS takes seconds, and HiGHS's presolve does not stop at a
    # spent limit; the makespan rows take half a minute on ResNet-50 on 16 devices.
    import time

    tables, cons, _, model = _time_shared_model()
    past = {"deadline": time.perf_counter() - 1.0}
    res = solve_model(model, options=past)
    assert res.status == 1 and res.a is None and "before HiGHS started" in res.message
    res = solve_milp(tables, cons, 1.0, 0.0, objective="makespan", options=past)
    assert res.status == 1 and res.a is None and "built" in res.message


@pytest.mark.parametrize("lp_seconds, runs_highs", [(40.0, False), (10.0, True)])
def test_the_makespan_milp_goes_to_highs_only_if_two_lps_fit_in_the_time_left(
    monkeypatch: pytest.MonkeyPatch, lp_seconds: float, runs_highs: bool
) -> None:
    # HiGHS's root solves the LP again beside an analytic centre that no time limit stops, so
    # under a 100 s limit an LP that took 40 s leaves too little (60 s < 80 s) and one that took
    # 10 s does not. The LP's time is simulated: the module reads a shifted clock.
    import time
    import types

    from multigpu.partition.solvers import makespan_milp

    tables, cons, _, _ = _time_shared_model()
    shift = [0.0]
    monkeypatch.setattr(
        makespan_milp, "time", types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + shift[0])
    )
    real_lp, calls = makespan_milp.solve_lp, []

    def slow_lp(model, deadline):
        shift[0] += lp_seconds
        return real_lp(model, deadline)

    def spy(model, verbose=False, options=None):
        calls.append(options)
        return solve_model(model, verbose=verbose, options=options)

    monkeypatch.setattr(makespan_milp, "solve_lp", slow_lp)
    monkeypatch.setattr(makespan_milp, "solve_model", spy)
    budget = Budget(time_limit=100.0)
    res, lp_bound = makespan_milp.solve_within(tables, cons, 1.0, 0.0, budget)
    assert np.isfinite(lp_bound) and len(calls) == int(runs_highs)
    if runs_highs:
        assert res.status == 0 and lp_bound <= res.value * (1 + 1e-9)
    else:
        assert res.status == 1 and res.a is None and "too little time" in res.message
    # Without a limit there is no LP first: HiGHS gets the model at once.
    calls.clear()
    res, lp_bound = makespan_milp.solve_within(tables, cons, 1.0, 0.0, Budget())
    assert len(calls) == 1 and res.status == 0 and lp_bound == -np.inf


def test_a_makespan_lp_stopped_by_the_limit_skips_highs(monkeypatch: pytest.MonkeyPatch) -> None:
    from multigpu.partition.solvers import makespan_milp
    from multigpu.partition.solvers.milp import LpTimeLimit

    tables, cons, _, _ = _time_shared_model()

    def runs_out(model, deadline):
        raise LpTimeLimit("the LP relaxation stopped at its deadline")

    monkeypatch.setattr(makespan_milp, "solve_lp", runs_out)
    monkeypatch.setattr(makespan_milp, "solve_model", lambda *a, **k: pytest.fail("HiGHS must not run"))
    budget = Budget(time_limit=100.0)
    res, lp_bound = makespan_milp.solve_within(tables, cons, 1.0, 0.0, budget)
    assert res.status == 1 and res.a is None and lp_bound == -np.inf


def test_under_a_limit_the_makespan_milp_runs_in_a_child_with_the_same_answer() -> None:
    from multigpu.partition.solvers.makespan_milp import solve_makespan_milp, solve_within

    tables, cons, _, _ = _time_shared_model()
    here, here_lp = solve_within(tables, cons, 1.0, 0.0, Budget(time_limit=600.0))
    there, there_lp = solve_makespan_milp(tables, cons, 1.0, 0.0, Budget(time_limit=600.0), has_plan=True)
    assert here.status == there.status == 0 and np.array_equal(here.a, there.a)
    assert there.value == pytest.approx(here.value, rel=1e-9) and there_lp == pytest.approx(here_lp, rel=1e-9)


def test_without_a_plan_to_fall_back_on_the_makespan_milp_stays_in_this_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Ending HiGHS at the deadline would leave nothing to answer with: HiGHS may overrun to
    # find a first plan, as every first-plan step does.
    from multigpu.partition.solvers import makespan_milp

    monkeypatch.setattr(makespan_milp, "Call", lambda *a: pytest.fail("no child without a plan"))
    tables, cons, _, _ = _time_shared_model()
    res, _ = makespan_milp.solve_makespan_milp(tables, cons, 1.0, 0.0, Budget(time_limit=600.0), has_plan=False)
    assert res.status == 0 and res.a is not None


def test_the_makespan_milp_under_a_cutoff_looks_only_below_it() -> None:
    from multigpu.partition.solvers.makespan_milp import solve_within

    tables, cons, _, _ = _time_shared_model()
    best, _ = solve_within(tables, cons, 1.0, 0.0, Budget(gap=0.0))
    assert best.status == 0 and best.a is not None
    # The cutoff is the horizon: the schedule rows' M shrinks from the slow source's 6,000 s
    # to it, and at HiGHS's default tolerance (gap 0.1%) the value is still the schedule's.
    above, _ = solve_within(tables, cons, 1.0, 0.0, Budget(), cutoff=1.5 * best.value)
    assert above.status == 0 and above.value == pytest.approx(best.value, rel=1e-6)
    # Just below the optimum nothing is left: no plan, and "infeasible" or a bound stop says so.
    below, _ = solve_within(tables, cons, 1.0, 0.0, Budget(), cutoff=best.value * (1 - 1e-4))
    assert below.a is None and (below.status == 2 or "bound" in below.message.lower())


def _memory_bound_resnet18() -> tuple[Any, Any]:
    graph, lab = load_graph("resnet18"), load_cluster("lab")
    mem = 0.4 * float(graph.param_bytes.sum()) + float(graph.activation_bytes.max())
    return graph, dataclasses.replace(lab, devices=tuple(dataclasses.replace(d, memory=mem) for d in lab.devices))


def test_under_a_limit_the_makespan_milp_runs_beside_the_search_for_the_least_time_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every plan's makespan is at most its T, so the plan of least T is a makespan plan; the
    # makespan MILP (here: out of time, no plan) runs in a child started before that search.
    from multigpu.partition.solvers import methods
    from multigpu.partition.solvers.milp import MilpResult

    graph, cluster = _memory_bound_resnet18()
    order: list[str] = []

    class Idle:
        def cancel(self) -> None:
            order.append("cancel")

    def start(*args: Any) -> Idle:
        order.append("child")
        assert np.isfinite(args[-1])  # the starting plans' best makespan is the child's cutoff
        return Idle()

    def collect(call: Any, deadline: float) -> tuple[MilpResult, float]:
        order.append("collect")
        return MilpResult(1, "time limit", None, np.inf), -np.inf

    real = methods.MilpSolver._least_time
    monkeypatch.setattr(methods, "start_in_child", start)
    monkeypatch.setattr(methods, "collect", collect)
    monkeypatch.setattr(methods.MilpSolver, "_least_time", lambda *a: order.append("least T") or real(*a))
    plan = autopartition(graph, cluster, objective="makespan", time_limit=60.0)
    assert order == ["child", "least T", "collect", "cancel"]
    least = autopartition(graph, cluster, wt=1.0, we=0.0)
    assert least.proof == "optimal"
    assert plan.value <= least.makespan * (1 + 1e-9) and plan.proof != "optimal"
    # The critical path's least T bounds the makespan far above the longest path at the
    # fastest devices (0.19 s against 0.0004 s): memory forces the path's transfers.
    tables = CostTables.build(graph, cluster, False)
    cons = Constraints().resolve(graph, cluster)
    path = path_bound(tables, cons, methods._solve_chain, Budget())
    assert makespan_floor(tables, cons) * 10 < path <= plan.bound <= plan.value


def test_without_a_limit_the_makespan_milp_must_beat_the_least_time_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    from multigpu.partition.solvers import methods

    # The time-shared pair's cluster, with a fork: two branches between l1 and the join.
    _, cluster = _time_shared()
    layers = [{"name": "l0", "flops": 1e9, "param_bytes": 1e6, "output_bytes": 1e6}]
    layers += [
        {"name": f"b{i}", "flops": 1e9, "param_bytes": 1e6, "output_bytes": 1e6, "inputs": ["l0"]} for i in (1, 2)
    ]
    layers += [{"name": "join", "flops": 1e9, "param_bytes": 1e6, "output_bytes": 1e6, "inputs": ["b1", "b2"]},
               {"name": "l4", "flops": 1e9, "param_bytes": 1e6, "output_bytes": 1e6}]  # fmt: skip
    graph = Graph.from_dict({"input_bytes": 1e3, "layers": layers})
    seen: list[float] = []
    real = methods.solve_makespan_milp

    def spy(*args: Any, **kw: Any) -> Any:
        seen.append(kw["cutoff"])
        return real(*args, **kw)

    monkeypatch.setattr(methods, "solve_makespan_milp", spy)
    monkeypatch.setattr(methods, "start_in_child", lambda *a: pytest.fail("no child without a time limit"))
    plan = autopartition(graph, cluster, objective="makespan", gap=0)
    least = autopartition(graph, cluster, wt=1.0, we=0.0, gap=0)
    assert seen and seen[0] <= least.makespan * (1 + 1e-12)
    assert plan.proof == "optimal" and plan.value <= least.makespan * (1 + 1e-9)
