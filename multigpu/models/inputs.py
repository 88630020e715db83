"""Checks of the arrays a user feeds a model: images shaped for it, integer labels in range."""

from __future__ import annotations

from typing import Any

import numpy as np

from multigpu.errors import InputError


def check_images(model: Any, X: Any, what: str = "X") -> np.ndarray:
    """Return ``X`` (a batch of ``model``'s inputs) as float32; raise InputError naming what is wrong.

    ``what`` names the argument in the messages.

    Finiteness is checked after the cast, so a float64 value beyond float32's range
    (which the cast turns into infinity) is refused too.
    """
    X = np.asarray(X)
    want = model.input_shape
    if X.ndim != len(want) + 1 or tuple(X.shape[1:]) != want:
        raise InputError(f"{what} has shape {X.shape}; {model.name} needs (batch, {', '.join(map(str, want))})")
    if len(X) == 0:
        raise InputError(f"{what} is empty; pass at least one example")
    if not np.issubdtype(X.dtype, np.floating):
        raise InputError(
            f"{what} has dtype {X.dtype}; pass floating-point images (float32), e.g. X.astype('float32') / 255"
        )
    with np.errstate(over="ignore"):  # overflow becomes inf, refused just below
        X = X.astype(np.float32, copy=False)
    if not np.isfinite(X).all():
        raise InputError(f"{what} contains NaN or infinity, or values beyond float32's range (|x| > 3.4e38)")
    return X


def check_batch(model: Any, X: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(X, y)`` as float32/int64 arrays; raise InputError naming what is wrong."""
    X = check_images(model, X)
    y = np.asarray(y)
    if y.shape != (len(X),):
        raise InputError(f"y has shape {y.shape}; it must be ({len(X)},), one integer label per row of X")
    if not np.issubdtype(y.dtype, np.integer):
        raise InputError(f"y has dtype {y.dtype}; labels must be integers")
    classes = model.num_classes
    bad = (y < 0) | (y >= classes)
    if bad.any():
        raise InputError(f"label {int(y[bad][0])} is out of range; {model.name} has classes 0..{classes - 1}")
    return X, y.astype(np.int64, copy=False)
