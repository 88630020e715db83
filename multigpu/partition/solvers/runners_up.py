"""The planner's runners-up: the next best plans after its choice, in order of predicted value.

Lawler's k-best scheme (as in Murty's ranked assignments), over pins alone, so every solver
that honours ``Constraints.pinned`` serves it unchanged. The plans that agree with a node's
pins are split, around the node's best plan ``x``, into ``x`` itself and the disjoint sets
"the first j-1 free layers as in ``x``, free layer j on another device d" (one per j and d).
Each set's best plan is one solve with those pins; the least of all open sets' best plans is
the next plan. The sets never overlap, so the plans are distinct, and each is the best (to
the solve's gap) of what is left: ``bench plans`` runs them to see whether the model's
second and third choices measure as it ranks them.

A node with j pinned layers costs up to (n - j) * (devices - 1) solves: for a 69-layer
ResNet-18 on three devices, about 140 solves per plan taken, each ~10 ms on the DP.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Any

from multigpu.partition.exceptions import InfeasibleError, PartitionInputError, UnusableLinkError
from multigpu.partition.inputs.cluster import Cluster
from multigpu.partition.inputs.graph import Graph
from multigpu.partition.solvers.constraints import Constraints
from multigpu.partition.solvers.planner import OBJECTIVES, Plan, autopartition
from multigpu.partition.solvers.solver import DEFAULT_GAP

__all__ = ["plan_value", "runners_up"]


def plan_value(plan: Plan) -> float:
    """The value ``plan`` minimises: its bottleneck (throughput), makespan, or weighted cost."""
    if plan.objective == "throughput":
        return plan.bottleneck
    if plan.objective == "makespan":
        return plan.breakdown.makespan
    return plan.cost


def runners_up(
    graph: Graph,
    cluster: Cluster,
    count: int,
    objective: str = "latency",
    constraints: None | Constraints | Mapping[str, Any] = None,
    *,
    first: Plan | None = None,
    wt: float = 1.0,
    we: float = 0.0,
    gap: float = DEFAULT_GAP,
) -> list[Plan]:
    """The ``count`` best plans after the planner's own choice ``first`` (solved here when
    None), best first; fewer when the constraints allow fewer plans.

    Each is ``autopartition``'s optimum (to ``gap``) over the plans not yet returned, found
    by pinning layers (see the module docstring); ``constraints`` hold for all of them.
    Raises PartitionInputError for a negative ``count``, an unknown objective, or a ``first``
    solved for another objective, and what ``autopartition`` raises for the first plan.
    """
    if not isinstance(count, int) or count < 0:
        raise PartitionInputError(f"count={count!r} must be a whole number of plans, 0 or more")
    if objective not in OBJECTIVES:
        raise PartitionInputError(f"objective={objective!r} is unknown; choose one of {', '.join(OBJECTIVES)}")
    spec = Constraints.coerce(constraints)
    base = {graph.index(layer): dev for layer, dev in spec.pinned.items()}
    free_devices = [d for d in cluster.names if d not in set(spec.excluded)]

    def solve(pins: dict[int, str]) -> Plan | None:
        pinned: dict[str | int, str] = {i: d for i, d in pins.items()}
        cons = Constraints(
            memory=spec.memory,
            busy_time=spec.busy_time,
            energy_budget=spec.energy_budget,
            pinned=pinned,
            excluded=spec.excluded,
        )
        try:
            return autopartition(graph, cluster, wt, we, objective, cons, gap=gap)
        except (InfeasibleError, UnusableLinkError):  # no plan agrees with these pins
            return None

    root = first if first is not None else solve(base)
    if root is None:
        raise InfeasibleError("no plan satisfies the constraints; there is no first plan to rank others after")
    if root.objective != objective:
        raise PartitionInputError(
            f"first was solved for objective={root.objective!r}, not {objective!r}; pass a plan of the same objective"
        )
    # The heap holds (value, latency cost, order, pins, plan): the plan is the best of the
    # plans that agree with its pins; ties go to the lower cost, then to the order found.
    order = 0
    heap: list[tuple[float, float, int, dict[int, str], Plan]] = [(plan_value(root), root.cost, order, base, root)]
    out: list[Plan] = []
    seen: set[tuple[str, ...]] = set()
    while heap and len(out) < count + 1:
        _, _, _, pins, plan = heapq.heappop(heap)
        key = tuple(plan.assignment)
        if key in seen:  # pragma: no cover - the sets are disjoint; a repeat is a pin the solver ignored
            raise RuntimeError(f"internal error: runners_up found {plan.assignment} twice")
        seen.add(key)
        out.append(plan)
        if len(out) == count + 1:
            break
        prefix = dict(pins)
        for i in range(graph.n):
            if i in pins:
                continue
            for d in free_devices:
                if d == plan.assignment[i]:
                    continue
                child = solve({**prefix, i: d})
                if child is not None:
                    order += 1
                    heapq.heappush(heap, (plan_value(child), child.cost, order, {**prefix, i: d}, child))
            prefix[i] = plan.assignment[i]
    return out[1:]
