"""One suite, parametrized over every installed backend."""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest
from hypothesis import settings

import multigpu
import multigpu.contract.registry
from multigpu.contract.devices import CPUFallbackWarning
from multigpu.errors import BackendNotInstalledError

settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("ci")

BACKENDS = multigpu.available_backends()
FRAMEWORKS = [b for b in BACKENDS if b != "numpy"]
#: The registered backends whose framework is not installed here, left out of the suite.
MISSING = [b for b in multigpu.registered_backends() if b not in BACKENDS]
#: Why a framework may be missing from a known-good set (pyproject.toml's extras say the same).
LIMITS = {"mxnet": "MXNet 1.9 needs numpy < 1.24 and Python < 3.12, so constraints-numpy2.txt leaves it out"}


def missing_reason(name: str) -> str:
    """Why backend ``name`` is not tested here: the registry's error, and the framework's known limits."""
    try:
        multigpu.contract.registry.require_installed(name)
    except BackendNotInstalledError as e:
        why = str(e)
    else:
        return f"{name} is installed"
    limit = LIMITS.get(name)
    here = f"numpy {np.__version__}, Python {sys.version_info.major}.{sys.version_info.minor}"
    return f"{why} ({limit}; here: {here})" if limit else why


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


# -- the emulated lab's tests: one summary line CI logs can be searched for --------------
_LAB_TESTS = "tests/test_lab"  # test_lab.py, test_lab_plan.py, test_lab_cleanup.py
_LAB_SPAN: list[float] = []


def pytest_runtest_logstart(nodeid, location):
    """Note when the first lab test starts (its module's lab comes up then)."""
    import time

    if nodeid.startswith(_LAB_TESTS) and not _LAB_SPAN:
        _LAB_SPAN.append(time.monotonic())


def pytest_runtest_logfinish(nodeid, location):
    """Note when each lab test ends (the last one takes the lab down)."""
    import time

    if nodeid.startswith(_LAB_TESTS) and _LAB_SPAN:
        del _LAB_SPAN[1:]
        _LAB_SPAN.append(time.monotonic())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that reaches a backend whose framework is missing (or fails to import) skips,
    with the registry's message as the reason, instead of erroring."""
    outcome = yield
    rep = outcome.get_result()
    if call.excinfo is not None and call.excinfo.errisinstance(BackendNotInstalledError) and not rep.skipped:
        rep.outcome = "skipped"
        # Reported from here, so `pytest -rs` folds every such skip with one reason into one line.
        here = pytest_runtest_makereport.__code__.co_firstlineno
        rep.longrepr = (__file__, here, f"Skipped: {call.excinfo.value}")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print which backends the suite ran on (and why any is missing), then
    ``multigpu lab tests: N passed, ... (root: yes)`` so a CI log shows that the lab ran."""
    import os

    terminalreporter.write_line(f"multigpu backends tested: {', '.join(BACKENDS)}")
    for name in MISSING:
        terminalreporter.write_line(f"multigpu backend {name} not tested: {missing_reason(name)}")

    counts: dict[str, int] = {}
    reasons: set[str] = set()
    seconds = _LAB_SPAN[-1] - _LAB_SPAN[0] if len(_LAB_SPAN) > 1 else 0.0
    for outcome in ("passed", "failed", "error", "skipped", "xfailed", "xpassed"):
        for rep in terminalreporter.stats.get(outcome, []):
            if not getattr(rep, "nodeid", "").startswith(_LAB_TESTS):
                continue
            if outcome == "skipped" and isinstance(rep.longrepr, tuple):
                reasons.add(str(rep.longrepr[2]).removeprefix("Skipped: "))
            if rep.when == "call" or outcome in ("skipped", "error"):
                counts[outcome] = counts.get(outcome, 0) + 1
    if not counts:
        return
    text = ", ".join(f"{n} {k}" for k, n in counts.items())
    why = f"; skipped because {'; '.join(sorted(reasons))}" if reasons else ""
    terminalreporter.write_line(
        f"multigpu lab tests: {text} in {seconds:.0f} s (root: {'yes' if os.geteuid() == 0 else 'no'}){why}"
    )
