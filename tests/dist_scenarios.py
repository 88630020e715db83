"""One rank of the multi-process scenarios; ``tests/test_distributed.py`` runs it as
``multigpu launch --nproc-per-node 2 --backend B -- tests/dist_scenarios.py OUT``.

Every phase writes what it saw to ``OUT/<phase>.rank<r>.json`` (or ``.npz``) and the
test compares. One job runs every phase, so each engine pays its start-up once. The
last phase hangs rank 1 on purpose, so the job ends with rank 0's collective timeout.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from rank_helpers import outside_the_job

import multigpu
from multigpu import models
from multigpu.distributed.rank import init_process_group
from multigpu.errors import CollectiveMismatchError
from multigpu.optim import SGD
from multigpu.parallel.agreement import random_batches, train_run, train_steps
from multigpu.parallel.data_parallel import DataParallel

OUT = Path(sys.argv[1])
group = init_process_group()
be, rank, name = group.backend, group.rank, group.backend.name


def save_json(phase: str, obj: object) -> None:
    (OUT / f"{phase}.rank{rank}.json").write_text(json.dumps(obj))


def save_npz(phase: str, **arrays: object) -> None:
    np.savez(OUT / f"{phase}.rank{rank}.npz", **arrays)


def dataset(n_train: int, n_test: int = 33, seed: int = 0) -> SimpleNamespace:
    """Random images whose first two pixels encode the sample's index (to trace shards)."""
    rng = np.random.default_rng(seed)
    X = rng.random((n_train, 1, 28, 28), dtype=np.float32)
    X[:, 0, 0, 0], X[:, 0, 0, 1] = np.arange(n_train) // 256, np.arange(n_train) % 256
    return SimpleNamespace(
        train_images=X,
        train_labels=rng.integers(0, 10, n_train),
        test_images=rng.random((n_test, 1, 28, 28), dtype=np.float32),
        test_labels=rng.integers(0, 10, n_test),
    )


# 1. the collectives themselves ---------------------------------------------------
t = be.from_numpy(np.arange(6, dtype=np.float32) * (rank + 1), group.device)
group.allreduce_(t)
b = be.from_numpy(np.full(4, 10.0 + rank, np.float32), group.device)
group.broadcast_(b, src=1)
group.barrier()
save_json("collectives", {"allreduce": be.to_numpy(t).tolist(), "broadcast": be.to_numpy(b).tolist()})

# 2. 2 processes x 1 device against 1 process x 2 devices and 1 device on the full batch
m = models.lenet()
start = m.init_params(seed=3)
mine = start if rank == 0 else m.init_params(seed=99)  # construction must broadcast rank 0's
tr = DataParallel(m, backend=name, devices="cpu:1", lr=0.3, params=mine, process_group=group)
after_broadcast = tr.get_params()
batches = random_batches(m, steps=5, batch=27, seed=5)  # 27 rows: 14 on rank 0, 13 on rank 1
losses = [tr.train_batch(X, y) for X, y in batches]
Xe, ye = random_batches(m, steps=1, batch=31, seed=6)[0]
acc = tr.evaluate(Xe, ye)
save_npz(
    "agree",
    losses=losses,
    acc=acc,
    broadcast0=after_broadcast[0],
    start0=start[0],
    **{f"p{i}": p for i, p in enumerate(tr.get_params())},
)
# 2a. the same in small buckets, one gradient buffer each, summed by the engine during backward
bucketed = DataParallel(m, backend=name, devices="cpu:1", lr=0.3, params=mine, process_group=group, bucket_mb=0.05)
save_npz(
    "agree_buckets",
    losses=[bucketed.train_batch(X, y) for X, y in batches],
    buckets=len(bucketed._layout.params),
    **{f"p{i}": p for i, p in enumerate(bucketed.get_params())},
)
if rank == 0:
    for devices in ("cpu:2", "cpu:1"):
        ref_losses, ref_params, _ = train_steps(m, name, start, batches, devices=devices, lr=0.3)
        local = DataParallel(m, backend=name, devices=devices, params=tr.get_params())
        save_npz(
            f"agree_{devices.replace(':', '')}",
            losses=ref_losses,
            acc=local.evaluate(Xe, ye),
            **{f"p{i}": p for i, p in enumerate(ref_params)},
        )

