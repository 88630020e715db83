"""Reading Tarnawski et al.'s pipeline instances (``inputs/graph_pipeline.py``) and the
compact throughput MILP (``solvers/milp_compact.py``), on a small hand-written instance
in their format and on random uniform clusters, against brute force."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from multigpu.partition import Cluster, DeviceSpec, EngineProfile, Graph, LayerSpec, LinkSpec
from multigpu.partition.cost.arithmetic import bottleneck_of, memory_use
from multigpu.partition.cost.tables import CostTables
from multigpu.partition.exceptions import GraphError
from multigpu.partition.inputs.graph_pipeline import BYTES_PER_SECOND, pipeline_max_load, read_pipeline_instance
from multigpu.partition.inputs.hosts import TransferCpu
from multigpu.partition.solvers.bottleneck_bound import bottleneck_lower_bound
from multigpu.partition.solvers.constraints import Constraints
from multigpu.partition.solvers.milp_compact import why_not_compact
from multigpu.partition.solvers.solver import Budget
from multigpu.partition.solvers.throughput import solve_throughput

# Five nodes: 1 feeds 2 and 3; 2 feeds 4 (one colour class with 2); 3 feeds 5; 4 and 5 are
# sinks. Latencies and costs in milliseconds, as in their files.
TINY = {
    "maxFPGAs": 2,
    "maxCPUs": 1,
    "maxSizePerFPGA": 1000.0,
    "nodes": [
        {"id": 1, "name": "a", "cpuLatency": 10.0, "fpgaLatency": 1.0, "size": 100.0, "supportedOnFpga": 1,
         "isBackwardNode": 0, "colorClass": None},
        {"id": 2, "name": "b", "cpuLatency": 20.0, "fpgaLatency": 2.0, "size": 200.0, "supportedOnFpga": 1,
         "isBackwardNode": 0, "colorClass": 7},
        {"id": 3, "name": "c", "cpuLatency": 30.0, "fpgaLatency": 3.0, "supportedOnFpga": 1, "isBackwardNode": 0},
        {"id": 4, "name": "d", "cpuLatency": 5.0, "fpgaLatency": 0.5, "size": 50.0, "supportedOnFpga": 1,
         "isBackwardNode": 0, "colorClass": 7},
        {"id": 5, "name": "e", "cpuLatency": 40.0, "fpgaLatency": 4.0, "supportedOnFpga": 1, "isBackwardNode": 0},
    ],
    "edges": [
        {"sourceId": 1, "destId": 2, "cost": 1.5},
        {"sourceId": 1, "destId": 3, "cost": 1.5},
        {"sourceId": 2, "destId": 4, "cost": 0.25},
        {"sourceId": 3, "destId": 5, "cost": 2.0},
    ],
}  # fmt: skip


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    return read_pipeline_instance(path)


def test_reads_the_graph_and_cluster(tiny):
    g, c = tiny.graph, tiny.cluster
    # The class {b, d} is one layer; the two sinks feed a zero-time layer "output".
    assert g.names == ["a", "b", "c", "e", "output"]
    assert [g.producers[i] for i in range(g.n)] == [(-1,), (0,), (0,), (2,), (1, 3)]
    assert g.param_bytes.tolist() == [100.0, 250.0, 0.0, 0.0, 0.0]
    assert g.output_bytes.tolist() == pytest.approx([1.5e-3 * BYTES_PER_SECOND, 0.0, 2e-3 * BYTES_PER_SECOND, 0, 0])
    assert c.names == ["cpu", "acc0", "acc1"]
    assert c.source == "cpu" and c.memory.tolist()[1:] == [1000.0 + 2e6] * 2  # + the largest activation
    tables = CostTables.build(g, c, False)
    # Seconds: the accelerators at their latencies, the CPU at ten times them.
    assert tables.comp[:, 1].tolist() == pytest.approx([1e-3, 2.5e-3, 3e-3, 4e-3, 0.0])
    assert tables.comp[:, 0].tolist() == pytest.approx([10e-3, 25e-3, 30e-3, 40e-3, 0.0])
    assert tiny.layer_of == {1: 0, 2: 1, 3: 2, 4: 1, 5: 3}


def test_ours_matches_theirs_but_for_the_sender_charged_per_device(tiny):
    """Over every placement, our bottleneck is their max-load, plus a's cost once more on
    a's device where a sends to two other devices (we charge a sender per device)."""
    g, c = tiny.graph, tiny.cluster
    differs = 0
    for a in itertools.product(range(c.k), repeat=g.n):
        a = np.array(a)
        ours = 1e3 * bottleneck_of(g, c, a, warm=False)
        names = [c.names[d] for d in a]
        theirs = pipeline_max_load(tiny.data, tiny.original_assignment(names))
        two = len({int(a[1]), int(a[2])} - {int(a[0])}) == 2
        if not two:
            assert ours == pytest.approx(theirs, rel=1e-9)
        else:
            differs += 1
            assert ours >= theirs - 1e-9
            assert ours <= theirs + 1.5 + 1e-9
    assert differs > 0


