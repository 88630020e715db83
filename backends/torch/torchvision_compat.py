"""torchvision's Python models (and ``transformers``, which imports torchvision whenever it is installed),
importable where torchvision's compiled ops are not.

# NOTE: the torchvision wheel that pairs with the pinned CPU torch (0.28.0) is a CUDA build: its C++ ops
(``torchvision::nms`` and the rest) do not load against the CPU torch, and ``import torchvision`` then fails
in ``torchvision/_meta_registrations.py``, which registers fake kernels for ``torchvision::nms`` and
``torchvision::qnms`` without first asking whether the ops exist (the other registrations there ask).
The classification models use none of those ops, so defining the two schemas with ``torch.library``
(no kernels: calling them raises) lets the import finish and the models build. Where the compiled ops
do load, torchvision imports as it is.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

#: The schemas torchvision registers fake kernels for unconditionally (from its csrc/ops/nms.cpp).
_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
#: The ``torch.library.Library`` that holds them; kept, because torch drops a library's definitions when it is freed.
_LIBRARY: list[Any] = []


def torchvision_or_none() -> ModuleType | None:
    """``torchvision``, imported (with the two op schemas defined first where its compiled ops do not load),
    or None where it is not installed.

    transformers imports torchvision whenever it is installed (for its image processors), so
    ``transformers.BertModel`` fails the same way until this has run.
    """
    import sys

    import torch

    try:
        import torchvision
    except ImportError:
        return None
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]  # the failed import's half-built modules
        if not _LIBRARY:
            library = torch.library.Library("torchvision", "DEF")
            for schema in _SCHEMAS:
                library.define(schema)
            _LIBRARY.append(library)
        import torchvision
    return torchvision
