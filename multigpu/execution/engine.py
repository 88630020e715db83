"""The Ray engine: one actor per worker device, stages chained through Ray, timed at both ends.

This is the only module of multigpu that imports Ray, and nothing imports it until
a plan runs or a profile starts (``multigpu.run_partitioned`` and
``multigpu.profile`` load it on their first call).

Two ways to move activations between stages:

* ``"tasks"`` (default): ordinary actor calls. The driver submits every stage of an
  item at once, each call taking the previous call's result (an ObjectRef), so Ray
  moves the activation from stage to stage without the driver waiting in between.
  An idle worker uses no CPU.
* ``"compiled"``: a Ray Compiled Graph (``experimental_compile``): shared-memory
  channels between the actors, several times cheaper per hop, but each waiting
  actor polls its channel and so keeps a CPU core partly busy (see docs/design/executor.md).

A message is ``(array, trace)``; the driver stamps the send time, every stage adds
the start and end of its computation, and the driver stamps the arrival of the
result. A hop's time is the receiver's start minus the sender's end: measured at
both ends, and it includes converting to and from numpy on either side.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import socket
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NoReturn, cast

import numpy as np

from multigpu.distributed.job import route_address
from multigpu.errors import (
    InputError,
    MissingDependencyError,
    MultigpuError,
    PlanError,
    WorkerDiedError,
    WorkerTimeoutError,
)
from multigpu.execution.cores import usable_cores
from multigpu.execution.worker import StageWorker, merge_trace, thread_env
from multigpu.partition.inputs.cluster import DeviceSpec

try:
    import ray
    from ray import exceptions as ray_exceptions
except ImportError as _exc:  # pragma: no cover - exercised through a subprocess test
    raise MissingDependencyError(
        "running a plan needs Ray, which is not installed; install it with: pip install 'multigpu[cluster]'"
    ) from _exc

__all__ = ["ChainResult", "DagResult", "RaySession", "Workers", "run_chain", "run_dag"]

# Seconds a compiled graph's teardown waits for an actor's loop before killing it
# (Ray's default is 30 s, and without kill_actors it may wait forever).
CGRAPH_TEARDOWN_TIMEOUT = 1
PING_TIMEOUT = 5.0
# Items a compiled graph may hold at once (the streaming window is capped to it).
CGRAPH_MAX_INFLIGHT = 16
# Ray returns results below ``max_direct_call_object_size`` (100 KiB by default,
# ray_config_def.h) inline through the caller and larger ones through the shared-memory
# object store, and the second path costs about 0.7 ms more per hop: a step that no
# latency + bytes/bandwidth link can fit. A local instance started here keeps Ray's
# defaults; the engine profile prices the step instead (its ``inline_bytes`` and each
# link's ``inline_latency``, which ``multigpu profile`` fits where the activations
# straddle the threshold).
#
# NOTE: Ray also starts its worker processes at nice 15 (to keep its daemons responsive),
# and the driver's own stages run at the caller's priority (usually 0). On an idle
# machine that changes nothing; where other processes contend for the cores, a worker's
# stages get less CPU than the driver's. The profile times each device as a run meets it
# (its workers at Ray's niceness), so the plans are priced on that.
RAY_DEFAULT_INLINE = 100 * 1024
# Bytes Ray's serialization adds to a stage message (the array and its trace of
# timestamps): measured here at 167-300 for float32 arrays of 0-1 KiB.
MESSAGE_FRAMING = 256


def inline_payload_bytes() -> int:
    """The largest activation (bytes) Ray passes inside its own messages rather than
    through the object store: ``max_direct_call_object_size`` less a message's framing.
    That is Ray's default threshold on a local instance as on a joined one, unless the
    environment's ``RAY_max_direct_call_object_size`` (the lab sets it on every process)
    gives another; the profile records it as the engine's ``inline_bytes``."""
    env = os.environ.get("RAY_max_direct_call_object_size")
    limit = int(env) if env and env.strip().isdigit() else RAY_DEFAULT_INLINE
    return max(limit - MESSAGE_FRAMING, 0)


Link = tuple[str, int]  # (device, stage id on that device's worker)


