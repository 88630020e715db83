"""Backend lookup, and the proof that importing multigpu loads no framework."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

import multigpu
from multigpu.contract import registry

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


def test_backend_returns_a_protocol_implementation(be):
    assert isinstance(be, multigpu.Backend)
    assert be.name in multigpu.available_backends()


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
