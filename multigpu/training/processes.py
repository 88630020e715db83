"""``train()`` across processes: start the ranks, join a job, share a checkpoint.

``train(processes=N)`` calls ``train_processes``: this process becomes the launcher
(``multigpu.distributed.supervisor``, no framework import), the N ranks run
``python -m multigpu.training.rank_entry SPEC OUT`` and call ``train()`` again,
which joins the job from the environment. Rank 0 writes its ``TrainResult`` to OUT;
a rank that raises writes its exception beside it, so the caller gets the same
``InputError`` (say) as from a single-process run, not just "rank 0 failed".
"""

from __future__ import annotations

import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from multigpu.checks import check_count
from multigpu.contract.registry import backend as get_backend
from multigpu.distributed.job import DEFAULT_TIMEOUT, ENV_TIMEOUT, Job
from multigpu.distributed.rank import broadcast_json, env_seconds, init_process_group, launched, local_devices
from multigpu.distributed.supervisor import run as run_job
from multigpu.errors import CollectiveError, InputError, RankFailedError


def train_processes(processes: int, kwargs: dict[str, Any]) -> Any:
    """Run ``train(**kwargs)`` as ``processes`` ranks on this host; return rank 0's TrainResult.

    Raises the ranks' own error when one failed on its own (e.g. InputError), else
    RankFailedError naming the rank; InputError when ``kwargs`` cannot be pickled.
    """
    check_count(processes, "processes", example=2)
    if launched():
        raise InputError(
            "processes=N starts its own job, but this process is already a rank of one; "
            "call train() without processes inside a launched job"
        )
    try:
        pickled = pickle.dumps(kwargs)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise InputError(
            f"train(processes={processes}) passes its arguments to new processes, and one of "
            f"them cannot be pickled ({exc}); pass module-level functions and plain data"
        ) from exc
    if b"__main__" in pickled:
        raise InputError(
            f"train(processes={processes}) passes its arguments to new processes, which cannot "
            "load a function or class defined in __main__; move it into an importable module"
        )
    # The ranks import what the arguments need from the same places as this process.
    spec = pickle.dumps({"sys_path": list(sys.path), "kwargs": pickled})
    timeout = env_seconds(ENV_TIMEOUT, DEFAULT_TIMEOUT)
    with tempfile.TemporaryDirectory(prefix="multigpu-train-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.pkl", Path(tmp) / "result.pkl"
        spec_path.write_bytes(spec)
        job = Job(kwargs.get("backend", "numpy"), processes, timeout=timeout)
        try:
            run_job(job, [sys.executable, "-m", "multigpu.training.rank_entry", str(spec_path), str(out_path)])
        except RankFailedError as failure:
            own = _own_error(Path(tmp), processes)
            if own is not None:
                raise own from failure
            raise
        with open(out_path, "rb") as f:
            return pickle.load(f)


def _own_error(folder: Path, processes: int) -> BaseException | None:
    """The lowest rank's exception that is not a consequence of another rank's failure."""
    for rank in range(processes):
        path = folder / f"error.rank{rank}.pkl"
        if path.exists():
            try:
                exc = pickle.loads(path.read_bytes())
            except Exception:
                continue
            if not isinstance(exc, (CollectiveError, RankFailedError)):
                return exc
    return None


def join_job(backend: str, devices: Any) -> tuple[Any, list[Any]]:
    """Inside a launched rank: this rank's devices and the checked process group on the first."""
    devices = local_devices(get_backend(backend), devices)
    return init_process_group(backend, device=devices[0]), devices


def share_checkpoint(tr: Any, saved: tuple[list[np.ndarray], dict[str, Any]] | None) -> Any:
    """Give every rank rank 0's checkpoint state (``saved`` is read on rank 0 only).

    Returns ``(params, state)``, params on rank 0 only (None elsewhere: the caller sets
    rank 0's and broadcasts them), or None when there is no checkpoint. Only rank 0
    needs the checkpoint folder, which suits hosts without a shared disk.
    """
    state = broadcast_json(tr.process_group, tr.backend, None if saved is None else saved[1])
    if state is None:
        return None
    return (saved[0] if tr.rank == 0 and saved is not None else None), state