def test_their_max_load_by_hand(tiny):
    # a, b, d on acc0; c, e on acc1: acc0 = 1 + 2 + 0.5 + 1.5 (a sends) = 5; acc1 = 3 + 4 + 1.5 (receives a) = 8.5.
    place = {1: 1, 2: 1, 4: 1, 3: 2, 5: 2}
    assert pipeline_max_load(TINY, place) == pytest.approx(8.5)
    # Everything on the CPU: compute only.
    assert pipeline_max_load(TINY, dict.fromkeys(place, 0)) == pytest.approx(105.0)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda d: d.pop("maxFPGAs"), "missing key"),
        (lambda d: d["edges"].append({"sourceId": 1, "destId": 5, "cost": 9.0}), "two outgoing costs"),
        (lambda d: d["edges"].append({"sourceId": 5, "destId": 1, "cost": 0.0}), "cycle"),
        (lambda d: d["edges"].append({"sourceId": 5, "destId": 99, "cost": 0.0}), "not among the nodes"),
        (lambda d: d["nodes"][0].update(cpuLatency=-1), "finite number >= 0"),
    ],
)
def test_refuses_bad_instances(tmp_path, change, match):
    data = json.loads(json.dumps(TINY))
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(GraphError, match=match):
        read_pipeline_instance(path)


def test_missing_file_names_the_repository(tmp_path):
    with pytest.raises(GraphError, match="msr-fiddle/dnn-partitioning"):
        read_pipeline_instance(tmp_path / "none.json")


def _brute(graph, cluster, allowed):
    """The least bottleneck over the placements that fit in memory."""
    best = np.inf
    for a in itertools.product(*[np.flatnonzero(allowed[i]) for i in range(graph.n)]):
        a = np.array(a)
        if np.all(memory_use(graph, cluster, a) <= cluster.memory * (1 + 1e-9)):
            best = min(best, bottleneck_of(graph, cluster, a, warm=False))
    return best


def _solve(tables, cons, form):
    return solve_throughput(
        tables, cons, 1.0, 0.0, 1.0, None, lambda: AssertionError("infeasible"), Budget(gap=0.0), form=form
    )


def test_compact_form_on_the_tiny_instance(tiny):
    tables = CostTables.build(tiny.graph, tiny.cluster, False)
    cons = Constraints.coerce(tiny.constraints).resolve(tiny.graph, tiny.cluster)
    assert why_not_compact(tables, cons, bottleneck_lower_bound(tables, cons)) is None
    best = _brute(tiny.graph, tiny.cluster, cons.allowed)
    for form in ("compact", "pairwise"):
        sol = _solve(tables, cons, form)
        assert sol.value == pytest.approx(best, rel=1e-7)
        assert bottleneck_of(tiny.graph, tiny.cluster, sol.a, warm=False) == pytest.approx(best, rel=1e-7)


