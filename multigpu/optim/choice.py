"""Optimizers by name (``multigpu train --optimizer``)."""

from __future__ import annotations

from typing import Any

from multigpu.errors import InputError
from multigpu.optim.adamw import AdamW
from multigpu.optim.base import Optimizer
from multigpu.optim.sgd import SGD

#: Names ``make_optimizer`` knows.
OPTIMIZERS = ("sgd", "adamw")


def make_optimizer(spec: Any) -> Optimizer:
    """Return ``spec`` if it is an Optimizer, else the named one with its defaults
    (``"sgd"``: plain SGD, ``"adamw"``: torch's AdamW defaults); raise InputError otherwise."""
    if isinstance(spec, Optimizer):
        return spec
    if spec == "sgd":
        return SGD()
    if spec == "adamw":
        return AdamW()
    raise InputError(
        f"optimizer={spec!r} is unknown; use one of {list(OPTIMIZERS)} or an optimizer object, "
        "e.g. multigpu.optim.SGD(momentum=0.9, weight_decay=5e-4)"
    )
