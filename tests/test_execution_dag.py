"""Plans with branches: a graph model's stages as a DAG on Ray workers.

Without Ray: the messages a plan sends (an activation once per consuming device), the
prediction (the makespan), and the plans refused by name. On Ray (slow): outputs equal
to the unpartitioned model for plans that cut through residual blocks with the main
path and the shortcut on different workers, one framework per worker process; two
branches on two workers running at the same time; streaming in order.
"""

from __future__ import annotations

import numpy as np
import pytest

import multigpu
from multigpu.errors import PlanError
from multigpu.execution import Session, check_plan, predict, profile, run_partitioned
from multigpu.execution.plan import SINK, SOURCE, routes, worker_params
from multigpu.models import (
    INPUT,
    BatchNorm2d,
    Conv2d,
    Dense,
    Flatten,
    GlobalAvgPool2d,
    Model,
    Parallel,
    ReLU,
    basic_block,
)
from multigpu.partition import Cluster, DeviceSpec, LinkSpec, evaluate, graph_from_model

FRAMEWORKS = [b for b in ("torch", "paddle", "mxnet") if b in multigpu.available_backends()]


def tiny_resnet() -> Model:
    """A stem and two basic blocks (the second with a projected shortcut) on 3x8x8."""
    return Model(
        [
            Conv2d(8, 3, 1, 1, name="stem"),
            BatchNorm2d(name="bn"),
            ReLU(name="relu"),
            basic_block(8, 1, False, "b1"),
            basic_block(16, 2, True, "b2"),
            GlobalAvgPool2d(name="pool"),
            Flatten(name="flat"),
            Dense(10, name="fc"),
        ],
        (3, 8, 8),
        name="tiny_resnet",
    )


NET = tiny_resnet()
NAMES = [n for n, _ in NET.layers]
PARAMS = NET.init_params(0)
_rng = np.random.default_rng(1)
# Running statistics away from (0, 1), so a stage that ignored them would show.
STATE = [
    (_rng.normal(size=s) if i % 2 == 0 else _rng.uniform(0.5, 2.0, size=s)).astype(np.float32)
    for i, s in enumerate(NET.state_shapes)
]


def place(default: str, **prefixes: str) -> list[str]:
    """One device per layer: ``default``, or the device of the longest matching name prefix
    (``b1__conv`` stands for ``b1.conv``)."""
    out = []
    for name in NAMES:
        hits = [(len(p), d) for p, d in ((k.replace("__", "."), v) for k, v in prefixes.items()) if name.startswith(p)]
        out.append(max(hits)[1] if hits else default)
    return out


# The main path of b1 on "b", its identity shortcut stays on "a"; b2's projection
# shortcut on "c", its main path on "a", its join in the driver.
CUT = place("a", b1__conv="b", b1__bn="b", b1__relu1="b", b2__downsample="c", b2__add="driver")
# b2's input goes to "b" once, for two stages there: b2.conv1 and the projection.
TWICE = place("a", b2__conv1="b", b2__downsample="b")


def cluster(*backends: str) -> Cluster:
    workers = tuple(DeviceSpec(n, 1e9, 0.0, backend=b, threads=1) for n, b in zip("abc", backends))
    return Cluster(
        devices=(DeviceSpec("driver", 1e9, 0.0, backend="numpy"), *workers),
        source="driver",
        default_link=LinkSpec(1e8, 1e-3),
    )


def reference(model: Model, params, x: np.ndarray, state=None) -> np.ndarray:
    be = multigpu.backend("numpy")
    dev = multigpu.Device("cpu", 0)
    put = [be.from_numpy(p, dev) for p in params]
    st = None if state is None else [be.from_numpy(s, dev) for s in state]
    out = model.run(be, put, {INPUT: be.from_numpy(x, dev)}, state=st)[model.output]
    return be.to_numpy(out).reshape(len(x), -1)