# 2b. synchronized BatchNorm across the processes: 2 x 1 device equals 1 device on the full batch
rm = models.resnet((1, 1), (4, 8), 5, (3, 12, 12), "tiny")
rstart = rm.init_params(seed=3)
rstate = rm.init_state() if rank == 0 else [s + 7 for s in rm.init_state()]  # rank 0's must win
momentum = SGD(momentum=0.9, weight_decay=5e-4)
synced = DataParallel(
    rm,
    backend=name,
    devices="cpu:1",
    lr=0.1,
    params=rstart,
    process_group=group,
    optimizer=momentum,
    sync_bn=True,
    state=rstate,
)
state_at_start = synced.get_state()
rbatches = random_batches(rm, steps=5, batch=13, seed=4)  # 13 rows: 7 on rank 0, 6 on rank 1
sync_losses = [synced.train_batch(X, y) for X, y in rbatches]
save_npz(
    "syncbn",
    losses=sync_losses,
    start_var=state_at_start[1],
    opt=synced.get_optimizer_state()[0],
    **{f"p{i}": p for i, p in enumerate(synced.get_params())},
    **{f"s{i}": s for i, s in enumerate(synced.get_state())},
)
if rank == 0:
    one = train_run(rm, name, rstart, rbatches, devices="cpu:1", lr=0.1, optimizer=momentum)
    save_npz(
        "syncbn_cpu1",
        losses=one.losses,
        opt=one.opt_state[0],
        **{f"p{i}": p for i, p in enumerate(one.params)},
        **{f"s{i}": s for i, s in enumerate(one.states[0])},
    )


# 2c. synchronized BatchNorm stays exact: mean/std 1000 and ResNet-18, one step, 2 x 1 device against 1
def first_update(model, backend, X, y, start, group=None):
    tr = DataParallel(model, backend=backend, devices="cpu:1", lr=0.1, params=start, process_group=group, sync_bn=True)
    tr.train_batch(X, y)
    return {f"u{i}": p - s for i, (p, s) in enumerate(zip(tr.get_params(), start))}


bm = models.Sequential([models.BatchNorm2d(), models.Flatten(), models.Dense(5)], (3, 4, 4), "bn_first", "he")
rng = np.random.default_rng(0)
bX = (10 + 0.01 * rng.standard_normal((8, 3, 4, 4))).astype(np.float32)
by = rng.integers(0, 5, 8)
save_npz("syncbn_ratio", **first_update(bm, name, bX, by, bm.init_params(0), group))
rn = models.resnet18(10, (3, 64, 64))
rng = np.random.default_rng(1)
nX, ny = rng.standard_normal((8, 3, 64, 64)).astype(np.float32), rng.integers(0, 10, 8)
save_npz("syncbn_resnet18", **first_update(rn, name, nX, ny, rn.init_params(0), group))
if rank == 0:  # one device on the whole batch: the NumPy reference at mean/std 1000, this backend on ResNet-18
    save_npz("syncbn_ratio_cpu1", **first_update(bm, "numpy", bX, by, bm.init_params(0)))
    save_npz("syncbn_resnet18_cpu1", **first_update(rn, name, nX, ny, rn.init_params(0)))

# 3. sharding: which samples each rank trained on in one epoch of train() ------------
original = DataParallel.train_batch
for n in (64, 65):  # 65: the last batch of 1 row joins the one before it
    seen: list[int] = []

    def spy(self, X, y, _seen=seen):
        for xs, _ in self.local_shards(X, y):
            _seen.extend((xs[:, 0, 0, 0] * 256 + xs[:, 0, 0, 1]).astype(int).tolist())
        return original(self, X, y)

    DataParallel.train_batch = spy
    multigpu.train(
        backend=name,
        devices="cpu:1",
        batch_size=16,
        lr=0.1,
        num_epochs=1,
        progress=False,
        data=dataset(n),
        process_group=group,
    )
    DataParallel.train_batch = original
    save_json(f"shard{n}", seen)

