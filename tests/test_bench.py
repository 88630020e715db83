"""The benchmark harness: timing helpers, the runner's files, and ``multigpu bench --quick``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

import multigpu
from multigpu.benchmarks import harness
from multigpu.benchmarks.harness import BENCHMARKS, Options, Result, Table, interleaved, ratio, summary
from multigpu.errors import BenchmarkError

ROOT = Path(__file__).resolve().parents[1]


def test_summary_gives_median_quartiles_and_range():
    s = summary([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s["median"], s["min"], s["max"], s["q1"], s["q3"], s["n"]) == (3.0, 1.0, 5.0, 2.0, 4.0, 5)
    assert summary([7.0])["q1"] == summary([7.0])["q3"] == 7.0
    with pytest.raises(ValueError):
        summary([])


def test_interleaved_alternates_cases_after_the_warmup_and_syncs_each_call():
    order: list[str] = []
    syncs: list[str] = []
    cases = {name: (lambda name: lambda: order.append(name))(name) for name in "abc"}  # noqa: B023 (bound by an argument or called at once)
    samples = interleaved(cases, repeat=3, warmup=2, sync=lambda: syncs.append(order[-1]))
    assert order == list("abc") * 5
    assert syncs == order  # a sync after every call, warm-up included
    assert {k: len(v) for k, v in samples.items()} == {"a": 3, "b": 3, "c": 3}
    assert all(t >= 0 for v in samples.values() for t in v)
    with pytest.raises(ValueError):
        interleaved(cases, repeat=0)
    order.clear()
    interleaved(cases, repeat=3, warmup=1, reverse_odd_rounds=True)
    assert "".join(order) == "abc" + "abc" + "cba" + "abc"


def test_ratio_pairs_rounds_so_a_slow_round_cancels():
    fast, slow = [1.0, 10.0, 1.0], [2.0, 20.0, 2.0]  # round 2 hit both cases alike
    r = ratio(fast, slow)
    assert r["median"] == r["min"] == r["max"] == 0.5
    assert r["of_medians"] == 0.5
    with pytest.raises(ValueError):
        ratio([1.0], [1.0, 2.0])


def test_every_benchmark_module_has_title_quick_flag_and_run():
    import importlib

    assert {"step", "allreduce", "scaling", "planner", "accuracy"} <= set(BENCHMARKS)
    for name, module in BENCHMARKS.items():
        mod = importlib.import_module(f"multigpu.benchmarks.{module}")
        assert isinstance(mod.TITLE, str) and mod.TITLE, name
        assert isinstance(mod.IN_QUICK, bool), name
        assert callable(mod.run), name
    quick = {n for n, m in BENCHMARKS.items() if importlib.import_module(f"multigpu.benchmarks.{m}").IN_QUICK}
    assert {"step", "allreduce", "scaling", "planner"} <= quick and "accuracy" not in quick


def _fake(name: str, fail: bool = False) -> types.ModuleType:
    mod = types.ModuleType(f"multigpu.benchmarks._{name}")
    mod.TITLE, mod.IN_QUICK = f"fake {name}", True

    def run(opts: Options) -> Result:
        if fail:
            raise RuntimeError("boom")
        return Result(
            name,
            mod.TITLE,
            [Table("t", ["a", "b"], [[1, 2.5]], note="n")],
            {"x": [1.0, float("nan")]},
            settings={"quick": opts.quick},
            notes=["a note"],
            plot=lambda fig: fig.subplots().plot([1, 2], [3, 4]),
        )

    mod.run = run
    return mod


def test_runner_writes_md_json_png_and_records_machine_and_load(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "multigpu.benchmarks._ok", _fake("ok"))
    monkeypatch.setitem(BENCHMARKS, "ok", "_ok")
    written = harness.run_benchmarks(
        ["ok"], Options(quick=True, out=tmp_path, progress=False, threads=1), echo=lambda s: None
    )
    assert sorted(p.name for p in written) == ["ok.json", "ok.md", "ok.png"]
    md = (tmp_path / "ok.md").read_text()
    assert "| a | b |" in md and "| 1 | 2.5 |" in md and "- a note" in md and "Load average" in md
    assert re.search(r"Run on \d{4}-\d\d-\d\d \d\d:\d\d UTC\. Machine: ", md)  # the page says when it ran
    assert "![" in md and "](ok.png)" in md  # and shows its plot
    js = json.loads((tmp_path / "ok.json").read_text())
    assert js["data"] == {"x": [1.0, None]}  # NaN is not JSON; it becomes null
    assert js["settings"] == {"quick": True}
    m = js["machine"]
    assert m["cores"] >= 1 and "versions" in m and len(m["loadavg"]) == 3 and m["date"].endswith(" UTC")
    assert m["thread_env"]["OMP_NUM_THREADS"] == "1"  # --threads reaches the environment of the run
    assert js["load"]["wall_s"] > 0 and js["load"]["own_cpu_s"] >= 0
    assert (tmp_path / "ok.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_failing_benchmark_does_not_hide_the_others(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "multigpu.benchmarks._bad", _fake("bad", fail=True))
    monkeypatch.setitem(sys.modules, "multigpu.benchmarks._ok", _fake("ok"))
    monkeypatch.setitem(BENCHMARKS, "bad", "_bad")
    monkeypatch.setitem(BENCHMARKS, "ok", "_ok")
    with pytest.raises(BenchmarkError, match="bad: RuntimeError: boom"):
        harness.run_benchmarks(["bad", "ok"], Options(out=tmp_path, progress=False), echo=lambda s: None)
    assert (tmp_path / "ok.json").exists() and not (tmp_path / "bad.json").exists()


def test_isolated_runs_in_another_process_and_reraises():
    import os

    assert harness.isolated("os:getpid") != os.getpid()
    with pytest.raises(ZeroDivisionError):
        harness.isolated("operator:truediv", 1, 0)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "multigpu", "bench", *args], capture_output=True, text=True, cwd=ROOT, timeout=600
    )


def test_bench_cli_rejects_unknown_names_and_backends(tmp_path):
    r = _cli("nosuch", "--out", str(tmp_path))
    assert r.returncode != 0 and "unknown benchmark" in r.stderr and "step" in r.stderr
    r = _cli("planner", "--backends", "numpy", "--out", str(tmp_path))
    assert r.returncode != 0 and "--backends" in r.stderr
    r = _cli("planner", "--threads", "0", "--out", str(tmp_path))
    assert r.returncode != 0 and "--threads" in r.stderr
    r = _cli("--list")
    assert r.returncode == 0 and all(name in r.stdout for name in BENCHMARKS)
    r = _cli("planner", "--cases", "resnet51", "--out", str(tmp_path))
    assert r.returncode != 0 and "resnet51" in r.stderr and "resnet50" in r.stderr
    r = _cli("planner", "step", "--cases", "graphs", "--out", str(tmp_path))
    assert r.returncode != 0 and "--cases" in r.stderr


def test_planner_cases_select_parts_graphs_and_clusters():
    from multigpu.benchmarks.planner import GRAPH_CLUSTERS, GRAPHS, PARTS, selection

    assert selection(None) == (set(PARTS), GRAPHS, GRAPH_CLUSTERS)
    assert selection(("resnet50", "inception", "gpu16")) == ({"graphs"}, ("resnet50", "inception"), ("gpu16",))
    assert selection(("dp", "lab")) == ({"dp", "graphs"}, GRAPHS, ("lab",))
    assert selection(("stress",)) == ({"stress"}, GRAPHS, GRAPH_CLUSTERS)


def test_planner_plot_has_a_panel_for_the_published_instances_alone():
    # ``--cases published`` runs no other part: its page still gets a plot (time to proof, ours
    # beside their IP's, per instance).
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from multigpu.benchmarks.planner import _plot

    rows = [
        {"instance": "BERT-24", "ours": {"proof_s": 6.7}, "ip": {"seconds": 7.3}},
        {"instance": "BERT-L3", "ours": {"proof_s": 1.6}, "ip": {"seconds": 1.4}},
    ]
    fig = plt.figure()
    _plot(fig, [], [], [], [], rows)
    (ax,) = fig.axes
    assert ax.get_title() == "published instances, throughput"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["BERT-24", "BERT-L3"]
    heights = sorted(round(p.get_height(), 6) for p in ax.patches)
    assert heights == [1.4, 1.6, 6.7, 7.3]
    plt.close(fig)


def test_planner_graph_case_reports_the_default_gap_and_the_exact_proof(tmp_path):
    """``bench planner --quick --cases resnet18,lab``: one graph row, timed to the 0.1% gap and to the
    proof, and each objective under a short time limit."""
    from multigpu.benchmarks import planner

    r = planner.run(Options(out=tmp_path, progress=False, quick=True, cases=("resnet18", "lab")))
    assert [t.title.split(" ")[0] for t in r.tables] == ["Graphs", "Graphs"]
    (row,) = r.data["graphs"]
    assert (row["graph"], row["cluster"], row["n"], row["k"]) == ("resnet18", "lab", 69, 5)
    assert row["within"]["asked"] == 0.001 and row["exact"]["asked"] == 0.0
    assert row["within"]["proven"] and row["within"]["gap"] <= 0.001
    assert row["exact"]["proven"] and row["exact"]["gap"] <= 1e-9
    # The plan within 0.1% costs at most 0.1% more than the proven optimum.
    assert row["within"]["cost"] <= row["exact"]["cost"] * (1 + 0.001)
    columns = r.tables[0].columns
    assert "memory-bound, to a 0.1% gap" in columns and "memory-bound, exact proof" in columns
    # --quick: each objective under the shortest limit only, each returning a plan with its gap.
    short = row["short_limits"]
    assert [(x["objective"], x["limit"]) for x in short] == [(o, planner.SHORT_LIMITS_S[0]) for o in planner.OBJECTIVES]
    assert all(x["cost"] is not None and 0 <= x["gap"] <= 1 for x in short)
    assert [c[2] for c in r.tables[1].rows] == list(planner.OBJECTIVES)


@pytest.mark.slow
def test_bench_quick_writes_every_file_and_each_parses(tmp_path):
    """What CI runs: ``multigpu bench --quick``; every quick benchmark's md, json and png."""
    import importlib

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image

    t0 = time.perf_counter()
    r = _cli("--quick", "--quiet", "--out", str(tmp_path))
    seconds = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    quick = [n for n, m in BENCHMARKS.items() if importlib.import_module(f"multigpu.benchmarks.{m}").IN_QUICK]
    assert {"step", "allreduce", "scaling", "planner"} <= set(quick)
    for name in quick:
        md = (tmp_path / f"{name}.md").read_text()
        assert md.startswith("## ") and "|---|" in md and "Load average" in md, name
        js = json.loads((tmp_path / f"{name}.json").read_text())
        assert js["name"] == name and js["tables"] and all(t["rows"] for t in js["tables"]), name
        assert js["machine"]["cores"] >= 1 and js["data"], name
        img = matplotlib.image.imread(tmp_path / f"{name}.png")
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100, name
    assert not (tmp_path / "accuracy.json").exists()  # long: not in --quick
    assert "FAILED" not in r.stdout
    print(f"multigpu bench --quick took {seconds:.0f} s")