def _random_dag(rng, n):
    layers = []
    for i in range(n):
        inputs = ("input",) if i == 0 else tuple(sorted({f"l{int(p)}" for p in rng.integers(0, i, size=2)}))
        layers.append(
            LayerSpec(
                f"l{i}", float(rng.uniform(1e8, 1e10)), float(rng.uniform(0, 1e6)), float(rng.uniform(1e4, 1e7)), inputs
            )
        )
    # Every layer but the last has a consumer: the last consumes the ones nobody else does.
    used = {p for x in layers for p in x.inputs}
    tail = tuple(x.name for x in layers[:-1] if x.name not in used)
    last = layers[-1]
    layers[-1] = LayerSpec(
        last.name, last.flops, last.param_bytes, last.output_bytes, tuple(sorted(set(last.inputs) | set(tail)))
    )
    return Graph(tuple(layers), input_bytes=float(rng.uniform(1e4, 1e6)), name="dag")


@pytest.mark.parametrize("seed", range(6))
def test_compact_equals_pairwise_on_random_uniform_clusters(seed):
    """Random DAGs on k = 3 devices with transfer CPU and one fast link speed (so no link
    binds), with and without memory limits: both forms reach the brute-force optimum."""
    rng = np.random.default_rng(seed)
    graph = _random_dag(rng, 5)
    mem = float(graph.param_bytes.sum()) * 0.5 + float(graph.activation_bytes.max()) if seed % 2 else None
    devices = tuple(
        DeviceSpec(
            f"d{i}",
            float(10 ** rng.uniform(10, 11)),
            1.0,
            mem if i else None,
        )
        for i in range(3)
    )
    cpu = {
        f"d{i}": TransferCpu(
            fixed=float(rng.uniform(0, 1e-3)),
            per_byte=float(rng.uniform(0, 2e-9)),
            receive_per_byte=float(rng.uniform(0, 2e-9)),
        )
        for i in range(3)
    }
    cluster = Cluster(
        devices, source="d0", default_link=LinkSpec(1e15, 0.0), engine=EngineProfile(transfer_cpu=cpu), name="uniform"
    )
    tables = CostTables.build(graph, cluster, False)
    cons = Constraints.coerce({}).resolve(graph, cluster)
    assert why_not_compact(tables, cons, bottleneck_lower_bound(tables, cons)) is None
    best = _brute(graph, cluster, cons.allowed)
    for form in ("compact", "pairwise", "auto"):
        sol = _solve(tables, cons, form)
        assert sol.value == pytest.approx(best, rel=1e-6), form
        assert sol.bound <= best * (1 + 1e-6)


def test_compact_refuses_what_it_cannot_model():
    rng = np.random.default_rng(0)
    graph = _random_dag(rng, 4)
    devices = tuple(DeviceSpec(f"d{i}", 1e10, 1.0) for i in range(3))
    from multigpu.partition import Link

    cluster = Cluster(devices, source="d0", links=(Link(("d0", "d1"), 1e6, 1e-3),), default_link=LinkSpec(1e9, 1e-4))
    tables = CostTables.build(graph, cluster, False)
    cons = Constraints.coerce({}).resolve(graph, cluster)
    assert why_not_compact(tables, cons, 0.0) == "link figures differ between pairs"
    with pytest.raises(ValueError, match="does not apply"):
        _solve(tables, cons, "compact")


def test_bench_instances_folder_is_checked(tmp_path):
    """`multigpu bench planner --instances DIR` names the folder and how to get the instances."""
    from multigpu.cli.commands.bench import _instances
    from multigpu.errors import InputError

    with pytest.raises(InputError, match=r"--instances .*git clone https://github.com/msr-fiddle/dnn-partitioning"):
        _instances(str(tmp_path / "nowhere"))
    assert _instances(None) is None
    from multigpu.benchmarks.planner_published import INSTANCES

    for rel in INSTANCES.values():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(json.dumps(TINY))
    assert _instances(str(tmp_path)) == tmp_path
