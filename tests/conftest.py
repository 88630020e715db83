"""One suite, parametrized over every installed backend."""
from __future__ import annotations

import warnings

import pytest
from hypothesis import settings

import multigpu
from multigpu.contract.devices import CPUFallbackWarning

settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("ci")

BACKENDS = multigpu.available_backends()
FRAMEWORKS = [b for b in BACKENDS if b != "numpy"]


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    """The name of each installed backend in turn."""
    return request.param


@pytest.fixture
def be(backend_name: str):
    """The adapter of each installed backend in turn."""
    return multigpu.backend(backend_name)


@pytest.fixture
def ref():
    """The NumPy reference adapter."""
    return multigpu.backend("numpy")


@pytest.fixture(autouse=True)
def _quiet_cpu_fallback():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CPUFallbackWarning)
        yield


def gpu_available() -> bool:
    """True when any installed framework sees a GPU."""
    return any(multigpu.backend(b).gpu_count() > 0 for b in FRAMEWORKS)


@pytest.fixture
def data_cache(tmp_path, monkeypatch):
    """Fashion-MNIST's cache folder, in an isolated cache with no system copy and no network.

    Data tests use it through ``pytestmark = pytest.mark.usefixtures("data_cache")``;
    see tests/data_fakes.py.
    """
    from data_fakes import isolate

    return isolate(tmp_path, monkeypatch)
