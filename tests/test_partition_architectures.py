"""The shipped graph files of published architectures: written by the generator (never by
hand), the published parameter counts and FLOPs, fork-join, and loadable by name."""

from __future__ import annotations

import subprocess
import sys

import pytest

from multigpu.partition import load_graph
from multigpu.partition.inputs.architectures import ARCHITECTURES, write_shipped
from multigpu.partition.inputs.graph import _graphs_dir, shipped_graphs
from multigpu.partition.solvers.forkjoin import structure

# Parameters of torchvision's resnet18, resnet50 and googlenet (aux_logits=False), 1000 classes.
PUBLISHED = {"resnet18": (11_689_512, 1.814e9), "resnet50": (25_557_032, 4.09e9), "inception": (6_624_904, 1.50e9)}


def test_the_shipped_files_are_what_the_generator_writes():
    assert write_shipped(_graphs_dir(), check=True) == []
    proc = subprocess.run(
        [sys.executable, "-m", "multigpu.partition.inputs.architectures", "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_published_parameters_and_multiply_accumulates(name):
    g = load_graph(name) if name in shipped_graphs() else ARCHITECTURES[name]()
    params, macs = PUBLISHED[name]
    assert g.param_bytes.sum() == 4 * params
    # Convolutions and the classifier: the layers with parameters but BatchNorm's (2 FLOPs per element).
    conv_and_dense = sum(x.flops for x in g.layers if x.param_bytes and x.flops != x.output_bytes / 2)
    assert conv_and_dense / 2 == pytest.approx(macs, rel=0.02)
    assert g.input_bytes == 4 * 3 * 224 * 224 and g.layers[-1].output_bytes == 4 * 1000
    structure(g)  # residual and Inception blocks nest: fork-join


def test_batch_scales_flops_and_activations_not_parameters():
    one, eight = ARCHITECTURES["resnet50"](), ARCHITECTURES["resnet50"](batch=8)
    assert (eight.flops == 8 * one.flops).all() and (eight.output_bytes == 8 * one.output_bytes).all()
    assert (eight.param_bytes == one.param_bytes).all() and eight.input_bytes == 8 * one.input_bytes


def test_the_generated_resnet18_is_the_model_specs_graph():
    # With #15's graph models, load_graph("resnet18") comes from the model (a built-in name wins):
    # node for node (names, inputs, FLOPs, parameter and output bytes) it is the generated graph.
    from multigpu import models

    generated, loaded = ARCHITECTURES["resnet18"](), load_graph("resnet18")
    assert loaded == generated
    if "resnet18" in models.MODELS:
        assert loaded.name == "resnet18(batch=1)"
    else:  # before the graph models: the shipped file
        assert loaded.name == "resnet18"
