"""One exit-code scheme for every command (0 ok, 1 failure, 2 bad input, 130 interrupted),
one-line errors, and every option and output path checked before data loads."""

from __future__ import annotations

import importlib
import inspect
import json

import pytest
from conftest import FRAMEWORKS
from idx_files import write_learnable_set

import multigpu
import multigpu.errors
import multigpu.partition.exceptions
from multigpu.cli import COMMANDS, EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_INTERRUPTED, exit_code, main
from multigpu.contract import registry
from multigpu.errors import AdapterError, SolverError
from multigpu.training.checkpoint import FILENAME


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_learnable_set(tmp_path_factory.mktemp("fm"), n_train=128, n_test=32)


def _train(data_dir, *extra):
    return [
        "train",
        "--backend",
        "numpy",
        "--devices",
        "cpu:2",
        "--epochs",
        "1",
        "--batch-size",
        "64",
        "--data-dir",
        str(data_dir),
        "--no-verify-data",
        "--quiet",
        *extra,
    ]


def run(capsys, argv):
    """Run the CLI in-process; return (exit code, stdout, stderr)."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def _one_error_line(err: str, command: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith(f"multigpu {command}: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# -- every command, every outcome ------------------------------------------------------

CASES = [
    # (id, argv, code, words in the one error line)
    ("check ok", ["check", "--steps", "1", "--backends", "numpy"], 0, None),
    ("check bad --steps 0", ["check", "--steps", "0"], 2, "steps=0 must be a positive integer"),
    ("check bad --tol", ["check", "--tol", "-1"], 2, "--tol -1.0"),
    ("check bad backend", ["check", "--backends", "jax", "--steps", "1"], 2, "unknown backend 'jax'"),
    ("check bad --json", ["check", "--out", "/nonexistent-dir/c.json"], 2, "--out /nonexistent-dir/c.json"),
    ("partition ok", ["partition", "--model", "lenet", "--cluster", "lab", "--json"], 0, None),
    (
        "partition infeasible",
        ["partition", "--model", "alexnet", "--cluster", "lab", "--energy-budget", "0.001"],
        1,
        "infeasible (energy budget)",
    ),
    ("partition bad", ["partition", "--model", "vgg", "--cluster", "lab"], 2, "no graph file 'vgg'"),
    (
        "partition repeated pin",
        ["partition", "--model", "alexnet", "--cluster", "lab", "--pin", "conv1=pi1", "--pin", "conv1=pi2"],
        2,
        "--pin names 'conv1' twice",
    ),
    ("bench list", ["bench", "--list"], 0, None),
    ("bench bad name", ["bench", "nosuch"], 2, "unknown benchmark(s) ['nosuch']"),
]


@pytest.mark.parametrize("argv, code, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_exit_codes(capsys, argv, code, words):
    got, _, err = run(capsys, argv)
    assert got == code, err
    if words is not None:
        assert words in _one_error_line(err, argv[0])


def test_check_refuses_bad_counts_before_any_output(capsys):
    code, out, err = run(capsys, ["check", "--batch-size", "0"])
    assert code == EXIT_BAD_INPUT and out == "" and "--batch-size=0 must be a positive integer" in err


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_train_exit_codes(capsys, data_dir, tmp_path):
    assert run(capsys, _train(data_dir))[0] == 0
    code, out, err = run(capsys, [*_train(data_dir, "--lr", "1e9"), "--epochs", "3"])  # a run-time failure
    assert code == EXIT_FAILURE and "the loss is nan at epoch 2, step 1" in _one_error_line(err, "train")
    code, out, err = run(capsys, _train(data_dir, "--lr", "nan"))  # the issue's bare ValueError
    assert code == EXIT_BAD_INPUT and "lr=nan must be a finite number" in _one_error_line(err, "train")
    code, _, err = run(capsys, _train(tmp_path / "no-such-folder"))
    assert code == EXIT_BAD_INPUT and "no-such-folder does not exist" in _one_error_line(err, "train")


def test_train_refuses_fashion_mnist_look_alikes(capsys, data_dir):
    argv = [a for a in _train(data_dir) if a != "--no-verify-data"]
    code, _, err = run(capsys, argv)
    assert code == EXIT_BAD_INPUT and "is not Fashion-MNIST's" in _one_error_line(err, "train")


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--out", "/nonexistent-dir/out.json"], "--out /nonexistent-dir/out.json: the folder"),
        (["--plot", "/nonexistent-dir/acc.png"], "plot /nonexistent-dir/acc.png: the folder"),
        (["--backend", "jax"], "unknown backend 'jax'"),
        (["--devices", "tpu:2"], "'tpu:2'"),
        (["--epochs", "0"], "num_epochs=0"),
        (["--model", "vgg"], "unknown model 'vgg'"),
        (["--optimizer", "sgd", "--momentum", "-0.5"], "momentum=-0.5 must be at least 0"),
        (["--weight-decay", "nan"], "weight_decay=nan must be a finite number"),
        (["--nesterov"], "nesterov=True needs momentum > 0"),
        (["--optimizer", "adamw", "--momentum", "0.9"], "--momentum and --nesterov are SGD settings"),
        (["--betas", "0.9,0.99"], "--betas is an AdamW setting"),
        (["--optimizer", "adamw", "--betas", "0.9"], "betas=(0.9,) must be two numbers"),
    ],
)
def test_train_checks_options_and_outputs_before_the_data(capsys, tmp_path, extra, words):
    """The data folder does not exist, so any later check would report the data first."""
    code, out, err = run(capsys, [*_train(tmp_path / "no-such-folder"), *extra])
    assert code == EXIT_BAD_INPUT and words in _one_error_line(err, "train")
    assert "epoch" not in out


def test_train_allreduce_takes_only_known_algorithms(capsys, tmp_path):
    code, _, err = run(capsys, [*_train(tmp_path / "no-such-folder"), "--allreduce", "foo"])
    assert code == 2 and "invalid choice: 'foo'" in err and "no-such-folder" not in err


def test_train_corrupt_checkpoint_is_one_line(capsys, tmp_path):
    (tmp_path / FILENAME).write_bytes(b"PK\x03\x04 not really a zip")
    code, _, err = run(capsys, [*_train(tmp_path / "no-such-folder"), "--checkpoint", str(tmp_path)])
    assert code == EXIT_BAD_INPUT and "cannot read checkpoint" in _one_error_line(err, "train")


def test_train_takes_the_optimizer_and_batchnorm_flags(capsys, data_dir, tmp_path):
    out = tmp_path / "r.json"
    argv = _train(
        data_dir,
        "--optimizer",
        "sgd",
        "--momentum",
        "0.9",
        "--nesterov",
        "--weight-decay",
        "5e-4",
        "--sync-bn",
        "--out",
        str(out),
    )
    assert run(capsys, argv)[0] == 0
    d = json.loads(out.read_text())
    assert (
        d["optimizer"] == {"name": "sgd", "momentum": 0.9, "weight_decay": 5e-4, "nesterov": True, "dampening": 0.0}
        and d["sync_bn"] is True
    )
    assert run(capsys, _train(data_dir, "--optimizer", "adamw", "--betas", "0.8,0.9", "--out", str(out)))[0] == 0
    assert json.loads(out.read_text())["optimizer"]["betas"] == [0.8, 0.9]


@pytest.mark.slow
def test_train_a_resnet18_with_the_issues_flags_checkpoints_and_resumes(capsys, data_dir, tmp_path):
    """``multigpu train --model resnet18 --optimizer sgd --momentum 0.9 --weight-decay 5e-4 --sync-bn``
    trains the torchvision layout built for the data, checkpoints it and resumes it; a resume with
    other BatchNorm flags is refused as a different run. Slow: 11.7M parameters on the NumPy
    reference, about 8 s a run on 2 cores."""
    ck, out = tmp_path / "ck", tmp_path / "r.json"
    flags = [
        "--model",
        "resnet18",
        "--optimizer",
        "sgd",
        "--momentum",
        "0.9",
        "--weight-decay",
        "5e-4",
        "--sync-bn",
        "--train-limit",
        "16",
        "--test-limit",
        "8",
        "--batch-size",
        "8",
        "--checkpoint",
        str(ck),
        "--out",
        str(out),
    ]
    assert run(capsys, _train(data_dir, *flags))[0] == 0
    first = json.loads(out.read_text())
    assert first["model"] == "resnet18" and first["sync_bn"] is True and first["optimizer"]["momentum"] == 0.9
    assert (ck / FILENAME).exists() and len(first["test_acc"]) == 1
    assert run(capsys, [*_train(data_dir, *flags), "--epochs", "2"])[0] == 0
    resumed = json.loads(out.read_text())
    assert len(resumed["test_acc"]) == 2 and resumed["train_loss"][0] == first["train_loss"][0]
    code, _, err = run(capsys, [*_train(data_dir, *[f for f in flags if f != "--sync-bn"]), "--epochs", "3"])
    assert code == EXIT_BAD_INPUT and "different run" in _one_error_line(err, "train") and "sync_bn" in err


def test_train_json_result_is_written_or_refused_up_front(capsys, data_dir, tmp_path):
    out = tmp_path / "r.json"
    assert run(capsys, _train(data_dir, "--out", str(out)))[0] == 0 and out.read_text().startswith("{")
    code, stdout, err = run(capsys, _train(data_dir, "--out", str(tmp_path)))  # a folder
    assert code == EXIT_BAD_INPUT and "is a folder" in err and "final test acc" not in stdout


def test_train_piped_to_a_file_writes_lines_not_carriage_returns(data_dir, tmp_path):
    import subprocess
    import sys

    log = tmp_path / "log.txt"
    argv = [a for a in _train(data_dir) if a != "--quiet"]  # progress on, as the README's command 1
    with open(log, "wb") as f:
        proc = subprocess.run([sys.executable, "-m", "multigpu", *argv], stdout=f, stderr=subprocess.STDOUT)
    text = log.read_bytes()
    assert proc.returncode == 0 and b"\r" not in text
    assert text.count(b"epoch 1/1: test acc") == 1 and b"final test acc" in text


def test_train_json_prints_the_result_alone_on_stdout(capsys, data_dir, tmp_path):
    code, stdout, err = run(capsys, [*_train(data_dir, "--json"), "--seed", "3"])
    printed = json.loads(stdout)  # nothing else on stdout: the summary went to stderr
    assert code == 0 and printed["seed"] == 3 and len(printed["test_acc"]) == 1 and "final test acc" in err
    out = tmp_path / "r.json"
    code, stdout, err = run(capsys, [*_train(data_dir, "--json", str(out)), "--seed", "3"])  # the old spelling
    assert code == 0 and "--json PATH is deprecated" in err and "final test acc" in stdout
    assert json.loads(out.read_text())["test_acc"] == printed["test_acc"]


@pytest.mark.skipif(not FRAMEWORKS, reason="needs a framework backend")
def test_train_defaults_to_the_first_installed_framework(capsys, data_dir):
    argv = [a for a in _train(data_dir) if a not in ("--backend", "numpy")]
    code, out, err = run(capsys, argv)
    first = registry.default_backend()
    assert code == 0, err
    assert (
        out.splitlines()[0] == f"backend: {first} (the first installed of torch, paddle, mxnet; choose with --backend)"
    )
    assert f"({first})" in out.splitlines()[-1]


def test_default_backend_order(monkeypatch):
    for installed, want in (
        (["mxnet", "numpy", "paddle", "torch"], "torch"),
        (["mxnet", "numpy", "paddle"], "paddle"),
        (["mxnet", "numpy"], "mxnet"),
        (["numpy"], "numpy"),
    ):
        monkeypatch.setattr(registry, "available_backends", lambda installed=installed: installed)
        assert registry.default_backend() == want


# -- interrupted and unexpected failures, the same for every command ---------------------


def _argv(command: str) -> list[str]:
    return {
        "partition": ["partition", "--model", "lenet", "--cluster", "lab"],
        "profile": ["profile", "--out", "cluster.json"],
        "run": ["run", "--plan", "cpu0", "--cluster", "cluster.json"],
        "lab": ["lab", "status"],
    }.get(command, [command])


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    "exc, code",
    [
        (KeyboardInterrupt(), EXIT_INTERRUPTED),
        (OSError(28, "No space left on device"), EXIT_FAILURE),
        (AdapterError("a worker died"), EXIT_FAILURE),
        (SolverError("HiGHS stopped at its time limit"), EXIT_FAILURE),
    ],
)
def test_every_command_maps_exceptions_the_same_way(capsys, monkeypatch, command, exc, code):
    def fail(args):
        raise exc

    monkeypatch.setattr(importlib.import_module(f"multigpu.cli.commands.{command}"), "run", fail)
    got, _, err = run(capsys, _argv(command))
    assert got == code
    if code == EXIT_INTERRUPTED:
        assert err.strip() == f"multigpu {command}: interrupted"
    else:
        _one_error_line(err, command)


def test_every_error_class_exits_as_its_docstring_says():
    """Each class in errors.py says "(bad input, exit 2)" or "exit 1"; the CLI agrees."""
    classes = [
        c
        for m in (multigpu.errors, multigpu.partition.exceptions)
        for _, c in inspect.getmembers(m)
        if inspect.isclass(c) and issubclass(c, multigpu.errors.MultigpuError)
    ]
    checked = 0
    for cls in classes:
        doc = " ".join((cls.__doc__ or "").split())
        for code in (1, 2):
            if f"exit {code})" in doc:
                diverged = cls is multigpu.errors.TrainingDivergedError
                instance = cls("x", 1, 1, float("nan")) if diverged else cls("x")
                assert exit_code(instance) == code, cls.__name__
                checked += 1
    assert checked >= 16
    assert exit_code(multigpu.partition.exceptions.PartitionInputError("x")) == 2  # via ClusterError