class RaySession:
    """Start a local Ray instance, join one (``address``), or reuse the one already
    initialised in this process; on exit shut down only what this session started.

    A local instance listens on loopback only and uses token authentication with a
    fresh token in a private folder (``private_token``): nobody else on the network can
    reach it, and no other process on the machine can join it without reading that file.
    Joining a cluster uses the token the environment gives (``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``) with ``RAY_AUTH_MODE=token``.
    """

    def __init__(self, address: str | None = None, num_cpus: int | None = None):
        self.address = address
        self.num_cpus = num_cpus
        self.started = False
        self._saved_env: dict[str, str | None] = {}
        self._token_dir: str | None = None

    def _set_env(self, **values: str) -> None:
        for k, v in values.items():
            self._saved_env.setdefault(k, os.environ.get(k))
            os.environ[k] = v

    def _restore_env(self) -> None:
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved_env = {}
        if self._token_dir is not None:
            shutil.rmtree(self._token_dir, ignore_errors=True)
            self._token_dir = None

    def __enter__(self) -> RaySession:
        if not ray.is_initialized():
            kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
            if self.address is None:
                kwargs["num_cpus"] = self.num_cpus or os.cpu_count() or 1
                self._token_dir, token = private_token()
                # Ray's processes (raylet, gcs_server, workers) inherit these from this one.
                self._set_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token)
            else:
                if "RAY_AUTH_MODE" not in os.environ:
                    self._set_env(RAY_AUTH_MODE="token")
                here = _driver_address(self.address)
                if here is not None:
                    kwargs["_node_ip_address"] = here
            _reload_auth()
            try:
                with _loopback_only(self.address is None):
                    ray.init(address=self.address, **kwargs)
            except (ConnectionError, ValueError, RuntimeError) as e:
                self._restore_env()
                _reload_auth()
                where = f"the Ray cluster at {self.address!r}" if self.address else "a local Ray instance"
                chain, cause = str(e), e.__cause__
                while cause is not None:
                    chain, cause = chain + " " + str(cause), cause.__cause__
                if "AuthToken" in chain or "Authentication" in chain:
                    raise PlanError(
                        f"cannot join {where}: it asks for an authentication token; copy the head's "
                        f"~/.ray/auth_token to this machine (or point RAY_AUTH_TOKEN_PATH at it) and "
                        f"set RAY_AUTH_MODE=token"
                    ) from None
                raise PlanError(
                    f"cannot start or join {where}: {e}; check the address "
                    f"(`ray start --head` prints it) or leave --address out"
                ) from None
            except BaseException:
                self._restore_env()
                raise
            self.started = True
        quiet_ray_loggers()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.started:
            ray.shutdown()
            self.started = False
            self._restore_env()
            _reload_auth()


def _driver_address(address: str) -> str | None:
    """This host's address toward the cluster at ``HOST:PORT``, or None (``auto``, ``ray://``)."""
    # NOTE: a driver joining a cluster attaches to a raylet it finds among this machine's
    # processes, preferring the head's; on one machine holding several nodes (the lab, or
    # containers sharing a PID namespace) that is another host's. The node address picks
    # the raylet of this driver's own host.
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return None
    try:
        return route_address(host)
    except InputError:
        return None


def private_token() -> tuple[str, str]:
    """A fresh random Ray token in a new folder only this user can read: (folder, file)."""
    folder = tempfile.mkdtemp(prefix="multigpu-ray-")  # mode 0700
    path = os.path.join(folder, "auth_token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return folder, path


def _reload_auth() -> None:
    """Make this process's Ray read RAY_AUTH_MODE and the token again (it caches both)."""
    # NOTE: Ray caches the authentication mode in its config and the token in a loader
    # on first use; ray.init itself refreshes the config the same way when it turns
    # token authentication on.
    try:
        from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]  # not in Ray's stub

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    except (ImportError, AttributeError):  # pragma: no cover - another Ray version
        pass


@contextmanager
def _loopback_only(local: bool) -> Iterator[None]:
    """While a local instance starts, let Ray take 127.0.0.1 as this node's address, so its
    raylet, gcs_server and workers listen on loopback only."""
    # NOTE: Ray replaces a loopback node address by the machine's outward address unless
    # clusters are disabled (as on Windows and macOS, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER);
    # its processes then bind the node address. The flag is read when the node starts.
    from ray._private import ray_constants

    old = ray_constants.ENABLE_RAY_CLUSTER
    if local:
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = old


