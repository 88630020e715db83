"""Atomic training checkpoints: parameters, optimizer state, BatchNorm statistics, epoch, history and
random state in one file; ``Checkpointer``, the callback that restores one and saves every epoch."""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from multigpu.data.files import atomic_write, check_writable_dir
from multigpu.errors import CheckpointError, ParamsError
from multigpu.training.callbacks import Callback
from multigpu.training.processes import share_checkpoint

#: The ``multigpu.training.Trainer`` (typed loosely: the trainer imports this module).
TrainerLike = Any

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


class Checkpointer(Callback):
    """Resume from ``folder`` at the start of a run and save to it after every epoch.

    Only the writing rank (rank 0) reads and writes the folder, at construction, so a
    damaged file fails before any training; the other ranks receive its state. A
    checkpoint written with other settings (``config``) raises CheckpointError.
    """

    def __init__(self, folder: str | os.PathLike[str], writer: bool) -> None:
        self.folder = folder
        self.saved = load_checkpoint(check_writable_dir(folder, "checkpoint")) if writer else None

    def restore(self, trainer: TrainerLike) -> int:
        """Load the saved run into ``trainer`` (every rank takes part); return the epoch to start at."""
        tr, saved = trainer.parallel, self.saved
        arrays = saved[1].pop("arrays") if saved is not None else None  # numpy: stays on rank 0
        if tr.world_size > 1:
            saved = share_checkpoint(tr, saved)  # only rank 0 needs the folder
        if saved is None:
            return 0
        params, state = saved
        diff = {k: (state["config"].get(k), v) for k, v in trainer.config.items() if state["config"].get(k) != v}
        if diff:
            raise CheckpointError(
                f"checkpoint in {self.folder} belongs to a different run (saved vs now: {diff}); "
                "use another folder or the same settings"
            )
        try:
            if params is not None:  # None on ranks other than 0: broadcast below
                tr.set_params(params)
                buffers = [(arrays or {})[f"opt{j}"] for j in range(tr.optimizer.buffers)]
                tr.set_optimizer_state(buffers, state.get("steps", 0))
            tr.steps = int(state.get("steps", 0))
            trainer.rng.bit_generator.state = state["rng"]
        except (ParamsError, TypeError, ValueError, KeyError) as exc:
            raise self._damaged(exc) from exc
        tr.broadcast_params()  # rank 0's restored parameters to every rank (no-op in one process)
        if tr.model.batch_norms:
            try:  # every replica's own running statistics, rank 0's file to every rank
                tr.scatter_states(arrays.get("bn") if arrays is not None else None)
            except (ParamsError, AttributeError) as exc:
                raise self._damaged(exc) from exc
        for key in ("test_acc", "train_loss", "sec_per_epoch", "val_loss", "step_loss"):
            getattr(trainer.result, key).extend(state.get(key, []))  # a token model's losses, if any
        return int(state["epoch"])

    def _damaged(self, exc: BaseException) -> CheckpointError:
        return CheckpointError(f"checkpoint in {self.folder} is damaged ({exc}); delete it to start afresh")

    def on_epoch_end(self, trainer: TrainerLike, epoch: int, logs: dict[str, float]) -> None:
        """Save the finished epoch on rank 0, then tell every callback where it went."""
        if trainer.rank != 0:
            return
        tr, result = trainer.parallel, trainer.result
        extra = {f"opt{j}": a for j, a in enumerate(tr.get_optimizer_state())}
        if tr.model.batch_norms:
            extra["bn"] = trainer.epoch_stats
        state = {
            "config": trainer.config,
            "epoch": epoch + 1,
            "rng": trainer.rng.bit_generator.state,
            "test_acc": result.test_acc,
            "train_loss": result.train_loss,
            "sec_per_epoch": result.sec_per_epoch,
            "val_loss": result.val_loss,
            "step_loss": result.step_loss,
            "steps": tr.steps,
        }
        path = save_checkpoint(self.folder, trainer.epoch_params, state, extra)
        trainer.callbacks.on_checkpoint(trainer, epoch, path)
