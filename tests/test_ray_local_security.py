"""A Ray instance the project starts on its own (``multigpu run``/``profile``/``Session``
without ``--address``) listens on loopback only and uses token authentication with a fresh
token only its user can read; both are undone when it stops."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")


def _tree(pid: int) -> set[int]:
    try:
        return {pid} | {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


@pytest.mark.slow
def test_a_local_instance_listens_on_loopback_only_with_a_private_token():
    from multigpu.execution.engine import RaySession

    if ray.is_initialized():  # pragma: no cover - another module left one running
        ray.shutdown()
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")}
    with RaySession():
        assert os.environ["RAY_AUTH_MODE"] == "token"
        token = Path(os.environ["RAY_AUTH_TOKEN_PATH"])
        assert stat.S_IMODE(token.stat().st_mode) == 0o600 and stat.S_IMODE(token.parent.stat().st_mode) == 0o700
        assert len(token.read_text()) == 64 and token.parent != Path.home() / ".ray"

        @ray.remote
        def ping() -> int:
            return os.getpid()

        worker = ray.get(ping.remote())
        pids = _tree(os.getpid()) | {worker}
        listening = [c for c in psutil.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN and c.pid in pids]
        assert listening, "the instance listened nowhere"
        addresses = {c.laddr.ip for c in listening}
        assert addresses <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, addresses
        assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")
    assert {k: os.environ.get(k) for k in saved} == saved
    assert not token.exists() and not token.parent.exists()
