"""Explain why a placement problem is infeasible, naming the binding constraint.

Checks go from cheap and specific to expensive and general: unreachable devices
(links, pins, exclusions), one layer that fits nowhere, an energy budget below the
least possible energy (exact, by DP), then one MILP feasibility solve per
constraint family, then pairs.
"""

from __future__ import annotations

import itertools

import numpy as np

from multigpu.partition.cost.arithmetic import assignment_arrays
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.exceptions import InfeasibleError
from multigpu.partition.solvers.constraints import ResolvedConstraints
from multigpu.partition.solvers.free import free_solver
from multigpu.partition.units import fmt_bytes

__all__ = ["explain_unreachable", "explain_coupled", "layer_candidates"]


def _names(cluster, cols) -> str:
    cols = list(cols)
    return ", ".join(repr(cluster.names[c]) for c in cols) if cols else "none"


def explain_unreachable(tables: CostTables, cons: ResolvedConstraints) -> InfeasibleError:
    """Error for a problem where every assignment needs an unusable device pair
    (given pins and exclusions)."""
    graph, cluster = tables.graph, tables.cluster
    tab = cluster.tables
    ok = cons.allowed & np.isfinite(tables.node_time)
    for i in range(graph.n):
        if not ok[i].any():
            allowed = np.flatnonzero(cons.allowed[i])
            return InfeasibleError(
                f"infeasible: layer {graph.layers[i].name!r} may only run on {_names(cluster, allowed)}, "
                f"but with ship_params its parameters must come from the source {cluster.source!r} and "
                f"no link joins them; add a link or a default_link, or change the pins/exclusions"
            )
    # Where each layer can run given where its inputs can (a necessary condition; exact on a chain).
    reach = np.zeros_like(ok)
    src_row = tab.usable[cluster.source_index]
    for i, prods in enumerate(graph.producers):
        cand = ok[i].copy()
        for p in prods:
            fed = src_row if p < 0 else tab.usable[reach[p]].any(axis=0)
            if not (cand & fed).any():
                if p < 0:
                    what = "the first layer" if graph.is_chain else "layer"
                    return InfeasibleError(
                        f"infeasible: {what} {graph.layers[i].name!r} may run on "
                        f"{_names(cluster, np.flatnonzero(cand))}, but none of them is linked to the source "
                        f"{cluster.source!r}; add a link or a default_link, or change the pins/exclusions"
                    )
                return InfeasibleError(
                    f"infeasible: layer {graph.layers[i].name!r} may run on "
                    f"{_names(cluster, np.flatnonzero(cand))}, but none of them is linked to a device that "
                    f"can run layer {graph.layers[p].name!r} ({_names(cluster, np.flatnonzero(reach[p]))}); "
                    f"add a link or a default_link, or change the pins/exclusions"
                )
            cand &= fed
        reach[i] = cand
    if not tab.usable[reach[-1], cluster.sink_index].any():
        return InfeasibleError(
            f"infeasible: the last layer {graph.layers[-1].name!r} can only end on "
            f"{_names(cluster, np.flatnonzero(reach[-1]))}, and none of them is linked to the sink "
            f"{cluster.sink!r}; add a link or a default_link, or change the sink, pins or exclusions"
        )
    return InfeasibleError(
        "infeasible: every placement the pins and exclusions leave moves an activation between two devices "
        "that no link joins (each layer can run somewhere its inputs can reach, but not all at once); "
        "add links or a default_link, or change the pins/exclusions"
    )


def layer_candidates(tables: CostTables, cons: ResolvedConstraints) -> np.ndarray:
    """(n, k) bool: where each layer could run on its own (pins, exclusions, links,
    memory and busy limits checked one layer at a time)."""
    graph = tables.graph
    ok = cons.allowed & np.isfinite(tables.node_time)
    tol = 1 + 1e-9
    need = graph.param_bytes + graph.activation_bytes
    ok &= need[:, None] <= cons.memory[None, :] * tol
    ok &= tables.comp <= cons.busy[None, :] * tol
    return ok


