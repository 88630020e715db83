"""Atomic training checkpoints: parameters, epoch, history and random state in one file."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from .errors import CheckpointError

FILENAME = "checkpoint.npz"


def save_checkpoint(folder: str | os.PathLike[str], params: Sequence[np.ndarray], state: dict[str, Any]) -> Path:
    """Write ``params`` and the JSON-able ``state`` to ``folder/checkpoint.npz`` atomically.

    The file is written beside the target and renamed over it, so a crash leaves
    either the previous checkpoint or the new one, never a torn file.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".checkpoint-", suffix=".npz.part", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, state=np.array(json.dumps(state)), **{f"p{i}": p for i, p in enumerate(params)})
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / FILENAME)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return folder / FILENAME


def load_checkpoint(folder: str | os.PathLike[str]) -> Optional[tuple[list[np.ndarray], dict[str, Any]]]:
    """Return ``(params, state)`` from ``folder``, or None when it holds no checkpoint.

    Raises CheckpointError naming the file when it cannot be read.
    """
    path = Path(folder) / FILENAME
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            state = json.loads(str(z["state"]))
            params = [z[f"p{i}"] for i in range(sum(1 for k in z.files if k.startswith("p")))]
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}; delete it to start afresh") from exc
    return params, state
