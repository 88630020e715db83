"""Checks of the arrays a user feeds a model: images shaped for it, integer labels in range, token ids and masks."""

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


def _table_sizes(model: Any) -> tuple[int | None, int | None]:
    """The vocabulary size of the model's first token embedding and its position table's length."""
    vocab = positions = None
    for node in model.nodes:
        if vocab is None and node.layer.kind == "embedding":
            vocab = node.layer.vocab_size
        if positions is None and node.layer.kind == "position_embedding":
            positions = node.layer.max_positions
    return vocab, positions


def check_tokens(model: Any, ids: Any, mask: Any = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Return ``(ids, mask)`` as int64 arrays for a text model; raise InputError naming what is wrong.

    ``ids`` is (batch, S) integer token ids, each in the model's vocabulary, with S no longer
    than its position table; ``mask`` (Hugging Face's attention mask, 1 for a token and 0 for
    padding) has the shape of ``ids`` and holds 0s and 1s.
    """
    ids = np.asarray(ids)
    if ids.ndim == 1:
        ids = ids[None, :]
    if not np.issubdtype(ids.dtype, np.integer):
        raise InputError(
            f"input_ids have dtype {ids.dtype}; token ids must be integers: pass ids.astype('int64') "
            "(a tokenizer's input_ids)"
        )
    if ids.ndim != 2 or ids.size == 0:
        raise InputError(f"input_ids have shape {ids.shape}; pass (batch, tokens) with at least one token")
    vocab, positions = _table_sizes(model)
    if vocab is not None:
        bad = (ids < 0) | (ids >= vocab)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise InputError(
                f"token id {int(ids[where])} at {where} is outside the vocabulary of {model.name} "
                f"(ids 0..{vocab - 1}); encode the text with the model's own tokenizer"
            )
    if positions is not None and ids.shape[1] > positions:
        raise InputError(
            f"a sequence of {ids.shape[1]} tokens is longer than the position table ({positions} positions); "
            f"truncate the input to {positions} tokens (a tokenizer's truncation to max_length={positions})"
        )
    if mask is None:
        return ids.astype(np.int64, copy=False), None
    mask = np.asarray(mask)
    if mask.ndim == 1 and mask.shape[0] == ids.shape[1]:
        mask = mask[None, :]
    if mask.shape != ids.shape:
        raise InputError(
            f"attention_mask has shape {mask.shape} but input_ids {ids.shape}; pass one 0/1 per token, shaped "
            "as the ids (the tokenizer's attention_mask: 1 for a token, 0 for padding)"
        )
    if not np.isin(mask, (0, 1)).all():
        raise InputError("attention_mask holds values other than 0 and 1; use 1 for a token and 0 for padding")
    return ids.astype(np.int64, copy=False), mask.astype(np.int64, copy=False)
