"""``run_partitioned``: run a plan's stages on their devices and time every part."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from multigpu import models
from multigpu.checks import check_count, check_positive
from multigpu.contract import registry
from multigpu.errors import InputError, PlanError
from multigpu.execution.plan import SINK, SOURCE, ExecutionPlan, PlanLike, check_plan, routes, worker_params
from multigpu.execution.result import RunResult, try_predict
from multigpu.models.inputs import check_images, check_tokens
from multigpu.partition.inputs.cluster import Cluster, as_cluster

__all__ = ["Session", "run_partitioned", "resolve_model", "resolve_cluster", "split_inputs"]

ENGINES = ("tasks", "compiled")


def resolve_model(model: Any) -> Any:
    """A ``Sequential``, or a built-in model name."""
    if isinstance(model, str):
        return models.get(model)
    if not hasattr(model, "forward") or not hasattr(model, "layers"):
        raise PlanError(
            f"model must be a multigpu Sequential or a built-in name "
            f"({', '.join(sorted(models.MODELS))}), got {type(model).__name__}"
        )
    return model


def resolve_cluster(cluster: Cluster | Mapping[str, Any] | str | os.PathLike[str]) -> Cluster:
    """A ``Cluster``, a dict laid out as a cluster file, or a path/shipped name (``as_cluster``)."""
    return as_cluster(cluster)


def split_inputs(model: Any, inputs: Any, batch: int) -> list[np.ndarray]:
    """Cut ``inputs`` (N, *input_shape) into items of ``batch`` rows (the last may be
    shorter); InputError on a wrong shape or dtype, or fewer than ``batch`` inputs."""
    check_count(batch, "batch", example=32)
    named = tuple(getattr(model, "inputs", {}))
    if any(spec.dtype == "int64" for spec in getattr(model, "inputs", {}).values()):
        # a token model: ids (and a mask) travel as one int64 array (N, inputs, T); workers split it
        given = inputs if isinstance(inputs, Mapping) else {named[0]: inputs}
        if len(named) > 1 and not isinstance(inputs, Mapping):
            raise InputError(f"{model.name} takes the inputs {list(named)}: pass inputs as a dict {{name: (N, T)}}")
        unknown = [k for k in given if k not in named]
        if unknown:
            raise InputError(f"{model.name} takes the inputs {list(named)}; inputs name unknown {unknown}")
        ids, mask = check_tokens(model, given.get(named[0]), given.get(named[1]) if len(named) > 1 else None)
        if len(named) > 1 and mask is None:
            mask = np.ones_like(ids)  # no padding given: every token counts
        x = np.stack([ids] if mask is None else [ids, mask], axis=1)
    else:
        x = check_images(model, inputs, "inputs")
    if len(x) < batch:
        # Every figure is priced and compared per item of ``batch`` rows: with fewer
        # inputs no such item runs, and the comparison would set a smaller item's times
        # beside a full one's prediction.
        raise InputError(
            f"{len(x)} inputs are fewer than one item of batch {batch}: give at least {batch} inputs "
            f"(e.g. --random {batch}) or a batch of at most {len(x)}"
        )
    return [np.ascontiguousarray(x[i : i + batch]) for i in range(0, len(x), batch)]


def _time_full_items(result: RunResult, items: Sequence[np.ndarray], batch: int) -> RunResult:
    """Leave a short last item out of the timed figures (its outputs stay), with a note.

    The prediction prices items of ``batch`` rows, and a shorter item's stages and hops
    are faster, so its times would pull every median below what a full item takes.
    """
    short = len(items[-1])
    if short == batch:
        return result
    keep = slice(0, len(items) - 1)
    result.stage_times, result.hop_times = result.stage_times[keep], result.hop_times[keep]
    result.end_to_end = result.end_to_end[keep]
    if result.stage_starts is not None:
        result.stage_starts = result.stage_starts[keep]
    if result.sent_at is not None:
        result.sent_at = result.sent_at[keep]
    result.notes.append(
        f"the last item has {short} of {batch} rows: its outputs are reported, its times are not "
        f"(the figures are per item of {batch}); the streaming rate counts it"
    )
    return result


def check_installed(xplan: ExecutionPlan) -> None:
    """Fail before starting Ray when a stage's backend is unknown or not installed here
    (for a local run, every worker runs on this machine)."""
    for s in xplan.stages:
        backend = xplan.spec(s.device).backend
        assert backend is not None  # check_plan refuses a stage on a device without one
        try:
            registry.require_installed(backend)
        except Exception as e:
            raise type(e)(f"{s.label()}: {e}") from None


@dataclass
class _Prepared:
    model: Any
    params: list[np.ndarray]
    xplan: ExecutionPlan
    items: list[np.ndarray]
    prediction: Any
    why: str | None
    state: list[np.ndarray] | None = None


def _prepare(
    model: Any,
    params: Sequence[Any] | None,
    plan: PlanLike,
    inputs: Any,
    cluster: Any,
    batch: int,
    engine: str,
    warmup: int,
    window: int | None,
    local: bool,
    state: Sequence[Any] | None = None,
) -> _Prepared:
    """Check every argument (and price the plan) before any worker starts."""
    model = resolve_model(model)
    params = model.init_params(0) if params is None else model.check_params(params)
    if getattr(model, "batch_norms", None):
        state = model.init_state() if state is None else model.check_state(state)
    elif state is not None:
        raise PlanError(
            f"state= was given but {model.name} has no BatchNorm (nothing keeps running statistics); leave it out"
        )
    cluster = resolve_cluster(cluster)
    xplan = check_plan(model, cluster, plan)
    if not xplan.chain and engine == "compiled":
        raise PlanError(
            f"engine='compiled' runs chains of stages; {model.name} is a graph with branches: use engine='tasks'"
        )
    items = split_inputs(model, inputs, batch)
    if engine not in ENGINES:
        raise PlanError(f"engine={engine!r} is unknown; choose one of {', '.join(ENGINES)}")
    check_count(warmup, "warmup", minimum=0)
    if window is not None:
        check_count(window, "window", example=4)
    prediction, why = try_predict(xplan, batch)  # a bad layer_times entry fails here, before Ray
    if local:
        check_installed(xplan)
    return _Prepared(model, list(params), xplan, items, prediction, why, None if state is None else list(state))


def _check_timeouts(timeout: float, startup_timeout: float) -> None:
    for name, value in (("timeout", timeout), ("startup_timeout", startup_timeout)):
        check_positive(value, name, unit="seconds", example=60)


class Session:
    """Workers kept up across runs: one Ray actor per device of ``cluster`` that names a
    backend (or of ``devices``), started once; ``run`` then runs any plan over them.

    Use as a context manager. Ray starts locally unless this process already runs it
    or ``address`` names a cluster to join; on exit the actors are killed and only a
    Ray instance this session started is shut down. ``driver=False`` keeps the
    driver's backend unloaded (no stage may then run on the driver).
    ``run_partitioned`` is one ``Session.run`` in a session of the plan's own devices.
    """

    def __init__(
        self,
        cluster: Cluster | Mapping[str, Any] | str | os.PathLike[str],
        devices: Sequence[str] | None = None,
        *,
        address: str | None = None,
        timeout: float = 60.0,
        startup_timeout: float = 180.0,
        on_workers: Callable[[list[dict[str, Any]]], None] | None = None,
        driver: bool = True,
    ):
        _check_timeouts(timeout, startup_timeout)
        self.use_driver = driver
        self.cluster = resolve_cluster(cluster)
        names = (
            list(devices)
            if devices is not None
            else [d.name for d in self.cluster.devices if d.backend is not None and d.name != self.cluster.source]
        )
        for name in names:
            spec = self.cluster.devices[self.cluster.index(name)]
            if spec.backend is None:
                raise PlanError(f'device {name!r} has no "backend" in cluster {self.cluster.name!r}; add one')
        self.devices = [n for n in names if n != self.cluster.source]
        self.address = address
        self.timeout = float(timeout)
        self.startup_timeout = float(startup_timeout)
        self.on_workers = on_workers
        self._stack: Any = None
        self.workers: Any = None
        self.startup_seconds = 0.0

    def __enter__(self) -> Session:
        from contextlib import ExitStack

        from multigpu.execution import engine as ray_engine  # the one place Ray is imported

        driver = self.cluster.devices[self.cluster.source_index]
        t0 = time.perf_counter()
        with ExitStack() as stack:
            stack.enter_context(ray_engine.RaySession(self.address))
            self.workers = stack.enter_context(
                ray_engine.Workers(
                    [self.cluster.devices[self.cluster.index(d)] for d in self.devices],
                    driver if driver.backend is not None and self.use_driver else None,
                    self.timeout,
                    self.startup_timeout,
                )
            )
            self._stack = stack.pop_all()
        self.startup_seconds = time.perf_counter() - t0
        if self.on_workers is not None:
            self.on_workers([vars(i) for i in self.workers.info.values()])
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Kill the workers; shut Ray down if this session started it."""
        if self._stack is not None:
            stack, self._stack = self._stack, None
            self.workers = None
            stack.close()

    def run(
        self,
        model: Any,
        params: Sequence[Any] | None,
        plan: PlanLike,
        inputs: Any,
        *,
        batch: int = 1,
        stream: bool = False,
        engine: str = "tasks",
        warmup: int = 1,
        window: int | None = None,
        cluster: Cluster | None = None,
        state: Sequence[Any] | None = None,
    ) -> RunResult:
        """Run ``plan`` over this session's workers; see ``run_partitioned``. ``cluster``
        prices the plan instead of the session's (e.g. a profile of the same devices)."""
        if self.workers is None:
            raise PlanError("the session is not open; use it as `with Session(...) as s: s.run(...)`")
        prep = _prepare(
            model,
            params,
            plan,
            inputs,
            cluster or self.cluster,
            batch,
            engine,
            warmup,
            window,
            local=self.address is None,
            state=state,
        )
        missing = [d for d in prep.xplan.workers if d not in self.workers.actors]
        if missing:
            raise PlanError(
                f"the plan uses device(s) {missing} that this session has no worker for; "
                f"its workers: {', '.join(self.workers.actors) or 'none'}"
            )
        if engine == "compiled":
            # A compiled graph's teardown kills its actors, so it gets workers of its own.
            return run_partitioned(
                prep.model,
                prep.params,
                prep.xplan.assignment,
                inputs,
                prep.xplan.cluster,
                batch=batch,
                stream=stream,
                engine=engine,
                address=self.address,
                timeout=self.timeout,
                startup_timeout=self.startup_timeout,
                warmup=warmup,
                window=window,
            )
        return _run(self.workers, prep, batch, stream, engine, warmup, window, self.startup_seconds)


