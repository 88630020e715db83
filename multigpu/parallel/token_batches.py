"""Batches of token models for data-parallel training: named int64 feeds and per-position labels.

A token model (one whose inputs are int64 ids, and optionally an attention mask) trains on
``X``, the ids ``(B, T)`` or ``{input name: (B, T)}``, and ``y``, the labels ``(B, T)``: the
next token at every position, or :data:`IGNORE_INDEX` where a position is not counted
(padding). The loss is the per-position cross-entropy summed over a shard; the shards' sums
are summed over devices and processes, and the step divides by the number of counted
positions in the whole global batch, as the image path divides by the global batch size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from multigpu.errors import InputError
from multigpu.models.inputs import check_tokens

#: The label of a position that is not counted (torch's and Paddle's ``ignore_index`` default).
IGNORE_INDEX = -100


def is_token_model(model: Any) -> bool:
    """True when ``model`` takes integer inputs (token ids), so it trains on ``(ids, labels)`` sequences."""
    return any(spec.dtype == "int64" for spec in model.inputs.values())


def _vocab(model: Any) -> int:
    """The number of classes of the model's output (the head's width)."""
    return int(model.shapes[model.output][-1])


def check_token_batch(model: Any, X: Any, y: Any) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Return ``(feeds, labels)``: the ids (and mask) as int64 ``{input name: (B, T)}`` and the
    labels as int64 ``(B, T)``; raise InputError naming what is wrong.

    ``X`` is the ids array (a model with one input) or a dict of the model's inputs; every
    label is a class of the output or ``IGNORE_INDEX``, and at least one is counted.
    """
    names = model.input_names
    if isinstance(X, Mapping):
        unknown = [k for k in X if k not in names]
        missing = [k for k in names if k not in X]
        if unknown or missing:
            raise InputError(
                f"model {model.name!r} takes the inputs {list(names)}; the batch "
                + (f"names unknown {unknown}" if unknown else f"lacks {missing}")
            )
        ids, mask = X[names[0]], X.get(names[1]) if len(names) > 1 else None
    elif len(names) == 1:
        ids, mask = X, None
    else:
        raise InputError(
            f"model {model.name!r} takes the inputs {list(names)}: pass the batch as a dict {{name: (batch, tokens)}}"
        )
    ids, mask = check_tokens(model, ids, mask)
    feeds = {names[0]: ids} if mask is None else {names[0]: ids, names[1]: mask}
    y = np.asarray(y)
    if y.shape != ids.shape:
        raise InputError(
            f"labels have shape {y.shape} but input_ids {ids.shape}; give one label per token "
            f"(the next token, or {IGNORE_INDEX} where a position is not counted)"
        )
    if not np.issubdtype(y.dtype, np.integer):
        raise InputError(f"labels have dtype {y.dtype}; labels must be integer token ids")
    classes = _vocab(model)
    bad = ((y < 0) | (y >= classes)) & (y != IGNORE_INDEX)
    if bad.any():
        raise InputError(
            f"label {int(y[bad][0])} is out of range; {model.name} predicts classes 0..{classes - 1} "
            f"({IGNORE_INDEX} marks a position that is not counted)"
        )
    if not (y != IGNORE_INDEX).any():
        raise InputError(f"every label of the batch is {IGNORE_INDEX} (ignored); a batch needs a counted position")
    return feeds, y.astype(np.int64, copy=False)


def counted(labels: np.ndarray) -> int:
    """The number of positions whose label counts (is not ``IGNORE_INDEX``)."""
    return int((labels != IGNORE_INDEX).sum())
