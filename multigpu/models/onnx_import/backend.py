"""An ``onnx.backend.base.Backend`` for each multigpu backend, so ONNX's own node tests run against it.

``onnx_backend("torch")`` returns a Backend class whose ``prepare`` imports the model with
``from_onnx`` and whose rep runs it on that multigpu backend: the outside check that the
frameworks compute what ONNX says. A graph with several outputs is imported once per
output (a ``Model`` has one). Outputs come back in the graph's declared element types
(multigpu computes in float32 and int64). This module imports ``onnx`` when it is imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx import ModelProto
from onnx.backend.base import Backend, BackendRep

from multigpu.contract.protocol import Device
from multigpu.contract.registry import backend
from multigpu.errors import OnnxError
from multigpu.models.context import RunContext
from multigpu.models.onnx_import.importer import OnnxImport, from_onnx
from multigpu.models.onnx_numpy import numpy_dtype

_CPU = Device("cpu", 0)


class MultigpuRep(BackendRep):
    """A prepared ONNX model: one import per graph output, run on one multigpu backend.

    The node tests feed what the importer needs as constants (a Reshape's shape, a Slice's
    bounds, axes, a Conv's weights) as graph inputs. The rep imports the graph with every
    input a run-time input; when that raises OnnxError, it imports it again at ``run`` with
    every input but the first made an initializer of the values given (the same computation,
    with those inputs folded or taken as parameters), and says so in ``folded_inputs``.
    """

    def __init__(self, model: ModelProto, backend_name: str):
        self.model = model
        self.be = backend(backend_name)
        inits = {t.name for t in model.graph.initializer}
        self.inputs = [i.name for i in model.graph.input if i.name not in inits]
        self.dtypes = [numpy_dtype(out.type.tensor_type.elem_type) for out in model.graph.output]
        self.folded_inputs: list[str] = []
        try:
            self.imports: list[OnnxImport] | None = self._import(model)
        except OnnxError:
            self.imports = None  # import at run time, with the inputs but the first as constants

    def _import(self, model: ModelProto) -> list[OnnxImport]:
        inits = {t.name for t in model.graph.initializer}
        shapes = {
            i.name: tuple(d.dim_value for d in i.type.tensor_type.shape.dim)
            for i in model.graph.input
            if i.name not in inits
        }
        return [from_onnx(model, shapes, output=out.name) for out in model.graph.output]

    def _folded(self, feeds: dict[str, np.ndarray]) -> list[OnnxImport]:
        from onnx import numpy_helper

        model = ModelProto()
        model.CopyFrom(self.model)
        keep = self.inputs[:1]
        self.folded_inputs = self.inputs[1:]
        for name in self.folded_inputs:
            model.graph.initializer.append(numpy_helper.from_array(np.asarray(feeds[name]), name))
        kept = [i for i in model.graph.input if i.name in keep]
        del model.graph.input[:]
        model.graph.input.extend(kept)
        return self._import(model)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run every output's model on ``inputs`` (in graph-input order, or a dict by name)."""
        feeds = dict(inputs) if isinstance(inputs, dict) else dict(zip(self.inputs, inputs))
        imports = self.imports if self.imports is not None else self._folded(feeds)
        outs = []
        for imp, dtype in zip(imports, self.dtypes):
            be = self.be
            params = [be.from_numpy(p, _CPU) for p in imp.params]
            state = [be.from_numpy(s, _CPU) for s in imp.state] or None
            tensors = {k: be.from_numpy(_array(feeds[k]), _CPU) for k in imp.model.input_names}
            result = imp.model.run(be, params, tensors, state=state, context=RunContext(devices=[_CPU]))
            outs.append(be.to_numpy(result[imp.output]).astype(dtype))
        return tuple(outs)


def _array(value: Any) -> np.ndarray:
    arr = np.ascontiguousarray(value)
    return arr.astype(np.int64) if arr.dtype == bool else arr  # a boolean input is a 0/1 mask here


def onnx_backend(backend_name: str) -> type[Backend]:
    """An ``onnx.backend.base.Backend`` class that runs ONNX models on the multigpu backend ``backend_name``."""

    class MultigpuBackend(Backend):
        @classmethod
        def prepare(cls, model: ModelProto, device: str = "CPU", **kwargs: Any) -> MultigpuRep:
            return MultigpuRep(model, backend_name)

        @classmethod
        def supports_device(cls, device: str) -> bool:
            return device == "CPU"

        @classmethod
        def run_node(cls, node: Any, inputs: Any, device: str = "CPU", outputs_info: Sequence | None = None,
                     **kwargs: Any) -> tuple[Any, ...] | None:  # fmt: skip
            raise NotImplementedError("run a one-node model through prepare(); nodes alone are not imported")

    MultigpuBackend.__name__ = MultigpuBackend.__qualname__ = f"Multigpu{backend_name.capitalize()}Backend"
    return MultigpuBackend