def run_partitioned(
    model: Any,
    params: Sequence[Any] | None,
    plan: PlanLike,
    inputs: Any,
    cluster: Cluster | Mapping[str, Any] | str | os.PathLike[str],
    *,
    batch: int = 1,
    stream: bool = False,
    engine: str = "tasks",
    address: str | None = None,
    timeout: float = 60.0,
    startup_timeout: float = 180.0,
    warmup: int = 1,
    window: int | None = None,
    on_workers: Callable[[list[dict[str, Any]]], None] | None = None,
    state: Sequence[Any] | None = None,
) -> RunResult:
    """Run each stage of ``plan`` on its device and return the outputs and timings.

    ``model`` is a ``Sequential`` or a graph ``Model`` (or a built-in name); ``params``
    its parameter list (None: the seeded random init); ``state`` a graph model's
    BatchNorm running statistics (None: ``model.init_state()``); ``plan`` one device
    name per layer (a list, ``[layer, device]`` pairs, a planner ``Plan``, the dict
    ``multigpu partition --json`` prints, or a JSON file of either). A graph model's stages form a DAG:
    each runs once its inputs are there, stages on different workers at the same
    time, and an activation goes once to each worker that consumes it;
    ``inputs`` an array (N, *input_shape), run in items of ``batch`` rows;
    ``cluster`` a Cluster, a dict laid out as a cluster file (checked as a file is) or a
    cluster file, whose devices name their ``backend``.

    The cluster's source is the driver (this process): its stages run here, every
    other device gets one Ray actor. Ray starts locally unless this process already
    runs it or ``address`` names a cluster to join; only what this call started is
    shut down. ``stream`` pipelines the items (``window`` in flight; default two per
    stage plus one) and reports items per second beside the predicted 1/bottleneck.
    ``engine`` is "tasks" (actor calls) or "compiled" (a Ray Compiled Graph).
    ``warmup`` untimed items run first. ``timeout`` bounds each stage's wait per
    item (seconds), ``startup_timeout`` the workers' start. ``on_workers`` is called
    with each worker's device, backend, pid and host once they are up.

    Raises PlanError, ParamsError, InputError, ClusterError (a measured time for a
    layer the model lacks), UnknownBackendError / BackendNotInstalledError (naming
    the extra), MissingDependencyError (Ray: ``multigpu[cluster]``), and at run time
    WorkerDiedError / WorkerTimeoutError naming the stage and device.
    """
    _check_timeouts(timeout, startup_timeout)
    prep = _prepare(
        model, params, plan, inputs, cluster, batch, engine, warmup, window, local=address is None, state=state
    )
    xplan = prep.xplan
    with Session(
        xplan.cluster,
        xplan.workers,
        address=address,
        timeout=timeout,
        startup_timeout=startup_timeout,
        on_workers=on_workers,
        driver=any(s.device == xplan.driver for s in xplan.stages),
    ) as session:
        return _run(session.workers, prep, batch, stream, engine, warmup, window, session.startup_seconds)


