"""The entry point of each rank that ``train(processes=N)`` starts.

``python -m multigpu.training.rank_entry SPEC OUT`` unpickles the arguments from SPEC,
calls ``train()`` (which joins the job from the environment) and, on rank 0, writes the
``TrainResult`` to OUT. A rank that raises a ``MultigpuError`` writes it beside OUT, so
the caller re-raises the rank's own error.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Sequence
from pathlib import Path

from multigpu.distributed.rank import launched_rank
from multigpu.errors import MultigpuError
from multigpu.training.trainer import train


def main(argv: Sequence[str] | None = None) -> int:
    """A rank of ``train(processes=N)``: run train() from SPEC, write rank 0's result to OUT."""
    spec, out = sys.argv[1:] if argv is None else argv
    rank = launched_rank()
    with open(spec, "rb") as f:
        outer = pickle.load(f)
    sys.path[:] = [*outer["sys_path"], *(p for p in sys.path if p not in outer["sys_path"])]
    kwargs = pickle.loads(outer["kwargs"])
    try:
        result = train(**kwargs)
    except MultigpuError as exc:
        Path(out).with_name(f"error.rank{rank}.pkl").write_bytes(pickle.dumps(exc))
        raise
    if rank == 0:
        tmp = Path(out).with_suffix(".part")
        tmp.write_bytes(pickle.dumps(result))
        tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
