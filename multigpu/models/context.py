"""What a model's run knows beyond its inputs: training or inference, the dropout seed and step,
and the device each replica runs on.

A ``RunContext`` travels through ``Model.run``, ``Model.apply`` and ``Model.forward`` to the
layers that need it, as the BatchNorm mode does to BatchNorm nodes:

* **Dropout** draws its masks in the core, never with a framework's RNG:
  :func:`dropout_mask` keys a counter-based generator (``numpy.random.Philox``) by
  ``(seed, node, stream)`` and sets its counter from ``step``, so every backend drops the
  same units, the same seed gives the same run, and no draw depends on how many draws
  came before. With ``shards`` the mask of the whole global batch is drawn and each
  replica takes its rows, so the units dropped do not depend on the number of devices.
  Inference (``training=False``, the default) never drops anything.
* **Constants** (a causal mask, the ones a padding mask is turned around with) are made
  on the replica's device with ``from_numpy``: the protocol has no op that makes a
  tensor from nothing, so a layer that needs one asks :meth:`NodeCall.constant`, which
  needs ``devices``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from multigpu.contract.protocol import Device
from multigpu.errors import ModelError

_MASK64 = (1 << 64) - 1


def dropout_mask(shape: Sequence[int], rate: float, seed: int, step: int, node: int, stream: int = 0) -> np.ndarray:
    """Return a float32 keep-mask (1 = keep, 0 = drop) of ``shape``, each unit dropped with ``rate``.

    Counter-based: the generator is ``Philox`` with key ``(seed, node)`` and counter
    ``(0, 0, step, stream)``, so a mask depends on these four numbers alone. Raises
    ModelError for a rate outside [0, 1).
    """
    if not (isinstance(rate, (int, float)) and 0 <= rate < 1):
        raise ModelError(f"dropout rate={rate!r} must be in [0, 1), e.g. 0.1")
    key = (int(seed) & _MASK64) | ((int(node) & _MASK64) << 64)
    counter = np.array([0, 0, int(step) & _MASK64, int(stream) & _MASK64], dtype=np.uint64)
    gen = np.random.Generator(np.random.Philox(key=key, counter=counter))
    return (gen.random(tuple(shape), dtype=np.float32) >= np.float32(rate)).astype(np.float32)


@dataclass
class RunContext:
    """How a model runs: ``training`` (dropout on), the dropout ``seed`` and ``step``, and per
    replica the ``devices`` (for constants) and the ``shards`` (each replica's rows
    ``(start, stop)`` of a global batch of ``batch`` rows; None: each replica's batch is whole).
    """

    training: bool = False
    seed: int = 0
    step: int = 0
    devices: Sequence[Device] | None = None
    shards: Sequence[tuple[int, int]] | None = None
    batch: int | None = None
    _constants: dict[tuple[int, str], Any] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.training, bool):
            raise ModelError(f"RunContext training={self.training!r} must be True or False")
        for attr in ("seed", "step"):
            v = getattr(self, attr)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ModelError(f"RunContext {attr}={v!r} must be an integer >= 0")
        if self.devices is not None:
            self.devices = tuple(self.devices)
            bad = [d for d in self.devices if not isinstance(d, Device)]
            if bad:
                raise ModelError(f"RunContext devices holds {bad[0]!r}; give Device('cpu', i) or Device('gpu', i)")
        if (self.shards is None) != (self.batch is None):
            raise ModelError("RunContext: give shards and batch together (each replica's rows of the global batch)")

    def for_replica(self, replica: int) -> RunContext:
        """A one-replica context for replica ``replica`` of this one: its device and its rows of the
        global batch (a data-parallel step runs each replica on its own)."""
        pick = lambda seq: None if seq is None else [seq[replica]]  # noqa: E731
        return RunContext(
            training=self.training,
            seed=self.seed,
            step=self.step,
            devices=pick(self.devices),
            shards=pick(self.shards),
            batch=self.batch,
        )

    def at(self, node: int, replica: int) -> NodeCall:
        """The view of this context that node ``node`` gets on replica ``replica``."""
        return NodeCall(self, node, replica)


@dataclass(frozen=True)
class NodeCall:
    """What one node sees of the run on one replica: the context, its node index and replica."""

    context: RunContext
    node: int
    replica: int

    @property
    def training(self) -> bool:
        """True in a training step (dropout on)."""
        return self.context.training

    def device(self, what: str) -> Device:
        """The replica's device; ModelError naming ``what`` needs it when the context has none."""
        devices = self.context.devices
        if devices is None or self.replica >= len(devices):
            raise ModelError(
                f"{what} needs a constant on the replica's device: pass context=RunContext(devices=[device]) "
                "(one device per replica) to Model.run, apply or forward"
            )
        return devices[self.replica]

    def constant(self, backend: Any, key: str, make: Any, what: str) -> Any:
        """A tensor on the replica's device made once per run from ``make()`` (a numpy array)."""
        cache, k = self.context._constants, (self.replica, f"{id(backend)}:{key}")
        if k not in cache:
            cache[k] = backend.from_numpy(make(), self.device(what))
        return cache[k]

    def keep_mask(self, backend: Any, shape: Sequence[int], rate: float, stream: int, what: str) -> Any:
        """The dropout keep-mask for a tensor of ``shape`` on this replica, as a tensor on its device."""
        ctx = self.context
        if ctx.shards is None:
            mask = dropout_mask(shape, rate, ctx.seed, ctx.step, self.node, stream)
        else:
            start, stop = ctx.shards[self.replica]
            if stop - start != shape[0]:
                raise ModelError(
                    f"{what}: replica {self.replica} holds {shape[0]} rows but its shard is rows {start}..{stop - 1}; "
                    "give each replica's (start, stop) rows in RunContext.shards"
                )
            assert ctx.batch is not None  # __post_init__ refuses shards without batch
            mask = dropout_mask((ctx.batch, *shape[1:]), rate, ctx.seed, ctx.step, self.node, stream)[start:stop]
        return backend.from_numpy(np.ascontiguousarray(mask), self.device(what))
