"""The stage worker: hosts the stages of one device and runs them on its own backend.

A plain class with no Ray import. The Ray engine wraps it as an actor (one process
per device of a plan); the driver instantiates it directly for the stages that run
on the source device. Every stage of a chain is a slice of the same ``Sequential``
(``model.forward(backend, params, x, start, stop)``), every stage of a graph model a
set of its nodes (``model.run``), on the backend the device names, so no
framework-specific model code exists anywhere.

Timestamps use ``time.time()``: one clock for every process on a host, so a hop's
two ends can be subtracted (the engine corrects for another host's clock offset).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from multigpu.contract.protocol import Device
from multigpu.execution.cores import usable_cores
from multigpu.execution.daemon_cpu import node_daemon
from multigpu.models.context import RunContext

__all__ = [
    "PROBE",
    "PROBE_IDLE",
    "PROBE_SEND",
    "StageWorker",
    "merge_trace",
    "THREAD_ENV_VARS",
    "parse_framework_device",
    "thread_env",
]

# Stage id of a link probe: the message passes through unchanged while the worker
# computes some layers of the profiled model, so a hop is timed between two workers
# that really compute (their caches as cold as in a run).
PROBE = -1
# Stage id of a bare link probe: nothing computed (the engine's own cost, compared
# with a bare actor call).
PROBE_IDLE = -2
# Stage id of a one-way stream probe: computes as PROBE does, and replies with the
# payload's first value only, so a stream of them loads the link one way, as a stage
# that sends back a small result does (``stream_fitting``).
PROBE_SEND = -3

# Read by OpenMP, MKL, OpenBLAS and oneDNN when the framework loads; torch, paddle
# and mxnet size their CPU thread pools from them.
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def thread_env(threads: int | None) -> dict[str, str]:
    """Environment variables that give a fresh worker process ``threads`` math threads."""
    return {} if threads is None else {k: str(threads) for k in THREAD_ENV_VARS}


def parse_framework_device(text: str | None) -> Device:
    """``"cpu"`` -> Device("cpu", 0); ``"gpu:1"`` -> Device("gpu", 1) (the cluster file has
    already checked the syntax)."""
    if text is None or text == "cpu":
        return Device("cpu", 0)
    kind, _, index = text.partition(":")
    return Device(kind, int(index))


def merge_trace(into: dict[Any, Any], got: Mapping[Any, Any]) -> None:
    """Add the trace ``got`` to ``into``. A stage run in parts reaches a device through
    several messages, each with the stage as far as it had run: its entry with the
    latest end wins, so an early message never undoes a later one."""
    for key, value in got.items():
        old = into.get(key)
        if old is None or not isinstance(value, tuple) or value[1] >= old[1]:
            into[key] = value


class StageWorker:
    """One device's worker: loads the backend, receives stages and parameters, runs them.

    A message between stages is ``(array, trace)``: ``trace`` is a tuple of
    timestamps that every stage extends with the start and end of its computation.
    """

    def __init__(self, name: str, backend: str, device: str | None, threads: int | None):
        self.name = name
        self.backend_name = backend
        self.device = parse_framework_device(device)
        self.threads = threads
        self.be: Any = None
        self.model: Any = None
        self.params: list[Any] = []
        self.stages: dict[int, tuple[int, int]] = {}
        self.routes: dict[int, Any] = {}  # a graph model's stages (plan.StageRoute)
        self.send_names: dict[int, tuple[str, ...]] = {}  # message index -> the tensors it carries
        self.state: list[Any] | None = None  # BatchNorm running statistics, on the device
        self._store: dict[int, dict[str, Any]] = {}  # per item: tensors later stages here consume
        self._traces: dict[int, dict[Any, Any]] = {}  # stage -> (start, end, busy); ("sent", j) -> end

    # -- set-up ------------------------------------------------------------
    def where(self) -> dict[str, Any]:
        """This worker's process id and host, before any framework is imported (so a worker
        that dies while importing one is still named by host)."""
        return {"pid": os.getpid(), "host": os.uname().nodename}

    def setup(self) -> dict[str, Any]:
        """Load the backend (the framework is imported here); return where this worker runs.

        Raises BackendNotInstalledError (naming the pip extra) or UnknownBackendError.
        """
        from multigpu.contract import registry

        framework_loaded = self._framework_loaded()
        wanted = thread_env(self.threads)
        if self.threads is not None and not framework_loaded:
            os.environ.update(wanted)
        # Loaded earlier under the same settings (a second run in one process) counts as applied.
        applied = not framework_loaded or all(os.environ.get(k) == v for k, v in wanted.items())
        self.be = registry.backend(self.backend_name)
        self.be.from_numpy(np.zeros(1, np.float32), self.device)  # fail now on a bad device
        self._context = RunContext(devices=[self.device])
        return {
            "name": self.name,
            "pid": os.getpid(),
            "host": os.uname().nodename,
            "backend": self.backend_name,
            "device": str(self.device),
            "threads": self.threads,
            "threads_applied": applied,
            "time": time.time(),
            "cores": usable_cores(),
        }

    def _framework_loaded(self) -> bool:
        from multigpu.contract import registry

        try:
            framework = registry.declaration(self.backend_name).framework
        except Exception:
            return False  # setup's registry.backend call raises the precise error
        return framework is not None and framework in sys.modules

    def load(
        self,
        model: Any,
        stages: Sequence[Any],
        params: dict[int, np.ndarray],
        state: Sequence[np.ndarray] | None = None,
        sends: Sequence[Any] | None = None,
    ) -> float:
        """Receive the model spec, this device's stages (a chain's ``(index, start, stop)``;
        a graph model's ``StageRoute``s with the plan's ``sends``), the parameters they use
        (by index into the model's parameter list) and the BatchNorm ``state``; return the
        seconds spent placing parameters and state on the device."""
        t0 = time.perf_counter()
        self.model = model
        self.stages = {int(st[0]): (int(st[1]), int(st[2])) for st in stages if isinstance(st, tuple)}
        self.routes = {int(st.index): st for st in stages if not isinstance(st, tuple)}
        self.send_names = {j: tuple(m.names) for j, m in enumerate(sends or ())}
        self._store, self._traces = {}, {}
        full: list[Any] = [None] * len(model.param_shapes)
        for i, arr in params.items():
            full[int(i)] = self.be.from_numpy(arr, self.device)
        self.params = full
        self.state = None if state is None else [self.be.from_numpy(a, self.device) for a in state]
        self.be.synchronize(self.device)
        return time.perf_counter() - t0

    def echo(self, x: np.ndarray) -> np.ndarray:
        """Return ``x``: a bare actor call, the yardstick a hop is compared with."""
        return x

    def clock(self) -> float:
        """This worker's ``time.time()`` (for clock-offset estimates across hosts)."""
        return time.time()

    def cpu_time(self) -> tuple[float, float, float, float, int | None, float | None]:
        """CPU seconds so far: (this worker's process, every thread (Ray's included); the
        thread that runs its calls (and stages); of the first, spent computing link
        probes' layers; of the second, likewise; the pid of its node daemon (the raylet,
        which moves its objects between nodes) and that process's CPU seconds, both None
        where they cannot be read)."""
        probe = getattr(self, "_probe_cpu", (0.0, 0.0))
        pid, daemon = node_daemon()
        return time.process_time(), time.thread_time(), probe[0], probe[1], pid, daemon

    # -- running -----------------------------------------------------------
    def _named(self) -> tuple[str, ...]:
        """The model's named inputs when it has several or integer ones (a token model), else ()."""
        inputs = getattr(self.model, "inputs", {})
        named = len(inputs) > 1 or any(spec.dtype == "int64" for spec in inputs.values())
        return tuple(inputs) if named else ()

    def _received(self, name: str, arr: np.ndarray) -> dict[str, Any]:
        """The tensors a received array holds: the model input of a token model arrives as one
        (B, inputs, ...) array (``runner.split_inputs``), split here into its named inputs."""
        be, dev, named = self.be, self.device, self._named()
        if name != "input" or not named:
            return {name: be.from_numpy(arr, dev)}
        return {n: be.from_numpy(np.ascontiguousarray(arr[:, k]), dev) for k, n in enumerate(named)}

    def _feeds(self, store: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
        """A part's feeds from the store, the model input expanded to a token model's named inputs."""
        named = self._named()
        out: dict[str, Any] = {}
        for n in names:
            for k in named if n == "input" and named else (n,):
                out[k] = store[k]
        return out

    def run(self, stage: int, message: tuple[np.ndarray, tuple[float, ...]]) -> tuple[np.ndarray, tuple[float, ...]]:
        """Run stage ``stage`` on the message's array; return the output and the extended trace."""
        x, trace = message
        be, dev = self.be, self.device
        t = be.from_numpy(x, dev)
        t0 = time.time()
        if stage in (PROBE, PROBE_IDLE, PROBE_SEND):  # a link probe: the payload passes unchanged
            if stage != PROBE_IDLE:  # ... while the worker computes, as a stage would
                c0, h0 = time.process_time(), time.thread_time()
                self._busy()
                be.synchronize(dev)
                p0, p1 = getattr(self, "_probe_cpu", (0.0, 0.0))
                self._probe_cpu = (p0 + time.process_time() - c0, p1 + time.thread_time() - h0)
            y = t
        else:
            start, stop = self.stages[stage]
            y = self.model.forward(be, self.params, t, start, stop, state=self.state, context=self._context)
        be.synchronize(dev)
        t1 = time.time()
        out = be.to_numpy(y)
        return (out.reshape(-1)[:1].copy() if stage == PROBE_SEND else out), trace + (t0, t1)

    def run_stage(
        self,
        stage: int,
        item: int,
        *messages: tuple[dict[str, np.ndarray], dict[Any, Any]],
        after: Any = None,
        token: bool = False,
        part: int | None = None,
    ) -> Any:
        """Run stage ``stage`` of a graph model for item ``item``: its part ``part``
        (``StageRoute.parts``; None: every part, one after another).

        ``messages`` are ``(tensors, trace)`` pairs: the tensors this device receives
        for the stage (kept for its later parts and stages too) and each sender's trace.
        A trace maps a stage to ``(start, end, busy)``: its first part's start, its latest
        part's end and the seconds its parts computed; and ``("sent", j)`` to when the part
        that sends message ``j`` ended. Returns one ``(tensors, trace)`` per message the
        part sends (a tuple when it sends several; its trace alone when none), followed by
        an order token (None) with ``token``: ``after`` is the token of the device's
        previous call of the item, which Ray delivers before this call runs (a Ray worker
        runs its calls out of order; see ``engine.run_dag``).
        """
        route = self.routes[stage]
        be, dev = self.be, self.device
        store = self._store.setdefault(item, {})
        trace = self._traces.setdefault(item, {})
        for tensors, got in messages:
            for name, arr in tensors.items():
                store.update(self._received(name, arr))
            merge_trace(trace, got)
        which = range(len(route.parts)) if part is None else (part,)
        sends: list[int] = []
        for p in which:
            piece = route.parts[p]
            t0 = time.time()
            # the worker's device in the context: layers that make constants (masks, an imported
            # graph's folded values) make them there
            out = self.model.run(
                be, self.params, self._feeds(store, piece.feeds), piece.nodes, state=self.state, context=self._context
            )
            be.synchronize(dev)
            t1 = time.time()
            store.update(out)
            begun, busy = (t0, 0.0) if p == 0 else trace[stage][::2]
            trace[stage] = (begun, t1, busy + t1 - t0)
            for j in piece.sends:
                trace[("sent", j)] = t1
            sends += piece.sends
        replies = [({n: be.to_numpy(store[n]) for n in self.send_names[j]}, dict(trace)) for j in sends]
        if route.last and (part is None or part == len(route.parts) - 1):
            self._store.pop(item, None)
            self._traces.pop(item, None)
        results: list[Any] = replies or [({}, dict(trace))]
        if token:
            results.append(None)  # what the device's next call of this item waits for
        return results[0] if len(results) == 1 else tuple(results)

    # -- profiling ---------------------------------------------------------
    def prepare_profile(self, model: Any, params: Sequence[np.ndarray] | None, batch: int, seed: int = 0) -> None:
        """Place ``params`` (None: the model's own initial parameters from ``seed``, made
        here) and a graph model's initial BatchNorm state and a random input batch on
        the device, and keep every layer's inputs of one pass, for ``time_pass`` and
        ``time_first``."""
        be, dev = self.be, self.device
        self._prof_model = model
        # Made here from the seed rather than shipped: a layer's time does not depend on
        # its weights' values, and AlexNet's 244 MB would take four minutes over the
        # report's 1 MB/s WiFi.
        params = model.init_params(seed) if params is None else params
        self._prof_params = [be.from_numpy(p, dev) for p in params]
        self._prof_state = (
            [be.from_numpy(a, dev) for a in model.init_state()] if getattr(model, "batch_norms", None) else None
        )
        rng = np.random.default_rng(seed)
        self._prof_input = rng.random((batch, *model.input_shape), dtype=np.float32)
        x = be.from_numpy(self._prof_input, dev)
        names = [name for name, _ in model.layers]
        # Every node's output of one pass (a graph model's layer may consume any earlier one).
        self._prof_env = model.run(be, self._prof_params, {"input": x}, names, state=self._prof_state, outputs=names)
        self._prof_env["input"] = x
        self._prof_feeds = [{n: self._prof_env[n] for n in node.inputs} for node in model.nodes]
        be.synchronize(dev)

    def set_probe_work(self, layers: int, wait: float = 0.0) -> None:
        """A probe sleeps ``wait`` seconds, then computes the first ``layers`` layers of the model
        ``prepare_profile`` set up, as a stage runs after the hop before it waited."""
        self._probe_layers = int(layers)
        self._probe_wait = max(float(wait), 0.0)

    def _busy(self) -> None:
        if getattr(self, "_probe_wait", 0.0):
            # Sleep, not compute: the hop's other processes wait as long as a stage would keep
            # them waiting, while a host's CPU quota stays for the transfer (a busy wait on a
            # Pi-class host throttles the object store's pull and the fit would price it as
            # bandwidth).
            time.sleep(self._probe_wait)
        model = self._prof_model
        model.forward(
            self.be,
            self._prof_params,
            self._prof_feeds[0]["input"],
            0,
            getattr(self, "_probe_layers", 0),
            state=self._prof_state,
        )

    def _layer(self, i: int) -> Any:
        """Run layer ``i`` alone on its inputs of the prepared pass."""
        model = self._prof_model
        return model.run(self.be, self._prof_params, self._prof_feeds[i], [model.nodes[i].name], state=self._prof_state)

    def time_pass(self) -> list[float]:
        """Seconds of each layer in one forward pass, the device synchronized after each
        (a warm-up; the profile's layer times come from ``time_prefix``)."""
        be, dev, model = self.be, self.device, self._prof_model
        out = []
        for i in range(len(model)):
            t0 = time.perf_counter()
            self._layer(i)
            be.synchronize(dev)
            out.append(time.perf_counter() - t0)
        return out

    def time_prefix(self, stop: int) -> float:
        """Seconds of layers ``0..stop-1`` run as one stage runs them: one call of the
        model's slice, one synchronize (the profile times the whole pass so; a prefix of
        a graph model's topological order consumes only the input)."""
        be, dev, model = self.be, self.device, self._prof_model
        t0 = time.perf_counter()
        model.forward(be, self._prof_params, self._prof_feeds[0]["input"], 0, stop, state=self._prof_state)
        be.synchronize(dev)
        return time.perf_counter() - t0

    def time_local_pass(self) -> float:
        """Seconds of a whole pass as a plan that never leaves this device runs an item:
        the numpy input onto the device, every layer, one synchronize, the output back to
        numpy (what ``run`` does with a stage that holds every layer)."""
        be, dev, model = self.be, self.device, self._prof_model
        t0 = time.perf_counter()
        y = model.forward(
            be, self._prof_params, be.from_numpy(self._prof_input, dev), 0, len(model), state=self._prof_state
        )
        be.synchronize(dev)
        be.to_numpy(y)
        return time.perf_counter() - t0

    def time_first(self, layer: int) -> float:
        """Seconds of layer ``layer`` alone as the first work of a call: what a stage
        starting at that layer pays (``time_pass`` minus this is the stage overhead)."""
        be, dev = self.be, self.device
        t0 = time.perf_counter()
        self._layer(layer)
        be.synchronize(dev)
        return time.perf_counter() - t0