def test_the_run_counts_its_own_processes_wherever_they_run():
    """A child that burns CPU and is never waited for by this process (a daemon, as Ray's
    are) is this run's load, not other load."""
    import subprocess
    import sys
    import time

    from multigpu.lab.accounting import CpuAccount

    with CpuAccount() as account:
        code = "import os,time\nif os.fork(): os._exit(0)\nt=time.process_time()\nwhile time.process_time()-t<0.6: pass"
        subprocess.run([sys.executable, "-c", code], check=True)  # the grandchild outlives its parent
        time.sleep(1.5)
        seconds = account.seconds()
    assert seconds >= 0.4, (account.method, seconds)


@pytest.mark.slow
@pytest.mark.skipif("torch" not in __import__("multigpu").available_backends(), reason="needs torch")
def test_resnet_step_measures_ours_against_the_frameworks_own_loop_small():
    """``resnet_step`` end to end on a 16x16 ResNet-18 (the real one is not in --quick: seconds a step)."""
    from multigpu.benchmarks import resnet_step

    r = resnet_step.run(Options(quick=True, progress=False, backends=("torch",)), size=16, batch=4)
    (row,) = r.tables[0].rows
    assert row[0] == "torch" and row[2] == "nn.Module" and "(differs)" not in row[-1]
    assert r.data["torch"]["agreement"]["nn.Module"] <= resnet_step.AGREE_TOL
    assert "cProfile of ours on torch" in " ".join(r.notes)
    assert not resnet_step.IN_QUICK and "resnet_step" in BENCHMARKS and "resnet_accuracy" in BENCHMARKS


