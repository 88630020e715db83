"""``multigpu lab``: bring a cluster file up as an emulated lab on this machine, use it, take it down."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from typing import Any

from multigpu.cli.parsers import add_command, add_json_output, check_output, emit_json
from multigpu.errors import InputError

DESCRIPTION = """\
Emulate a cluster file on this Linux machine (root): each host a network namespace
with its own address (198.18.0.0/24) and hostname, the links between hosts shaped per
pair to the file's bandwidths (htb), each host's CPU limited to a share from its
FLOP/s (a CFS quota) and its memory to the file's "memory" (cgroups), and a Ray node
per host with that host's devices as resources and token authentication.

  multigpu lab up lab --backend torch       bring the shipped `lab` cluster up
  multigpu lab status                       what is up, the shaped rates, the Ray address
  multigpu lab exec pi1 -- multigpu profile --cluster CLUSTER --address ADDR --out p.json
  multigpu lab down                         take every lab down

The lab cannot emulate a link's latency (that needs the netem qdisc) nor a GPU's
speed (a host gets at most --max-cores of this machine's CPU); `up` says what it
left out. Everything it makes is named mgl-*; `down`, Ctrl-C during `up`, and the
next `up` after a crash remove it all.
Exit status: 0 ok, 1 a failure while building or running, 2 bad input or a machine
that cannot host a lab (not root, no namespaces, no htb, no cgroup v1)."""


def register(sub: Any) -> None:
    """Add the ``lab`` sub-command and its actions."""
    p = add_command(
        sub,
        "lab",
        run,
        help="emulate a cluster on this machine: namespaces, shaped links, CPU/memory limits",
        description=DESCRIPTION,
        raw=True,
    )
    acts = p.add_subparsers(dest="action", metavar="ACTION")
    acts.required = True
    up = acts.add_parser("up", help="bring a cluster file up as a lab", description="Bring CLUSTER up as a lab.")
    up.add_argument("cluster", metavar="CLUSTER", help="a cluster file or a shipped name (lab, gpu-box)")
    up.add_argument(
        "--cpu-scale",
        type=float,
        default=0.25,
        help="cores the slowest device gets; the others in proportion to FLOP/s (default 0.25)",
    )
    up.add_argument("--max-cores", type=float, default=None, help="most cores one host gets (default: all)")
    up.add_argument(
        "--bandwidth-scale",
        type=float,
        default=1.0,
        help="factor on every link's bandwidth, e.g. 10 to run transfers 10x faster (default 1)",
    )
    up.add_argument("--head", default=None, help="host of the Ray head (default: the one with the most memory)")
    up.add_argument("--backend", default=None, help="backend of every device that names none (e.g. torch)")
    up.add_argument(
        "--device-backend",
        action="append",
        default=[],
        metavar="DEVICE=BACKEND",
        help="backend of one device (repeatable), e.g. imac=paddle",
    )
    up.add_argument(
        "--threads", type=int, default=1, help="math threads per worker in the emulated cluster (default 1)"
    )
    up.add_argument("--no-ray", action="store_true", help="no Ray nodes (namespaces, links and limits only)")
    add_json_output(up, "the lab's status")
    up.add_argument("--quiet", action="store_true", help="no progress lines")
    down = acts.add_parser(
        "down",
        help="take labs down",
        description="Take down every lab (or --lab ID), leftovers of crashed ones included.",
    )
    down.add_argument("--lab", default=None, metavar="ID", help="only this lab")
    st = acts.add_parser("status", help="show what is up", description="Show every lab that is up.")
    add_json_output(st, "every lab's status and the leftovers of crashed ones")
    ex = acts.add_parser(
        "exec",
        help="run a command inside a lab host",
        description="Run COMMAND inside HOST: its network namespace, hostname, CPU and memory "
        "limits, with the lab's Ray token (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN_PATH) "
        "and MULTIGPU_LAB_RAY_ADDRESS set. Exits with COMMAND's status.",
    )
    ex.add_argument("host", metavar="HOST", help="a host of the lab")
    ex.add_argument("--lab", default=None, metavar="ID", help="the lab (needed when several are up)")
    ex.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...", help="what to run, after '--'")


def run(args: argparse.Namespace) -> int:
    """Run the lab action ``args.action`` names; return its exit code."""
    return {"up": run_up, "down": run_down, "status": run_status, "exec": run_exec}[args.action](args)


def _backends(args: argparse.Namespace) -> Any:
    if not args.device_backend:
        return args.backend
    out = {}
    for item in args.device_backend:
        dev, sep, backend = item.partition("=")
        if not sep or not dev or not backend:
            raise InputError(f"--device-backend {item!r} is not DEVICE=BACKEND; e.g. imac=paddle")
        out[dev] = backend
    if args.backend:
        from multigpu.partition import load_cluster

        for d in load_cluster(args.cluster).names:
            out.setdefault(d, args.backend)
    return out


def _print_status(st: dict[str, Any]) -> None:
    print(f"lab {st['id']} (cluster {st['cluster']}): Ray head at {st['address'] or '- (no Ray)'}")
    print(f"  emulated cluster file: {st['cluster_file']}; Ray token: {st['token']}")
    for h in st["hosts"]:
        mem = h["memory"]
        limit = "unlimited" if h["memory_limit"] is None else f"{h['memory_limit'] / 1e6:.0f} MB"
        used = "-" if mem.get("usage") is None else f"{mem['usage'] / 1e6:.0f} MB"
        oom = f", {mem['oom_kills']} OOM kill(s)" if mem.get("oom_kills") else ""
        print(
            f"  {h['name']:<12} {h['address']:<12} {', '.join(h['devices']):<16} {h['cores']:.3g} cores  memory "
            f"{used} of {limit}{oom}  {h['processes']} process(es)"
        )
    by_src: dict[str, list[str]] = {}
    for ln in st["links"]:
        rate = (
            "dropped"
            if ln["blocked"]
            else "unshaped"
            if ln["rate_bits"] is None
            else f"{ln['bandwidth'] / 1e6:.3g} MB/s"
        )
        by_src.setdefault(ln["src"], []).append(f"{ln['dst']} {rate}")
    for src, outs in by_src.items():
        print(f"  {src} -> " + ", ".join(outs))
    for n in st["notes"]:
        print(f"  note: {n}")


def run_up(args: argparse.Namespace) -> int:
    """Bring the lab up and leave it up; return 0."""
    from multigpu.lab import Lab

    check_output(args)
    lab = Lab(
        args.cluster,
        cpu_scale=args.cpu_scale,
        bandwidth_scale=args.bandwidth_scale,
        max_cores=args.max_cores,
        head=args.head,
        backend=_backends(args),
        threads=args.threads,
        ray=not args.no_ray,
        keep_up=True,
        echo=(lambda s: None) if args.quiet or args.json else (lambda s: print(s, file=sys.stderr)),
    )
    lab.up()  # on Ctrl-C or an error, up() has already taken down what it made
    st = lab.status()
    emit_json(args, st)
    if not args.json:
        _print_status(st)
        first = lab.plan.cluster.source
        print(
            f"  next: multigpu lab exec {lab.plan.host_of(first).name} -- multigpu run --address {lab.address} "
            f"--cluster {lab.cluster_file} --plan ... ; then: multigpu lab down"
        )
    return 0


def run_down(args: argparse.Namespace) -> int:
    """Take labs down; return 0 (1 when something could not be removed)."""
    from multigpu.lab import down_all

    result = down_all(args.lab)
    bad = {k: v for k, v in result.items() if v}
    for lab_id, problems in result.items():
        print(f"lab {lab_id}: " + ("down" if not problems else "could not remove " + ", ".join(problems)))
    if not result:
        print("no lab was up")
    return 1 if bad else 0


def run_status(args: argparse.Namespace) -> int:
    """Print the labs that are up; return 0."""
    from multigpu.lab import Lab, labs, leftovers

    check_output(args)
    states = [Lab.attach(s["id"]).status() for s in labs()]
    emit_json(args, {"labs": states, "leftovers": leftovers()})
    if args.json:
        return 0
    for st in states:
        _print_status(st)
    if not states:
        print("no lab is up")
    for old in leftovers():
        print(f"leftovers of crashed lab {old} remain; `multigpu lab down` removes them")
    return 0


def run_exec(args: argparse.Namespace) -> int:
    """Run the command in the host; return its exit status (130 on Ctrl-C)."""
    from multigpu.lab import Lab

    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise InputError("no command given; write it after '--', e.g. multigpu lab exec pi1 -- hostname")
    lab = Lab.attach(args.lab)
    argv = [sys.executable, "-m", "multigpu", *command[1:]] if command[0] == "multigpu" else command
    proc = lab.popen(args.host, argv)
    return _wait(proc)


def _wait(proc: subprocess.Popen, grace: float | None = 5.0) -> int:
    """Wait for ``proc``; on Ctrl-C (which the terminal sends it too) give it ``grace``
    seconds to finish before killing it."""
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        try:
            rc = proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        raise
    return rc if rc >= 0 else 128 - rc
