"""Direct access to the reference adapter's Var type, for float64 finite differences."""

from multigpu.backends.numpy.adapter import NumpyBackend
from multigpu.backends.numpy.adapter import Var as NumpyVar


def numpy_backend() -> NumpyBackend:
    """A fresh reference adapter."""
    return NumpyBackend()


__all__ = ["NumpyVar", "numpy_backend"]
