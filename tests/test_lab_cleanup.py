"""Teardown always happens: a lab whose owner is killed goes down with it, a lab whose
keeper is killed is removed by the next ``up``, and Ctrl-C during ``multigpu lab up`` leaves
nothing. Small labs (two hosts, mostly without Ray) so each takes seconds.

Needs root; skipped, with that reason, elsewhere.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="the lab needs root: it creates network namespaces, shapes links with tc and limits hosts with cgroups",
    ),
]

TWO = {
    "devices": [{"name": "a", "flops": 1e10, "power": 1, "memory": 4e8}, {"name": "b", "flops": 2e10, "power": 1}],
    "links": [{"between": ["a", "b"], "bandwidth": 2e6, "latency": 0.001}],
    "source": "a",
}


def _mine(lab_id: str) -> list[str]:
    """Everything of lab ``lab_id`` still on the machine."""
    from multigpu.lab.cgroups import find_lab_cgroups

    left = [p.name for p in Path("/run/netns").glob(f"mgl-{lab_id}-*")] if Path("/run/netns").exists() else []
    left += [str(p) for p in find_lab_cgroups(f"mgl-{lab_id}")]
    left += [str(p) for p in (Path(f"/run/multigpu-lab/{lab_id}"), Path(f"/tmp/mgl-{lab_id}")) if p.exists()]
    return left


def _wait_gone(lab_id: str, seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while _mine(lab_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _mine(lab_id)


@pytest.fixture
def two(tmp_path) -> Path:
    path = tmp_path / "two.json"
    path.write_text(json.dumps(TWO))
    return path


OWNER = """
import sys, time
from multigpu.lab import Lab
lab = Lab(sys.argv[1], ray=False).up()
print(lab.id, flush=True)
time.sleep(600)
"""


def test_a_lab_goes_down_with_the_process_that_owns_it_even_when_it_is_killed(two):
    p = subprocess.Popen([sys.executable, "-c", OWNER, str(two)], stdout=subprocess.PIPE, text=True)
    lab_id = p.stdout.readline().strip()
    assert lab_id and _mine(lab_id)
    p.kill()
    p.wait()
    assert _wait_gone(lab_id, 15) == []


def test_a_lab_whose_keeper_died_is_a_leftover_that_the_next_up_removes(two):
    from multigpu.lab import Lab, leftovers

    crashed = Lab(two, ray=False, keep_up=True).up()
    keeper = json.loads((crashed.state_dir / "state.json").read_text())["keeper"]
    os.kill(keeper, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while crashed.id not in leftovers():
        assert time.monotonic() < deadline, "a lab without its keeper is not listed as a leftover"
        time.sleep(0.1)
    with Lab(two, ray=False) as fresh:
        fresh_id = fresh.id
        assert _mine(crashed.id) == [] and fresh_id != crashed.id
    assert _mine(fresh_id) == []


def test_ctrl_c_during_lab_up_takes_down_what_was_made(two):
    root = Path("/run/multigpu-lab")
    others = {d.name for d in root.glob("*")} if root.exists() else set()
    # Ctrl-C in a terminal reaches a process whose SIGINT has its default action. A runner that
    # started this suite in the background (a shell's `cmd &`) hands it down ignored, and a
    # Python started with SIGINT ignored keeps ignoring it, as a background job should.
    p = subprocess.Popen(
        [sys.executable, "-m", "multigpu", "lab", "up", str(two)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    lab_id = None
    while lab_id is None and time.monotonic() < deadline:  # wait until its Ray nodes are starting
        for d in root.glob("*") if root.exists() else []:
            if d.name not in others and (d / "keeper.json").exists() and (d / "keeper.log").exists():
                lab_id = d.name
        time.sleep(0.05)
    assert lab_id, "lab up did not get as far as starting Ray"
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    if p.returncode != 130:  # it came up in spite of the signal: take it down before failing
        from multigpu.lab import down_all

        down_all(lab_id)
    assert p.returncode == 130, err[-1500:]
    assert "interrupted" in err
    assert _wait_gone(lab_id, 15) == []
