"""``run_partitioned``: run a plan's stages on their devices and time every part."""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from .. import models, registry
from ..errors import InputError, PlanError
from ..partition.cluster import Cluster, load_cluster
from .plan import ExecutionPlan, PlanLike, check_plan, worker_params
from .result import RunResult, try_predict

__all__ = ["run_partitioned", "resolve_model", "resolve_cluster", "split_inputs"]

ENGINES = ("tasks", "compiled")


def resolve_model(model: Any) -> Any:
    """A ``Sequential``, or a built-in model name."""
    if isinstance(model, str):
        return models.get(model)
    if not hasattr(model, "forward") or not hasattr(model, "layers"):
        raise PlanError(f"model must be a multigpu Sequential or a built-in name "
                        f"({', '.join(sorted(models.MODELS))}), got {type(model).__name__}")
    return model


def resolve_cluster(cluster: Union[Cluster, str, "os.PathLike[str]"]) -> Cluster:
    """A ``Cluster``, or a path/shipped name for ``load_cluster``."""
    return cluster if isinstance(cluster, Cluster) else load_cluster(cluster)


def split_inputs(model: Any, inputs: Any, batch: int) -> list[np.ndarray]:
    """Cut ``inputs`` (N, *input_shape) into items of ``batch`` rows (the last may be
    shorter); InputError on a wrong shape or dtype."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InputError(f"batch={batch!r} must be a positive integer")
    x = np.asarray(inputs)
    if x.ndim != len(model.input_shape) + 1 or tuple(x.shape[1:]) != tuple(model.input_shape):
        raise InputError(f"inputs have shape {x.shape}; {model.name} takes (N, "
                         f"{', '.join(map(str, model.input_shape))}) with N >= 1")
    if len(x) == 0:
        raise InputError("inputs are empty; pass at least one input")
    if not np.issubdtype(x.dtype, np.floating):
        raise InputError(f"inputs have dtype {x.dtype}; pass float32 images")
    if not np.all(np.isfinite(x)):
        raise InputError("inputs contain NaN or infinity")
    x = x.astype(np.float32, copy=False)
    return [np.ascontiguousarray(x[i:i + batch]) for i in range(0, len(x), batch)]


def check_installed(xplan: ExecutionPlan) -> None:
    """Fail before starting Ray when a stage's backend is unknown or not installed here
    (for a local run, every worker runs on this machine)."""
    for s in xplan.stages:
        backend = xplan.spec(s.device).backend
        try:
            registry.require_installed(backend)  # type: ignore[arg-type]
        except Exception as e:
            raise type(e)(f"{s.label()}: {e}") from None


def run_partitioned(model: Any, params: Optional[Sequence[Any]], plan: PlanLike, inputs: Any,
                    cluster: Union[Cluster, str, "os.PathLike[str]"], *, batch: int = 1,
                    stream: bool = False, engine: str = "tasks", address: Optional[str] = None,
                    timeout: float = 60.0, startup_timeout: float = 180.0, warmup: int = 1,
                    window: Optional[int] = None,
                    on_workers: Optional[Callable[[list[dict[str, Any]]], None]] = None) -> RunResult:
    """Run each stage of ``plan`` on its device and return the outputs and timings.

    ``model`` is a ``Sequential`` (or "lenet"/"alexnet"); ``params`` its parameter
    list (None: the seeded random init); ``plan`` one device name per layer (a list,
    the dict ``multigpu partition --json`` prints, or a JSON file of either);
    ``inputs`` an array (N, *input_shape), run in items of ``batch`` rows;
    ``cluster`` a Cluster or a cluster file whose devices name their ``backend``.

    The cluster's source is the driver (this process): its stages run here, every
    other device gets one Ray actor. Ray starts locally unless this process already
    runs it or ``address`` names a cluster to join; only what this call started is
    shut down. ``stream`` pipelines the items (``window`` in flight; default two per
    stage plus one) and reports items per second beside the predicted 1/bottleneck.
    ``engine`` is "tasks" (actor calls) or "compiled" (a Ray Compiled Graph).
    ``warmup`` untimed items run first. ``on_workers`` is called with each worker's
    device, backend, pid and host once they are up.

    Raises PlanError, ParamsError, InputError, ClusterError (a measured time for a
    layer the model lacks), UnknownBackendError / BackendNotInstalledError (naming
    the extra), MissingDependencyError (Ray: ``multigpu[cluster]``), and at run time
    WorkerDiedError / WorkerTimeoutError naming the stage and device.
    """
    model = resolve_model(model)
    params = model.init_params(0) if params is None else model.check_params(params)
    cluster = resolve_cluster(cluster)
    xplan = check_plan(model, cluster, plan)
    items = split_inputs(model, inputs, batch)
    if engine not in ENGINES:
        raise PlanError(f"engine={engine!r} is unknown; choose one of {', '.join(ENGINES)}")
    for name, value, low in (("timeout", timeout, 0), ("startup_timeout", startup_timeout, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > low:
            raise InputError(f"{name}={value!r} must be a number of seconds > 0")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise InputError(f"warmup={warmup!r} must be a whole number >= 0")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise InputError(f"window={window!r} must be a whole number >= 1")
    prediction, why = try_predict(xplan, batch)   # a bad layer_times entry fails here, before Ray
    if address is None:
        check_installed(xplan)

    from . import engine as ray_engine   # the one place Ray is imported

    driver = xplan.driver
    specs = [xplan.spec(d) for d in xplan.workers]
    driver_used = any(s.device == driver for s in xplan.stages)
    stage_map: dict[str, list[tuple[int, int, int]]] = {}
    for s in xplan.stages:
        stage_map.setdefault(s.device, []).append((s.index, s.start, s.stop))
    devices = xplan.workers + ([driver] if driver_used else [])
    dev_params = {d: worker_params(xplan, d, params) for d in devices}
    chain = [(s.device, s.index) for s in xplan.stages]
    labels = [s.label() for s in xplan.stages]
    width = window or (2 * len(xplan.stages) + 1 if stream else 1)

    t_start = time.perf_counter()
    with ray_engine.RaySession(address), \
            ray_engine.Workers(specs, xplan.spec(driver) if driver_used else None, float(timeout),
                               float(startup_timeout)) as workers:
        startup = time.perf_counter() - t_start
        info = [vars(i) for i in workers.info.values()]
        if on_workers is not None:
            on_workers(info)
        shipped, ship_seconds = workers.load(model, stage_map, dev_params)
        if warmup:
            ray_engine.run_chain(workers, chain, labels, [items[0]] * warmup, window=1, engine=engine)
        t0 = time.perf_counter()
        out = ray_engine.run_chain(workers, chain, labels, items, window=width, engine=engine)
        wall = time.perf_counter() - t0
    offsets = {d: workers.info[d].clock_offset for d in devices}
    return _result(xplan, out, offsets, batch, stream, engine, shipped, ship_seconds, startup, wall,
                   info, prediction, why)


def _result(xplan: ExecutionPlan, out: Any, offsets: dict[str, float], batch: int, stream: bool,
            engine: str, shipped: int, ship_seconds: float, startup: float, wall: float,
            info: list[dict[str, Any]], prediction: Any, why: Optional[str]) -> RunResult:
    stages = list(xplan.stages)
    m = len(stages)
    n = len(out.traces)
    compute = np.empty((n, m))
    hops = np.empty((n, m + 1))
    e2e = np.empty(n)
    for j, trace in enumerate(out.traces):
        starts = [trace[1 + 2 * i] - offsets[s.device] for i, s in enumerate(stages)]
        ends = [trace[2 + 2 * i] - offsets[s.device] for i, s in enumerate(stages)]
        compute[j] = [trace[2 + 2 * i] - trace[1 + 2 * i] for i in range(m)]
        hops[j, 0] = starts[0] - trace[0]
        for i in range(1, m):
            hops[j, i] = starts[i] - ends[i - 1]
        hops[j, m] = trace[-1] - ends[-1]
        e2e[j] = trace[-1] - trace[0]
    driver = xplan.driver
    route = [driver] + [s.device for s in stages] + [driver]
    stats = xplan.model.layer_stats(batch)
    sizes = [xplan.model.input_bytes(batch)] + [stats[s.stop - 1].output_bytes for s in stages]
    rate = None
    if stream and n >= 2 and out.done[-1] > out.done[0]:
        rate = (n - 1) / (out.done[-1] - out.done[0])
    outputs = np.concatenate([np.asarray(y).reshape(len(y), -1) for y in out.outputs])
    return RunResult(outputs=outputs, assignment=list(xplan.assignment), stages=stages,
                     hop_routes=list(zip(route[:-1], route[1:])), hop_bytes=sizes, stage_times=compute,
                     hop_times=hops, end_to_end=e2e, param_bytes=shipped, param_seconds=ship_seconds,
                     startup_seconds=startup, wall_seconds=wall, engine=engine, batch=batch, stream=stream,
                     items_per_second=rate, workers=info, prediction=prediction, prediction_note=why,
                     driver=driver)
