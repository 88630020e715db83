"""An adapter written the quick way a third party might: NumPy arrays and no checks of its own.

It reuses the reference's ops and backward rules, but behaves as leniently as the
reference used to: ``from_numpy`` casts booleans and complex numbers, labels wrap
like numpy indexing (-1 is the last class), an op accepts operands from different
devices, ``assign_`` broadcasts and ``split`` takes any sizes. Behind
``multigpu.contract.checked`` (what ``multigpu.backend("lenient")`` returns) it must still
raise exactly what the built-in adapters raise: the conformance suite proves that
the contract is enforced by the core, not by each adapter's good manners.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from multigpu.backends.numpy.adapter import NumpyBackend, Var
from multigpu.contract.protocol import Device


class LenientBackend(NumpyBackend):
    """The NumPy reference without its own strictness."""

    name = "lenient"
    tensor_type = Var

    def from_numpy(self, array: Any, device: Device) -> Var:
        """Cast anything numeric: bool to int64, complex to float32 (dropping the imaginary part)."""
        a = np.asarray(array)
        dtype = np.int64 if a.dtype.kind in "iub" else np.float32
        return Var(np.array(a.real if a.dtype.kind == "c" else a, dtype=dtype), device)

    def _node(self, data: np.ndarray, parents: tuple[Var, ...], backward: Any) -> Var:
        return Var(data, parents[0].device, parents, backward)  # no device check

    def softmax_cross_entropy(self, logits: Var, labels: Var) -> Var:
        """Wraps out-of-range labels, as numpy indexing does."""
        wrapped = Var(labels.data % logits.data.shape[1], labels.device)
        return super().softmax_cross_entropy(logits, wrapped)
