"""A rank of ``multigpu bench lab``'s jobs across lab hosts:
``python -m multigpu.benchmarks.lab_rank OUT BYTES REPEATS [LINGER]``.

Joins the job (``multigpu launch`` set it up), times ``REPEATS`` allreduces of a float32
buffer of ``BYTES`` after one untimed one, writes ``OUT/rank<r>.json`` with the seconds
of each, and with LINGER (seconds) waits that long after a barrier (writing
``OUT/listening.rank<r>``), so that what the job listens on can be seen.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from multigpu.distributed.rank import init_process_group


def main(argv: list[str]) -> int:
    """Run the rank; return 0."""
    out, nbytes, repeats = Path(argv[0]), int(argv[1]), int(argv[2])
    linger = float(argv[3]) if len(argv) > 3 else 0.0
    group = init_process_group()
    be = group.backend
    buf = be.from_numpy(np.ones(max(1, nbytes // 4), np.float32), group.device)
    group.allreduce_(buf)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        group.allreduce_(buf)
        times.append(time.perf_counter() - t0)
    (out / f"rank{group.rank}.json").write_text(
        json.dumps({"seconds": times, "bytes": nbytes, "world": group.world_size})
    )
    group.barrier()
    if linger:
        (out / f"listening.rank{group.rank}").write_text(str(time.time()))
        time.sleep(linger)
        group.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
