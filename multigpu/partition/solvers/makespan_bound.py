"""A lower bound on the makespan: the least T of one path through the graph, as a chain.

A path from the graph's input to the sink runs in order in every schedule: each of its
layers starts after the one before it on the path has finished and, across devices, after
that one's output has arrived; the sink hears after the last layer's output arrives. So a
plan's makespan is at least its path's compute plus the path's transfers, which is T of the
path alone, as a chain placed as the plan places it. Keeping only the constraints on the
path's own layers (memory, pins, exclusions; busy time and energy dropped) can only lower the
least such T, so a proven lower bound on the chain's T bounds every plan's makespan.

Where the graph is nearly a chain (ResNet's shortcuts hold one layer or none), the bound is
near the optimum: the path pays the transfers that memory forces, which the longest path at
each layer's fastest device (``makespan_floor``) does not. The path taken is that
longest one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from multigpu.errors import InfeasibleError, SolverError
from multigpu.partition.cost.choices import measured_devices
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.inputs.graph import Graph, LayerSpec
from multigpu.partition.solvers.constraints import ResolvedConstraints
from multigpu.partition.solvers.solver import Budget, Objective, Solution

__all__ = ["critical_path", "fastest_paths", "makespan_floor", "path_bound", "path_problem"]


def fastest_paths(tables: CostTables, cons: ResolvedConstraints) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """With every layer at its fastest allowed compute time: that time, the finish of the
    longest path from the input through each layer, and each layer's predecessor on that
    path (-1: the input); each (n,)."""
    graph = tables.graph
    fastest = np.where(cons.allowed, tables.comp, np.inf).min(axis=1)
    finish = np.zeros(graph.n)
    before = np.full(graph.n, -1)
    for i, producers in enumerate(graph.producers):
        inner = [p for p in producers if p >= 0]
        if inner:
            before[i] = max(inner, key=lambda p: finish[p])
        finish[i] = fastest[i] + (finish[before[i]] if before[i] >= 0 else 0.0)
    return fastest, finish, before


def makespan_floor(tables: CostTables, cons: ResolvedConstraints) -> float:
    """A lower bound on every plan's makespan: the longest path through the graph with each
    layer at its fastest allowed compute time (transfers and overheads only add to it)."""
    return float(fastest_paths(tables, cons)[1].max(initial=0.0))


def critical_path(tables: CostTables, cons: ResolvedConstraints) -> list[int]:
    """The layers of the longest path from the input to the last layer, each layer at its
    fastest allowed compute time."""
    before = fastest_paths(tables, cons)[2]
    path = [tables.graph.n - 1]
    while before[path[-1]] >= 0:
        path.append(int(before[path[-1]]))
    return path[::-1]


def path_problem(tables: CostTables, cons: ResolvedConstraints) -> tuple[CostTables, ResolvedConstraints] | None:
    """The critical path as a chain: its tables (no stage overheads, no parameter shipping)
    and its constraints (memory, pins and exclusions on its layers). None where the chain
    would not be priced as the schedule prices the path: an engine profile (warm passes,
    transfer CPU, relays) or measured layer times, which the solvers look up by graph name."""
    graph, cluster = tables.graph, tables.cluster
    if cluster.engine is not None or measured_devices(graph, cluster):
        return None
    path = critical_path(tables, cons)
    layers = tuple(
        LayerSpec(graph.names[i], float(graph.flops[i]), float(graph.param_bytes[i]), float(graph.output_bytes[i]))
        for i in path
    )
    chain = Graph(layers, input_bytes=float(graph.input_bytes), name=f"{graph.name} (critical path)")
    # A stage start only adds to the path; leaving it out keeps the bound below it.
    bare = dataclasses.replace(
        cluster, devices=tuple(dataclasses.replace(d, stage_overhead=0.0) for d in cluster.devices)
    )
    chain_tables = CostTables.build(chain, bare, False)
    if not np.allclose(chain_tables.comp, tables.comp[path], rtol=1e-12, atol=0.0):  # pragma: no cover
        return None  # the same layers, the same devices: a different time is a pricing this module does not know
    index = {layer: j for j, layer in enumerate(path)}
    chain_cons = ResolvedConstraints(
        memory=cons.memory,
        busy=np.full(cluster.k, np.inf),
        energy_budget=math.inf,
        allowed=cons.allowed[path],
        pins={index[i]: d for i, d in cons.pins.items() if i in index},
        excluded=cons.excluded,
    )
    return chain_tables, chain_cons


def path_bound(
    tables: CostTables,
    cons: ResolvedConstraints,
    solve_chain: Callable[[CostTables, ResolvedConstraints, Objective, Budget], Solution],
    budget: Budget,
) -> float:
    """A lower bound on every plan's makespan (-inf where ``path_problem`` has none, or the
    chain's solve found none in ``budget``). ``solve_chain(tables, cons, objective, budget)``
    is the planner's latency solve (``MilpSolver.solve``) for a chain."""
    problem = path_problem(tables, cons)
    if problem is None:
        return -math.inf
    chain_tables, chain_cons = problem
    budget.say(f"makespan bound: the least T of the critical path ({chain_tables.graph.n} layers)")
    try:
        found = solve_chain(chain_tables, chain_cons, Objective("latency", 1.0, 0.0), budget)
    except (SolverError, InfeasibleError):
        # No plan of the chain in time; or none at all, which the makespan solve reports itself.
        return -math.inf
    return float(found.bound)
