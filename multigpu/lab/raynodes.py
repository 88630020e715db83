"""The lab's Ray cluster: a head on one host and a node on every other, each node offering
its host's devices as resources, every instance with token authentication.

The lab never imports Ray: it runs Ray's own ``ray start`` in each host. Every port is
fixed (``PORTS``), so the documentation can list what listens where, and each host has
its own Ray temp folder, so no other Ray instance on the machine finds the lab's (nor
the lab another's).

Token authentication: the lab writes a fresh random token to a file only root can
read, and every process it starts gets ``RAY_AUTH_MODE=token`` and
``RAY_AUTH_TOKEN_PATH`` to that file. A node or a driver without the token is refused.
"""

from __future__ import annotations

import json
import math
import secrets
import shutil
import sys
from pathlib import Path

from multigpu.errors import MissingDependencyError
from multigpu.lab.plan import HostPlan, LabPlan

__all__ = ["PORTS", "RAY_ENV", "head_address", "node_command", "pull_timeout_ms", "ray_env", "write_token"]

#: Every port a lab Ray node listens on (each host has its own network namespace, so
#: every host uses the same numbers). The GCS listens on the head only.
PORTS = {
    "gcs": 6379,
    "node_manager": 6380,
    "object_manager": 6381,
    "runtime_env_agent": 6382,
    "dashboard_agent_grpc": 6383,
    "dashboard_agent_http": 6384,
    "metrics_export": 6385,
    "workers_min": 6400,
    "workers_max": 6499,
}

#: Ray settings for every process of the lab (Ray reads ``RAY_<setting>`` from the environment).
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    # Results above this size stay in the producing node's object store and the consuming
    # node pulls them directly; below it they return inline through the driver. In the lab
    # the driver sits on a slow host, so an activation between two workers should go from
    # one to the other as the cost model prices it, not through the driver.
    "RAY_max_direct_call_object_size": "1024",
    # A node that stops answering (its link down, its host killed) is declared dead after
    # period x threshold, not Ray's default of 15 s plus timeouts.
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "5",
    # A worker on a host with a fraction of a core, on a busy machine, may take long to
    # import its framework and register.
    "RAY_worker_register_timeout_seconds": "180",
    # A process waiting for an object that another node sends (a driver's ray.get, a
    # worker's argument) can miss the store's notice that it arrived, and then sees it only
    # when it next looks, after this interval: at Ray's 1000 ms hops took 1.0-2.2 s in steps
    # of a second (measured in docs/design/lab.md, "An arrived object is seen at once").
    "RAY_get_check_signal_interval_milliseconds": "10",
}


def write_token(path: Path) -> Path:
    """Write a fresh random token (hex) to ``path``, readable by its owner only."""
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(secrets.token_hex(32))
    return path


#: Ray's own pull timeout (``object_manager_pull_timeout_ms``), the least the lab sets.
RAY_PULL_TIMEOUT_MS = 10_000


def pull_timeout_ms(plan: LabPlan) -> int:
    """How long a node's pull of an object waits before Ray asks again: twice the longest time
    an object can take over a shaped link (the largest that fits both hosts' object stores,
    at the link's rate), at least Ray's 10 s.

    Ray re-sends a pull after ``object_manager_pull_timeout_ms`` whether or not the first
    is still arriving, and the sender then pushes every chunk again from the start
    (``PushManager::StartPush``'s "resending all the chunks"). On a shaped link an object
    that takes longer than the timeout so crosses twice or more: AlexNet's 242.5 MB of
    parameters to imac over the 10 MB/s LAN made desk-cpu send 514.4 MB at Ray's 10 s, and
    259.4-261.8 MB with the timeout out of reach; the chunks still queued when the stage
    got its parameters delayed the items after them by whole seconds."""
    worst = 0.0
    for ln in plan.links:
        if ln.shaped and ln.rate_bits is not None:  # shaped: a rate is set
            largest = min(object_store_bytes(plan.host(ln.src)), object_store_bytes(plan.host(ln.dst)))
            worst = max(worst, largest / (ln.rate_bits / 8))
    return max(RAY_PULL_TIMEOUT_MS, int(math.ceil(2 * worst * 1e3)))


def ray_env(token: Path, plan: LabPlan) -> dict[str, str]:
    """The environment every process of the lab of ``plan`` gets: token authentication,
    ``RAY_ENV`` and a pull timeout its slowest link can meet (``pull_timeout_ms``)."""
    return {
        **RAY_ENV,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "RAY_object_manager_pull_timeout_ms": str(pull_timeout_ms(plan)),
    }


def ray_program() -> str:
    """The ``ray`` command of this Python; MissingDependencyError when Ray is not installed."""
    here = Path(sys.executable).with_name("ray")
    found = str(here) if here.exists() else shutil.which("ray")
    if found is None:
        raise MissingDependencyError(
            "the lab's Ray nodes need Ray, which is not installed; install it with: "
            "pip install 'multigpu[cluster]' (or bring the lab up with --no-ray)"
        )
    return found


def head_address(plan: LabPlan) -> str:
    """``ADDRESS:PORT`` of the lab's Ray head (what ``--address`` takes)."""
    return f"{plan.host(plan.head).address}:{PORTS['gcs']}"


def _resources(plan: LabPlan, host: HostPlan) -> dict[str, float]:
    res: dict[str, float] = {}
    for name in host.devices:
        spec = plan.cluster.devices[plan.cluster.index(name)]
        res[name] = 1.0
        for key, amount in (spec.resources or {}).items():
            if key not in ("CPU", "GPU"):
                res[key] = max(res.get(key, 0.0), float(amount))
    return res


def object_store_bytes(host: HostPlan) -> int:
    """The node's object store: a fifth of a limited host's memory (at least Ray's minimum of
    75 MiB), 512 MiB on an unlimited one."""
    if host.memory is None:
        return 512 * 2**20
    return max(75 * 2**20, host.memory // 5)


def node_command(plan: LabPlan, host: HostPlan, temp_dir: Path, head: bool, cpus: int | None = None) -> list[str]:
    """The ``ray start`` command of ``host``'s node (the head's when ``head``)."""
    argv = [
        ray_program(),
        "start",
        f"--node-ip-address={host.address}",
        f"--temp-dir={temp_dir}",
        f"--num-cpus={cpus if cpus is not None else max(1, math.ceil(host.cores))}",
        "--num-gpus=0",
        f"--resources={json.dumps(_resources(plan, host))}",
        f"--object-store-memory={object_store_bytes(host)}",
        f"--node-manager-port={PORTS['node_manager']}",
        f"--object-manager-port={PORTS['object_manager']}",
        f"--runtime-env-agent-port={PORTS['runtime_env_agent']}",
        f"--dashboard-agent-grpc-port={PORTS['dashboard_agent_grpc']}",
        f"--dashboard-agent-listen-port={PORTS['dashboard_agent_http']}",
        f"--metrics-export-port={PORTS['metrics_export']}",
        f"--min-worker-port={PORTS['workers_min']}",
        f"--max-worker-port={PORTS['workers_max']}",
        "--include-log-monitor=false",
        "--disable-usage-stats",
        "--log-style=record",
        "--log-color=false",
    ]
    if head:
        argv += ["--head", f"--port={PORTS['gcs']}", "--include-dashboard=false"]
    else:
        argv += [f"--address={head_address(plan)}"]
    return argv
