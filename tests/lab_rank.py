"""One rank of a job across two lab hosts; ``tests/test_lab.py`` runs it on each host as
``multigpu launch --nnodes 2 --node-rank R --nproc-per-node 1 ... -- tests/lab_rank.py OUT [LINGER]``.

Rank 0 also trains the same steps in one process on two CPU devices (the reference the
two hosts must match) and times a few allreduces of 1 MiB across the link. Each rank
writes ``OUT/rank<r>.npz``; with LINGER (seconds) the ranks wait that long after a
barrier, so that a test can see what the job listens on while it runs. With ``loop``
instead, the ranks allreduce until the job is stopped (a link pulled, a host killed).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from rank_helpers import outside_the_job

from multigpu import models
from multigpu.distributed.rank import init_process_group
from multigpu.parallel.agreement import random_batches, train_steps
from multigpu.parallel.data_parallel import DataParallel

OUT = Path(sys.argv[1])
LOOP = len(sys.argv) > 2 and sys.argv[2] == "loop"
LINGER = float(sys.argv[2]) if len(sys.argv) > 2 and not LOOP else 0.0
group = init_process_group()
be, rank, name = group.backend, group.rank, group.backend.name
if LOOP:
    t = be.from_numpy(np.ones(1000, np.float32), group.device)
    group.allreduce_(t)
    (OUT / f"joined.rank{rank}").write_text(str(time.time()))
    while True:
        group.allreduce_(t)
        time.sleep(0.05)


m = models.lenet()
start = m.init_params(seed=3)
tr = DataParallel(m, backend=name, devices="cpu:1", lr=0.3, params=start, process_group=group)
batches = random_batches(m, steps=4, batch=26, seed=5)  # 13 rows on each host
losses = [tr.train_batch(X, y) for X, y in batches]
arrays = {f"p{i}": p for i, p in enumerate(tr.get_params())}
# Bus bandwidth of a 1 MiB allreduce across the hosts (2 ranks: each sends and receives it once).
buf = be.from_numpy(np.ones(2**18, np.float32), group.device)
group.allreduce_(buf)
times = []
for _ in range(3):
    t0 = time.perf_counter()
    group.allreduce_(buf)
    times.append(time.perf_counter() - t0)
arrays["allreduce_seconds"] = np.array(times)
if rank == 0:
    with outside_the_job():
        ref_losses, ref_params, _ = train_steps(m, name, start, batches, devices="cpu:2", lr=0.3)
    arrays.update({f"ref{i}": p for i, p in enumerate(ref_params)})
    arrays["ref_losses"] = np.array(ref_losses)
np.savez(OUT / f"rank{rank}.npz", losses=np.array(losses), **arrays)
group.barrier()
if LINGER:
    (OUT / f"listening.rank{rank}").write_text(str(time.time()))
    time.sleep(LINGER)
group.barrier()