# -- without Ray -------------------------------------------------------------------
def test_stages_of_a_cut_residual_block_form_a_dag_and_each_activation_goes_once_per_device():
    x = check_plan(NET, cluster("numpy", "numpy", "numpy"), CUT)
    assert not x.chain and x.workers == ["a", "b", "c"]
    assert [(s.device, s.span) for s in x.stages] == [
        ("a", "stem..relu"),
        ("b", "b1.conv1..b1.bn2"),
        ("a", "b1.add..b2.bn2"),
        ("c", "b2.downsample.0..b2.downsample.1"),
        ("driver", "b2.add"),
        ("a", "b2.relu2..fc"),
    ]
    rs, sends = routes(x)
    # b1's shortcut ('relu') stays on a for stage 3: no message carries it back.
    assert [(m.source, m.device, m.stage, m.names) for m in sends] == [
        (SOURCE, "a", 0, ("input",)),
        (0, "b", 1, ("relu",)),
        (1, "a", 2, ("b1.bn2",)),
        (2, "c", 3, ("b1.relu2",)),
        (2, "driver", 4, ("b2.bn2",)),
        (3, "driver", 4, ("b2.downsample.1",)),
        (4, "a", 5, ("b2.add",)),
        (5, "driver", SINK, ("fc",)),
    ]
    assert rs[2].feeds == ("relu", "b1.bn2") and rs[2].receives == (2,) and rs[2].sends == (3, 4)
    assert [r.last for r in rs] == [False, True, False, True, True, True]
    # Stage 3 computes c's input (b1.relu2) before b2's main path: it runs in two parts,
    # so the message leaves when b1.relu2 is done; the second part reads it from the store.
    assert [(pt.nodes[0], pt.nodes[-1], pt.feeds, pt.sends) for pt in rs[2].parts] == [
        ("b1.add", "b1.relu2", ("b1.bn2", "relu"), (3,)),
        ("b2.conv1", "b2.bn2", ("b1.relu2",), (4,)),
    ]
    assert sum(len(pt.nodes) for pt in rs[2].parts) == len(rs[2].nodes)
    # A stage whose only message carries its last layer's output stays one part.
    assert all(len(r.parts) == 1 and r.parts[0].nodes == r.nodes for i, r in enumerate(rs) if i != 2)
    # Every parameter of a stage's members goes to its device, and nothing else.
    got = {d: set(worker_params(x, d, PARAMS)) for d in ("a", "b", "c", "driver")}
    assert set().union(*got.values()) == set(range(len(PARAMS))) and got["driver"] == set()
    assert sum(map(len, got.values())) == len(PARAMS)


def test_a_tensor_two_stages_of_one_device_consume_travels_once():
    x = check_plan(NET, cluster("numpy", "numpy"), TWICE)
    rs, sends = routes(x)
    to_b = [m for m in sends if m.device == "b" and "b1.relu2" in m.names]
    assert len(to_b) == 1  # one transfer to b ...
    on_b = [r for r in rs if r.device == "b"]
    assert len(on_b) == 2 and all("b1.relu2" in r.feeds for r in on_b)  # ... for both stages there
    assert to_b[0].stage == on_b[0].index
    bd = evaluate(graph_from_model(NET), x.cluster, list(x.assignment))
    assert sum(t.producer == "b1.relu2" and t.between == ("a", "b") for t in bd.transfers) == 1


def test_the_prediction_of_a_graph_plan_is_its_makespan_per_message():
    x = check_plan(NET, cluster("numpy", "numpy", "numpy"), CUT)
    p = predict(x)
    bd = evaluate(graph_from_model(NET), x.cluster, list(x.assignment))
    assert p.end_to_end == pytest.approx(bd.makespan) and p.end_to_end < bd.time  # branches overlap
    assert p.bottleneck == pytest.approx(bd.bottleneck)
    assert len(p.hops) == len(routes(x)[1]) and len(p.stage_compute) == len(x.stages)
    assert sum(p.hops) == pytest.approx(sum(t.time for t in bd.transfers))  # every transfer in one message
    assert sum(p.stage_compute) == pytest.approx(bd.compute_time + bd.stage_time)


