"""A backend wrapper that records every protocol call and every host read of a tensor.

``Recording(inner)`` forwards each protocol method to ``inner`` (any adapter) and
appends an event to ``log``. Tensors it hands out are ``Handle`` proxies: the core
may only pass them back to the backend, so any other use of one (``float(t)``,
``t.item()``, ``np.asarray(t)``, ``bool(t)``, an attribute) is logged as a host read
("host:<what>") before it is forwarded. ``value_and_grad`` is logged as a
``forward`` event when it starts and a ``backward`` event when it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Methods whose results are not tensors (they pass through unwrapped).
_PLAIN = {
    "gpu_count",
    "synchronize",
    "to_numpy",
    "shape",
    "add_",
    "assign_",
    "sgd_",
    "native_allreduce",
    "scale_",
    "axpby_",
    "addcmul_",
    "addcdiv_sqrt_",
}


class Handle:
    """A tensor handed out by ``Recording``: opaque to the core, loud when read."""

    __slots__ = ("tensor", "log")

    def __init__(self, tensor: Any, log: list[str]):
        object.__setattr__(self, "tensor", tensor)
        object.__setattr__(self, "log", log)

    def _read(self, what: str) -> Any:
        self.log.append(f"host:{what}")
        return self.tensor

    def __float__(self) -> float:
        return float(self._read("float"))

    def __int__(self) -> int:
        return int(self._read("int"))

    def __index__(self) -> int:
        return self._read("index").__index__()

    def __bool__(self) -> bool:
        return bool(self._read("bool"))

    def __array__(self, *args: Any) -> Any:
        import numpy as np

        return np.asarray(self._read("array"), *args)

    def __len__(self) -> int:
        return len(self._read("len"))

    def __iter__(self) -> Any:
        return iter(self._read("iter"))

    def __getitem__(self, key: Any) -> Any:
        return self._read("getitem")[key]

    def __format__(self, spec: str) -> str:
        return format(self._read("format"), spec)

    def __getattr__(self, name: str) -> Any:  # .item(), .numpy(), .asscalar(), .grad, ...
        return getattr(self._read(f"attr.{name}"), name)


def unwrap(x: Any) -> Any:
    """Replace every Handle in ``x`` (recursively through lists/tuples) by its tensor."""
    if isinstance(x, Handle):
        return x.tensor
    if isinstance(x, (list, tuple)):
        return type(x)(unwrap(v) for v in x)
    return x


class Recording:
    """Forward the backend protocol to ``inner``; log calls and host reads in ``log``."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.name = inner.name
        self.log: list[str] = []

    def _wrap(self, x: Any) -> Any:
        if isinstance(x, (list, tuple)):
            return type(x)(self._wrap(v) for v in x)
        return Handle(x, self.log)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)  # AttributeError when inner lacks it (native_allreduce)
        if not callable(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            self.log.append(name)
            out = method(*unwrap(args), **{k: unwrap(v) for k, v in kwargs.items()})
            return out if name in _PLAIN or out is None else self._wrap(out)

        return call

    def value_and_grad(
        self,
        fn: Callable[..., Any],
        params: Any,
        *inputs: Any,
        aux: bool = False,
        out: Any = None,
        buckets: Any = None,
        on_bucket: Any = None,
    ) -> Any:
        """Log ``forward``, run the inner value_and_grad with ``fn`` seeing Handles, log ``backward``
        (and ``bucket:k`` when the inner adapter signals bucket k)."""

        def inner_fn(leaves: Any, *xs: Any) -> Any:
            return unwrap(fn(self._wrap(list(leaves)), *(Handle(x, self.log) for x in xs)))

        self.log.append("forward")
        kwargs: dict[str, Any] = {"aux": True} if aux else {}
        if out is not None:
            kwargs["out"] = unwrap(out)
        if buckets is not None or on_bucket is not None:

            def signal(k: int) -> None:
                self.log.append(f"bucket:{k}")
                on_bucket(k)

            kwargs.update(buckets=buckets, on_bucket=signal)
        result = self.inner.value_and_grad(inner_fn, unwrap(params), *unwrap(inputs), **kwargs)
        self.log.append("backward")
        flat, rest = (result[0], result[1:]) if aux else (result, ())
        flat = out if out is not None else Handle(flat, self.log)  # the contract returns out itself
        return (flat, *(Handle(r, self.log) for r in rest)) if aux else flat


def host_reads(events: list[str]) -> list[int]:
    """Return the positions of events that bring a device value to the host."""
    return [i for i, e in enumerate(events) if e == "to_numpy" or e.startswith("host:")]
