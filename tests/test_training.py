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
from idx_files import write_learnable_set

import multigpu
from multigpu.data import FashionMNIST, find_fashion_mnist, load_fashion_mnist
from multigpu.errors import (
    CheckpointError,
    DeviceError,
    InputError,
    ModelError,
    TrainingDivergedError,
    UnknownAlgorithmError,
    UnknownBackendError,
)
from multigpu.training.checkpoint import FILENAME, load_checkpoint
from multigpu.training.trainer import learning_rate


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    folder = write_learnable_set(tmp_path_factory.mktemp("fm"), n_train=256, n_test=64)
    return folder, load_fashion_mnist(folder, verify=False)  # synthetic: not the published MD5s


def _train(data, **kw):
    args = dict(
        backend="numpy", devices="cpu:2", batch_size=64, lr=0.3, num_epochs=2, progress=False, data=data, seed=0
    )
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


def test_linear_scaling_follows_the_global_batch_not_the_device_count(small_data):
    """k devices at one global batch train like one device, with or without lr_scaling."""
    _, data = small_data
    one = _train(data, devices="cpu:1", batch_size=64, lr_scaling="linear")
    two = _train(data, devices="cpu:2", batch_size=64, lr_scaling="linear")  # multiplier 1: lr stays 0.3
    for p, q in zip(one.params, two.params):
        np.testing.assert_allclose(p, q, atol=1e-6)
    # scale_batch doubles the batch on 2 devices, and linear scaling doubles the rate with it:
    # the same run as 1 device with batch 64 and lr 0.6.
    scaled = _train(data, devices="cpu:2", batch_size=32, lr=0.3, scale_batch=True, lr_scaling="linear")
    plain = _train(data, devices="cpu:1", batch_size=64, lr=0.6)
    assert scaled.batch_size == 64
    for p, q in zip(scaled.params, plain.params):
        np.testing.assert_allclose(p, q, atol=1e-6)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's overflow warnings on the way to NaN
def test_a_diverging_run_stops_naming_epoch_and_step(small_data, backend_name):
    """A NaN loss is an error naming where it happened, not train_loss [nan] and accuracy 0.1."""
    with pytest.raises(TrainingDivergedError) as e:
        _train(small_data[1], backend=backend_name, lr=1e9)
    assert (e.value.epoch, e.value.step) == (1, 3) and np.isnan(e.value.loss)
    assert str(e.value).startswith(
        "training diverged: the loss is nan at epoch 1, step 3 (lr 1e+09); lower the learning rate, e.g. to 1e+08"
    )


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_parameters_gone_bad_in_the_last_step_are_caught_at_the_epoch_end(small_data):
    """The loss is read after the update but computed before it: a NaN born in an epoch's last
    update shows in the parameters first, and the epoch's end checks them (no checkpoint of them)."""
    with pytest.raises(
        TrainingDivergedError, match="the parameters hold NaN or infinity after epoch 1 although every loss was finite"
    ):
        _train(small_data[1], backend="numpy", lr=1e6)


@pytest.mark.slow
@pytest.mark.skipif(
    find_fashion_mnist() is None or "torch" not in multigpu.available_backends(),
    reason="needs real Fashion-MNIST and torch",
)
def test_the_issues_diverging_torch_run_on_real_data():
    """The issue's case: train(backend="torch", lr=1e6) ended with train_loss [nan]."""
    with pytest.raises(TrainingDivergedError, match="the loss is nan at epoch 1, step"):
        multigpu.train(
            backend="torch", devices=1, lr=1e6, num_epochs=1, train_limit=5120, test_limit=500, progress=False
        )


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_divergence_leaves_the_last_good_checkpoint(small_data, tmp_path):
    _, data = small_data
    _train(data, num_epochs=1, checkpoint=tmp_path)
    good = (tmp_path / FILENAME).read_bytes()
    # Same run resumed on images scaled by 1e30: the first update overflows the parameters.
    huge = FashionMNIST(
        data.train_images * np.float32(1e30), data.train_labels, data.test_images, data.test_labels, data.source
    )
    with pytest.raises(
        TrainingDivergedError, match=f"epoch 2, step .*the checkpoint in {tmp_path} still holds epoch 1"
    ):
        _train(huge, num_epochs=3, checkpoint=tmp_path)
    assert (tmp_path / FILENAME).read_bytes() == good
    assert sorted(os.listdir(tmp_path)) == [FILENAME]


