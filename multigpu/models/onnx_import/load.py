"""Reading an ONNX file: the ``onnx`` package (imported lazily), external data, the opset."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from multigpu.errors import MissingDependencyError, OnnxError

#: The default-domain opsets the importer reads (all that ONNX 1.17.0 defines from 9; torch's
#: TorchScript exporter writes up to 20).
OPSETS = range(9, 23)


def need_onnx() -> Any:
    """The ``onnx`` module; MissingDependencyError naming the extra when it is not installed."""
    try:
        import onnx
    except ImportError:
        raise MissingDependencyError(
            "importing ONNX models needs the onnx package: pip install 'multigpu[onnx]' (onnx==1.17.0)"
        ) from None
    return onnx


def load_model(source: Any) -> Any:
    """Return the ``ModelProto`` of ``source`` (a path or a ModelProto), with its external data.

    Raises OnnxError for a file that is not ONNX, a tensor whose external data file is
    missing, and a model without a default-domain opset in ``OPSETS``.
    """
    onnx = need_onnx()
    if isinstance(source, onnx.ModelProto):
        proto, base = source, None
    else:
        if not isinstance(source, (str, os.PathLike)):
            raise OnnxError(f"from_onnx takes a path or an onnx.ModelProto, got {type(source).__name__}")
        path = Path(source)
        if not path.is_file():
            raise OnnxError(f"{str(path)!r} is not a file; pass the path of a .onnx model")
        try:
            proto = onnx.load(str(path), load_external_data=False)
        except Exception as exc:  # protobuf's DecodeError and friends: the bytes are not a ModelProto
            raise OnnxError(f"{str(path)!r} is not an ONNX model ({type(exc).__name__}: {exc})") from None
        if not proto.graph.node and not proto.graph.output:
            raise OnnxError(f"{str(path)!r} is not an ONNX model: it holds no graph (is it a different file format?)")
        base = path.parent
    _load_external(onnx, proto, base)
    opset_version(proto)
    return proto


def _load_external(onnx: Any, proto: Any, base: Path | None) -> None:
    """Fill in tensors stored outside the file; OnnxError naming the tensor and the file when one is missing."""
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    for tensor in proto.graph.initializer:
        if not uses_external_data(tensor):
            continue
        info = {e.key: e.value for e in tensor.external_data}
        where = info.get("location", "?")
        if base is None:
            raise OnnxError(
                f"initializer {tensor.name!r} is stored in the external file {where!r}; pass the model's path "
                "(not a ModelProto loaded without its data) so that the file can be found"
            )
        if not (base / where).is_file():
            raise OnnxError(
                f"initializer {tensor.name!r} is stored in the external file {where!r}, which is missing from "
                f"{str(base)!r}; copy it beside the .onnx file"
            )
        load_external_data_for_tensor(tensor, str(base))
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]


def opset_version(proto: Any) -> int:
    """The model's default-domain opset; OnnxError when it is outside ``OPSETS``."""
    versions = {o.domain or "ai.onnx": o.version for o in proto.opset_import}
    version = versions.get("ai.onnx")
    if version is None:
        raise OnnxError(f"the model imports no default ONNX opset (only {sorted(versions)}); it cannot be read")
    if version not in OPSETS:
        raise OnnxError(
            f"the model uses ONNX opset {version}; the importer reads opsets {OPSETS.start}..{OPSETS.stop - 1}: "
            "convert it with onnx.version_converter.convert_version(model, 17)"
        )
    return int(version)
