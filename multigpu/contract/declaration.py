"""What a backend package declares, once: its name, the framework and pip extra it needs,
where its adapter class lives, and where its multi-process engine lives.

A backend registers one ``BackendDeclaration`` under the entry-point group
``multigpu.backends`` (``torch = "multigpu.backends.torch:BACKEND"``). The registry
reads it without importing the framework; ``load()`` imports the adapter module (and
so the framework) on first use, and the engine functions import the engine module only
inside a rank. A third-party backend (JAX, say) declares itself the same way.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


def _resolve(path: str) -> Any:
    module, _, attr = path.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, attr) if attr else obj


@dataclass(frozen=True)
class BackendDeclaration:
    """One backend package's declaration, read by ``multigpu.contract.registry``.

    ``adapter`` is ``"module:Class"``: the class implementing ``multigpu.contract.protocol.Backend``.
    ``engine`` is the module with ``launch_plan(job)`` and ``join(device, timeout, init_timeout)``
    (the framework's own multi-process engine), or None when the backend has none.
    ``framework`` is the import name the adapter needs (None: numpy only); ``extra`` the pip
    extra that installs it.
    """

    name: str
    adapter: str
    framework: str | None = None
    extra: str | None = None
    engine: str | None = None

    def load(self) -> Any:
        """Return a new adapter instance (imports the framework)."""
        return _resolve(self.adapter)()

    @property
    def has_engine(self) -> bool:
        """True when the backend offers a multi-process engine."""
        return self.engine is not None

    def launch_plan(self, job: Any) -> Any:
        """Return the engine's ``LaunchPlan`` for ``job`` (imports the engine module, not the framework)."""
        return _resolve(self.engine or "").launch_plan(job)

    def join(self, device: Any, timeout: float, init_timeout: float) -> Any:
        """Join the job this process was launched into with the engine (imports the framework)."""
        return _resolve(self.engine or "").join(device, timeout, init_timeout)
