"""Plans that run, without Ray: plan files, stages, measured figures in the cost model,
link fits, CLI parsing, inputs and parameters, and every bad input caught before Ray starts."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import multigpu
from multigpu.contract import registry
from multigpu.errors import BackendNotInstalledError, ClusterError, InputError, ParamsError, PlanError
from multigpu.execution import check_plan, fit_link, predict, read_plan, run_partitioned, split_stages
from multigpu.execution.inputs import load_images, load_params, random_inputs
from multigpu.execution.link_fitting import LinkFit, fit_link_regimes, link_sizes, pair_walk
from multigpu.execution.plan import worker_params
from multigpu.partition import Cluster, DeviceSpec, LinkSpec, autopartition, evaluate, graph_from_model, load_cluster
from multigpu.partition.cost.choices import compute_times
from multigpu.training.checkpoint import save_checkpoint

LENET = multigpu.models.lenet()
NAMES = [n for n, _ in LENET.layers]


def cluster(**kw) -> Cluster:
    """driver (numpy) + a (torch) + b (paddle), 1 ms links."""
    devices = kw.pop("devices", None) or (
        DeviceSpec("driver", 1e9, 0.0, backend="numpy"),
        DeviceSpec("a", 2e9, 0.0, backend="torch", threads=1),
        DeviceSpec("b", 4e9, 0.0, backend="paddle", device="cpu", threads=2),
    )
    return Cluster(devices=devices, source="driver", default_link=LinkSpec(1e8, 1e-3), **kw)


# -- plans ---------------------------------------------------------------------------
def test_read_plan_takes_a_list_the_partition_json_and_files(tmp_path):
    plan = ["a"] * 4 + ["b"] * 6
    assert read_plan(plan) == plan
    assert read_plan({"assignment": plan, "time": 1.0}) == plan
    f = tmp_path / "plan.json"
    f.write_text(json.dumps({"assignment": plan}))
    assert read_plan(f) == plan
    f.write_text(json.dumps(plan))
    assert read_plan(str(f)) == plan


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"time": 1}, 'without an "assignment"'),
        ("", "cannot read"),
        ([], "empty"),
        ([1, 2], "entry 0 is 1"),
        (42, "must list one device name per layer"),
    ],
)
def test_read_plan_rejects_what_is_not_a_plan(bad, match, tmp_path):
    with pytest.raises(PlanError, match=match):
        read_plan(bad)


def test_read_plan_names_a_malformed_file(tmp_path):
    f = tmp_path / "plan.json"
    f.write_text('["a",')
    with pytest.raises(PlanError, match="plan.json.*not JSON.*line 1"):
        read_plan(f)


def test_stages_are_runs_of_equal_names_and_a_device_may_host_two():
    stages = split_stages(["a", "a", "b", "a"], ["l1", "l2", "l3", "l4"])
    assert [(s.device, s.start, s.stop, s.first, s.last) for s in stages] == [
        ("a", 0, 2, "l1", "l2"),
        ("b", 2, 3, "l3", "l3"),
        ("a", 3, 4, "l4", "l4"),
    ]
    assert stages[1].label() == "stage 2 (l3) on device 'b'"
    x = check_plan(LENET, cluster(), ["a"] * 3 + ["b"] * 4 + ["a"] * 3)
    assert x.workers == ["a", "b"] and x.driver == "driver" and len(x.stages) == 3


def test_worker_params_are_the_slices_each_device_uses():
    params = LENET.init_params(0)
    x = check_plan(LENET, cluster(), ["a"] * 3 + ["b"] * 4 + ["a"] * 3)
    got_a, got_b = worker_params(x, "a", params), worker_params(x, "b", params)
    # a: conv1 (W1 b1), fc3 (W3 b3), fc4 (W4 b4); b: conv2 (W2 b2); no other layer has parameters
    assert sorted(got_a) == [0, 1, 4, 5, 6, 7] and sorted(got_b) == [2, 3]
    assert all(got_a[i] is params[i] for i in got_a)


def test_check_plan_errors_name_the_bad_value_and_the_fix():
    with pytest.raises(PlanError, match="plan has 3 entries but lenet has 10 layers.*multigpu partition"):
        check_plan(LENET, cluster(), ["a"] * 3)
    with pytest.raises(
        PlanError, match="layer 'fc4' on device 'gpu9', which cluster .* lacks; its devices are: driver, a, b"
    ):
        check_plan(LENET, cluster(), ["a"] * 9 + ["gpu9"])
    bare = cluster(devices=(DeviceSpec("driver", 1e9, 0.0), DeviceSpec("a", 1e9, 0.0, backend="torch")))
    with pytest.raises(
        PlanError, match="stage 1 \\(conv1\\) on device 'driver' cannot run.*the driver.*add e.g. \"backend\""
    ):
        check_plan(LENET, bare, ["driver"] + ["a"] * 9)
    away = cluster(sink="a")
    with pytest.raises(PlanError, match="sink 'a' but source 'driver'"):
        check_plan(LENET, away, ["a"] * 10)


def test_bad_inputs_fail_before_ray_starts(monkeypatch):
    cl = cluster()
    with pytest.raises(ParamsError, match="params has 2 arrays"):
        run_partitioned(LENET, LENET.init_params(0)[:2], ["a"] * 10, np.zeros((1, 1, 28, 28), np.float32), cl)
    with pytest.raises(InputError, match="inputs has shape \\(2, 28, 28\\)"):
        run_partitioned(LENET, None, ["a"] * 10, np.zeros((2, 28, 28), np.float32), cl)
    with pytest.raises(PlanError, match="engine='fast' is unknown"):
        run_partitioned(LENET, None, ["a"] * 10, np.zeros((1, 1, 28, 28), np.float32), cl, engine="fast")
    real = registry.importlib.util.find_spec
    monkeypatch.setattr(
        registry.importlib.util, "find_spec", lambda name, *a: None if name == "paddle" else real(name, *a)
    )
    with pytest.raises(
        BackendNotInstalledError, match="stage 2 \\(pool2..fc4\\) on device 'b'.*pip install 'multigpu\\[paddle\\]'"
    ):
        run_partitioned(LENET, None, ["a"] * 5 + ["b"] * 5, np.zeros((1, 1, 28, 28), np.float32), cl)


def test_a_cluster_given_as_a_dict_is_checked_as_its_file_is(tmp_path):
    """A dict laid out as a cluster file is a cluster, with the file's checks and messages."""
    data = cluster().to_dict()
    x = np.zeros((2, 28, 28), np.float32)
    with pytest.raises(InputError, match="inputs has shape \\(2, 28, 28\\)"):  # past the cluster and the plan
        run_partitioned(LENET, None, ["a"] * 10, x, data)
    with pytest.raises(PlanError, match="on device 'gpu9', which cluster .* lacks; its devices are: driver, a, b"):
        run_partitioned(LENET, None, ["a"] * 9 + ["gpu9"], x, data)
    data["devices"][1]["flops"] = 0
    (tmp_path / "cluster.json").write_text(json.dumps(data))
    with pytest.raises(ClusterError) as from_file:
        load_cluster(tmp_path / "cluster.json")
    with pytest.raises(ClusterError) as from_dict:
        run_partitioned(LENET, None, ["a"] * 10, x, data)
    assert str(from_dict.value) == str(from_file.value) and "device 'a': flops=0 must be greater than 0" in str(
        from_dict.value
    )
    for bad in (["driver", "a"], 3):
        with pytest.raises(ClusterError, match=f"cluster must be a Cluster, a dict .* got {type(bad).__name__}"):
            run_partitioned(LENET, None, ["a"] * 10, x, bad)


