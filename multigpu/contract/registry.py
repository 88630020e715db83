"""Find backends through the ``multigpu.backends`` entry-point group.

Each entry point names a ``BackendDeclaration`` (``multigpu.contract.declaration``):
the framework it needs, the pip extra that installs it, its adapter class and its
engine. Listing backends never imports a framework; ``backend(name)`` does, on first use.
"""

from __future__ import annotations

import importlib
import importlib.util
from functools import cache
from importlib.metadata import EntryPoint, entry_points

from multigpu.contract.checked import CheckedBackend, checked
from multigpu.contract.declaration import BackendDeclaration
from multigpu.errors import BackendNotInstalledError, UnknownBackendError

GROUP = "multigpu.backends"


def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def registered_backends() -> list[str]:
    """Return the names of every registered backend, installed framework or not."""
    return sorted(_entry_points())


def available_backends() -> list[str]:
    """Return the registered backends whose framework is importable here."""
    out = []
    for name in sorted(_entry_points()):
        framework = declaration(name).framework
        if framework is None or importlib.util.find_spec(framework) is not None:
            out.append(name)
    return out


def declaration(name: str) -> BackendDeclaration:
    """Return the declaration of the backend called ``name`` (no framework import).

    Raises UnknownBackendError, listing the available backends, for an unknown name.
    The launcher reads an engine's ``launch_plan`` through it without loading the framework.
    """
    if not isinstance(name, str):
        raise UnknownBackendError(f"backend must be a name such as 'torch', got {name!r}")
    eps = _entry_points()
    if name not in eps:
        raise UnknownBackendError(
            f"unknown backend {name!r}; available backends: {', '.join(available_backends()) or 'none'}"
            f" (registered: {', '.join(sorted(eps)) or 'none'})"
        )
    found = eps[name].load()
    if not isinstance(found, BackendDeclaration):
        raise UnknownBackendError(
            f"the entry point {name!r} = {eps[name].value!r} is not a BackendDeclaration; point it at the "
            "package's BACKEND, e.g. 'mypkg:BACKEND' (see multigpu.contract.declaration)"
        )
    return found


@cache
def backend(name: str) -> CheckedBackend:
    """Return the adapter called ``name`` behind the contract (one shared instance per name).

    Every call on it is checked first (``multigpu.contract.checked``), so a bad call raises
    the same exception whichever adapter runs it. Raises UnknownBackendError
    (listing the available ones) for an unknown name and BackendNotInstalledError
    (naming the pip extra) when its framework is missing or fails to import.
    """
    decl = require_installed(name)
    if decl.framework is not None:
        try:
            importlib.import_module(decl.framework)
        except Exception as e:  # e.g. MXNet 1.9 under numpy >= 1.24: AttributeError for np.bool
            raise BackendNotInstalledError(
                f"backend {name!r} needs the {decl.framework!r} package, which is installed but fails to import "
                f"here ({type(e).__name__}: {e}); install the versions the extra allows: "
                f"pip install 'multigpu[{decl.extra or name}]' (the install guide lists known-good sets)"
            ) from e
    return checked(decl.load())


def require_installed(name: str) -> BackendDeclaration:
    """Return the declaration of ``name`` after checking that its framework is installed.

    Raises UnknownBackendError or BackendNotInstalledError exactly as ``backend`` does.
    """
    decl = declaration(name)
    if decl.framework is not None and importlib.util.find_spec(decl.framework) is None:
        raise BackendNotInstalledError(
            f"backend {name!r} needs the {decl.framework!r} package, which is not installed; "
            f"install it with: pip install 'multigpu[{decl.extra or name}]'"
        )
    return decl


#: The order ``default_backend`` tries the frameworks in.
PREFERRED = ("torch", "paddle", "mxnet")


def default_backend() -> str:
    """Return the first installed framework of torch, paddle and mxnet, else ``"numpy"``.

    Listing does not import any framework.
    """
    installed = available_backends()
    return next((name for name in PREFERRED if name in installed), "numpy")