def quiet_ray_loggers() -> None:
    """Keep Ray's INFO/WARNING chatter (compiled-graph teardown, worker deaths) off stderr."""
    for name in ("ray", "ray.dag", "ray.dag.compiled_dag_node", "ray.experimental"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _actor_options(spec: DeviceSpec) -> dict[str, Any]:
    res = dict(spec.resources or {})
    # Out of order: a worker runs whichever of its calls has its arguments, not the next one
    # submitted. In order, a worker holding two stages of a DAG plan (a ResNet's main path
    # with its shortcut elsewhere) idles at an item's later stage until the other worker
    # answers, though the next item's first stage is ready: streamed, that plan delivered
    # 21.4 items/s against the 41.1 its bottleneck allows. A call's order within one item on
    # one worker is kept by run_dag's tokens; a chain's calls each wait for the one before.
    opts: dict[str, Any] = {
        "num_cpus": res.pop("CPU", 0),
        "max_restarts": 0,
        "max_task_retries": 0,
        "allow_out_of_order_execution": True,
    }
    if "GPU" in res:
        opts["num_gpus"] = res.pop("GPU")
    if res:
        opts["resources"] = res
    env = thread_env(spec.threads)
    if env:
        # Set before the worker process starts, so the framework sizes its pools by it.
        opts["runtime_env"] = {"env_vars": env}
    return opts


def _check_resources(specs: Sequence[DeviceSpec]) -> None:
    total = ray.cluster_resources()
    for spec in specs:
        need = dict(spec.resources or {})
        for key, amount in need.items():
            have = total.get(key, 0.0)
            if have < amount:
                offered = ", ".join(sorted(k for k in total if not k.startswith("node:"))) or "nothing"
                raise PlanError(
                    f"device {spec.name!r} asks for Ray resource {key}={amount:g}, but the Ray cluster "
                    f"offers {have:g} (its resources: {offered}); start the node that should host it with "
                    f"`ray start --address=HEAD:6379 --resources='{{\"{key}\": {amount:g}}}'`, or change "
                    f'"resources" in the cluster file'
                )


@dataclass
class WorkerInfo:
    """Where one device's worker runs."""

    device: str
    backend: str
    pid: int
    host: str
    local: bool
    threads: int | None
    clock_offset: float = 0.0  # worker clock minus driver clock, seconds
    cores: float | None = None  # CPU cores its process may use on its host


class Workers:
    """The workers of a set of devices: a Ray actor per device, and an in-process
    worker for the driver's device. Use as a context manager: leaving it kills the
    actors (and tears down a compiled graph)."""

    def __init__(self, specs: Sequence[DeviceSpec], driver: DeviceSpec | None, timeout: float, startup_timeout: float):
        self.specs = {s.name: s for s in specs}
        self.driver = driver
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        self.actors: dict[str, Any] = {}
        self.local: StageWorker | None = None
        self.info: dict[str, WorkerInfo] = {}
        self.compiled: Any = None
        self.compiled_chain: list[Link] = []
        self._actor_ids: dict[str, str] = {}

    # -- life cycle ------------------------------------------------------------
    def __enter__(self) -> Workers:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _start(self) -> None:
        host = socket.gethostname()
        d = self.driver
        if d is not None and d.backend is not None:
            self.local = StageWorker(d.name, d.backend, d.device, d.threads)
            got = self.local.setup()
            self.info[d.name] = WorkerInfo(
                d.name,
                d.backend,
                os.getpid(),
                host,
                True,
                d.threads,
                cores=usable_cores(),
            )
            if not got["threads_applied"]:
                import warnings

                warnings.warn(
                    f"threads={d.threads} of the driver device {d.name!r} is not applied: its "
                    f"framework was imported before the run started",
                    RuntimeWarning,
                    stacklevel=3,
                )
        remote_specs = [s for s in self.specs.values()]
        _check_resources(remote_specs)
        actor_cls = ray.remote(StageWorker)
        for spec in remote_specs:
            handle: Any = actor_cls.options(**_actor_options(spec)).remote(
                spec.name, spec.backend, spec.device, spec.threads
            )
            self.actors[spec.name] = handle
            self._actor_ids[handle._actor_id.hex()] = spec.name
        # Where each worker runs is asked first (no framework import): a worker dying while it
        # imports its framework is then named by pid and host, as a running one is.
        where: dict[str, dict[str, Any]] = {}
        for step in ("where", "setup"):
            refs = {name: getattr(a, step).remote() for name, a in self.actors.items()}
            for name, ref in refs.items():
                at = f" (pid {where[name]['pid']} on host {where[name]['host']})" if name in where else ""
                try:
                    got = ray.get(ref, timeout=self.startup_timeout)
                except ray_exceptions.GetTimeoutError:
                    raise WorkerTimeoutError(
                        f"the worker on device {name!r}{at} did not start within {self.startup_timeout:g} s "
                        f"(no node can host it, or its framework takes longer to import); check its "
                        f'"resources" and the Ray cluster, or raise the startup timeout'
                    ) from None
                except ray_exceptions.RayTaskError as e:
                    raise _cause(e, f"device {name!r}: ") from None
                except ray_exceptions.RayActorError as e:
                    raise WorkerDiedError(
                        f"the worker on device {name!r}{at} died while starting: {_first_line(e)}"
                    ) from None
                if step == "where":
                    where[name] = got
                else:
                    self.info[name] = WorkerInfo(
                        name, got["backend"], got["pid"], got["host"], False, got["threads"], cores=got.get("cores")
                    )
        for name, info in self.info.items():
            if not info.local and info.host != host:
                info.clock_offset = self._clock_offset(name)

    def _clock_offset(self, name: str, pings: int = 7) -> float:
        """Worker clock minus driver clock, from the ping with the shortest round trip
        (Cristian's algorithm); only used for workers on another host."""
        best = (float("inf"), 0.0)
        for _ in range(pings):
            t0 = time.time()
            remote = self._get(
                self.actors[name].clock.remote(),
                lambda: f"the worker on device {name!r}",
                what="answering a clock ping",
                device=name,
                timeout=PING_TIMEOUT,
            )
            t1 = time.time()
            best = min(best, (t1 - t0, remote - (t0 + t1) / 2))
        return best[1]

    def load(
        self,
        model: Any,
        stages: dict[str, list[Any]],
        params: dict[str, dict[int, np.ndarray]],
        state: Sequence[np.ndarray] | None = None,
        sends: Sequence[Any] | None = None,
    ) -> tuple[int, float]:
        """Send each worker its stages, parameters and BatchNorm ``state`` (and a graph
        plan's ``sends``); return (bytes shipped to the actors, seconds until every actor
        had them on its device)."""
        shipped = sum(int(a.nbytes) for name, p in params.items() if name in self.actors for a in p.values())
        t0 = time.perf_counter()
        # ray.put: parameters travel through the object store, whatever their size.
        extra: tuple[Any, ...] = (
            () if state is None and sends is None else (None if state is None else ray.put(list(state)), sends)
        )
        refs = {
            name: self.actors[name].load.remote(model, stages.get(name, []), ray.put(params.get(name, {})), *extra)
            for name in self.actors
        }
        for name, ref in refs.items():
            who = partial("the worker of device {!r}".format, name)
            self._get(ref, who, what="receiving its parameters", device=name)
        seconds = time.perf_counter() - t0
        if self.local is not None:
            name = self.local.name
            self.local.load(model, stages.get(name, []), params.get(name, {}), state, sends)
        return shipped, seconds

    def close(self) -> None:
        """Tear down the compiled graph, if any, and kill every actor (idempotent)."""
        if self.compiled is not None:
            cdag, self.compiled = self.compiled, None
            try:
                from ray.dag import DAGContext

                DAGContext.get_current().teardown_timeout = CGRAPH_TEARDOWN_TIMEOUT
                cdag.teardown(kill_actors=True)
            except Exception:  # noqa: BLE001 - the actors are killed below either way
                pass
        for handle in self.actors.values():
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self.actors.clear()

    # -- errors --------------------------------------------------------------
    def _get(
        self, ref: Any, who: Callable[[], str], what: str, device: str | None = None, timeout: float | None = None
    ) -> Any:
        timeout = self.timeout if timeout is None else timeout
        try:
            return ray.get(ref, timeout=timeout)
        except ray_exceptions.GetTimeoutError:
            info = self.info.get(device) if device is not None else None
            where = f" (pid {info.pid} on host {info.host})" if info is not None else ""
            raise WorkerTimeoutError(
                f"{who()}{where} did not finish {what} within {timeout:g} s; the run "
                f"was stopped and its workers shut down (raise the timeout if it is "
                f"only slow)"
            ) from None
        except ray_exceptions.RayActorError as e:
            raise self.died(e, who) from None
        except (ray_exceptions.ObjectLostError, ray_exceptions.NodeDiedError):
            raise WorkerDiedError(
                f"{who()}: a result was lost with its worker's host (its processes died or its "
                f"node left the Ray cluster) while {what}; the run was stopped"
            ) from None
        except ray_exceptions.RayTaskError as e:
            raise _cause(e, f"{who()}: ") from None

    def died(self, e: Exception, who: Callable[[], str], device: str | None = None) -> WorkerDiedError:
        """A WorkerDiedError naming the worker whose actor ``e`` reports dead (``device`` where
        ``e`` names no actor of ours)."""
        name = self.device_of(e) or device
        info = self.info.get(name) if name else None
        where = f" (pid {info.pid} on host {info.host})" if info else ""
        return WorkerDiedError(
            f"{who()}: its worker process{where} died ({_first_line(e)}); the run was stopped and its workers shut down"
        )

    def lost(self, device: str, label: str, index: int) -> WorkerDiedError:
        """A WorkerDiedError for a result of ``device`` that Ray lost with its host's node."""
        info = self.info.get(device)
        where = f" (pid {info.pid} on host {info.host})" if info else ""
        return WorkerDiedError(
            f"{label}: the output of item {index} was lost with its worker{where}: that host's "
            f"processes died or its node left the Ray cluster; the run was stopped and its "
            f"workers shut down"
        )

    def device_of(self, e: Exception) -> str | None:
        """The device whose actor the Ray error ``e`` is about, if it names one."""
        return self._actor_ids.get(_actor_id_hex(e) or "")


def _actor_id_hex(e: Exception) -> str | None:
    aid = getattr(e, "actor_id", None)
    if aid is None:
        return None
    return aid if isinstance(aid, str) else getattr(aid, "hex", lambda: None)()


def _first_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    for marker in ("The actor died", "The actor is dead", "The actor is unavailable"):
        i = text.find(marker)
        if i >= 0:
            return text[i:].split(". ")[0]
    return text[:200]


def _cause(e: Any, prefix: str) -> BaseException:
    cause = getattr(e, "cause", None)
    if isinstance(cause, MultigpuError):
        return type(cause)(prefix + str(cause))
    if isinstance(cause, BaseException):
        return RuntimeError(f"{prefix}{type(cause).__name__}: {cause}")
    return RuntimeError(f"{prefix}{e}")


# -- running a chain -------------------------------------------------------------
@dataclass
class ChainResult:
    """Per item: the output, the trace (send, (start, end) per link, arrival)."""

    outputs: list[np.ndarray]
    traces: list[tuple[float, ...]]
    done: list[float] = field(default_factory=list)  # driver clock at each item's arrival


@dataclass
class _Item:
    index: int
    value: Any
    next: int = 0
    refs: list[tuple[int, Any]] = field(default_factory=list)


def run_chain(
    workers: Workers,
    chain: Sequence[Link],
    labels: Sequence[str],
    inputs: Sequence[np.ndarray],
    window: int = 1,
    engine: str = "tasks",
) -> ChainResult:
    """Push every input through ``chain`` (``(device, stage id)`` per link) and return
    the outputs and their traces in input order.

    ``window`` items are in flight at once (1: one at a time, for latency; more:
    a pipeline, stage i working on item j while stage i-1 works on item j+1).
    ``labels`` name each link in error messages.
    """
    if engine == "compiled":
        return _run_compiled(workers, chain, labels, inputs, window)
    driver = workers.local.name if workers.local is not None else None
    # The outputs are placeholders until each item arrives.
    out = ChainResult(cast(list[np.ndarray], [None] * len(inputs)), [()] * len(inputs), [0.0] * len(inputs))
    active: deque[_Item] = deque()
    nxt = 0
    finished = 0

    def advance(item: _Item) -> None:
        while item.next < len(chain):
            dev, sid = chain[item.next]
            if workers.local is not None and dev == driver:
                if isinstance(item.value, ray.ObjectRef):
                    return
                item.value = workers.local.run(sid, item.value)
            else:
                item.value = workers.actors[dev].run.remote(sid, item.value)
                item.refs.append((item.next, item.value))
            item.next += 1

    while finished < len(inputs):
        while nxt < len(inputs) and len(active) < window:
            item = _Item(nxt, (inputs[nxt], (time.time(),)))
            advance(item)
            active.append(item)
            nxt += 1
        item = active[0]
        if isinstance(item.value, ray.ObjectRef):
            item.value = _wait_item(workers, item, labels, chain)
        if item.next < len(chain):
            advance(item)
            continue
        arrival = time.time()
        y, trace = item.value
        out.outputs[item.index] = y
        out.traces[item.index] = trace + (arrival,)
        out.done[item.index] = arrival
        active.popleft()
        finished += 1
    return out


def _wait_item(workers: Workers, item: _Item, labels: Sequence[str], chain: Sequence[Link]) -> Any:
    """``ray.get`` the item's latest result; name the failing stage on an error."""
    try:
        return ray.get(item.value, timeout=workers.timeout)
    except ray_exceptions.GetTimeoutError:
        # A stage that failed is the cause, not a later one still waiting for its output (a
        # host killed mid-run: its stage's result holds the error while the next stage waits).
        stuck = None
        for pos, ref in item.refs:
            try:
                ray.get(ref, timeout=0)
            except _STAGE_ERRORS as e:
                _raise_stage_error(workers, item, labels, chain, e, pos)
            except ray_exceptions.GetTimeoutError:
                stuck = pos if stuck is None else stuck
        stuck = item.refs[-1][0] if stuck is None else stuck
        info = workers.info.get(chain[stuck][0])
        where = f" (its worker: pid {info.pid} on host {info.host})" if info is not None else ""
        raise WorkerTimeoutError(
            f"{labels[stuck]}{where} did not finish item {item.index} within {workers.timeout:g} s; the run was "
            f"stopped and its workers shut down (raise the timeout if the stage is only slow, or check that "
            f"host and its link)"
        ) from None
    except _STAGE_ERRORS as e:
        _raise_stage_error(workers, item, labels, chain, e)


_STAGE_ERRORS = (
    ray_exceptions.RayActorError,
    ray_exceptions.ObjectLostError,
    ray_exceptions.NodeDiedError,
    ray_exceptions.RayTaskError,
)


def _raise_stage_error(
    workers: Workers, item: _Item, labels: Sequence[str], chain: Sequence[Link], e: Exception, at: int | None = None
) -> NoReturn:
    """Raise the error naming the stage (and its worker's host) that Ray error ``e`` (one of
    ``_STAGE_ERRORS``) is about; ``at`` is the position of the stage whose result raised it, when
    known."""
    fallback = item.refs[-1][0] if at is None else at
    if isinstance(e, ray_exceptions.RayActorError):
        dev = workers.device_of(e)
        pos = next((p for p, _ in item.refs if labels[p].endswith(f"device {dev!r}")), fallback)
        raise workers.died(e, lambda: labels[pos], chain[pos][0]) from None
    if isinstance(e, (ray_exceptions.ObjectLostError, ray_exceptions.NodeDiedError)):
        # A host that died with its node takes the results it held (and its worker) along.
        lost = getattr(e, "object_ref_hex", None)
        pos = next((p for p, r in item.refs if r.hex() == lost), fallback)
        raise workers.lost(chain[pos][0], labels[pos], item.index) from None
    raise _cause(e, "") from None  # a RayTaskError: the stage's own exception


def _run_compiled(
    workers: Workers, chain: Sequence[Link], labels: Sequence[str], inputs: Sequence[np.ndarray], window: int
) -> ChainResult:
    from ray.dag import InputNode

    driver = workers.local.name if workers.local is not None else None
    remote = [i for i, (dev, _) in enumerate(chain) if dev != driver]
    if remote and remote != list(range(remote[0], remote[-1] + 1)):
        raise PlanError(
            "the compiled engine needs the driver's stages at the start or the end of the "
            "plan (a compiled graph cannot call back into the driver); use engine='tasks'"
        )
    head = [chain[i] for i in range(0, remote[0] if remote else len(chain))]
    tail = [chain[i] for i in range(remote[-1] + 1, len(chain))] if remote else []
    if workers.compiled is not None and workers.compiled_chain != list(chain):
        raise PlanError(
            "this set of workers already runs a compiled graph for another chain; a compiled "
            "graph is compiled once per set of workers (run_partitioned starts fresh ones)"
        )
    if workers.compiled is None and remote:
        workers.compiled_chain = list(chain)
        with InputNode() as node:
            dag = node
            for i in remote:
                dev, sid = chain[i]
                dag = workers.actors[dev].run.bind(sid, dag)
        try:
            workers.compiled = dag.experimental_compile(_max_inflight_executions=CGRAPH_MAX_INFLIGHT)
        except ray_exceptions.RayActorError as e:  # a worker died while the graph was being compiled
            failed = workers.device_of(e)
            raise workers.died(e, lambda: f"a worker of the compiled graph (device {failed!r})") from None
    cdag = workers.compiled
    window = min(window, CGRAPH_MAX_INFLIGHT)
    # The outputs are placeholders until each item arrives.
    out = ChainResult(cast(list[np.ndarray], [None] * len(inputs)), [()] * len(inputs), [0.0] * len(inputs))
    pending: deque[tuple[int, Any]] = deque()

    def local(links: Sequence[Link], msg: Any) -> Any:
        for _, sid in links:
            assert workers.local is not None  # a driver's link: the driver runs stages
            msg = workers.local.run(sid, msg)
        return msg

    def collect() -> None:
        idx, ref = pending.popleft()
        try:
            msg = ray.get(ref, timeout=workers.timeout)
        except ray_exceptions.GetTimeoutError:
            raise WorkerTimeoutError(
                f"item {idx} did not come out of the compiled graph ({', '.join(labels[i] for i in remote)}) "
                f"within {workers.timeout:g} s; the run was stopped and its workers shut down"
            ) from None
        except ray_exceptions.RayActorError as e:
            dev = workers.device_of(e)
            if dev is None:  # Ray's error names no actor: say which stages could be the one
                who = "a worker of the compiled graph (" + "; ".join(labels[i] for i in remote) + ")"
                raise workers.died(e, lambda: who) from None
            pos = next((i for i in remote if chain[i][0] == dev), remote[0])
            raise workers.died(e, lambda: labels[pos]) from None
        except ray_exceptions.RayTaskError as e:
            raise _cause(e, "") from None
        y, trace = msg
        y, trace = local(tail, (np.array(y, copy=True), tuple(trace)))
        arrival = time.time()
        out.outputs[idx], out.traces[idx], out.done[idx] = y, trace + (arrival,), arrival

    for idx, x in enumerate(inputs):
        msg = local(head, (x, (time.time(),)))
        if not remote:  # every stage on the driver: nothing to compile
            arrival = time.time()
            out.outputs[idx], out.traces[idx], out.done[idx] = msg[0], msg[1] + (arrival,), arrival
            continue
        pending.append((idx, cdag.execute(msg)))
        if len(pending) >= window:
            collect()
    while pending:
        collect()
    return out


# -- running a DAG of stages -------------------------------------------------------
@dataclass
class DagResult:
    """Per item: the output, the trace (worker clocks: each stage's (start, end, busy)
    by stage index, and ``("sent", j)``: when message j's part ended; see
    ``StageWorker.run_stage``), the driver's send time and arrival time."""

    outputs: list[np.ndarray]
    traces: list[dict[Any, Any]]  # stage -> (start, end, busy); ("sent", j) -> end
    sent: list[float]
    done: list[float]


@dataclass
class _DagItem:
    index: int
    msgs: dict[int, Any]
    next: int = 0
    refs: list[tuple[int, Any]] = field(default_factory=list)  # (stage index, ref) of every remote call
    tokens: list[Any] = field(default_factory=list)  # results of stages that send nothing
    after: dict[str, Any] = field(default_factory=dict)  # device -> its latest stage's order token


def run_dag(
    workers: Workers,
    routes: Sequence[Any],
    sends: Sequence[Any],
    labels: Sequence[str],
    inputs: Sequence[np.ndarray],
    window: int = 1,
) -> DagResult:
    """Push every input through a DAG plan's stages (``plan.routes``) and return the
    outputs and traces in input order.

    The driver submits an item's stages in stage order, each remote call taking the
    ObjectRefs of the messages it receives as arguments, so a stage starts on its
    worker as soon as its inputs are there and stages on different workers run at the
    same time; a stage returns one ObjectRef per message it sends (an activation goes
    once to each consuming device). A worker's stage runs as one call per part
    (``StageRoute.parts``), so a message leaves when the layer it carries is done, not
    when the stage is. Workers run their calls out of order (whichever has its
    arguments), so one that is not its device's last for the item also returns a
    token, which its device's next call of the item waits for: it reads what the
    earlier one kept. The driver's own stages run here, whole, once their inputs arrive.
    ``window`` items are in flight at once. ``labels`` name each stage in error messages.
    """
    from multigpu.execution.plan import SINK, SOURCE

    driver = workers.local.name if workers.local is not None else None
    sink = next(j for j, m in enumerate(sends) if m.stage == SINK)
    out = DagResult(
        cast(list[np.ndarray], [None] * len(inputs)),  # placeholders until each item arrives
        [{} for _ in inputs],
        [0.0] * len(inputs),
        [0.0] * len(inputs),
    )
    active: deque[_DagItem] = deque()
    nxt = 0
    finished = 0

    def reply(item: _DagItem, sends: Sequence[int], got: Any) -> None:
        if not sends:
            item.tokens.append(got)
            return
        vals = [got] if len(sends) == 1 else list(got)
        for j, v in zip(sends, vals):
            item.msgs[j] = v

    def advance(item: _DagItem) -> None:
        while item.next < len(routes):
            r = routes[item.next]
            args = [item.msgs[j] for j in r.receives]
            if workers.local is not None and r.device == driver:
                if any(isinstance(a, ray.ObjectRef) for a in args):
                    return
                reply(item, r.sends, workers.local.run_stage(r.index, item.index, *args))
            else:
                # One call per part: a message leaves when its part is done, while the
                # stage's later parts run (the stage's inputs all go to its first part).
                for p, part in enumerate(r.parts):
                    count = max(1, len(part.sends))
                    token = not (r.last and p == len(r.parts) - 1)  # the device's next call of the item waits for it
                    got = (
                        workers.actors[r.device]
                        .run_stage.options(num_returns=count + token)
                        .remote(
                            r.index,
                            item.index,
                            *(args if p == 0 else ()),
                            after=item.after.get(r.device),
                            token=token,
                            part=p,
                        )
                    )
                    refs = [got] if count + token == 1 else list(got)
                    if token:
                        item.after[r.device] = refs.pop()
                    item.refs += [(r.index, ref) for ref in refs]
                    reply(item, part.sends, refs[0] if count == 1 else refs)
            item.next += 1

    def resolve(item: _DagItem, keys: Sequence[int]) -> None:
        refs = [item.msgs[j] for j in keys if isinstance(item.msgs[j], ray.ObjectRef)]
        values = iter(_get_dag(workers, item, refs, labels, routes))
        for j in keys:
            if isinstance(item.msgs[j], ray.ObjectRef):
                item.msgs[j] = next(values)

    while finished < len(inputs):
        while nxt < len(inputs) and len(active) < window:
            t_send = time.time()
            msgs: dict[int, Any] = {j: ({"input": inputs[nxt]}, {}) for j, m in enumerate(sends) if m.source == SOURCE}
            item = _DagItem(nxt, msgs)
            out.sent[nxt] = t_send
            advance(item)
            active.append(item)
            nxt += 1
        item = active[0]
        if item.next < len(routes):
            resolve(item, routes[item.next].receives)
            advance(item)
            continue
        resolve(item, [sink])
        arrival = time.time()
        tensors, trace = item.msgs[sink]
        merged: dict[Any, Any] = {}
        pending = [t for t in item.tokens if isinstance(t, ray.ObjectRef)]
        for tok in _get_dag(workers, item, pending, labels, routes) + [
            t for t in item.tokens if not isinstance(t, ray.ObjectRef)
        ]:
            merge_trace(merged, tok[1])
        merge_trace(merged, trace)
        out.outputs[item.index] = tensors[sends[sink].names[0]]
        out.traces[item.index] = merged
        out.done[item.index] = arrival
        active.popleft()
        finished += 1
    return out


def _get_dag(
    workers: Workers, item: _DagItem, refs: Sequence[Any], labels: Sequence[str], routes: Sequence[Any]
) -> list[Any]:
    """``ray.get`` some of an item's results; name the failing stage on an error (as a
    chain's item does: its calls' refs are by stage index, the labels' positions)."""
    if not refs:
        return []
    # _wait_item names a stuck stage's worker by its device, looked up by stage index (routes come in stage order).
    by_stage = [(r.device, r.index) for r in routes]
    return list(_wait_item(workers, _Item(item.index, list(refs), refs=item.refs), labels, by_stage))
