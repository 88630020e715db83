"""``multigpu profile`` and ``multigpu run`` from the command line: bad input exits 2 with
one line, and profile -> partition -> run works end to end on real images."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import multigpu
from multigpu.data import find_fashion_mnist
from multigpu.partition import Cluster, DeviceSpec, LinkSpec
from multigpu.training.checkpoint import save_checkpoint


def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "multigpu", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def small_cluster(tmp_path) -> str:
    cl = Cluster(
        devices=(DeviceSpec("driver", 1e9, 0.0, backend="numpy"), DeviceSpec("a", 1e9, 0.0, backend="numpy")),
        source="driver",
        default_link=LinkSpec(1e8, 1e-3),
    )
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cl.to_dict()))
    return str(path)


@pytest.mark.parametrize("command", ["run", "profile"])
def test_help(command):
    out = cli(command, "--help")
    assert out.returncode == 0 and "Exit status" in out.stdout


@pytest.mark.parametrize(
    "args, match",
    [
        (["--plan", "a*3"], "the plan has 3 entries but lenet has 10 layers"),
        (["--plan", "a*9,zz"], "device 'zz', which cluster 'c' lacks"),
        (["--plan", "a*10", "--random", "0"], "--random=0 must be a positive integer"),
        (["--plan", "a*10", "--images", "fashion-mnist:dev:0"], "--images 'fashion-mnist:dev:0' is not understood"),
        (["--plan", "a*10", "--params", "nowhere.npz"], "--params 'nowhere.npz' does not exist"),
        (["--plan", "a*10", "--model", "vgg"], "unknown model 'vgg'"),
    ],
)
def test_run_bad_input_exits_2_with_one_line(tmp_path, args, match):
    out = cli("run", "--cluster", small_cluster(tmp_path), *args, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("multigpu run: error:") and match in lines[0], out.stderr


def test_run_missing_cluster_file_exits_2(tmp_path):
    out = cli("run", "--cluster", str(tmp_path / "none.json"), "--plan", "a*10", cwd=tmp_path)
    assert out.returncode == 2 and "no cluster file" in out.stderr


@pytest.mark.parametrize(
    "args, match",
    [
        ([], "no workers to profile"),
        (["--backends", "torch", "--threads", "1,x"], "--threads '1,x' must list whole numbers"),
        (["--worker", "torch:fast"], "is not BACKEND[:DEVICE][:THREADS]"),
        (["--backends", "jax"], "unknown backend 'jax'"),
        (["--backends", "numpy", "--repeats", "0"], "repeats=0 must be a positive integer"),
        (["--backends", "numpy", "--stream-items", "2"], "stream_items=2 must be"),
    ],
)
def test_profile_bad_input_exits_2_with_one_line(tmp_path, args, match):
    out = cli("profile", "--out", str(tmp_path / "p.json"), *args, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and match in lines[0], out.stderr
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("out, match", [("p.txt", "name it .json"), ("no-such-dir/p.json", "does not exist")])
def test_profile_out_is_checked_before_profiling(tmp_path, out, match):
    # Workers that would profile for minutes: the bad --out is refused before any of it.
    out = cli("profile", "--out", str(tmp_path / out), "--backends", "numpy", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("multigpu profile: error: --out") and match in lines[0], out.stderr


@pytest.mark.slow
@pytest.mark.skipif(
    find_fashion_mnist() is None, reason="real Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"
)
def test_profile_partition_run_on_real_images(tmp_path):
    """The loop of the README: profile this machine, plan on the profile, run the plan on
    real test images with checkpointed parameters, compare and check against the
    unpartitioned model."""
    params = multigpu.models.lenet().init_params(7, scale=0.1)
    save_checkpoint(
        tmp_path / "ck",
        params,
        {"config": {}, "epoch": 1, "rng": {}, "test_acc": [0.1], "train_loss": [2.3], "sec_per_epoch": [1.0]},
    )
    workers = ["--worker", "numpy"] + (["--worker", "torch:1"] if "torch" in multigpu.available_backends() else [])
    prof = cli(
        "profile",
        "--model",
        "lenet",
        *workers,
        "--driver-backend",
        "numpy",
        "--repeats",
        "3",
        "--warmup",
        "1",
        "--link-repeats",
        "3",
        "--out",
        str(tmp_path / "measured.json"),
        "--quiet",
        cwd=tmp_path,
    )
    assert prof.returncode == 0, prof.stderr
    assert "link driver <-> numpy" in prof.stdout and "wrote" in prof.stdout
    part = cli("partition", "--model", "lenet", "--cluster", str(tmp_path / "measured.json"), "--json", cwd=tmp_path)
    assert part.returncode == 0, part.stderr
    (tmp_path / "plan.json").write_text(part.stdout)
    for plan in (str(tmp_path / "plan.json"), "numpy*5,driver*5"):
        run = cli(
            "run",
            "--model",
            "lenet",
            "--params",
            str(tmp_path / "ck"),
            "--plan",
            plan,
            "--cluster",
            str(tmp_path / "measured.json"),
            "--images",
            "fashion-mnist:test:0-19",
            "--compare",
            "--check",
            "--json",
            cwd=tmp_path,
        )
        assert run.returncode == 0, run.stderr
        out = json.loads(run.stdout)
        assert out["recognition"]["total"] == 20 and out["check"]["same"] == 20
        assert out["check"]["max_abs_diff"] < 1e-5
        assert [r["kind"] for r in out["compare"]][-1] == "end_to_end"
        assert out["prediction"]["measured_devices"] == ["driver", "numpy"] + (["torch-1t"] if len(workers) > 2 else [])
    text = cli(
        "run",
        "--model",
        "lenet",
        "--params",
        str(tmp_path / "ck"),
        "--plan",
        "numpy*5,driver*5",
        "--cluster",
        str(tmp_path / "measured.json"),
        "--images",
        "fashion-mnist:test:0-4",
        "--compare",
        cwd=tmp_path,
    )
    assert text.returncode == 0, text.stderr
    for needle in (
        "recognition: #0",
        "accuracy:",
        "stage 1",
        "hop driver -> numpy",
        "end to end",
        "predicted (cost model on lenet(batch=1)",
    ):
        assert needle in text.stdout, text.stdout
    assert np.isfinite(out["end_to_end"])
