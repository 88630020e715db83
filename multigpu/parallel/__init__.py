"""The data-parallel step in one process: split a batch, allreduce, update every replica.

Stands on the backend contract and the model spec. A process group, when given,
extends the sum across processes through the interface in
``multigpu.parallel.process_group``; this package never imports the multi-process side.
"""

from __future__ import annotations

from multigpu.parallel.allreduce import ALGORITHMS, allreduce_grads
from multigpu.parallel.data_parallel import DataParallel
from multigpu.parallel.process_group import ProcessGroup
from multigpu.parallel.split import shard_sizes, split_batch

__all__ = ["ALGORITHMS", "DataParallel", "ProcessGroup", "allreduce_grads", "shard_sizes", "split_batch"]