def test_merged_measurements_keep_each_plan_with_its_own_runs_and_load():
    from multigpu.benchmarks.plans import Measured, merged

    a = Measured(
        profiles=["p-lenet"],
        plans=[{"label": "a0"}, {"label": "a1"}],
        runs={0: ["ra0"], 1: ["ra1"]},
        loads=[(0.1, 0.2)],
        others={1: [0.3]},
        params={"lenet": "w"},
        run_profiles={0: ["p-lenet"], 1: ["p-lenet"]},
    )
    b = Measured(
        profiles=["p-alexnet"],
        plans=[{"label": "b0"}],
        runs={0: ["rb0"]},
        loads=[(0.4, 0.5)],
        others={0: [0.6]},
        params={"alexnet": "v"},
        run_profiles={0: ["p-alexnet"]},
    )
    m = merged([a, b])
    assert [p["label"] for p in m.plans] == ["a0", "a1", "b0"]
    assert m.runs == {0: ["ra0"], 1: ["ra1"], 2: ["rb0"]} and m.others == {1: [0.3], 2: [0.6]}
    # The AlexNet plan's diagnostics are priced on AlexNet's profile, not on every profile of the merge.
    assert m.run_profiles == {0: ["p-lenet"], 1: ["p-lenet"], 2: ["p-alexnet"]}
    assert m.profiles == ["p-lenet", "p-alexnet"] and m.loads == [(0.1, 0.2), (0.4, 0.5)]
    assert m.params == {"lenet": "w", "alexnet": "v"}


