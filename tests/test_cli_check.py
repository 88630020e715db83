"""`multigpu check`: help, the agreement table and its exit code."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import FRAMEWORKS

from multigpu.cli import main


def test_help_works_for_every_command():
    for argv in (["--help"], ["check", "--help"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 0


def test_check_passes_and_writes_json(tmp_path, capsys):
    out = tmp_path / "check.json"
    assert main(["check", "--steps", "3", "--out", str(out), "--no-resnet"]) == 0
    text = capsys.readouterr().out
    assert "agreement with the numpy reference" in text and "batch_norm_train with stats" in text
    data = json.loads(out.read_text())
    assert data["agree"] is True and data["resnet18_step"] == []
    assert {r["backend"] for r in data["rows"]} == set(FRAMEWORKS or ["numpy"])
    assert {r["op"] for r in data["ops"]} >= {"group_sum of BatchNorm stats", "conv2d without bias, stride 2"}
    sync = {r["backend"]: r for r in data["sync_bn"]}  # k devices with synchronized BatchNorm = 1 device
    assert set(sync) == {"numpy", *FRAMEWORKS} and all(r["ok"] and len(r["devices"]) == 2 for r in sync.values())
    assert "synchronized BatchNorm against 1 device on the full batch" in text


@pytest.mark.slow
def test_check_covers_a_resnet18_step_part_by_part(tmp_path, capsys):
    out = tmp_path / "check.json"
    assert main(["check", "--steps", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["resnet18_step"]
    assert {r["backend"] for r in rows} == set(FRAMEWORKS or ["numpy"])
    for r in rows:
        assert r["ok"] and r["decisions_differ"] == 0, r
    assert "ResNet-18 step against the numpy reference" in capsys.readouterr().out


@pytest.mark.skipif(not FRAMEWORKS, reason="needs a framework backend besides numpy")
def test_check_exits_nonzero_when_backends_disagree(capsys):
    # A tolerance no float32 framework can meet forces a disagreement.
    assert main(["check", "--steps", "2", "--backends", FRAMEWORKS[0], "--tol", "1e-15", "--no-resnet"]) == 1
    assert "DISAGREES" in capsys.readouterr().out


def test_console_script_exit_code_on_bad_input(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "multigpu", "check", "--backends", "jax", "--steps", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2  # bad input
    assert "unknown backend 'jax'" in proc.stderr