def _explain_layer(tables: CostTables, cons: ResolvedConstraints, i: int) -> InfeasibleError:
    graph, cluster = tables.graph, tables.cluster
    name = graph.layers[i].name
    base = np.flatnonzero(cons.allowed[i] & np.isfinite(tables.node_time[i]))
    need = float(graph.param_bytes[i] + graph.activation_bytes[i])
    fits_mem = [d for d in base if need <= cons.memory[d] * (1 + 1e-9)]
    if not fits_mem:
        best = max(base, key=lambda d: cons.memory[d])
        return InfeasibleError(
            f"infeasible (memory): layer {name!r} needs {fmt_bytes(graph.param_bytes[i])} of parameters "
            f"+ {fmt_bytes(graph.activation_bytes[i])} of activations = {fmt_bytes(need)}, more than "
            f"any device it may use can hold (largest: {cluster.names[best]!r} with "
            f"{fmt_bytes(cons.memory[best])}); raise a device's memory, allow a bigger device, or "
            f"ignore declared memory (memory=False, --ignore-memory)"
        )
    best = min(fits_mem, key=lambda d: tables.comp[i, d] / cons.busy[d])
    return InfeasibleError(
        f"infeasible (busy time): layer {name!r} alone needs {tables.comp[i, best]:.6g} s of compute even "
        f"on {cluster.names[best]!r}, whose busy-time limit is {cons.busy[best]:.6g} s; raise the "
        f"busy-time limits"
    )


def min_energy(tables: CostTables, cons: ResolvedConstraints) -> tuple[np.ndarray, float]:
    """The least energy any allowed assignment needs (exact: the graph's DP, or the MILP
    without coupling rows for a graph the DP does not cover)."""
    from multigpu.partition.solvers.milp import solve_milp

    free, _ = free_solver(tables.graph)
    if free is not None:
        node = np.where(cons.allowed, tables.node(0.0, 1.0), np.inf)
        return free(tables, node, 0.0, 1.0)
    res = solve_milp(tables, cons, 0.0, 1.0, families=())
    if res.a is None:
        return np.zeros(tables.graph.n, dtype=np.intp), np.inf
    return res.a, float(assignment_arrays(tables.graph, tables.cluster, res.a, tables.ship_params, warm=False).energy)


def explain_coupled(
    tables: CostTables, cons: ResolvedConstraints, wt: float, we: float, verbose: bool = False
) -> InfeasibleError:
    """Error for a MILP the solver found infeasible, naming the binding constraint(s)."""
    from multigpu.partition.solvers.milp import FAMILIES, solve_milp

    cluster = tables.cluster
    cand = layer_candidates(tables, cons)
    for i in range(tables.graph.n):
        if not cand[i].any():
            return _explain_layer(tables, cons, i)
    if cons.has_energy:
        _, e_min = min_energy(tables, cons)
        if e_min > cons.energy_budget * (1 + 1e-9):
            return InfeasibleError(
                f"infeasible (energy budget): the budget of {cons.energy_budget:.6g} J is below the least "
                f"energy any allowed assignment needs ({e_min:.6g} J); raise the budget "
                f"(--energy-budget) to at least {e_min:.6g} J"
            )
    present = [f for f in FAMILIES if getattr(cons, f"has_{f}")]

    def infeasible(fams: tuple[str, ...]) -> bool:
        res = solve_milp(tables, cons, wt, we, objective="feasibility", families=fams, verbose=verbose)
        return res.status == 2

    if "memory" in present and infeasible(("memory",)):
        mem = np.isfinite(cons.memory)
        total = float(tables.graph.param_bytes.sum())
        cap = float(cons.memory[mem].sum())
        return InfeasibleError(
            f"infeasible (memory): the layers cannot be spread over the devices' memory (parameters total "
            f"{fmt_bytes(total)}; the memory-limited devices {_names(cluster, np.flatnonzero(mem))} hold "
            f"{fmt_bytes(cap)} together, and each also needs room for its largest activation); raise "
            f"memory, allow more devices, or ignore declared memory (memory=False, --ignore-memory)"
        )
    if "busy" in present and infeasible(("busy",)):
        lim = np.isfinite(cons.busy)
        return InfeasibleError(
            f"infeasible (busy time): the busy-time limits of {_names(cluster, np.flatnonzero(lim))} "
            f"leave no way to place every layer; raise the limits or free more devices"
        )
    for r in (2, 3):
        for fams in itertools.combinations(present, r):
            if infeasible(fams):
                return InfeasibleError(
                    f"infeasible: the {' and '.join(_label(f) for f in fams)} constraints can each be met "
                    f"alone but not together; relax one of them"
                )
    return InfeasibleError(  # pragma: no cover - one of the checks above always fires
        "infeasible: the solver found no assignment that meets every constraint; "
        "relax the memory, busy-time or energy limits"
    )


def _label(family: str) -> str:
    return {"memory": "memory", "busy": "busy-time", "energy": "energy-budget"}[family]