def _run(
    workers: Any,
    prep: _Prepared,
    batch: int,
    stream: bool,
    engine: str,
    warmup: int,
    window: int | None,
    startup: float,
) -> RunResult:
    from multigpu.execution import engine as ray_engine

    xplan, items = prep.xplan, prep.items
    if not xplan.chain:
        return _time_full_items(_run_dag(workers, prep, batch, stream, warmup, window, startup), items, batch)
    driver = xplan.driver
    stage_map: dict[str, list[tuple[int, int, int]]] = {}
    for s in xplan.stages:
        stage_map.setdefault(s.device, []).append((s.index, s.start, s.stop))
    devices = list(workers.actors) + ([driver] if workers.local is not None else [])
    dev_params = {d: worker_params(xplan, d, prep.params) for d in devices}
    chain = [(s.device, s.index) for s in xplan.stages]
    labels = [s.label() for s in xplan.stages]
    width = window or (2 * len(xplan.stages) + 1 if stream else 1)
    if any(s.device == driver for s in xplan.stages) and workers.local is None:
        raise PlanError(f"the plan runs stages on the driver {driver!r}, which has no backend")
    info = [vars(i) for i in workers.info.values()]
    # a chain of a model with BatchNorm (an imported CNN) needs its running statistics on every worker too
    shipped, ship_seconds = workers.load(prep.model, stage_map, dev_params, prep.state)
    if warmup:
        ray_engine.run_chain(workers, chain, labels, [items[0]] * warmup, window=1, engine=engine)
    t0 = time.perf_counter()
    out = ray_engine.run_chain(workers, chain, labels, items, window=width, engine=engine)
    wall = time.perf_counter() - t0
    offsets = {d: workers.info[d].clock_offset for d in devices}
    used = set(xplan.workers) | ({driver} if any(s.device == driver for s in xplan.stages) else set())
    return _time_full_items(
        _result(
            xplan,
            out,
            offsets,
            batch,
            stream,
            engine,
            shipped,
            ship_seconds,
            startup,
            wall,
            [w for w in info if w["device"] in used],
            prep.prediction,
            prep.why,
        ),
        items,
        batch,
    )