@pytest.mark.parametrize(
    "kw, error, match",
    [
        (dict(allreduce="foo"), UnknownAlgorithmError, "'foo'"),
        (dict(backend="jax"), UnknownBackendError, "'jax'"),
        (dict(devices="tpu:1"), DeviceError, "'tpu:1'"),
        (dict(lr=float("nan")), InputError, "lr=nan"),
        (dict(lr=float("inf")), InputError, "lr=inf"),
        (dict(model="vgg"), ModelError, "'vgg'"),
        (dict(plot="/nonexistent-folder/acc.png"), InputError, "plot /nonexistent-folder/acc.png"),
        (dict(train_limit=-1), InputError, "train_limit=-1"),
        (dict(bucket_mb=0), InputError, "bucket_mb=0 must be greater than 0"),
        (dict(batch_size=1), InputError, "batch_size=1 .*one row per device"),
    ],
)
def test_arguments_are_checked_before_the_data_loads(tmp_path, kw, error, match):
    args = dict(backend="numpy", devices="cpu:2", progress=False, data_dir=tmp_path / "no-data-here")
    args.update(kw)
    with pytest.raises(error, match=match):
        multigpu.train(**args)


@pytest.mark.parametrize("content", [b"not a zip at all", b"PK\x03\x04 truncated zip"])
def test_a_corrupt_checkpoint_is_a_checkpoint_error_before_the_data_loads(tmp_path, content):
    (tmp_path / FILENAME).write_bytes(content)
    with pytest.raises(CheckpointError, match=f"cannot read checkpoint {tmp_path / FILENAME}"):
        multigpu.train(backend="numpy", progress=False, checkpoint=tmp_path, data_dir=tmp_path / "none")


def test_a_checkpoint_missing_its_state_is_refused(tmp_path):
    np.savez(tmp_path / FILENAME, state=np.array('{"epoch": 1}'))
    with pytest.raises(CheckpointError, match="lacks config"):
        load_checkpoint(tmp_path)


def test_every_example_is_used_each_epoch(small_data):
    from multigpu.training.trainer import _batches

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


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(batch_size=0), "batch_size=0"),
        (dict(num_epochs=0), "num_epochs=0"),
        (dict(lr_scaling="sqrt"), "lr_scaling='sqrt'"),
        (dict(warmup_epochs=2), "warmup_epochs only applies"),
        (dict(batch_size=1), "batch_size=1"),
        (dict(model="vgg"), "unknown model 'vgg'"),
        (dict(train_limit=0), "train_limit=0"),
    ],
)
def test_bad_arguments(small_data, kw, match):
    with pytest.raises(multigpu.MultigpuError, match=match):
        _train(small_data[1], **kw)


def test_checkpoint_of_another_run_is_refused(small_data, tmp_path):
    _train(small_data[1], num_epochs=1, checkpoint=tmp_path)
    with pytest.raises(multigpu.errors.CheckpointError, match="different run.*lr"):
        _train(small_data[1], num_epochs=2, checkpoint=tmp_path, lr=0.1)


def _cli(folder, ck, out, epochs=4):
    return [
        sys.executable,
        "-m",
        "multigpu",
        "train",
        "--backend",
        "numpy",
        "--devices",
        "cpu:2",
        "--batch-size",
        "32",
        "--lr",
        "0.3",
        "--epochs",
        str(epochs),
        "--data-dir",
        str(folder),
        "--checkpoint",
        str(ck),
        "--out",
        str(out),
        "--quiet",
        "--no-verify-data",
    ]


