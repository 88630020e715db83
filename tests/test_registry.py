"""Backend lookup, and the proof that importing multigpu loads no framework."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BACKENDS, missing_reason

import multigpu
from multigpu.contract import registry

TESTS = Path(__file__).parent

FRAMEWORK_MODULES = ["torch", "mxnet", "paddle", "ray"]


def test_importing_multigpu_loads_no_framework(tmp_path):
    code = (
        "import sys, json, multigpu, multigpu.cli\n"
        "multigpu.cli.build_parser()\n"
        "multigpu.available_backends(); multigpu.registered_backends()\n"
        f"print(json.dumps(sorted(set({FRAMEWORK_MODULES!r}) & set(sys.modules))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_every_adapter_is_registered_as_an_entry_point():
    assert {"numpy", "torch", "mxnet", "paddle"} <= set(multigpu.registered_backends())
    assert "numpy" in multigpu.available_backends()


@pytest.mark.parametrize("name", multigpu.registered_backends())
def test_each_backend_loads_here_or_skips_saying_why(name):
    if name not in BACKENDS:  # e.g. mxnet in the numpy 2 set: one skip line with the reason
        pytest.skip(missing_reason(name))
    be = multigpu.backend(name)
    assert isinstance(be, multigpu.Backend)
    assert be.name == name


def test_a_framework_that_fails_to_import_raises_not_installed_with_the_cause(monkeypatch):
    real = registry.importlib.import_module

    def broken(module, *a):
        if module == "paddle":  # as MXNet 1.9 fails under numpy >= 1.24
            raise AttributeError("module 'numpy' has no attribute 'bool'")
        return real(module, *a)

    monkeypatch.setattr(registry.importlib, "import_module", broken)
    registry.backend.cache_clear()
    try:
        with pytest.raises(multigpu.BackendNotInstalledError) as e:
            multigpu.backend("paddle")
        assert "'paddle' package, which is installed but fails to import here" in str(e.value)
        assert "AttributeError: module 'numpy' has no attribute 'bool'" in str(e.value)
        assert "pip install 'multigpu[paddle]'" in str(e.value)
    finally:
        registry.backend.cache_clear()


def test_a_test_that_reaches_a_missing_framework_skips_with_the_reason(tmp_path):
    # The suite's own hook (tests/conftest.py), run on a test that asks for a backend whose
    # framework is missing: it skips, and `pytest -rs` gives the reason on one line.
    (tmp_path / "conftest.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('suite_conftest', {str(TESTS / 'conftest.py')!r})\n"
        "suite = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(suite)\n"
        "pytest_runtest_makereport = suite.pytest_runtest_makereport\n"
    )
    (tmp_path / "test_missing.py").write_text(
        "import importlib.util\nimport multigpu\nfrom multigpu.contract import registry\n\n"
        "def test_one(monkeypatch):\n"
        "    real = importlib.util.find_spec\n"
        "    monkeypatch.setattr(registry.importlib.util, 'find_spec',"
        " lambda n, *a: None if n == 'paddle' else real(n, *a))\n"
        "    multigpu.backend('paddle')\n\n"
        "def test_two():\n    assert multigpu.backend('numpy').name == 'numpy'\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed, 1 skipped" in out.stdout
    skipped = [line for line in out.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 1 and "pip install 'multigpu[paddle]'" in skipped[0], out.stdout


def test_unknown_backend_lists_the_available_ones():
    with pytest.raises(multigpu.UnknownBackendError, match="'jax'.*available backends: .*numpy"):
        multigpu.backend("jax")


def test_missing_framework_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        registry.importlib.util, "find_spec", lambda name, *a: None if name == "paddle" else real(name, *a)
    )
    registry.backend.cache_clear()
    try:
        with pytest.raises(multigpu.BackendNotInstalledError, match=r"pip install 'multigpu\[paddle\]'"):
            multigpu.backend("paddle")
        assert "paddle" not in multigpu.available_backends()
    finally:
        registry.backend.cache_clear()
