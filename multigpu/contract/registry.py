"""Find backend adapters through the ``multigpu.backends`` entry-point group.

An adapter module declares ``FRAMEWORK`` (the import name it needs), ``EXTRA`` (the
pip extra that installs it) and ``load()`` (returns the adapter). Listing backends
never imports a framework; ``backend(name)`` does, on first use.
"""
from __future__ import annotations

import importlib.util
from functools import lru_cache
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType

from multigpu.contract.checked import CheckedBackend, checked
from multigpu.errors import BackendNotInstalledError, UnknownBackendError

GROUP = "multigpu.backends"


def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def _module(name: str) -> ModuleType:
    eps = _entry_points()
    if name not in eps:
        raise UnknownBackendError(
            f"unknown backend {name!r}; available backends: {', '.join(available_backends()) or 'none'}"
            f" (registered: {', '.join(sorted(eps)) or 'none'})"
        )
    return eps[name].load()


def registered_backends() -> list[str]:
    """Return the names of every registered adapter, installed framework or not."""
    return sorted(_entry_points())


def available_backends() -> list[str]:
    """Return the registered adapters whose framework is importable here."""
    out = []
    for name, ep in sorted(_entry_points().items()):
        framework = _framework_of(ep)
        if framework is None or importlib.util.find_spec(framework) is not None:
            out.append(name)
    return out


def _framework_of(ep: EntryPoint) -> str | None:
    # The module is tiny and framework-free, so loading it here is cheap and safe.
    return getattr(ep.load(), "FRAMEWORK", None)


@lru_cache(maxsize=None)
def backend(name: str) -> CheckedBackend:
    """Return the adapter called ``name`` behind the contract (one shared instance per name).

    Every call on it is checked first (``multigpu.contract.checked``), so a bad call raises
    the same exception whichever adapter runs it. Raises UnknownBackendError
    (listing the available ones) for an unknown name and BackendNotInstalledError
    (naming the pip extra) when its framework is missing.
    """
    return checked(require_installed(name).load())


def require_installed(name: str) -> ModuleType:
    """Return the adapter module of ``name`` without importing its framework.

    Raises UnknownBackendError or BackendNotInstalledError exactly as ``backend`` does.
    """
    module = adapter_module(name)
    framework = getattr(module, "FRAMEWORK", None)
    if framework is not None and importlib.util.find_spec(framework) is None:
        extra = getattr(module, "EXTRA", name)
        raise BackendNotInstalledError(
            f"backend {name!r} needs the {framework!r} package, which is not installed; "
            f"install it with: pip install 'multigpu[{extra}]'"
        )
    return module


#: The order ``default_backend`` tries the frameworks in.
PREFERRED = ("torch", "paddle", "mxnet")


def default_backend() -> str:
    """Return the first installed framework of torch, paddle and mxnet, else ``"numpy"``.

    Listing does not import any framework.
    """
    installed = available_backends()
    return next((name for name in PREFERRED if name in installed), "numpy")


def adapter_module(name: str) -> ModuleType:
    """Return the framework-free package of the adapter called ``name`` (no framework import).

    Raises UnknownBackendError for an unknown name. The launcher reads an engine's
    ``launch_plan`` from it without loading the framework.
    """
    if not isinstance(name, str):
        raise UnknownBackendError(f"backend must be a name such as 'torch', got {name!r}")
    return _module(name)