@pytest.mark.slow  # about 5 s: the planner's runners-up on two objectives
def test_the_lab_runs_every_candidate_of_lenets_two_settings_with_its_hand_made_plans():
    """``bench plans --lab``'s plans, made on the lab's file (the run makes them on its profile):
    per setting at least 8 candidates, the planner's choice first, every lab host a single-host
    plan, each hand-made plan of the setting's kind among them, streamed exactly for throughput."""
    from multigpu.benchmarks import plans_lab
    from multigpu.benchmarks.plans import MIN_CANDIDATES

    cluster = multigpu.partition.load_cluster("lab")
    plans = plans_lab.lenet_candidates(cluster)
    settings = list(dict.fromkeys(p["setting"] for p in plans))
    assert settings == ["lenet, latency", "lenet, throughput"]
    hand = plans_lab.lenet_plans()
    for objective in ("latency", "throughput"):
        cands = [p for p in plans if p["objective"] == objective]
        assert len(cands) >= MIN_CANDIDATES and "planner" in cands[0]["roles"] and "left_out" in cands[0]
        assert all(p["stream"] == (objective == "throughput") and len(p["plan"]) == 10 for p in cands)
        assert {p["plan"][0] for p in cands if "single device" in p["roles"]} == set(cluster.names)
        mine = [h["plan"] for h in hand if bool(h.get("stream")) == (objective == "throughput")]
        assert mine and all(any(p["plan"] == h for p in cands) for h in mine)


@pytest.mark.parametrize("framework", [b for b in ("torch", "paddle", "mxnet") if b in multigpu.available_backends()])
def test_the_native_gpts_have_our_gpts_architecture_and_step(framework):
    """``transformer_step`` compares the same architecture: each framework's own GPT holds as many
    parameters as ours, and one of its steps runs."""
    from multigpu.benchmarks import transformer_step as t
    from multigpu.models import gpt

    ours = gpt(t.VOCAB, t.HIDDEN, t.LAYERS, t.HEADS, max_positions=t.SEQ, seq_len=t.SEQ)
    step = t.NATIVE[framework](False)
    step()
    assert step.params == ours.num_params()
    assert "transformer_step" in BENCHMARKS and not t.IN_QUICK
