"""``multigpu check``: installed backends, their devices, and whether they agree."""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from multigpu import models
from multigpu.checks import check_count
from multigpu.cli.parsers import add_command
from multigpu.contract.registry import available_backends, backend, registered_backends
from multigpu.data.files import atomic_write, check_writable
from multigpu.errors import InputError, MultigpuError
from multigpu.parallel.agreement import agreement
from multigpu.parallel.allreduce import ALGORITHMS

DESCRIPTION = """\
List every registered backend and the devices it sees, then train LeNet for a few
steps from the same start on each and compare with the NumPy reference. Exit
status: 0 all agree, 1 a backend differs by more than --tol, 2 bad input, 130
interrupted.
"""


def register(sub: Any) -> None:
    """Add the ``check`` sub-command."""
    p = add_command(sub, "check", run, help="list backends and devices; check they agree with the NumPy reference",
                    description=DESCRIPTION)
    p.add_argument("--backends", default=None, help="comma-separated backends to check (default: all installed)")
    p.add_argument("--steps", type=int, default=10, help="SGD steps (default 10)")
    p.add_argument("--batch", type=int, default=32, help="global batch size (default 32)")
    p.add_argument("--devices", default="cpu:2", help="device spec, e.g. 2, cpu:2, gpu:0,1 (default cpu:2)")
    p.add_argument("--allreduce", choices=ALGORITHMS, default="fused", help="allreduce algorithm (default fused)")
    p.add_argument("--tol", type=float, default=1e-5, help="max absolute difference allowed (default 1e-5)")
    p.add_argument("--json", dest="json_path", default=None, metavar="PATH", help="also write the result as JSON")


def _devices(text: str) -> object:
    return int(text) if text.isdigit() else text


def run(args: argparse.Namespace) -> int:
    """Print the backend/device list and the agreement table; return 1 on disagreement."""
    check_count(args.steps, "--steps", example=10)  # before any output, not after the listing
    check_count(args.batch, "--batch", example=32)
    if not (args.tol >= 0 and math.isfinite(args.tol)):
        raise InputError(f"--tol {args.tol} must be a finite number >= 0, e.g. 1e-5")
    if args.json_path is not None:
        check_writable(args.json_path, "--json")
    installed = available_backends()
    print("backends:")
    for name in registered_backends():
        if name not in installed:
            print(f"  {name:<7} not installed (pip install 'multigpu[{name}]')")
            continue
        try:
            gpus = backend(name).gpu_count()
        except MultigpuError as exc:
            print(f"  {name:<7} failed to load: {exc}")
            continue
        print(f"  {name:<7} installed; sees {gpus} GPU(s) and the CPU")
    wanted = installed if args.backends is None else [b.strip() for b in args.backends.split(",") if b.strip()]
    others = [b for b in wanted if b != "numpy"] or ["numpy"]
    rows = agreement(models.lenet(), others, steps=args.steps, batch=args.batch,
                     devices=_devices(args.devices), allreduce=args.allreduce)
    print(f"\nagreement with the numpy reference: LeNet, {args.steps} steps, batch {args.batch}, "
          f"{args.allreduce} allreduce")
    print(f"  {'backend':<8} {'devices':<14} {'max |dparam|':>13} {'max |dloss|':>12}  verdict")
    failed = False
    for r in rows:
        ok = r.max_param_diff <= args.tol and r.max_loss_diff <= args.tol
        failed |= not ok
        print(f"  {r.backend:<8} {','.join(r.devices):<14} {r.max_param_diff:>13.2e} {r.max_loss_diff:>12.2e}  "
              f"{'ok' if ok else 'DISAGREES'}")
    if args.json_path:
        with atomic_write(args.json_path) as f:
            f.write(json.dumps({"tol": args.tol, "steps": args.steps, "rows": [r.__dict__ for r in rows],
                                "agree": not failed}, indent=2).encode())
    if failed:
        print(f"multigpu check: a backend differs from the reference by more than {args.tol}", file=sys.stderr)
    return 1 if failed else 0