def test_killed_run_resumes_to_the_uninterrupted_result(small_data, tmp_path):
    folder, _ = small_data
    full = subprocess.run(
        _cli(folder, tmp_path / "ck_full", tmp_path / "full.json"), cwd=tmp_path, capture_output=True, text=True
    )
    assert full.returncode == 0, full.stderr
    proc = subprocess.Popen(
        _cli(folder, tmp_path / "ck", tmp_path / "part.json"),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not (tmp_path / "ck" / FILENAME).exists():
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint before the run ended"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = load_checkpoint(tmp_path / "ck")
    assert saved is not None and 1 <= saved[1]["epoch"] < 4, "the kill must land partway through"
    assert not (tmp_path / "part.json").exists()
    resumed = subprocess.run(
        _cli(folder, tmp_path / "ck", tmp_path / "part.json"), cwd=tmp_path, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr
    a, b = json.loads((tmp_path / "full.json").read_text()), json.loads((tmp_path / "part.json").read_text())
    assert a["test_acc"] == b["test_acc"] and a["train_loss"] == b["train_loss"]
    for p, q in zip(load_checkpoint(tmp_path / "ck_full")[0], load_checkpoint(tmp_path / "ck")[0]):
        np.testing.assert_array_equal(p, q)
    assert not [p for p in os.listdir(tmp_path / "ck") if p != FILENAME]  # no temporary files left


def test_cli_train_prints_a_line_per_epoch_and_fails_cleanly(small_data, tmp_path):
    folder, _ = small_data
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "multigpu",
            "train",
            "--backend",
            "numpy",
            "--devices",
            "cpu:2",
            "--epochs",
            "2",
            "--batch-size",
            "64",
            "--data-dir",
            str(folder),
            "--no-verify-data",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    epoch_lines = [line for line in ok.stdout.splitlines() if line.startswith("epoch ")]
    assert len(epoch_lines) == 2 and all("sec/epoch" in line and "cpu:1" in line for line in epoch_lines)
    bad = subprocess.run(
        [sys.executable, "-m", "multigpu", "train", "--data-dir", str(tmp_path / "none")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "none" in bad.stderr  # bad input
    assert bad.stderr.strip().splitlines()[-1].startswith("multigpu train: error: data_dir ")
    assert "Traceback" not in bad.stderr


@pytest.mark.slow
@pytest.mark.skipif(
    find_fashion_mnist() is None, reason="real Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"
)
def test_short_real_data_run_agrees_across_backends():
    """Ten steps on real Fashion-MNIST with every backend from one seed: the same numbers.

    LeNet's 0.01 init sits on a loss plateau for a few hundred steps, so a short run
    cannot show accuracy; `multigpu bench accuracy` measures the full run.
    """
    results = {
        b: multigpu.train(
            backend=b,
            devices="cpu:2",
            batch_size=256,
            lr=0.2,
            num_epochs=1,
            train_limit=2560,
            test_limit=1000,
            progress=False,
            seed=0,
        )
        for b in multigpu.available_backends()
    }
    ref = results["numpy"]
    for name, r in results.items():
        assert r.devices == ["cpu:0", "cpu:1"]
        assert abs(r.train_loss[0] - ref.train_loss[0]) < 1e-5, name
        assert abs(r.test_acc[0] - ref.test_acc[0]) <= 0.002, name
        for p, q in zip(r.params, ref.params):
            np.testing.assert_allclose(p, q, atol=1e-5)


def _tiny_resnet() -> multigpu.models.Model:
    return multigpu.models.resnet((1, 1), (4, 8), 10, (1, 28, 28), "tiny")


@pytest.mark.parametrize("sync_bn", [False, True], ids=["per-device", "synchronized"])
def test_a_resnet_with_momentum_resumes_exactly_from_its_checkpoint(small_data, tmp_path, sync_bn):
    """The checkpoint holds the optimizer's buffers, its step count and every replica's running
    statistics: one epoch, then a resumed second, ends where two straight epochs end."""
    from multigpu.optim import SGD

    _, data = small_data
    kw = dict(model=_tiny_resnet(), optimizer=SGD(momentum=0.9, weight_decay=5e-4), sync_bn=sync_bn, lr=0.05)
    full = _train(data, num_epochs=2, **kw)
    _train(data, num_epochs=1, checkpoint=tmp_path, **kw)
    _, state = load_checkpoint(tmp_path)
    assert state["steps"] == 4 and state["arrays"]["bn"].shape == (2, sum(s[0] for s in _tiny_resnet().state_shapes))
    assert state["config"]["optimizer"]["momentum"] == 0.9 and state["arrays"]["opt0"].any()
    resumed = _train(data, num_epochs=2, checkpoint=tmp_path, **kw)
    assert resumed.train_loss == full.train_loss and resumed.test_acc == full.test_acc
    for a, b in zip([*resumed.params, *resumed.state], [*full.params, *full.state]):
        np.testing.assert_array_equal(a, b)
    assert full.optimizer["name"] == "sgd" and full.sync_bn is sync_bn and len(full.state) == 12
    with pytest.raises(CheckpointError, match="different run"):
        _train(data, num_epochs=3, checkpoint=tmp_path, **{**kw, "optimizer": SGD(momentum=0.5)})


def test_a_last_batch_too_small_for_batchnorm_joins_the_one_before(small_data):
    """A BatchNorm on 1x1 planes needs two rows per device: 67 rows in batches of 32 on 2 devices
    would end with 3 rows (one device would get 1), so those join the batch before."""
    _, data = small_data
    m = multigpu.models.resnet((1, 1, 1, 1), (4, 4, 8, 8), 10, (1, 28, 28), "deep")
    assert max(m.min_training_examples().values()) == 2
    r = _train(data, model=m, batch_size=32, train_limit=67, num_epochs=1)
    assert np.isfinite(r.train_loss[0])
    assert multigpu.training.trainer._batches(67, 32, 4, np.random.default_rng(0))[-1].size == 35
