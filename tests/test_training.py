"""multigpu.train: determinism, JSON, schedules, checkpoints, plots, errors and real data."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import multigpu
from multigpu.checkpoint import FILENAME, load_checkpoint
from multigpu.data import find_fashion_mnist, load_fashion_mnist
from multigpu.training import learning_rate

from idx_files import write_learnable_set


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    folder = write_learnable_set(tmp_path_factory.mktemp("fm"), n_train=256, n_test=64)
    return folder, load_fashion_mnist(folder)


def _train(data, **kw):
    args = dict(backend="numpy", num_gpus="cpu:2", batch_size=64, lr=0.3, num_epochs=2,
                progress=False, data=data, seed=0)
    args.update(kw)
    return multigpu.train(**args)


def test_same_seed_same_numbers_and_learning(small_data):
    _, data = small_data
    a, b = _train(data), _train(data)
    assert a.test_acc == b.test_acc and a.train_loss == b.train_loss
    for p, q in zip(a.params, b.params):
        np.testing.assert_array_equal(p, q)
    assert a.train_loss[-1] < a.train_loss[0]  # learning itself is shown on real data below
    c = _train(data, seed=1)
    assert c.train_loss != a.train_loss


def test_result_fields_and_json(small_data, tmp_path):
    _, data = small_data
    r = _train(data, num_epochs=2)
    assert len(r.test_acc) == len(r.train_loss) == len(r.sec_per_epoch) == 2
    assert r.devices == ["cpu:0", "cpu:1"] and r.backend == "numpy"
    assert r.samples_per_sec == pytest.approx(256 * 2 / sum(r.sec_per_epoch))
    r.save_json(tmp_path / "r.json")
    d = json.loads((tmp_path / "r.json").read_text())
    assert d["test_acc"] == r.test_acc and d["params"] is None
    assert len(r.to_dict(include_params=True)["params"]) == 8


def test_scale_batch_and_linear_lr_with_warmup(small_data):
    _, data = small_data
    r = _train(data, num_epochs=1, scale_batch=True, lr_scaling="linear", warmup_epochs=1)
    assert r.batch_size == 128
    assert learning_rate(0.1, 4, 0, 10, "linear", 2) == pytest.approx(0.1)
    assert learning_rate(0.1, 4, 10, 10, "linear", 2) == pytest.approx(0.25)
    assert learning_rate(0.1, 4, 20, 10, "linear", 2) == pytest.approx(0.4)
    assert learning_rate(0.1, 4, 5, 10, "linear", 0) == pytest.approx(0.4)
    assert learning_rate(0.1, 4, 5, 10, None, 0) == pytest.approx(0.1)


def test_every_example_is_used_each_epoch(small_data):
    from multigpu.training import _batches
    chunks = _batches(601, 64, 3, np.random.default_rng(0))
    assert sorted(np.concatenate(chunks).tolist()) == list(range(601))
    assert min(len(c) for c in chunks) >= 3


def test_plot_writes_a_png(small_data, tmp_path):
    _, data = small_data
    _train(data, num_epochs=1, plot=tmp_path / "acc.png")
    assert (tmp_path / "acc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_names_the_extra(small_data, monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "matplotlib" else real(n, *a))
    with pytest.raises(multigpu.errors.MissingDependencyError, match=r"multigpu\[plot\]"):
        _train(small_data[1], plot=tmp_path / "x.png")


@pytest.mark.parametrize("kw, match", [
    (dict(batch_size=0), "batch_size=0"),
    (dict(num_epochs=0), "num_epochs=0"),
    (dict(lr_scaling="sqrt"), "lr_scaling='sqrt'"),
    (dict(warmup_epochs=2), "warmup_epochs only applies"),
    (dict(batch_size=1), "batch_size=1"),
    (dict(model="vgg"), "unknown model 'vgg'"),
    (dict(train_limit=0), "train_limit=0"),
])
def test_bad_arguments(small_data, kw, match):
    with pytest.raises(multigpu.MultigpuError, match=match):
        _train(small_data[1], **kw)


def test_checkpoint_of_another_run_is_refused(small_data, tmp_path):
    _train(small_data[1], num_epochs=1, checkpoint=tmp_path)
    with pytest.raises(multigpu.errors.CheckpointError, match="different run.*lr"):
        _train(small_data[1], num_epochs=2, checkpoint=tmp_path, lr=0.1)


def _cli(folder, ck, out, epochs=4):
    return [sys.executable, "-m", "multigpu", "train", "--backend", "numpy", "--gpus", "cpu:2",
            "--batch-size", "32", "--lr", "0.3", "--epochs", str(epochs), "--data-dir", str(folder),
            "--checkpoint", str(ck), "--json", str(out), "--quiet"]


def test_killed_run_resumes_to_the_uninterrupted_result(small_data, tmp_path):
    folder, _ = small_data
    full = subprocess.run(_cli(folder, tmp_path / "ck_full", tmp_path / "full.json"), cwd=tmp_path,
                          capture_output=True, text=True)
    assert full.returncode == 0, full.stderr
    proc = subprocess.Popen(_cli(folder, tmp_path / "ck", tmp_path / "part.json"), cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (tmp_path / "ck" / FILENAME).exists():
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint before the run ended"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = load_checkpoint(tmp_path / "ck")
    assert saved is not None and 1 <= saved[1]["epoch"] < 4, "the kill must land partway through"
    assert not (tmp_path / "part.json").exists()
    resumed = subprocess.run(_cli(folder, tmp_path / "ck", tmp_path / "part.json"), cwd=tmp_path,
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    a, b = json.loads((tmp_path / "full.json").read_text()), json.loads((tmp_path / "part.json").read_text())
    assert a["test_acc"] == b["test_acc"] and a["train_loss"] == b["train_loss"]
    for p, q in zip(load_checkpoint(tmp_path / "ck_full")[0], load_checkpoint(tmp_path / "ck")[0]):
        np.testing.assert_array_equal(p, q)
    assert not [p for p in os.listdir(tmp_path / "ck") if p != FILENAME]  # no temporary files left


def test_cli_train_prints_a_line_per_epoch_and_fails_cleanly(small_data, tmp_path):
    folder, _ = small_data
    ok = subprocess.run([sys.executable, "-m", "multigpu", "train", "--gpus", "cpu:2", "--epochs", "2",
                         "--batch-size", "64", "--data-dir", str(folder)], cwd=tmp_path,
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    epoch_lines = [line for line in ok.stdout.splitlines() if line.startswith("epoch ")]
    assert len(epoch_lines) == 2 and all("sec/epoch" in line and "cpu:1" in line for line in epoch_lines)
    bad = subprocess.run([sys.executable, "-m", "multigpu", "train", "--data-dir", str(tmp_path / "none")],
                         cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode == 1 and "none" in bad.stderr


@pytest.mark.slow
@pytest.mark.skipif(find_fashion_mnist() is None, reason="real Fashion-MNIST not installed "
                    "(apt-get install dataset-fashion-mnist)")
def test_short_real_data_run_agrees_across_backends():
    """Ten steps on real Fashion-MNIST with every backend from one seed: the same numbers.

    LeNet's 0.01 init sits on a loss plateau for a few hundred steps, so a short run
    cannot show accuracy; `multigpu bench accuracy` measures the full run.
    """
    results = {b: multigpu.train(backend=b, num_gpus="cpu:2", batch_size=256, lr=0.2, num_epochs=1,
                                 train_limit=2560, test_limit=1000, progress=False, seed=0)
               for b in multigpu.available_backends()}
    ref = results["numpy"]
    for name, r in results.items():
        assert r.devices == ["cpu:0", "cpu:1"]
        assert abs(r.train_loss[0] - ref.train_loss[0]) < 1e-5, name
        assert abs(r.test_acc[0] - ref.test_acc[0]) <= 0.002, name
        for p, q in zip(r.params, ref.params):
            np.testing.assert_allclose(p, q, atol=1e-5)
