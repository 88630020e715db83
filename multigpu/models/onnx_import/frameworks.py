"""From a framework's own network to a ``Model``: its exporter writes ONNX, ``from_onnx`` reads it.

Each function imports its framework lazily and exports at a pinned opset into a temporary
folder: torch through the TorchScript exporter (``dynamo=False``; the default dynamo exporter
needs onnxscript), Paddle through the two steps of ``paddle.onnx.export`` (``paddle.jit.save``, then paddle2onnx), MXNet
through ``mx.onnx.export_model``. The batch axis of every input is exported as dynamic where
the exporter allows it, so the imported model runs at any batch.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from multigpu.errors import MissingDependencyError, OnnxError
from multigpu.models.onnx_import.importer import OnnxImport, from_onnx

#: The opset torch's TorchScript exporter writes for ``from_torch`` (it reaches 20; 17 has
#: LayerNormalization, and Gelu only arrived in 20, which the exporter writes as Erf before it).
TORCH_OPSET = 17
#: The opset for Paddle's exporter (MXNet 1.9's writes the newest its onnx package knows).
PADDLE_OPSET = 13


def _as_tuple(example_inputs: Any) -> tuple[Any, ...]:
    return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)


def from_torch(
    module: Any,
    example_inputs: Any,
    *,
    input_names: Sequence[str] | None = None,
    output: str | None = None,
    group: int | Callable[[str], str | None] | None = None,
    opset: int = TORCH_OPSET,
    dynamic_batch: bool = True,
) -> OnnxImport:
    """Import a torch ``nn.Module`` by exporting it to ONNX (TorchScript exporter) at ``opset``.

    ``example_inputs`` is a tensor or a tuple of them (batch axis first); the module is exported
    in eval mode with BatchNorm kept as its own op (``TrainingMode.PRESERVE``), its train/eval
    mode restored afterwards. ``input_names`` names the graph inputs (default ``input``,
    ``input_1``, ...); outputs are ``output``, ``output_1``, ...: pick one with ``output=`` when the
    module returns several. With ``dynamic_batch`` the inputs' axis 0 is exported dynamic.
    """
    try:
        import torch
    except ImportError:
        raise MissingDependencyError("from_torch needs torch: pip install 'multigpu[torch,onnx]'") from None
    args = _as_tuple(example_inputs)
    names = list(input_names) if input_names is not None else [input_name(k) for k in range(len(args))]
    if len(names) != len(args):
        raise OnnxError(f"input_names={names} names {len(names)} inputs but {len(args)} example inputs were given")
    training = module.training
    module.eval()  # before the probe too: a forward in training mode would move BatchNorm's statistics
    try:
        with torch.no_grad():
            probe = module(*args)
        outs = len(probe) if isinstance(probe, (tuple, list)) else 1
        out_names = ["output" if k == 0 else f"output_{k}" for k in range(outs)]
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "model.onnx")
            dynamic = {n: {0: "batch"} for n in names + out_names} if dynamic_batch else None
            torch.onnx.export(
                module,
                args,
                path,
                dynamo=False,
                opset_version=opset,
                training=torch.onnx.TrainingMode.PRESERVE,
                # NOTE: torch's constant folding pre-transposes Linear weights into new initializers
                # named onnx::MatMul_N; unfolded, the Transpose folds here and the weight keeps its name.
                do_constant_folding=False,
                # NOTE: otherwise the exporter merges initializers of equal value in an eval-mode module
                # (squeezenet's zero biases, a fresh BatchNorm's ones): torch's separate parameters would
                # become one shared parameter here, tied in training. As inputs, they all stay apart.
                keep_initializers_as_inputs=True,
                input_names=names,
                output_names=out_names,
                dynamic_axes=dynamic,
            )
            shapes = {n: tuple(a.shape) for n, a in zip(names, args)}
            return from_onnx(path, shapes, output=output, group=group, name=type(module).__name__)
    finally:
        module.train(training)


def input_name(k: int) -> str:
    """The name ``from_torch`` and ``from_mxnet`` give graph input ``k``: ``input``, ``input_1``, ..."""
    return "input" if k == 0 else f"input_{k}"


def from_paddle(
    layer: Any,
    input_spec: Sequence[Any],
    *,
    input_shapes: Any = None,
    output: str | None = None,
    group: int | Callable[[str], str | None] | None = None,
    opset: int = PADDLE_OPSET,
) -> OnnxImport:
    """Import a Paddle ``nn.Layer`` through Paddle's exporter (``paddle.jit.save``, then paddle2onnx).

    ``input_spec`` is a list of ``paddle.static.InputSpec``; a None (dynamic) dimension in it
    needs its size in ``input_shapes`` (``{name: shape}``, batch first). The layer is exported in
    eval mode.
    """
    try:
        import paddle
    except ImportError:
        raise MissingDependencyError("from_paddle needs paddle: pip install 'multigpu[paddle,onnx]'") from None
    try:
        import paddle2onnx
    except ImportError:
        raise MissingDependencyError(
            "from_paddle needs paddle2onnx (paddle.onnx.export calls it): pip install paddle2onnx==2.1.0 "
            "(it needs onnx<=1.17.0)"
        ) from None
    training = layer.training
    layer.eval()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            prefix = str(Path(tmp) / "model")
            # NOTE: paddle.onnx.export is jit.save then paddle2onnx.export, which by default folds
            # constants with Polygraphy after setting POLYGRAPHY_AUTOINSTALL_DEPS=1: Polygraphy then
            # pip-installs onnx_graphsurgeon, and with it numpy 2, into the running environment.
            # The two steps are taken here with paddle2onnx's optimizer off (from_onnx folds
            # constants itself); paddle.onnx.export offers no way to turn it off.
            paddle.jit.save(layer, prefix, input_spec=list(input_spec))
            pir = Path(prefix + ".json")
            program = pir if pir.is_file() else Path(prefix + ".pdmodel")
            params = Path(prefix + ".pdiparams")
            path = prefix + ".onnx"
            paddle2onnx.export(str(program), str(params) if params.is_file() else "", path, opset, optimize_tool="None")
            if not Path(path).is_file():  # paddle2onnx logs its errors and returns
                raise OnnxError(
                    f"paddle2onnx {paddle2onnx.__version__} could not export {type(layer).__name__} at opset "
                    f"{opset}: see its log above; a newer opset= may have the op it lacks"
                )
            return from_onnx(path, input_shapes, output=output, group=group, name=type(layer).__name__)
    finally:
        layer.train() if training else layer.eval()


def from_mxnet(
    block: Any,
    example_inputs: Any,
    *,
    output: str | None = None,
    group: int | Callable[[str], str | None] | None = None,
    dynamic_batch: bool = True,
) -> OnnxImport:
    """Import a Gluon ``HybridBlock`` through ``mx.onnx.export_model`` (MXNet 1.9).

    ``example_inputs`` is an NDArray or numpy array, or a tuple of them (batch first). The block
    is hybridized and run once on them, then exported with its parameters; with
    ``dynamic_batch`` the inputs' axis 0 is exported dynamic.
    """
    try:
        import mxnet as mx
    except ImportError:
        raise MissingDependencyError("from_mxnet needs mxnet: pip install 'multigpu[mxnet,onnx]'") from None
    args = [a if isinstance(a, mx.nd.NDArray) else mx.nd.array(np.asarray(a)) for a in _as_tuple(example_inputs)]
    block.hybridize()
    block(*args)
    with tempfile.TemporaryDirectory() as tmp:
        prefix = str(Path(tmp) / "model")
        block.export(prefix)
        shapes = [tuple(a.shape) for a in args]
        dynamic = [(None, *s[1:]) for s in shapes] if dynamic_batch else None
        path = str(Path(tmp) / "model.onnx")
        mx.onnx.export_model(
            f"{prefix}-symbol.json",
            f"{prefix}-0000.params",
            shapes,
            [np.dtype(a.dtype).type for a in args],
            path,
            dynamic=dynamic_batch,
            dynamic_input_shapes=dynamic,
        )
        import onnx

        proto = onnx.load(path)
        names = [i.name for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}]
        return from_onnx(proto, dict(zip(names, shapes)), output=output, group=group, name=type(block).__name__)