def test_importing_multigpu_and_the_executor_loads_no_ray_and_no_framework(tmp_path):
    code = (
        "import sys, json, multigpu, multigpu.cli, multigpu.execution\n"
        "multigpu.cli.build_parser(); multigpu.run_partitioned; multigpu.profile\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('ray', 'torch', 'mxnet', 'paddle'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_ray_missing_names_the_cluster_extra(tmp_path):
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import numpy as np, multigpu\n"
        "from multigpu.partition import Cluster, DeviceSpec\n"
        "cl = Cluster(devices=(DeviceSpec('d', 1e9, 0, backend='numpy'),), source='d')\n"
        "try:\n"
        "    multigpu.run_partitioned('lenet', None, ['d'] * 10, np.zeros((1, 1, 28, 28), np.float32), cl)\n"
        "except multigpu.errors.MissingDependencyError as e:\n"
        "    print('MISSING', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert "MISSING" in out.stdout and "pip install 'multigpu[cluster]'" in out.stdout


# -- measured figures in the cluster file ------------------------------------------------
def lenet_times(scale: float = 1e-4) -> dict[str, float]:
    return {n: scale * (i + 1) for i, n in enumerate(NAMES)}


def test_layer_times_round_trip_through_the_file_and_override_flops(tmp_path):
    cl = cluster(
        devices=(
            DeviceSpec("driver", 1e9, 0.0, backend="numpy"),
            DeviceSpec(
                "a",
                2e9,
                0.0,
                backend="torch",
                threads=1,
                resources={"CPU": 1},
                layer_times={"lenet(batch=1)": lenet_times()},
                stage_overhead=2e-5,
            ),
        )
    )
    f = tmp_path / "c.json"
    f.write_text(json.dumps(cl.to_dict()))
    back = load_cluster(f)
    assert back == cl and back.devices[1].measured("lenet(batch=1)") == lenet_times()
    g = graph_from_model(LENET, 1)
    table = compute_times(g, back)
    np.testing.assert_allclose(table[:, 1], list(lenet_times().values()))
    np.testing.assert_allclose(table[:, 0], g.flops / 1e9)  # the driver has no profile
    g8 = graph_from_model(LENET, 8)  # another graph: FLOP/s again
    np.testing.assert_allclose(compute_times(g8, back)[:, 1], g8.flops / 2e9)


@pytest.mark.parametrize(
    "times, match",
    [
        (
            {"lenet(batch=1)": {**lenet_times(), "conv9": 1e-4}},
            "time for layer 'conv9', which graph 'lenet\\(batch=1\\)' lacks",
        ),
        ({"lenet(batch=1)": {k: v for k, v in lenet_times().items() if k != "fc4"}}, "no time for layer 'fc4'"),
    ],
)
def test_a_measured_time_for_a_layer_the_graph_lacks_is_an_error(times, match):
    cl = cluster(
        devices=(
            DeviceSpec("driver", 1e9, 0.0, backend="numpy"),
            DeviceSpec("a", 2e9, 0.0, backend="numpy", layer_times=times),
        )
    )
    g = graph_from_model(LENET, 1)
    with pytest.raises(ClusterError, match=match):
        evaluate(g, cl, ["a"] * 10)
    with pytest.raises(ClusterError, match=match):
        autopartition(g, cl)
    with pytest.raises(ClusterError, match=match):  # the executor refuses before starting Ray
        run_partitioned(LENET, None, ["a"] * 10, np.zeros((1, 1, 28, 28), np.float32), cl)


@pytest.mark.parametrize(
    "entry, match",
    [
        ({"layer_times": {"lenet(batch=1)": {"conv1": -1.0}}}, "must be greater than 0"),
        ({"layer_times": {"lenet(batch=1)": {"conv1": float("nan")}}}, "=nan must be a finite number"),
        ({"layer_times": {"lenet(batch=1)": {"conv1": "fast"}}}, "must be a number"),
        ({"layer_times": {"lenet(batch=1)": {}}}, "non-empty object mapping layer names"),
        ({"layer_times": []}, "graph name"),
        ({"threads": 0}, "threads=0 must be a positive integer"),
        ({"device": "tpu:0"}, "not a framework device"),
        ({"resources": {"pi1": 0}}, "resources\\['pi1'\\]=0 must be greater than 0"),
        ({"stage_overhead": -1e-3}, "stage_overhead=-0.001 must be at least 0"),
        ({"backend": ""}, "backend must be a non-empty string"),
        ({"layer_time": {}}, "unknown key 'layer_time'"),
    ],
)
def test_bad_measured_or_execution_fields_are_rejected_on_load(entry, match, tmp_path):
    data = {"devices": [{"name": "d", "flops": 1e9, "power": 0, **entry}], "source": "d"}
    f = tmp_path / "c.json"
    f.write_text(json.dumps(data))
    with pytest.raises(ClusterError, match=match):
        load_cluster(f)


def test_measured_times_change_the_plan_where_they_should():
    """Nominal FLOP/s put everything on the fast 'a'; measured times say 'a' is fast
    only for the convolutions and 'b' for the rest, so the plan splits after pool2."""
    g = graph_from_model(LENET, 1)
    conv = {"conv1", "relu1", "pool1", "conv2", "relu2", "pool2"}
    ta = {n: (1e-5 if n in conv else 5e-3) for n in NAMES}
    tb = {n: (5e-3 if n in conv else 1e-5) for n in NAMES}
    devs = [DeviceSpec("a", 1e12, 0.0), DeviceSpec("b", 1e9, 0.0)]
    nominal = Cluster(devices=tuple(devs), source="a", default_link=LinkSpec(1e9, 1e-4))
    assert autopartition(g, nominal).assignment == ["a"] * 10
    measured = Cluster(
        devices=(
            DeviceSpec("a", 1e12, 0.0, layer_times={g.name: ta}),
            DeviceSpec("b", 1e9, 0.0, layer_times={g.name: tb}),
        ),
        source="a",
        default_link=LinkSpec(1e9, 1e-4),
    )
    plan = autopartition(g, measured)
    assert plan.assignment == ["a"] * 6 + ["b"] * 4
    assert plan.breakdown.layers[0].compute_time == 1e-5


# -- stage overhead: in T, in the DP/MILP, in the matrix form ---------------------------
@st.composite
def overhead_instances(draw):
    n = draw(st.integers(2, 6))
    k = draw(st.integers(1, 3))
    names = [f"l{i}" for i in range(n)]
    devices = []
    for d in range(k):
        times = {nm: draw(st.floats(1e-4, 1e-2)) for nm in names}
        devices.append(
            DeviceSpec(
                f"d{d}",
                draw(st.floats(1e8, 1e10)),
                draw(st.floats(0, 50)),
                layer_times={"g": times} if draw(st.booleans()) else None,
                stage_overhead=draw(st.sampled_from([0.0, 1e-4, 3e-3])),
            )
        )
    src = draw(st.integers(0, k - 1))
    cl = Cluster(
        devices=tuple(devices),
        source=f"d{src}",
        default_link=LinkSpec(draw(st.floats(1e5, 1e9)), draw(st.floats(0, 1e-3)), draw(st.floats(0, 5))),
    )
    from multigpu.partition import Graph, LayerSpec

    g = Graph(
        layers=tuple(
            LayerSpec(nm, draw(st.floats(1e5, 1e8)), draw(st.floats(0, 1e5)), draw(st.floats(4, 1e5))) for nm in names
        ),
        input_bytes=1e4,
        name="g",
    )
    return g, cl, draw(st.sampled_from([(1.0, 0.0), (0.0, 1.0), (1.0, 0.3)]))


def _by_hand(g, cl, a, wt, we):
    """T and E of assignment ``a`` straight from the definition (no tables)."""
    T = E = 0.0
    prev = cl.source
    for i, layer in enumerate(g.layers):
        d = cl.devices[cl.index(a[i])]
        t = d.measured("g")[layer.name] if d.measured("g") else layer.flops / d.flops
        oh = d.stage_overhead if (i == 0 or a[i] != a[i - 1]) else 0.0
        T += t + oh
        E += (t + oh) * d.power
        if prev != a[i]:
            ln = cl.link(prev, a[i])
            b = g.input_bytes if i == 0 else g.layers[i - 1].output_bytes
            tt = b / ln.bandwidth + ln.latency
            T += tt
            E += tt * ln.power
        prev = a[i]
    if a[-1] != cl.sink:
        ln = cl.link(a[-1], cl.sink)
        tt = g.layers[-1].output_bytes / ln.bandwidth + ln.latency
        T += tt
        E += tt * ln.power
    return T, E, wt * T + we * E


@given(overhead_instances())
def test_stage_overhead_and_layer_times_keep_the_optimum_exact(inst):
    g, cl, (wt, we) = inst
    best = min((_by_hand(g, cl, a, wt, we)[2], a) for a in itertools.product(cl.names, repeat=g.n))
    for solver in ("dp", "milp"):
        plan = autopartition(g, cl, wt, we, solver=solver, constraints={"memory": False})
        assert plan.cost == pytest.approx(best[0], rel=1e-6, abs=1e-12), solver
    a = list(best[1])
    bd = evaluate(g, cl, a, wt, we)
    T, E, _ = _by_hand(g, cl, a, wt, we)
    assert bd.time == pytest.approx(T, rel=1e-9) and bd.energy == pytest.approx(E, rel=1e-9, abs=1e-15)
    assert bd.matrix.time() == pytest.approx(T, rel=1e-9)
    assert bd.matrix.energy() == pytest.approx(E, rel=1e-9, abs=1e-15)


def test_predict_splits_the_model_into_stages_and_hops():
    g = graph_from_model(LENET, 1)
    times = {"lenet(batch=1)": lenet_times()}
    cl = cluster(
        devices=(
            DeviceSpec("driver", 1e9, 0.0, backend="numpy"),
            DeviceSpec("a", 2e9, 0.0, backend="torch", layer_times=times, stage_overhead=1e-3),
            DeviceSpec("b", 4e9, 0.0, backend="torch", layer_times=times),
        )
    )
    p = predict(check_plan(LENET, cl, ["a"] * 4 + ["b"] * 6))
    assert p.stage_compute[0] == pytest.approx(sum(list(lenet_times().values())[:4]) + 1e-3)
    assert p.stage_compute[1] == pytest.approx(sum(list(lenet_times().values())[4:]))
    link = 1e-3
    assert p.hops == pytest.approx(
        [g.input_bytes / 1e8 + link, g.output_bytes[3] / 1e8 + link, g.output_bytes[-1] / 1e8 + link]
    )
    assert p.end_to_end == pytest.approx(sum(p.stage_compute) + sum(p.hops))
    assert p.measured == ["a", "b"] and p.throughput == pytest.approx(1 / p.bottleneck)


# -- link fits, sizes, walks -------------------------------------------------------------
def test_fit_link_recovers_latency_and_bandwidth():
    sizes = [40, 4000, 40000, 400000, 4000000]
    lat, bw = fit_link([(b, 3e-4 + b / 5e8) for b in sizes])
    assert lat == pytest.approx(3e-4, rel=1e-6) and bw == pytest.approx(5e8, rel=1e-6)
    lat, bw = fit_link([(b, 2e-4) for b in sizes])  # no per-byte cost: latency only
    assert lat == pytest.approx(2e-4) and bw >= 1e14
    lat, bw = fit_link([(b, b / 1e9) for b in sizes[1:]])  # no latency
    assert lat == pytest.approx(0, abs=1e-12) and bw == pytest.approx(1e9, rel=1e-6)


def test_small_payloads_get_a_latency_of_their_own():
    # Ray sends a payload up to max_direct_call_object_size inside its messages (inline)
    # and a larger one through the object store: two latencies over one bandwidth.
    sizes = [40, 200, 700, 4000, 40000, 400000]
    lat, bw, inline = fit_link_regimes([(b, (1e-2 if b <= 768 else 2e-2) + b / 1e6) for b in sizes], 768)
    assert lat == pytest.approx(2e-2, rel=1e-6) and inline == pytest.approx(1e-2, rel=1e-6)
    assert bw == pytest.approx(1e6, rel=1e-6)
    fit = LinkFit(("a", "b"), lat, bw, [], inline, 768)
    assert fit.predict(40) == pytest.approx(1e-2 + 40e-6) and fit.predict(4000) == pytest.approx(2e-2 + 4e-3)
    # Samples on one side only: the one-latency fit, and no inline latency.
    assert fit_link_regimes([(b, 3e-4 + b / 5e8) for b in sizes], 10)[2] is None
    assert fit_link_regimes([(b, 3e-4 + b / 5e8) for b in sizes], 10**9)[:2] == pytest.approx((3e-4, 5e8))
    # The probe sizes straddle a threshold inside the activations' span.
    with_inline = link_sizes([LENET], 1, inline_bytes=768)
    assert any(s <= 768 for s in with_inline[1:]) and sum(s > 768 for s in with_inline) >= 2
    assert 384 in with_inline and 1536 in with_inline
    assert link_sizes([LENET], 1, inline_bytes=64 * 2**20) == link_sizes([LENET], 1)


def test_link_sizes_span_every_activation():
    sizes = link_sizes([LENET, multigpu.models.alexnet()], 1)
    assert sizes[0] == 40 and sizes[-1] == max(s.output_bytes for s in multigpu.models.alexnet().layer_stats(1))
    assert len(sizes) == 5 and all(s % 4 == 0 for s in sizes) and sizes == sorted(sizes)


def test_walk_crosses_every_pair():
    for k in range(1, 6):
        names = [f"w{i}" for i in range(k)]
        walk = pair_walk(names)
        pairs = {frozenset(p) for p in zip(walk, walk[1:])}
        assert pairs == {frozenset(p) for p in itertools.combinations(names, 2)}


# -- CLI parsing, inputs, parameters -------------------------------------------------------
def test_run_plan_argument_takes_files_and_inline_names(tmp_path):
    from multigpu.cli.commands.run import parse_plan

    assert parse_plan("a*3,b,c*2") == ["a", "a", "a", "b", "c", "c"]
    f = tmp_path / "p.json"
    f.write_text("[]")
    assert parse_plan(str(f)) == str(f)
    with pytest.raises(PlanError, match="neither a file nor a list"):
        parse_plan("a**2")


def test_profile_worker_specs():
    from multigpu.cli.commands.profile import _parse_worker

    assert _parse_worker("torch") == {"name": "torch", "backend": "torch", "device": "cpu", "threads": None}
    assert _parse_worker("torch:cpu:1")["name"] == "torch-1t"
    assert _parse_worker("mxnet:2") == {"name": "mxnet-2t", "backend": "mxnet", "device": "cpu", "threads": 2}
    assert _parse_worker("torch:gpu:0:4") == {
        "name": "torch-gpu0-4t",
        "backend": "torch",
        "device": "gpu:0",
        "threads": 4,
    }
    with pytest.raises(PlanError, match="not BACKEND\\[:DEVICE\\]\\[:THREADS\\]"):
        _parse_worker("torch:fast")


def test_params_load_from_a_checkpoint_folder_its_file_or_an_npz(tmp_path):
    params = LENET.init_params(3)
    save_checkpoint(
        tmp_path / "ck",
        params,
        {"config": {}, "epoch": 1, "rng": {}, "test_acc": [0.1], "train_loss": [2.3], "sec_per_epoch": [1.0]},
    )
    for where in (tmp_path / "ck", tmp_path / "ck" / "checkpoint.npz"):
        for p, q in zip(load_params(where), params):
            np.testing.assert_array_equal(p, q)
    np.savez(tmp_path / "plain.npz", *params)
    assert len(load_params(tmp_path / "plain.npz")) == 8
    np.savez(tmp_path / "named.npz", w=params[0])
    with pytest.raises(ParamsError, match="holds arrays \\['w'\\]"):
        load_params(tmp_path / "named.npz")
    with pytest.raises(ParamsError, match="without checkpoint.npz"):
        load_params(tmp_path)
    with pytest.raises(ParamsError, match="does not exist"):
        load_params(tmp_path / "nope.npz")


def test_image_specs_and_random_inputs(tmp_path):
    with pytest.raises(InputError, match="not understood"):
        load_images("mnist:test:0-9", LENET)
    with pytest.raises(InputError, match="range 9-3 is empty"):
        load_images("fashion-mnist:test:9-3", LENET)
    with pytest.raises(InputError, match="alexnet takes inputs of shape \\(3, 227, 227\\).*--random"):
        load_images("fashion-mnist:test:0-9", multigpu.models.alexnet())
    r = random_inputs(LENET, 3, seed=1)
    assert r.x.shape == (3, 1, 28, 28) and r.labels is None
    with pytest.raises(InputError):
        random_inputs(LENET, 0)


def test_real_images_come_with_labels_and_class_names():
    from multigpu.data import find_fashion_mnist

    if find_fashion_mnist() is None:
        pytest.skip("real Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
    im = load_images("fashion-mnist:test:0-9", LENET)
    assert im.x.shape == (10, 1, 28, 28) and im.x.dtype == np.float32 and 0 <= im.x.min() and im.x.max() <= 1
    assert im.classes[int(im.labels[0])] == "Ankle boot"  # the first test image
    with pytest.raises(InputError, match="rows 0-9999"):
        load_images("fashion-mnist:test:9990-10010", LENET)


def test_the_documented_multi_host_cluster_file_loads(tmp_path):
    """The guide's multi-host example is a valid cluster whose devices can all run."""
    from pathlib import Path as P

    text = (P(__file__).resolve().parents[1] / "docs" / "guide" / "running-plans.md").read_text()
    block = text.split("## A cluster of several machines", 1)[1].split("```json", 1)[1].split("```", 1)[0]
    f = tmp_path / "lab-ray.json"
    f.write_text(block)
    cl = load_cluster(f)
    assert all(d.backend and d.resources for d in cl.devices)
    assert cl.devices[cl.index("desk-gpu")].device == "gpu:0"
    x = check_plan(multigpu.models.alexnet(), cl, ["pi1"] * 6 + ["desk-gpu"] * 13)
    assert x.workers == ["desk-gpu"] and x.driver == "pi1"