def test_plans_for_graph_models_are_refused_by_name():
    cl = cluster("numpy", "numpy")
    with pytest.raises(
        PlanError, match=f"the plan has {len(NAMES) - 1} entries but tiny_resnet has {len(NAMES)} layers"
    ):
        check_plan(NET, cl, CUT[:-1])
    pairs = [[n, "a"] for n in NAMES] + [["b1.add", "b"]]
    with pytest.raises(PlanError, match="pairs: assignment places layer 'b1.add' on two devices, 'a' and 'b'"):
        check_plan(NET, cl, pairs)
    with pytest.raises(PlanError, match="places no device for layer 'fc'"):
        check_plan(NET, cl, [[n, "a"] for n in NAMES[:-1]])
    with pytest.raises(PlanError, match="unknown layer 'nope'"):
        check_plan(NET, cl, [["nope", "a"]] + [[n, "a"] for n in NAMES[1:]])
    with pytest.raises(PlanError, match="'x' is not a device; devices are: driver, a, b"):
        check_plan(NET, cl, [[n, "x"] for n in NAMES])
    # Pairs in any order mean the plan in layer order.
    assert check_plan(NET, cl, [[n, d] for n, d in reversed(list(zip(NAMES, TWICE)))]).assignment == tuple(TWICE)
    with pytest.raises(PlanError, match="engine='compiled' runs chains.*use engine='tasks'"):
        run_partitioned(NET, PARAMS, ["a"] * len(NAMES), np.zeros((1, 3, 8, 8), np.float32), cl, engine="compiled")
    with pytest.raises(PlanError, match="state= was given but lenet has no BatchNorm"):
        run_partitioned("lenet", None, ["a"] * 10, np.zeros((1, 1, 28, 28), np.float32), cl, state=STATE)


def test_run_takes_the_batchnorm_statistics_of_a_checkpoint(tmp_path):
    from multigpu.errors import ParamsError
    from multigpu.execution.inputs import load_state
    from multigpu.training.checkpoint import save_checkpoint

    flat = np.concatenate([s.reshape(-1) for s in STATE])
    meta = {"config": {}, "epoch": 1, "rng": None, "test_acc": [], "train_loss": [], "sec_per_epoch": []}
    save_checkpoint(tmp_path / "ck", PARAMS, meta, {"bn": np.stack([flat, flat + 1])})
    got = load_state(tmp_path / "ck", NET)
    assert all(np.array_equal(a, b) for a, b in zip(got, STATE))  # the first replica's
    assert load_state(tmp_path / "ck" / "checkpoint.npz", NET) is not None
    np.savez(tmp_path / "p.npz", *PARAMS)
    assert load_state(tmp_path / "p.npz", NET) is None  # parameters only
    save_checkpoint(tmp_path / "other", PARAMS, meta, {"bn": np.zeros((1, 7), np.float32)})
    with pytest.raises(ParamsError, match="holds 7 BatchNorm statistics per replica but tiny_resnet has"):
        load_state(tmp_path / "other", NET)


# -- on Ray ------------------------------------------------------------------------
ray = pytest.importorskip("ray", reason="the executor needs Ray (pip install 'multigpu[cluster]')")


@pytest.fixture(scope="module")
def local_ray():
    import logging

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    yield
    if started:
        ray.shutdown()


def two_towers() -> Model:
    """Two towers of three 3x3 convolutions on the input, added: more work per tower than
    the few milliseconds between the driver's two submissions. The first tower (torch's,
    below) is 192 channels wide: at 64, oneDNN ran it in ~1.5 ms, before paddle's stage had
    started under load (CI at efaaad2: overlap in 2 items of 6); at 192 it takes ~12 ms and
    the two overlapped in 10 items of 10, twice, beside a busy loop on one core."""

    def tower(width: int) -> list:
        return [Conv2d(width, 3, 1, 1), ReLU(), Conv2d(width, 3, 1, 1), ReLU(), Conv2d(64, 3, 1, 1)]

    return Model(
        [
            Parallel([tower(192), tower(64)], join="add", join_name="join"),
            GlobalAvgPool2d(name="pool"),
            Flatten(name="flat"),
            Dense(10, name="fc"),
        ],
        (16, 32, 32),
        name="towers",
    )


