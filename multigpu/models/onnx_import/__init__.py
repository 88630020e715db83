"""ONNX in: ``from_onnx`` turns an ONNX graph into a ``Model`` with its parameters and state, and
``from_torch``, ``from_paddle`` and ``from_mxnet`` get there from a framework's own network
through that framework's exporter. Needs the ``onnx`` extra (``pip install 'multigpu[onnx]'``);
the ``onnx`` package is imported only when a function here is called.
"""

from __future__ import annotations

from multigpu.models.onnx_import.frameworks import TORCH_OPSET, from_mxnet, from_paddle, from_torch
from multigpu.models.onnx_import.importer import RUNTIME_OPS, SUPPORTED_OPS, OnnxImport, from_onnx

__all__ = [
    "RUNTIME_OPS",
    "SUPPORTED_OPS",
    "TORCH_OPSET",
    "OnnxImport",
    "from_mxnet",
    "from_onnx",
    "from_paddle",
    "from_torch",
]
