"""``multigpu launch``: run a command as the ranks of a multi-process job on each framework's engine."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from multigpu.cli.parsers import add_alias, add_command
from multigpu.contract.registry import PREFERRED, default_backend
from multigpu.distributed.job import DEFAULT_INIT_TIMEOUT, DEFAULT_MULTI_HOST_PORT, DEFAULT_TIMEOUT, Job
from multigpu.distributed.supervisor import run as run_job
from multigpu.errors import InputError

EPILOG = """\
examples:
  multigpu launch --nproc-per-node 2 --backend torch -- train --epochs 1
  multigpu launch --nproc-per-node 2 --backend mxnet -- train --epochs 1 --out out.json
  multigpu launch --nproc-per-node 2 --backend paddle -- my_script.py --flag

two hosts (run on each, with --node-rank 0 on the host at --master-addr):
  multigpu launch --nnodes 2 --node-rank 0 --nproc-per-node 1 --master-addr 10.0.0.1 --master-port 29500 \\
      --backend torch -- train --epochs 10
"""


def register(sub: Any) -> None:
    """Add the ``launch`` sub-command."""
    p = add_command(
        sub,
        "launch",
        run,
        help="run a command as N ranks on torch.distributed, paddle.distributed or MXNet's kvstore",
        description="Start --nproc-per-node ranks on this host (and, with --nnodes, join ranks on other hosts), each "
        "running COMMAND: a multigpu sub-command (train), a Python script, or a program. Ranks "
        "join with the backend's own engine (torch: Gloo/NCCL via env://; paddle: Gloo/NCCL; "
        "mxnet: a dist_sync kvstore with a scheduler and parameter servers). The first rank that "
        "fails stops the job; every child is cleaned up on success, failure and Ctrl-C.",
        epilog=EPILOG,
        raw=True,
    )
    nproc = p.add_argument(
        "--nproc-per-node", type=int, default=2, help="ranks (processes) on this host, as torchrun's (default 2)"
    )
    add_alias(p, "--nproc", nproc)
    p.add_argument(
        "--backend",
        default=None,
        help=f"numpy, torch, paddle or mxnet (default: the first installed of {', '.join(PREFERRED)}, else numpy)",
    )
    p.add_argument("--nnodes", type=int, default=1, help="hosts in the job (default 1)")
    p.add_argument("--node-rank", type=int, default=0, help="this host's index, 0..nnodes-1 (default 0)")
    p.add_argument(
        "--master-addr",
        default="127.0.0.1",
        help="address of node 0 (torch/paddle master, MXNet scheduler); default 127.0.0.1",
    )
    p.add_argument(
        "--master-port",
        type=int,
        default=0,
        help=f"port on node 0 (default: a free port on one host, {DEFAULT_MULTI_HOST_PORT} on several)",
    )
    p.add_argument(
        "--node-addr",
        default=None,
        help="this host's address as the others reach it (MXNet's DMLC_NODE_HOST; default: "
        "loopback on one host, the first interface on several)",
    )
    p.add_argument("--servers", type=int, default=1, help="MXNet parameter servers per host (default 1)")
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds any collective may wait before the job fails (default {DEFAULT_TIMEOUT:g})",
    )
    p.add_argument(
        "--init-timeout",
        type=float,
        default=DEFAULT_INIT_TIMEOUT,
        help=f"seconds to wait for every rank to join (default {DEFAULT_INIT_TIMEOUT:g})",
    )
    p.add_argument(
        "--no-check",
        action="store_true",
        help="skip the header exchange that reports ranks calling different collectives "
        "(saves one small allreduce per collective; a mismatch may then hang until --timeout)",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...", help="what each rank runs, after '--'")


def run(args: argparse.Namespace) -> int:
    """Run the job; return 0 or raise RankFailedError (exit 2 when the failed rank refused its input)."""
    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    job = Job(
        args.backend or default_backend(),
        args.nproc_per_node,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        node_addr=args.node_addr,
        timeout=args.timeout,
        init_timeout=args.init_timeout,
        servers=args.servers,
        check=not args.no_check,
    )
    run_job(job, command_argv(command))
    return 0


def command_argv(command: Sequence[str]) -> list[str]:
    """Turn ``launch``'s command into argv: a multigpu sub-command, a .py script, or a program."""
    from multigpu.cli.main import COMMANDS

    if not command:
        raise InputError(
            "no command given; write it after '--', e.g. 'multigpu launch --nproc-per-node 2 -- train --epochs 1'"
        )
    first = command[0]
    if first == "launch":
        raise InputError("'launch' cannot launch itself; give the command each rank runs, e.g. 'train'")
    if first in COMMANDS:
        return [sys.executable, "-m", "multigpu", *command]
    if first.endswith(".py"):
        if not Path(first).is_file():
            raise InputError(f"script {first!r} does not exist; pass a path to a Python file")
        return [sys.executable, *command]
    return list(command)
