"""An imported network does what a built-in one does: ``train`` data-parallel on every backend (one process
with two devices, and two processes through the launch engine), real Fashion-MNIST on two Paddle devices,
``autopartition`` and ``run_partitioned`` across torch and Paddle workers, and ``multigpu partition`` /
``multigpu run --model net.onnx`` on the command line."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest
from idx_files import write_learnable_set
from ray_local import local_ray  # noqa: F401 - the module-scoped Ray fixture

import multigpu
from multigpu.data import find_fashion_mnist, load_fashion_mnist
from multigpu.partition import Cluster, Constraints, DeviceSpec, LinkSpec, autopartition, graph_from_model

onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")
nn = torch.nn

from multigpu.models import from_torch  # noqa: E402 - after the skips: needs onnx and torch


class FashionNet(nn.Module):
    """A small CNN for 1x28x28 images: conv-bn-relu-pool, conv-relu-pool, linear."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 7 * 7, 10)

    def forward(self, x):
        y = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        y = nn.functional.max_pool2d(torch.relu(self.conv2(y)), 2)
        return self.fc(torch.flatten(y, 1))


def _export(net: nn.Module, path) -> None:
    """``net`` as an ONNX file with a dynamic batch, as a user's own exporter call writes it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter warns on every export
        torch.onnx.export(
            net.eval(),
            (torch.randn(2, 1, 28, 28),),
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=["input"],
            dynamic_axes={"input": {0: "batch"}},
        )


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    net = FashionNet()
    with torch.no_grad():  # statistics away from (0, 1), so a run that ignored them would differ
        net.bn1.running_mean.uniform_(-0.2, 0.2)
        net.bn1.running_var.uniform_(0.5, 2.0)
    return net.eval()


@pytest.fixture(scope="module")
def imported(net):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return from_torch(net, torch.randn(2, 1, 28, 28))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return load_fashion_mnist(write_learnable_set(tmp_path_factory.mktemp("fm"), n_train=128, n_test=32), verify=False)


TRAIN = dict(devices="cpu:2", batch_size=32, lr=0.1, num_epochs=1, progress=False, seed=0)


@pytest.fixture(scope="module")
def numpy_run(imported, data):
    """The NumPy reference: the imported model trained on two devices in this process."""
    return multigpu.train(model=imported.model, backend="numpy", data=data, **TRAIN)


# -- train ----------------------------------------------------------------------------------------
def test_an_imported_cnn_trains_on_two_devices_alike_on_every_backend(imported, data, numpy_run, backend_name):
    got = multigpu.train(model=imported.model, backend=backend_name, data=data, **TRAIN)
    assert got.devices == ["cpu:0", "cpu:1"] and got.model == "FashionNet"
    assert got.train_loss == pytest.approx(numpy_run.train_loss, rel=1e-4)
    assert [p.shape for p in got.params] == [p.shape for p in imported.params]
    for a, b in zip(got.params, numpy_run.params):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
    # the learnable set: one epoch moves the loss below chance (ln 10 = 2.30) and classifies the test set
    assert numpy_run.train_loss[-1] < 2.0 and numpy_run.test_acc[-1] > 0.5


@pytest.mark.slow  # starts two ranks, each importing a framework and its engine (10-40 s each)
@pytest.mark.parametrize("backend", ["numpy", "torch", "paddle", "mxnet"])
def test_an_imported_cnn_trained_by_two_processes_equals_one_process_with_two_devices(
    imported, data, numpy_run, backend
):
    pytest.importorskip(backend)
    two = multigpu.train(model=imported.model, backend=backend, data=data, **{**TRAIN, "devices": 1}, processes=2)
    assert two.processes == 2 and two.rank == 0
    assert two.train_loss == pytest.approx(numpy_run.train_loss, rel=1e-4)
    assert two.test_acc == numpy_run.test_acc
    for a, b in zip(two.params, numpy_run.params):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)


@pytest.mark.slow  # 2 epochs of 6,000 real images: about 10 s on two CPU cores
@pytest.mark.skipif(
    find_fashion_mnist() is None, reason="real Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"
)
def test_an_imported_cnn_learns_real_fashion_mnist_on_two_paddle_devices(imported):
    pytest.importorskip("paddle")
    got = multigpu.train(
        model=imported.model,
        backend="paddle",
        devices=2,
        batch_size=64,
        lr=0.1,
        num_epochs=2,
        train_limit=6000,
        test_limit=1000,
        progress=False,
        seed=0,
    )
    assert got.backend == "paddle" and len(got.devices) == 2
    # 0.795 then 0.814 test accuracy on 1,000 test images (chance: 0.1)
    assert got.test_acc[-1] > 0.75, got.test_acc
    assert got.train_loss[-1] < got.train_loss[0]


# -- place and run -------------------------------------------------------------------------------
def _mixed_cluster() -> Cluster:
    """A NumPy driver with a torch worker and a Paddle worker; the Paddle one is faster."""
    return Cluster(
        devices=(
            DeviceSpec("driver", 1e9, 0.0, backend="numpy"),
            DeviceSpec("t", 2e9, 0.0, backend="torch", threads=1),
            DeviceSpec("p", 4e9, 0.0, backend="paddle", threads=1),
        ),
        source="driver",
        default_link=LinkSpec(1e9, 1e-4),
    )


def _placed(imported) -> dict:
    """The planner's plan for the imported model, its first node pinned on torch and its last on Paddle."""
    model = imported.model
    names = [n.name for n in model.nodes]
    cons = Constraints(pinned={names[0]: "t", names[-1]: "p"})
    plan = autopartition(graph_from_model(model, batch=4), _mixed_cluster(), constraints=cons)
    return plan.to_dict()


