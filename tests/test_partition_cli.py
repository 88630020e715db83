"""``multigpu partition``: report, --json keys, exit codes and one-line errors."""

from __future__ import annotations

import argparse
import json

import pytest

from multigpu.cli import main
from multigpu.cli.commands import partition as cmd
from multigpu.partition import GraphError, autopartition, load_cluster, load_graph


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="multigpu")
    sub = p.add_subparsers(dest="command")
    cmd.register(sub)
    return p


def run(argv: list[str]) -> int:
    """Run through the real CLI entry point, which maps exceptions to exit codes."""
    return main(["partition", *argv])


def test_help(capsys):
    with pytest.raises(SystemExit) as exc:
        parser().parse_args(["partition", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--model", "--cluster", "--wt", "--we", "--objective", "--energy-budget", "--json"):
        assert flag in out
    assert "partition" in parser().format_help()


def test_json_output_matches_the_api(capsys):
    assert run(["--model", "alexnet", "--cluster", "lab", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"assignment", "time", "energy", "cost"} <= set(data)
    plan = autopartition(load_graph("alexnet"), load_cluster("lab"))
    assert data["assignment"] == plan.assignment and len(data["assignment"]) == 19
    assert data["time"] == plan.time and data["energy"] == plan.energy and data["cost"] == plan.cost
    assert set(data["baselines"]) == {"single", "uniform", "balanced", "greedy"}
    assert all(b["cost"] >= data["cost"] * (1 - 1e-12) for b in data["baselines"].values() if b)


def test_report_has_every_section(capsys):
    assert run(["--model", "alexnet", "--cluster", "lab", "--we", "0.1"]) == 0
    out = capsys.readouterr().out
    for words in (
        "Per layer",
        "Per device",
        "memory / limit",
        "baselines",
        "best single device",
        "uniform contiguous split",
        "FLOPs-balanced split",
        "greedy",
        "conv1",
        "fc8",
        "pi1",
    ):
        assert words in out, words


def test_throughput_and_constraint_flags(capsys, tmp_path):
    g = tmp_path / "g.json"
    g.write_text(
        json.dumps(
            {
                "input_bytes": 1000,
                "layers": [
                    {"name": f"l{i}", "flops": 1e9, "param_bytes": 1000, "output_bytes": 1000} for i in range(4)
                ],
            }
        )
    )
    assert (
        run(
            [
                "--model",
                str(g),
                "--cluster",
                "gpu-box",
                "--objective",
                "throughput",
                "--json",
                "--pin",
                "l0=gpu1",
                "--exclude",
                "gpu3",
                "--busy-limit",
                "gpu2=1",
                "--ship-params",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["objective"] == "throughput" and data["assignment"][0] == "gpu1"
    assert "gpu3" not in data["assignment"]


@pytest.mark.parametrize(
    "argv,code,words",
    [
        (["--model", "alexnet", "--cluster", "nowhere.json"], 2, ["no cluster file 'nowhere.json'"]),
        (
            ["--model", "vgg", "--cluster", "lab"],
            2,
            ["no graph file 'vgg'", "alexnet, bert, googlenet, gpt, lenet, minilm"],
        ),
        (["--model", "alexnet", "--cluster", "lab", "--wt", "-1"], 2, ["wt=-1.0"]),
        (["--model", "alexnet", "--cluster", "lab", "--pin", "conv1"], 2, ["--pin 'conv1' must look like NAME=DEVICE"]),
        (["--model", "alexnet", "--cluster", "lab", "--pin", "conv1=tpu"], 2, ["'tpu' is not a device"]),
        (
            ["--model", "alexnet", "--cluster", "lab", "--pin", "conv1=pi1", "--pin", "conv1=pi2"],
            2,
            ["--pin names 'conv1' twice (conv1=pi1 and conv1=pi2)"],
        ),
        (
            ["--model", "alexnet", "--cluster", "lab", "--busy-limit", "pi1=1", "--busy-limit", "pi1=2"],
            2,
            ["--busy-limit names 'pi1' twice"],
        ),
        (["--model", "alexnet", "--cluster", "lab", "--busy-limit", "pi1=soon"], 2, ["'soon' is not a number"]),
        (["--model", "alexnet", "--cluster", "lab", "--energy-budget", "0.001"], 1, ["infeasible (energy budget)"]),
        (
            [
                "--model",
                "alexnet",
                "--cluster",
                "lab",
                "--exclude",
                "desk-cpu",
                "--exclude",
                "desk-gpu",
                "--exclude",
                "imac",
                "--batch-size",
                "512",
            ],
            1,
            ["infeasible (memory)", "layer 'conv1'", "--ignore-memory"],
        ),
    ],
)
def test_errors_are_one_line_with_exit_code(capsys, argv, code, words):
    assert run(argv) == code
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert err.startswith("multigpu partition: error: ") and "\n" not in err
    for w in words:
        assert w in err, (w, err)


@pytest.mark.parametrize(
    "text,words",
    [
        (
            '{"input_bytes": 10, "layers": [{"name": "a", "flops": -3, "param_bytes": 0, "output_bytes": 1}]}',
            ["flops=-3"],
        ),
        ('{"input_bytes": 10, "layers": []}', ['"layers" is empty']),
        ('{"input_bytes": 10, "layers": [', ["malformed JSON in graph file"]),
    ],
)
def test_bad_graph_file_is_a_graph_error_with_exit_code_2(capsys, tmp_path, text, words):
    """A graph-file mistake raises GraphError (a ClusterError, as before) and exits 2 with one line."""
    p = tmp_path / "g.json"
    p.write_text(text)
    with pytest.raises(GraphError):
        load_graph(p)
    assert run(["--model", str(p), "--cluster", "lab"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("multigpu partition: error: ") and "\n" not in err
    for w in words:
        assert w in err, (w, err)


def test_bad_cluster_file_exit_code(capsys, tmp_path):
    p = tmp_path / "c.json"
    p.write_text('{"devices": [{"name": "a", "flops": 0, "power": 1}], "source": "a"}')
    assert run(["--model", "lenet", "--cluster", str(p)]) == 2
    assert "device 'a': flops=0 must be greater than 0" in capsys.readouterr().err


def test_a_graph_with_branches_reports_its_stages_as_a_graph_and_plots(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    cluster = load_cluster("lab").to_dict()
    for d in cluster["devices"]:
        d["memory"] = 22e6  # about 40% of ResNet-18's parameters: the plan must spread them
    (tmp_path / "small.json").write_text(json.dumps(cluster))
    png = tmp_path / "plan.png"
    argv = ["--model", "resnet18", "--cluster", str(tmp_path / "small.json"), "--no-baselines"]
    assert run([*argv, "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "Stages (a DAG" in out and "<- waits for" in out and "Transfers (each activation once" in out
    img = matplotlib.image.imread(png)
    assert img.ndim == 3 and img.shape[1] > 800
    assert run([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["stages"]) >= 3 and all(t < i for i, s in enumerate(data["stages"]) for t in s["after"])
    assert sum(len(s["members"]) for s in data["stages"]) == 69
    assert {t["producer"] for t in data["transfers"]} and data["makespan"] <= data["time"] + 1e-12
    assert run([*argv, "--plot", str(tmp_path / "no" / "plan.png")]) == 2
    assert "its folder does not exist" in capsys.readouterr().err


def test_makespan_objective_and_time_limit_flags(capsys, tmp_path):
    g = tmp_path / "towers.json"
    g.write_text(
        json.dumps(
            {
                "input_bytes": 1e6,
                "layers": [
                    {"name": "stem", "flops": 1e9, "param_bytes": 0, "output_bytes": 1e6},
                    {"name": "a", "flops": 1e12, "param_bytes": 0, "output_bytes": 1e6, "inputs": ["stem"]},
                    {"name": "b", "flops": 1e12, "param_bytes": 0, "output_bytes": 1e6, "inputs": ["stem"]},
                    {"name": "cat", "flops": 0, "param_bytes": 0, "output_bytes": 2e6, "inputs": ["a", "b"]},
                ],
            }
        )
    )
    assert (
        run(
            [
                "--model",
                str(g),
                "--cluster",
                "gpu-box",
                "--objective",
                "makespan",
                "--time-limit",
                "60",
                "--json",
                "--no-baselines",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["objective"] == "makespan" and data["solver"] == "milp"
    assert data["assignment"][1] != data["assignment"][2]  # the towers run at once on two GPUs
    assert data["makespan"] < data["time"]
    assert run(["--model", str(g), "--cluster", "gpu-box", "--objective", "makespan", "--ship-params"]) == 2
    assert "ship_params is priced by the latency objective" in capsys.readouterr().err
