"""Plans that run: the profiler, the executor and predicted-against-measured time.

``run_partitioned`` runs a plan's stages on their devices (Ray actors, each on its
own backend) and times every part; ``profile`` measures per-layer times and the
engine's per-hop cost and writes them into a cluster file for the cost model.
Importing this package loads no framework and not Ray: the Ray engine
(``multigpu.execution.engine``) is imported on the first run or profile.
"""

from __future__ import annotations

from multigpu.execution.onnx_stages import export_stages
from multigpu.execution.plan import ExecutionPlan, Stage, check_plan, read_plan, split_stages
from multigpu.execution.profiler import ProfileResult, fit_link, profile
from multigpu.execution.result import Prediction, RunResult, predict
from multigpu.execution.runner import Session, run_partitioned

__all__ = [
    "ExecutionPlan",
    "Prediction",
    "ProfileResult",
    "RunResult",
    "Session",
    "Stage",
    "check_plan",
    "export_stages",
    "fit_link",
    "predict",
    "profile",
    "read_plan",
    "run_partitioned",
    "split_stages",
]