@pytest.mark.slow
@pytest.mark.skipif(len(FRAMEWORKS) < 3, reason="needs torch, paddle and mxnet")
def test_cut_residual_blocks_on_mixed_frameworks_equal_the_unpartitioned_model(local_ray):
    x = np.random.default_rng(2).random((5, 3, 8, 8), dtype=np.float32)
    ref = reference(NET, PARAMS, x, STATE)
    towers = two_towers()
    tparams = towers.init_params(3)
    tx = np.random.default_rng(4).random((10, 16, 32, 32), dtype=np.float32)
    tnames = [n for n, _ in towers.layers]
    split = [
        "b" if n.startswith("conv2d") and int(n[6:]) > 3 or n.startswith("relu") and int(n[4:]) > 2 else "a"
        for n in tnames
    ]
    split[tnames.index("join") :] = ["driver"] * (len(tnames) - tnames.index("join"))
    with Session(cluster(*FRAMEWORKS)) as s:
        backends = {w.device: w.backend for w in s.workers.info.values()}
        assert backends == {"driver": "numpy", "a": "torch", "b": "paddle", "c": "mxnet"}
        cut = s.run(NET, PARAMS, CUT, x, state=STATE)
        twice = s.run(NET, PARAMS, TWICE, x, state=STATE)
        streamed = s.run(NET, PARAMS, CUT, np.concatenate([x] * 4), state=STATE, stream=True, warmup=0)
        both = s.run(towers, tparams, split, tx)
        # The profiler times a graph model's layers (prefixes of its topological order) and
        # the run is priced on what it measured.
        prof = profile(NET, session=s, repeats=3, warmup=1, link_repeats=3, cpu_items=10, progress=False)
        priced = s.run(NET, PARAMS, CUT, x, state=STATE, cluster=prof.cluster)
    for d in prof.cluster.devices:
        assert set(d.measured("tiny_resnet(batch=1)") or {}) == set(NAMES), d.name
    assert sorted(priced.prediction.measured) == ["a", "b", "c", "driver"]
    np.testing.assert_allclose(priced.outputs, ref, atol=1e-5, rtol=0)
    for r in (cut, twice):
        np.testing.assert_allclose(r.outputs, ref, atol=1e-5, rtol=0)
        n_msgs = len(routes(check_plan(NET, r_cluster(), r.assignment))[1])
        assert r.stage_times.shape == (5, len(r.stages)) and r.hop_times.shape == (5, n_msgs)
        assert (r.stage_times > 0).all() and (r.hop_times > 0).all()
        # End to end holds the critical path: input hop, the first stage, the output hop.
        assert (r.end_to_end > r.hop_times[:, 0] + r.stage_times[:, 0] + r.hop_times[:, -1]).all()
        assert r.prediction is not None and r.prediction.end_to_end > 0
        kinds = [row["kind"] for row in r.compare_rows()]
        assert kinds.count("stage") == len(r.stages) and kinds[-1] == "end_to_end"
        assert "hop driver -> a (input->s1: input)" in r.format_timing()
    assert {w["device"] for w in cut.workers} == {"driver", "a", "b", "c"}
    assert cut.param_bytes == sum(p.nbytes for p in PARAMS)
    np.testing.assert_allclose(streamed.outputs, np.concatenate([ref] * 4), atol=1e-5, rtol=0)  # in order
    assert streamed.items_per_second and [row["kind"] for row in streamed.compare_rows()][-1] == "stream"
    np.testing.assert_allclose(both.outputs, reference(towers, tparams, tx), atol=1e-5, rtol=0)
    # The towers ran at the same time (the driver submits both at once, each takes the
    # input as soon as it is there): their intervals intersect in most items.
    assert {both.stages[0].device, both.stages[1].device} == {"a", "b"}
    assert both.overlapped(0, 1) >= 0.5, (both.stage_starts, both.stage_times)
    assert cut.overlapped(0, 1) == 0.0  # stage 2 waits for stage 1's output


def lopsided() -> Model:
    """A cheap 1x1 convolution beside a tower of two 3x3 ones (~10 ms on one thread), added."""
    heavy = [Conv2d(64, 3, 1, 1), ReLU(), Conv2d(64, 3, 1, 1)]
    return Model(
        [
            Parallel([[Conv2d(64, 1, 1, 0)], heavy], join="add", join_name="join"),
            GlobalAvgPool2d(name="pool"),
            Flatten(name="flat"),
            Dense(10, name="fc"),
        ],
        (16, 32, 32),
        name="lopsided",
    )


