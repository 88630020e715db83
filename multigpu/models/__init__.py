"""The model spec: layers as data, composed into DAG models, and the built-in models.

A model is a ``Model``: named nodes in one topological order, each naming its
inputs, built from blocks (a list is a chain, ``Residual`` and ``Parallel`` join
branches) or from explicit ``Node``s; ``Sequential`` is the chain case.
``multigpu.models.lenet()``, ``resnet18()``, ``resnet50()``, ``googlenet()`` and friends build the built-in networks;
``get(name)`` looks one up by name. ``bert()`` and ``gpt()`` build text models on token
ids (``multigpu.models.text_models``), and ``pretrained("all-MiniLM-L6-v2")`` loads a
published checkpoint (``multigpu.models.checkpoints``). ``to_onnx`` writes a model and
its parameters as a standard ONNX file (``multigpu.models.onnx_export``); ``from_onnx`` reads one
back, and ``from_torch``, ``from_paddle`` and ``from_mxnet`` import a framework's own network
through its exporter (``multigpu.models.onnx_import``). A model spec never imports a
framework: a backend walks it.
"""

from __future__ import annotations

from multigpu.models.attention import AttentionMask, MultiHeadAttention
from multigpu.models.batchnorm import BatchNormMode, BatchStatistics, RunningStatistics
from multigpu.models.blocks import Chain, Parallel, Residual
from multigpu.models.checkpoints import SentenceEncoder, load_safetensors, pretrained
from multigpu.models.context import RunContext, dropout_mask
from multigpu.models.dropout import Dropout
from multigpu.models.generate import generate
from multigpu.models.graph import LayerStats, Model
from multigpu.models.layers import (
    Add,
    AvgPool2d,
    BatchNorm2d,
    Concat,
    ContextLayer,
    Conv2d,
    Dense,
    Flatten,
    GlobalAvgPool2d,
    Identity,
    Layer,
    MaxPool2d,
    ReLU,
)
from multigpu.models.node import INPUT, Input, Node
from multigpu.models.onnx_export import to_onnx
from multigpu.models.onnx_import import OnnxImport, from_mxnet, from_onnx, from_paddle, from_torch
from multigpu.models.sequential import Sequential
from multigpu.models.text_models import bert, decoder_block, encoder_block, gpt
from multigpu.models.transformer_layers import (
    GELU,
    Embedding,
    LayerNorm,
    PositionEmbedding,
    Sigmoid,
    Tanh,
    TokenTypeEmbedding,
)
from multigpu.models.zoo import (
    MODELS,
    alexnet,
    basic_block,
    basic_conv,
    bottleneck_block,
    get,
    googlenet,
    inception_block,
    lenet,
    resnet,
    resnet18,
    resnet18_textbook,
    resnet50,
)

__all__ = [
    "Add",
    "AttentionMask",
    "AvgPool2d",
    "BatchNorm2d",
    "BatchNormMode",
    "BatchStatistics",
    "Chain",
    "Concat",
    "ContextLayer",
    "Conv2d",
    "Dense",
    "Dropout",
    "Embedding",
    "Flatten",
    "GELU",
    "GlobalAvgPool2d",
    "INPUT",
    "Identity",
    "Input",
    "Layer",
    "LayerNorm",
    "LayerStats",
    "MODELS",
    "MaxPool2d",
    "Model",
    "MultiHeadAttention",
    "Node",
    "Parallel",
    "PositionEmbedding",
    "ReLU",
    "Residual",
    "RunContext",
    "RunningStatistics",
    "SentenceEncoder",
    "Sequential",
    "Sigmoid",
    "Tanh",
    "TokenTypeEmbedding",
    "alexnet",
    "basic_block",
    "basic_conv",
    "bottleneck_block",
    "bert",
    "decoder_block",
    "dropout_mask",
    "encoder_block",
    "get",
    "generate",
    "googlenet",
    "gpt",
    "inception_block",
    "lenet",
    "load_safetensors",
    "pretrained",
    "resnet",
    "resnet18",
    "resnet18_textbook",
    "resnet50",
    "to_onnx",
    "from_onnx",
    "from_torch",
    "from_paddle",
    "from_mxnet",
    "OnnxImport",
]
