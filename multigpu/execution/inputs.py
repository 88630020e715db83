"""What ``multigpu run`` feeds a plan: Fashion-MNIST images, random inputs, and the
parameters of a ``multigpu train --checkpoint`` run."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from multigpu.checks import check_count
from multigpu.errors import CheckpointError, InputError, ParamsError
from multigpu.training.checkpoint import FILENAME, load_checkpoint

__all__ = ["Images", "load_images", "load_params", "load_state", "random_inputs"]

IMAGES_SPEC = re.compile(r"fashion-mnist:(test|train):(\d+)(?:-(\d+))?")


@dataclass(frozen=True)
class Images:
    """Inputs with their labels (None for random inputs), class names and a description."""

    x: np.ndarray
    labels: np.ndarray | None
    classes: tuple[str, ...] | None
    source: str


def load_images(
    spec: str, model: Any, data_dir: str | os.PathLike[str] | None = None, progress: bool = False
) -> Images:
    """Fashion-MNIST images by ``"fashion-mnist:test:0-99"`` (split, inclusive row range).

    Raises InputError for a bad spec, a range outside the split, or a model whose
    input is not 1x28x28; DataNotFoundError when the data set is nowhere to be found.
    """
    from multigpu.data import fashion_mnist as fm

    m = IMAGES_SPEC.fullmatch(spec.strip()) if isinstance(spec, str) else None
    if m is None:
        raise InputError(
            f"--images {spec!r} is not understood; write fashion-mnist:test:0-99 "
            f"(split test or train, then a row or an inclusive row range)"
        )
    split, first, last = m.group(1), int(m.group(2)), int(m.group(3) or m.group(2))
    if last < first:
        raise InputError(f"--images {spec!r}: the range {first}-{last} is empty; write FIRST-LAST with FIRST <= LAST")
    if tuple(model.input_shape) != (1, 28, 28):
        raise InputError(
            f"{model.name} takes inputs of shape {tuple(model.input_shape)}, and Fashion-MNIST "
            f"images are (1, 28, 28); use --random N for {model.name}"
        )
    data = fm.load_fashion_mnist(data_dir, progress=progress)  # the search, MD5 check and download of `train`
    x, y = (data.test_images, data.test_labels) if split == "test" else (data.train_images, data.train_labels)
    if last >= len(x):
        raise InputError(f"--images {spec!r}: the {split} split has rows 0-{len(x) - 1}; pick a range inside it")
    return Images(
        x[first : last + 1],
        y[first : last + 1].astype(np.int64),
        fm.CLASSES,
        f"Fashion-MNIST {split} images {first}-{last}",
    )


def random_inputs(model: Any, count: int, seed: int = 0) -> Images:
    """``count`` uniform random inputs in [0, 1) of the model's input shape."""
    check_count(count, "--random", example=8)
    rng = np.random.default_rng(seed)
    return Images(
        rng.random((count, *model.input_shape), dtype=np.float32), None, None, f"{count} random inputs (seed {seed})"
    )


def load_params(path: str | os.PathLike[str]) -> list[np.ndarray]:
    """Parameters from a ``multigpu train --checkpoint`` folder, its ``checkpoint.npz``,
    or an ``.npz`` of arrays saved in model order (``np.savez(path, *params)``).

    Raises ParamsError naming the path when there is nothing usable there.
    """
    p = Path(path)
    if p.is_dir():
        try:
            saved = load_checkpoint(p)
        except CheckpointError as e:
            raise ParamsError(str(e)) from None
        if saved is None:
            raise ParamsError(
                f"--params {str(p)!r} is a folder without {FILENAME}; give the folder of "
                f"`multigpu train --checkpoint DIR` or an .npz file"
            )
        return saved[0]
    if not p.is_file():
        raise ParamsError(
            f"--params {str(p)!r} does not exist; give a `multigpu train --checkpoint` folder or an .npz file"
        )
    try:
        with np.load(p, allow_pickle=False) as z:
            keys = list(z.files)
            for prefix in ("p", "arr_"):
                names = [f"{prefix}{i}" for i in range(sum(1 for k in keys if re.fullmatch(rf"{prefix}\d+", k)))]
                if names and all(n in keys for n in names):
                    return [z[n] for n in names]
    except (OSError, ValueError) as e:
        raise ParamsError(
            f"--params {str(p)!r} is not a readable .npz file ({e}); give a checkpoint folder "
            f"or np.savez(path, *params)"
        ) from None
    raise ParamsError(
        f"--params {str(p)!r} holds arrays {keys[:6]}, not p0, p1, ... (a checkpoint) or "
        f"arr_0, arr_1, ... (np.savez(path, *params)); save the parameters in model order"
    )


def load_state(path: str | os.PathLike[str], model: Any) -> list[np.ndarray] | None:
    """The BatchNorm running statistics a ``multigpu train --checkpoint`` folder (or its
    ``checkpoint.npz``) holds for ``model``, in state order (the first replica's; every
    replica's are equal with synchronized BatchNorm), or None when the file holds none
    (an ``.npz`` of parameters only).

    Raises ParamsError when they do not fit the model.
    """
    p = Path(path)
    folder = p if p.is_dir() else p.parent if p.name == FILENAME else None
    if folder is None or not getattr(model, "batch_norms", None):
        return None
    try:
        saved = load_checkpoint(folder)
    except CheckpointError as e:
        raise ParamsError(str(e)) from None
    rows = None if saved is None else saved[1].get("arrays", {}).get("bn")
    if rows is None:
        return None
    flat = np.asarray(rows, dtype=np.float32)
    flat = flat[0] if flat.ndim == 2 else flat.reshape(-1)  # gather_states: one row per replica
    sizes = [int(np.prod(s)) for s in model.state_shapes]
    if flat.size != sum(sizes):
        raise ParamsError(
            f"--params {str(p)!r} holds {flat.size} BatchNorm statistics per replica but "
            f"{model.name} has {sum(sizes)}; give the checkpoint of a {model.name} run"
        )
    out, at = [], 0
    for shape, size in zip(model.state_shapes, sizes):
        out.append(flat[at : at + size].reshape(shape))
        at += size
    return model.check_state(out)
