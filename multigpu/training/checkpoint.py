"""Atomic training checkpoints: parameters, optimizer state, BatchNorm statistics, epoch, history and
random state in one file."""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from multigpu.data.files import atomic_write
from multigpu.errors import CheckpointError

FILENAME = "checkpoint.npz"
#: Keys every checkpoint's state holds; a file without them is not ours or is damaged.
STATE_KEYS = ("config", "epoch", "rng", "test_acc", "train_loss", "sec_per_epoch")


def save_checkpoint(
    folder: str | os.PathLike[str],
    params: Sequence[np.ndarray],
    state: dict[str, Any],
    arrays: dict[str, np.ndarray] | None = None,
) -> Path:
    """Write ``params``, the JSON-able ``state`` and named ``arrays`` (optimizer buffers,
    BatchNorm running statistics) to ``folder/checkpoint.npz`` atomically.

    The file is written beside the target, flushed, renamed over it and the folder
    flushed (``multigpu.data.files.atomic_write``), so a crash leaves either the previous
    checkpoint or the new one, never a torn file. It gets the umask's normal mode.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_write(folder / FILENAME) as f:
        named: dict[str, Any] = {"state": np.array(json.dumps(state)), **{f"p{i}": p for i, p in enumerate(params)}}
        named.update({f"a_{k}": np.asarray(v) for k, v in (arrays or {}).items()})
        np.savez(f, **named)
    return folder / FILENAME


def load_checkpoint(folder: str | os.PathLike[str]) -> tuple[list[np.ndarray], dict[str, Any]] | None:
    """Return ``(params, state)`` from ``folder``, or None when it holds no checkpoint.

    The named arrays saved with it are in ``state["arrays"]`` (a dict of numpy arrays).

    Raises CheckpointError naming the file when it cannot be read, is not a
    checkpoint, or lacks part of its state.
    """
    path = Path(folder) / FILENAME
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            state = json.loads(str(z["state"]))
            params = [z[f"p{i}"] for i in range(sum(1 for k in z.files if k.startswith("p")))]
            arrays = {k[2:]: z[k] for k in z.files if k.startswith("a_")}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}; delete it to start afresh") from exc
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {', '.join(missing)}; delete it to start afresh")
    state["arrays"] = arrays
    return params, state
