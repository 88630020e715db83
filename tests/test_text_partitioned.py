"""MiniLM placed and run: ``multigpu partition --model minilm`` places the encoder of a sentence on the lab's
devices, and ``run_partitioned`` runs it across a torch and a Paddle worker (slow: Ray), equal to the
unpartitioned model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from ray_local import local_ray  # noqa: F401 - the module-scoped Ray fixture

import multigpu
from multigpu.cli import main
from multigpu.execution import run_partitioned
from multigpu.execution.runner import split_inputs
from multigpu.models import RunContext, SentenceEncoder, pretrained
from multigpu.partition import Cluster, DeviceSpec, LinkSpec, graph_from_model

SENTENCES = ["A man is playing a guitar.", "The new movie is awesome, I loved it so much!", "Hi."]


def test_the_partition_command_places_minilm_on_the_lab(capsys):
    assert main(["partition", "--model", "minilm", "--cluster", "lab", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    model = multigpu.models.get("minilm")
    placed = plan["assignment"] if "assignment" in plan else plan["plan"]
    assert len(placed) == len(model.nodes)
    graph = graph_from_model(model)
    # the ids and the mask both come from the source: the graph's one input
    by_name = {layer.name: layer for layer in graph.layers}
    assert by_name["extended_attention_mask"].inputs in (("input",), None)  # not ("input_ids", "attention_mask")
    assert by_name["encoder.layer.0.attention"].inputs == ("embeddings.dropout", "extended_attention_mask")
    assert graph.input_bytes == 2 * 16 * 8


def test_token_inputs_travel_as_one_int64_array_per_item():
    model = multigpu.models.get("minilm")
    ids = np.arange(3 * 16).reshape(3, 16) % 100
    mask = np.ones_like(ids)
    mask[2, 5:] = 0
    items = split_inputs(model, {"input_ids": ids, "attention_mask": mask}, 2)
    assert [i.shape for i in items] == [(2, 2, 16), (1, 2, 16)] and items[0].dtype == np.int64
    np.testing.assert_array_equal(items[1][0, 1], mask[2])
    with pytest.raises(multigpu.errors.InputError, match="token id 40000 at"):
        split_inputs(model, {"input_ids": ids + 40000, "attention_mask": mask}, 2)


@pytest.mark.slow
@pytest.mark.usefixtures("local_ray")
def test_minilm_runs_across_a_torch_and_a_paddle_worker_as_the_unpartitioned_model():
    model, params = pretrained("all-MiniLM-L6-v2", seq_len=16)
    ids, mask = SentenceEncoder("all-MiniLM-L6-v2", backend="numpy").tokenize(SENTENCES)
    ids, mask = ids[:, :16], mask[:, :16]
    cl = Cluster(
        devices=(
            DeviceSpec("driver", 1e9, 0.0, backend="numpy"),
            DeviceSpec("t", 1e9, 0.0, backend="torch", threads=1),
            DeviceSpec("p", 1e9, 0.0, backend="paddle", threads=1),
        ),
        source="driver",
        default_link=LinkSpec(1e8, 1e-3),
    )
    half = len(model.nodes) // 2
    plan = ["t"] * half + ["p"] * (len(model.nodes) - half)
    r = run_partitioned(model, params, plan, {"input_ids": ids, "attention_mask": mask}, cl, batch=len(ids))
    be, dev = multigpu.backend("torch"), multigpu.Device("cpu", 0)
    feeds = {"input_ids": be.from_numpy(ids, dev), "attention_mask": be.from_numpy(mask, dev)}
    whole = be.to_numpy(
        model.run(be, [be.from_numpy(p, dev) for p in params], feeds, context=RunContext(devices=[dev]))[model.output]
    )
    assert {w["device"]: w["backend"] for w in r.workers if not w.get("local")} == {"t": "torch", "p": "paddle"}
    got = np.asarray(r.outputs).reshape(whole.shape)
    # half the layers ran on Paddle: float32 rounding differs from torch's, within 1e-5 of the output's scale
    worst = np.abs(got - whole).max() / np.abs(whole).max()
    assert worst < 1e-5, worst