def _run_dag(
    workers: Any, prep: _Prepared, batch: int, stream: bool, warmup: int, window: int | None, startup: float
) -> RunResult:
    """``_run`` for a graph model: the stages as a DAG (``engine.run_dag``)."""
    from multigpu.execution import engine as ray_engine

    xplan, items = prep.xplan, prep.items
    driver = xplan.driver
    if any(s.device == driver for s in xplan.stages) and workers.local is None:
        raise PlanError(f"the plan runs stages on the driver {driver!r}, which has no backend")
    stage_routes, sends = routes(xplan)
    by_device: dict[str, list[Any]] = {}
    for r in stage_routes:
        by_device.setdefault(r.device, []).append(r)
    devices = list(workers.actors) + ([driver] if workers.local is not None else [])
    dev_params = {d: worker_params(xplan, d, prep.params) for d in devices}
    labels = [s.label() for s in xplan.stages]
    width = window or (2 * len(xplan.stages) + 1 if stream else 1)
    info = [vars(i) for i in workers.info.values()]
    shipped, ship_seconds = workers.load(prep.model, by_device, dev_params, prep.state, sends)
    if warmup:
        ray_engine.run_dag(workers, stage_routes, sends, labels, [items[0]] * warmup, window=1)
    t0 = time.perf_counter()
    out = ray_engine.run_dag(workers, stage_routes, sends, labels, items, window=width)
    wall = time.perf_counter() - t0
    offsets = {d: workers.info[d].clock_offset for d in devices}
    used = set(xplan.workers) | ({driver} if any(s.device == driver for s in xplan.stages) else set())
    stages = list(xplan.stages)
    n, m = len(out.traces), len(stages)
    compute, hops, e2e, begins = np.empty((n, m)), np.empty((n, len(sends))), np.empty(n), np.empty((n, m))
    for j, trace in enumerate(out.traces):
        start = {i: trace[i][0] - offsets[s.device] for i, s in enumerate(stages)}
        compute[j] = [trace[i][2] for i in range(m)]  # the seconds its parts computed
        begins[j] = [start[i] - out.sent[j] for i in range(m)]
        for h, msg in enumerate(sends):
            # A message leaves when the part of its stage that computes it ends.
            left = out.sent[j] if msg.source == SOURCE else trace[("sent", h)] - offsets[stages[msg.source].device]
            hops[j, h] = (out.done[j] if msg.stage == SINK else start[msg.stage]) - left
        e2e[j] = out.done[j] - out.sent[j]
    stats = {x.name: x for x in xplan.model.layer_stats(batch)}
    sizes = [
        sum(xplan.model.input_bytes(batch) if name == "input" else stats[name].output_bytes for name in msg.names)
        for msg in sends
    ]
    hop_routes = [(driver if msg.source == SOURCE else stages[msg.source].device, msg.device) for msg in sends]
    rate = None
    if stream and n >= 2 and out.done[-1] > out.done[0]:
        rate = (n - 1) / (out.done[-1] - out.done[0])
    outputs = np.concatenate([np.asarray(y).reshape(len(y), -1) for y in out.outputs])
    return RunResult(
        outputs=outputs,
        assignment=list(xplan.assignment),
        stages=stages,
        hop_routes=hop_routes,
        hop_bytes=sizes,
        stage_times=compute,
        hop_times=hops,
        end_to_end=e2e,
        param_bytes=shipped,
        param_seconds=ship_seconds,
        startup_seconds=startup,
        wall_seconds=wall,
        engine="tasks",
        batch=batch,
        stream=stream,
        items_per_second=rate,
        workers=[w for w in info if w["device"] in used],
        prediction=prep.prediction,
        prediction_note=prep.why,
        driver=driver,
        hop_names=[msg.names for msg in sends],
        hop_stages=[(msg.source, msg.stage) for msg in sends],
        stage_starts=begins,
        sent_at=np.asarray(out.sent) - out.sent[0],
    )


def _result(
    xplan: ExecutionPlan,
    out: Any,
    offsets: dict[str, float],
    batch: int,
    stream: bool,
    engine: str,
    shipped: int,
    ship_seconds: float,
    startup: float,
    wall: float,
    info: list[dict[str, Any]],
    prediction: Any,
    why: str | None,
) -> RunResult:
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
    return RunResult(
        outputs=outputs,
        assignment=list(xplan.assignment),
        stages=stages,
        hop_routes=list(zip(route[:-1], route[1:])),
        hop_bytes=sizes,
        stage_times=compute,
        hop_times=hops,
        end_to_end=e2e,
        param_bytes=shipped,
        param_seconds=ship_seconds,
        startup_seconds=startup,
        wall_seconds=wall,
        engine=engine,
        batch=batch,
        stream=stream,
        items_per_second=rate,
        workers=info,
        prediction=prediction,
        prediction_note=why,
        driver=driver,
    )
