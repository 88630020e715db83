"""torchvision for the tests: imported through ``multigpu.backends.torch.torchvision_compat`` (which defines
the op schemas that its CUDA wheel's compiled ops fail to register against the CPU torch), or skipped."""

from __future__ import annotations

from types import ModuleType

import pytest

from multigpu.backends.torch.torchvision_compat import torchvision_or_none

__all__ = ["import_torchvision", "torchvision_or_none"]


def import_torchvision() -> ModuleType:
    """``torchvision``, as ``torchvision_or_none`` imports it; skips the calling test where it is not installed."""
    pytest.importorskip("torch")
    torchvision = torchvision_or_none()
    if torchvision is None:
        pytest.skip("torchvision is not installed (pip install 'multigpu[test]')")
    return torchvision
