"""The NumPy reference: forward ops with a hand-written backward for each; the engine is a small socket allreduce.

The package itself is framework-free: the registry reads ``BACKEND`` without importing
the framework.
"""

from multigpu.contract.declaration import BackendDeclaration

BACKEND = BackendDeclaration(
    name="numpy",
    adapter="multigpu.backends.numpy.adapter:NumpyBackend",
    framework=None,
    extra=None,
    engine="multigpu.backends.numpy.process_group",
)