def test_the_planner_places_an_imported_cnn_across_torch_and_paddle(imported):
    plan = _placed(imported)
    placed = plan["assignment"]
    assert len(placed) == len(imported.model.nodes)
    assert placed[0] == "t" and placed[-1] == "p"


@pytest.mark.slow  # Ray and a torch and a Paddle worker
@pytest.mark.usefixtures("local_ray")
def test_the_planned_imported_cnn_runs_on_torch_and_paddle_workers_as_in_one_process(imported, net):
    pytest.importorskip("paddle")
    from multigpu.execution import run_partitioned

    x = np.random.default_rng(0).standard_normal((8, 1, 28, 28)).astype(np.float32)
    r = run_partitioned(imported.model, imported.params, _placed(imported), x, _mixed_cluster(), batch=4,
                        state=imported.state)  # fmt: skip
    assert {w["device"]: w["backend"] for w in r.workers if not w.get("local")} == {"t": "torch", "p": "paddle"}
    be, cpu = multigpu.backend("numpy"), multigpu.Device("cpu", 0)
    whole = be.to_numpy(
        imported.model.forward(
            be, [be.from_numpy(p, cpu) for p in imported.params], be.from_numpy(x, cpu),
            state=[be.from_numpy(s, cpu) for s in imported.state],
        )
    )  # fmt: skip
    got = np.asarray(r.outputs).reshape(whole.shape)
    np.testing.assert_allclose(got, whole, rtol=0, atol=1e-5)
    with torch.no_grad():
        np.testing.assert_allclose(got, net(torch.from_numpy(x)).numpy(), rtol=0, atol=1e-5)


# -- the command line ------------------------------------------------------------------------------
def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "multigpu", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def _cluster_file(tmp_path) -> str:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(_mixed_cluster().to_dict()))
    return str(path)


def test_run_help_names_onnx_files():
    out = cli("run", "--help")
    assert out.returncode == 0 and "FILE.onnx" in out.stdout and "ONNX file" in out.stdout


def test_run_refuses_a_missing_or_broken_onnx_file_in_one_line(tmp_path):
    (tmp_path / "broken.onnx").write_text("not a model")
    for model, match in (("nowhere.onnx", "nowhere.onnx"), ("broken.onnx", "broken.onnx")):
        out = cli("run", "--model", model, "--plan", "t", "--cluster", _cluster_file(tmp_path), cwd=tmp_path)
        assert out.returncode == 2, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("multigpu run: error:") and match in lines[0], out.stderr


def test_run_refuses_an_onnx_model_of_token_ids_naming_its_inputs(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            nn.Sequential(nn.Embedding(50, 8), nn.Flatten(), nn.Linear(8 * 6, 3)).eval(),
            (torch.zeros(2, 6, dtype=torch.int64),),
            str(tmp_path / "ids.onnx"),
            dynamo=False,
            opset_version=17,
            input_names=["input_ids"],
            dynamic_axes={"input_ids": {0: "batch"}},
        )
    out = cli("run", "--model", "ids.onnx", "--plan", "t", "--cluster", _cluster_file(tmp_path), cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "['input_ids'] (input_ids integer)" in out.stderr and "run_partitioned" in out.stderr


@pytest.mark.slow  # two CLI processes, the second with Ray and two workers
def test_partition_then_run_an_onnx_file_from_the_command_line(tmp_path, net):
    pytest.importorskip("paddle")
    pytest.importorskip("ray")
    _export(net, tmp_path / "net.onnx")
    cluster = _cluster_file(tmp_path)
    part = cli("partition", "--model", "net.onnx", "--cluster", cluster, "--batch-size", "4", "--json",
               "--pin", "/conv1/Conv=t", "--pin", "/fc/Gemm=p", "--out", "plan.json", cwd=tmp_path)  # fmt: skip
    assert part.returncode == 0, part.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["assignment"][0] == "t" and plan["assignment"][-1] == "p"
    run = cli("run", "--model", "net.onnx", "--plan", "plan.json", "--cluster", cluster, "--random", "8",
              "--batch-size", "4", "--check", "--json", cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert "seeded random init" not in run.stderr  # the file's own weights, not an init
    assert out["check"]["same"] == out["check"]["total"] == 8 and out["check"]["max_abs_diff"] < 1e-5
    assert {w["device"]: w["backend"] for w in out["workers"] if not w["local"]} == {"t": "torch", "p": "paddle"}


def test_partition_exports_the_stages_of_an_onnx_file_with_its_own_weights(tmp_path, net, capsys):
    """``multigpu partition --model net.onnx --export-stages DIR``: the stage files, chained under
    onnxruntime, give what onnxruntime gives for the whole file (its weights, not an init)."""
    ort = pytest.importorskip("onnxruntime")
    from test_onnx_export import run_stages

    from multigpu.cli import main

    _export(net, tmp_path / "net.onnx")
    argv = ["partition", "--model", str(tmp_path / "net.onnx"), "--cluster", _cluster_file(tmp_path)]
    pins = ["--pin", "/conv1/Conv=t", "--pin", "/fc/Gemm=p", "--batch-size", "4", "--no-baselines"]
    assert main([*argv, *pins, "--export-stages", str(tmp_path / "stages")]) == 0
    assert "the weights of" in capsys.readouterr().err
    x = np.random.default_rng(0).standard_normal((4, 1, 28, 28)).astype(np.float32)
    manifest, env = run_stages(tmp_path / "stages", {"input": x})
    assert len(manifest["stages"]) >= 2
    whole = ort.InferenceSession(str(tmp_path / "net.onnx"), providers=["CPUExecutionProvider"]).run(None, {"input": x})
    np.testing.assert_allclose(env[manifest["outputs"][0]], whole[0], rtol=1e-5, atol=1e-5)