@pytest.mark.slow
def test_a_worker_with_two_stages_of_an_item_takes_the_next_items_first_stage_while_the_join_waits(local_ray):
    """Streamed, "a" holds the cheap branch (stage 0) and the join (stage 2), "b" the heavy
    branch (stage 1). Run in submission order, a's stage 0 of item k+1 could not start
    before its join of item k, which waits for b: the items would pass one at a time. The
    workers run their calls out of order, and a's later stage of an item still runs after
    its earlier one (it reads what that kept): outputs as unpartitioned, in order."""
    model = lopsided()
    params = model.init_params(5)
    x = np.random.default_rng(6).random((8, 16, 32, 32), dtype=np.float32)
    plan = ["a", "b", "b", "b", "a", "a", "a", "a"]
    with Session(cluster("numpy", "numpy")) as s:
        r = s.run(model, params, plan, x, stream=True, warmup=1)
    np.testing.assert_allclose(r.outputs, reference(model, params, x), atol=1e-5, rtol=0)
    assert [(st.device, st.first) for st in r.stages] == [("a", "conv2d1"), ("b", "conv2d2"), ("a", "join")]
    starts = r.stage_starts + r.sent_at[:, None]  # one timeline: seconds after the first item's send
    ends = starts + r.stage_times
    ahead = np.mean(starts[1:, 0] < starts[:-1, 2])  # item k+1's first stage began before item k's join
    assert ahead >= 0.5, (starts, ends)
    assert (starts[:, 2] >= ends[:, 0]).all()  # within an item, a's join after its first stage


def early() -> Model:
    """A stem whose output feeds a heavy tower (three 192-channel 3x3 convolutions, ~12 ms
    on one thread) and a light one, added."""
    heavy = [Conv2d(192, 3, 1, 1), ReLU(), Conv2d(192, 3, 1, 1), ReLU(), Conv2d(16, 3, 1, 1)]
    return Model(
        [
            Conv2d(16, 3, 1, 1, name="stem"),
            Parallel([heavy, [Conv2d(16, 1, 1, 0), ReLU()]], join="add", join_name="join"),
            GlobalAvgPool2d(name="pool"),
            Flatten(name="flat"),
            Dense(10, name="fc"),
        ],
        (16, 32, 32),
        name="early",
    )


@pytest.mark.slow
def test_a_message_leaves_when_its_layer_is_done_not_when_its_stage_is(local_ray):
    """ "a" runs the stem and the heavy tower as one stage; "b" the light tower on the
    stem's output. The stem's output leaves after the stem (the stage's first part), so
    b's stage runs while a's heavy tower does, as the makespan models it."""
    model = early()
    params = model.init_params(7)
    x = np.random.default_rng(8).random((8, 16, 32, 32), dtype=np.float32)
    names = [n for n, _ in model.layers]
    plan = ["a"] * 6 + ["b"] * 2 + ["driver"] * (len(names) - 8)
    assert names[6:8] == ["conv2d4", "relu3"] and names[8] == "join"
    xplan = check_plan(model, cluster("numpy", "numpy"), plan)
    rs, sends = routes(xplan)
    assert [len(r.parts) for r in rs] == [2, 1, 1] and rs[0].parts[0].nodes == ("stem",)
    with Session(cluster("numpy", "numpy")) as s:
        r = s.run(model, params, plan, x, warmup=1)
    np.testing.assert_allclose(r.outputs, reference(model, params, x), atol=1e-5, rtol=0)
    assert [(st.device, st.first) for st in r.stages] == [("a", "stem"), ("b", "conv2d4"), ("driver", "join")]
    assert r.overlapped(0, 1) >= 0.5, (r.stage_starts, r.stage_times)
    # b's stage began before a's ended, and the stem's hop is timed from the stem's end.
    to_b = next(h for h, m in enumerate(sends) if m.device == "b")
    assert (r.hop_times[:, to_b] > 0).all()
    assert np.mean(r.stage_starts[:, 1] < r.stage_starts[:, 0] + r.stage_times[:, 0]) >= 0.5
    # The prediction (the makespan) overlaps them too: less than the sum of the parts.
    bd = evaluate(graph_from_model(model), xplan.cluster, plan)
    assert bd.makespan < bd.time


def r_cluster() -> Cluster:
    return cluster(*FRAMEWORKS)