# 4. train(): reduced loss and accuracy, rank-0-only checkpoints, resume ------------
args = {
    "backend": name,
    "devices": "cpu:1",
    "batch_size": 20,
    "lr": 0.2,
    "progress": False,
    "data": dataset(90, seed=1),
}
full = multigpu.train(num_epochs=2, process_group=group, **args)
folder = OUT / f"checkpoint.rank{rank}"  # each rank names its own; only rank 0 may write
multigpu.train(num_epochs=1, checkpoint=folder, process_group=group, **args)
resumed = multigpu.train(num_epochs=2, checkpoint=folder, process_group=group, **args)
save_json(
    "train",
    {
        "loss": full.train_loss,
        "acc": full.test_acc,
        "resumed_loss": resumed.train_loss,
        "resumed_acc": resumed.test_acc,
        "processes": full.processes,
        "rank": full.rank,
        "checkpoint_written": folder.exists(),
    },
)
save_npz(
    "train",
    **{f"full{i}": p for i, p in enumerate(full.params)},
    **{f"resumed{i}": p for i, p in enumerate(resumed.params)},
)
if rank == 0:
    with outside_the_job():
        single = multigpu.train(num_epochs=2, **{**args, "devices": "cpu:2"})
    save_json("train_single", {"loss": single.train_loss, "acc": single.test_acc})

# 4b. train() with BatchNorm and momentum: each rank's own running statistics go into rank 0's
# checkpoint (gathered) and come back to their rank on resume (scattered)
bn_args = dict(
    args,
    model=models.resnet((1, 1), (4, 8), 10, (1, 28, 28), "tiny28"),
    lr=0.05,
    optimizer=SGD(momentum=0.9, weight_decay=5e-4),
)
bn_full = multigpu.train(num_epochs=2, process_group=group, **bn_args)
bn_folder = OUT / f"bn_checkpoint.rank{rank}"
multigpu.train(num_epochs=1, checkpoint=bn_folder, process_group=group, **bn_args)
bn_resumed = multigpu.train(num_epochs=2, checkpoint=bn_folder, process_group=group, **bn_args)
save_npz(
    "bn_train",
    loss=bn_full.train_loss,
    resumed_loss=bn_resumed.train_loss,
    **{f"full{i}": a for i, a in enumerate([*bn_full.params, *bn_full.state])},
    **{f"resumed{i}": a for i, a in enumerate([*bn_resumed.params, *bn_resumed.state])},
)

# 5. mismatched collectives are reported on every rank, and the group goes on -------
messages = []
try:
    group.allreduce_(be.from_numpy(np.ones(10 + rank, np.float32), group.device))
except CollectiveMismatchError as exc:
    messages.append(str(exc))
ten = be.from_numpy(np.ones(10, np.float32), group.device)
try:
    group.broadcast_(ten, src=0) if rank == 0 else group.allreduce_(ten)
except CollectiveMismatchError as exc:
    messages.append(str(exc))
group.barrier()
save_json("mismatch", messages)


# 5b. the check folded into the step's exchange: a bucket set that every rank predicts runs with no header;
# a rank that calls something else is named with both sides, the group goes on, and a change that every
# rank makes together proceeds
def bucket_set(sizes: list[int], scale: float) -> list[list[float]]:
    bufs = [be.from_numpy(scale * np.arange(1, n + 1, dtype=np.float32), group.device) for n in sizes]
    group.announce_buckets(sizes)
    waits = [group.allreduce_async_(t) for t in bufs]
    for wait in waits:
        wait()
    sums = [be.to_numpy(t).tolist() for t in bufs]
    return [sums[0][:-1], *sums[1:]]  # bucket 0's last float is the check's flag


folded: dict = {"sums": [], "messages": []}
deviations = {
    "size": lambda: group.allreduce_(be.from_numpy(np.ones(5, np.float32), group.device)),
    "op": group.barrier,
    "split": lambda: bucket_set([5, 2], 2.0),
}
for deviate in deviations.values():
    folded["sums"] += [bucket_set([4, 3], rank + 1.0) for _ in range(2)]  # a header, then the fast path
    try:
        bucket_set([4, 3], 1.0) if rank == 0 else deviate()
    except CollectiveMismatchError as exc:
        folded["messages"].append(str(exc))
folded["sums"] += [bucket_set([4, 3], rank + 1.0) for _ in range(2)]
together = be.from_numpy(np.full(3, rank + 1.0, np.float32), group.device)
group.allreduce_(together)  # every rank leaves the predicted bucket set at once
folded["together"] = be.to_numpy(together).tolist()
folded["sums"].append(bucket_set([4, 3], rank + 1.0))
save_json("folded", folded)

# 6. rank 1 hangs: rank 0's next collective must time out and end the job ----------
save_json("hang", time.time())
if rank == 1:
    time.sleep(300)
group.timeout = 2.0
group.allreduce_(t)
save_json("after_hang", "rank 0 returned from a collective that rank 1 never joined")
