"""The shipped graph files of published architectures: written from ``multigpu.models`` (never by
hand), the published parameter counts and FLOPs, fork-join, and loadable by name."""

from __future__ import annotations

import subprocess
import sys

import pytest

from multigpu import models
from multigpu.partition import graph_from_model, load_graph
from multigpu.partition.inputs.architectures import ARCHITECTURES, architecture_graph, write_shipped
from multigpu.partition.inputs.graph import _graphs_dir
from multigpu.partition.solvers.forkjoin import structure

# Parameters and multiply-accumulates of torchvision's resnet18, resnet50 and googlenet
# (aux_logits=False), 1000 classes.
PUBLISHED = {"resnet18": (11_689_512, 1.814e9), "resnet50": (25_557_032, 4.09e9), "inception": (6_624_904, 1.50e9)}
# The figures of the graph files at batch 1: layers, FLOPs, parameter bytes and output bytes.
# They equal those of the former hand-written builder, except GoogLeNet's dropout node
# before the classifier (torchvision has one; the builder left it out): 1,024 FLOPs and
# 4,096 output bytes more, 197 layers instead of 196.
SHIPPED = {
    "resnet18": (69, 3_638_006_272, 46_758_048, 32_923_552),
    "resnet50": (175, 8_217_631_232, 102_228_128, 150_247_328),
    "inception": (197, 3_019_034_448 + 1_024, 26_499_616, 49_338_336 + 4_096),
}


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
    g = load_graph(name)
    params, macs = PUBLISHED[name]
    assert g.param_bytes.sum() == 4 * params
    # Convolutions and the classifier: the layers with parameters but BatchNorm's (2 FLOPs per element).
    conv_and_dense = sum(x.flops for x in g.layers if x.param_bytes and x.flops != x.output_bytes / 2)
    assert conv_and_dense / 2 == pytest.approx(macs, rel=0.02)
    assert g.input_bytes == 4 * 3 * 224 * 224 and g.layers[-1].output_bytes == 4 * 1000
    assert (g.n, g.flops.sum(), g.param_bytes.sum(), g.output_bytes.sum()) == SHIPPED[name]
    structure(g)  # residual and Inception blocks nest: fork-join


def test_batch_scales_flops_and_activations_not_parameters():
    one, eight = architecture_graph("resnet50"), architecture_graph("resnet50", batch=8)
    assert (eight.flops == 8 * one.flops).all() and (eight.output_bytes == 8 * one.output_bytes).all()
    assert (eight.param_bytes == one.param_bytes).all() and eight.input_bytes == 8 * one.input_bytes


@pytest.mark.parametrize(
    ("name", "model"), [("resnet18", "resnet18"), ("resnet50", "resnet50"), ("inception", "googlenet")]
)
def test_a_name_loads_the_model_specs_graph(name, model):
    # A built-in model name wins over the shipped file; node for node (names, inputs, FLOPs,
    # parameter and output bytes) the file is the model's graph.
    loaded, built = load_graph(name), graph_from_model(models.get(model))
    assert loaded == built == architecture_graph(name)
    assert loaded.name == (f"{model}(batch=1)" if name in models.MODELS else name)
