"""The local search on the bottleneck (``solvers/bottleneck_search.py``) that runs beside the
throughput MILP under a time limit. Its answers are checked against brute force on random DAGs
in test_partition_dag_table_oracle.py, and its wiring into the planner in
test_partition_anytime.py."""

from __future__ import annotations

import numpy as np
import pytest

from multigpu.benchmarks.planner import gpu_cluster, with_memory
from multigpu.partition import load_cluster, load_graph
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.solvers.constraints import Constraints


def _resolved(graph, cluster):
    return CostTables.build(graph, cluster, False), Constraints.coerce(None).resolve(graph, cluster)


def test_a_relay_is_a_device_whose_two_hops_are_each_faster_than_the_direct_link() -> None:
    from multigpu.partition.solvers.search_moves import relays as _relays

    # The planner benchmark's 16 devices: every GPU and CPU node on its own link to the host;
    # between two of them, the default link (1.25 GB/s), slower than a GPU's PCIe to the host.
    cluster = gpu_cluster()
    graph = load_graph("resnet18")
    relays = _relays(CostTables.build(graph, cluster, False))
    names = list(cluster.names)
    host, v0, v1, c0, c1 = (names.index(x) for x in ("host", "v100-0", "v100-1", "cpu-0", "cpu-1"))
    assert relays[v0, v1] == host and relays[v1, v0] == host
    assert relays[host, v0] == -1 and relays[v0, host] == -1  # the direct link is the fast one
    # CPU nodes reach the host at 1.25 GB/s, no faster than the default link: no relay.
    assert relays[c0, c1] == -1 and relays[v0, c0] == -1
    assert (np.diag(relays) == -1).all()


def test_the_search_runs_from_each_distinct_start_in_turn_and_keeps_the_best() -> None:
    import time

    from multigpu.partition.cost.arithmetic import bottleneck_of
    from multigpu.partition.solvers.bottleneck_search import improve_bottleneck, search_in_child
    from multigpu.partition.solvers.constraints import violations
    from multigpu.partition.solvers.fill import fill_plan

    graph = load_graph("resnet18")
    cluster = with_memory(load_cluster("gpu-box"), graph, 0.4)
    tables, cons = _resolved(graph, cluster)
    filled = fill_plan(tables, cons)
    assert filled is not None
    spread = np.arange(graph.n) * cluster.k // graph.n  # contiguous runs over every device in order
    assert not violations(tables, cons, spread)
    far = time.time() + 600
    alone = {name: improve_bottleneck(tables, cons, a, time.perf_counter() + 600) for name, a in
             (("fill", filled), ("spread", spread))}  # fmt: skip
    a, value = search_in_child(tables, cons, [filled, filled, spread], far)
    assert value == min(v for _, v in alone.values())
    assert value == pytest.approx(bottleneck_of(graph, cluster, a, warm=False), rel=1e-12)
    with pytest.raises(ValueError, match="starting plan"):
        search_in_child(tables, cons, [], far)
