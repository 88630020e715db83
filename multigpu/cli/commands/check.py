"""``multigpu check``: installed backends, their devices, and whether they agree."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from multigpu import models
from multigpu.checks import check_count
from multigpu.cli.parsers import add_alias, add_command, add_json_output, check_output, emit_json, report_stream
from multigpu.contract.op_check import op_agreement
from multigpu.contract.registry import available_backends, backend, registered_backends
from multigpu.errors import InputError, MultigpuError
from multigpu.optim import SGD
from multigpu.parallel.agreement import agreement, step_agreement, sync_bn_agreement
from multigpu.parallel.allreduce import ALGORITHMS

DESCRIPTION = """\
List every registered backend and the devices it sees, then compare each with the
NumPy reference: every protocol op (output and gradients), LeNet trained for a few
steps from the same start, synchronized BatchNorm on the devices against one device
on the full batch, and one ResNet-18 step with BatchNorm and momentum SGD part by part
(forward, gradients, running statistics, update). Exit status: 0 all
agree, 1 a backend differs by more than --tol (--rtol), 2 bad input, 130 interrupted.
"""


def register(sub: Any) -> None:
    """Add the ``check`` sub-command."""
    p = add_command(
        sub,
        "check",
        run,
        help="list backends and devices; check they agree with the NumPy reference",
        description=DESCRIPTION,
    )
    p.add_argument("--backends", default=None, help="comma-separated backends to check (default: all installed)")
    p.add_argument("--steps", type=int, default=10, help="SGD steps (default 10)")
    batch = p.add_argument(
        "--batch-size", type=int, default=32, metavar="N", help="global minibatch size of the LeNet steps (default 32)"
    )
    add_alias(p, "--batch", batch)
    p.add_argument("--devices", default="cpu:2", help="device spec, e.g. 2, cpu:2, gpu:0,1 (default cpu:2)")
    p.add_argument("--allreduce", choices=ALGORITHMS, default="fused", help="allreduce algorithm (default fused)")
    p.add_argument(
        "--tol",
        type=float,
        default=1e-5,
        help="max absolute difference allowed for LeNet and synchronized BatchNorm (default 1e-5)",
    )
    p.add_argument(
        "--rtol",
        type=float,
        default=5e-5,
        help="max difference relative to the reference's magnitude for the ops and the ResNet-18 step (default 5e-5)",
    )
    p.add_argument("--no-resnet", action="store_true", help="skip the ResNet-18 step (it takes about a minute)")
    add_json_output(p, "every table and the verdict", path_alias=True)


def _devices(text: str) -> object:
    return int(text) if text.isdigit() else text


RESNET_PARTS = ("forward", "gradients", "running_stats", "update")


def _resnet_step(backends: list[str], devices: object, rtol: float) -> list[dict[str, Any]]:
    """One ResNet-18 step (64x64, batch 4, momentum SGD with weight decay) of each backend against the
    reference, part by part; print the table and return its rows."""
    model = models.resnet18(10, (3, 64, 64))
    rows = step_agreement(
        model, backends, batch=4, devices=devices, lr=0.1, optimizer=SGD(momentum=0.9, weight_decay=5e-4), tries=40
    )
    same = not any(r.decisions_differ for r in rows)
    print(
        f"\nResNet-18 step against the numpy reference: 64x64, batch 4, momentum 0.9, weight decay 5e-4, "
        f"seed {rows[0].seed if rows else '-'}"
        + (" (no ReLU or max pool choice differs from the reference's)" if same else "")
    )
    print(f"  {'backend':<8} " + " ".join(f"{p:>14}" for p in RESNET_PARTS) + "  verdict")
    out = []
    for r in rows:
        scale = {"update": 1.0, **r.scale}
        rel = {p: getattr(r, p) / max(1.0, scale[p]) for p in RESNET_PARTS}
        ok = all(v <= rtol for v in rel.values())
        note = "" if not r.decisions_differ else f" ({r.decisions_differ} ReLU/max pool choices differ)"
        print(
            f"  {r.backend:<8} "
            + " ".join(f"{getattr(r, p):>14.2e}" for p in RESNET_PARTS)
            + f"  {'ok' if ok else 'DISAGREES'}{note}"
        )
        out.append({**r.__dict__, "relative": rel, "ok": ok})
    return out


def _sync_bn(backends: list[str], devices: object, tol: float) -> list[dict[str, Any]]:
    """Synchronized BatchNorm on ``devices`` against 1 device on the full batch, each backend against
    itself (a small ResNet, 5 steps of momentum SGD); print the table and return its rows."""
    model = models.resnet((1, 1), (4, 8), 5, (3, 12, 12), "small-resnet")
    rows = sync_bn_agreement(
        model, backends, devices, steps=5, batch=13, optimizer=SGD(momentum=0.9, weight_decay=5e-4)
    )
    print(
        f"\nsynchronized BatchNorm against 1 device on the full batch (each backend against itself): "
        f"a small ResNet, 5 steps of momentum SGD, batch 13 on {len(rows[0].devices) if rows else '-'} devices"
    )
    print(
        f"  {'backend':<8} {'devices':<14} {'max |dparam|':>13} {'max |dloss|':>12} {'max |dstats|':>13} "
        f"{'max |dbuffer|':>14}  verdict"
    )
    out = []
    for r in rows:
        worst = max(r.max_param_diff, r.max_loss_diff, r.max_state_diff, r.max_opt_diff)
        print(
            f"  {r.backend:<8} {','.join(r.devices):<14} {r.max_param_diff:>13.2e} {r.max_loss_diff:>12.2e} "
            f"{r.max_state_diff:>13.2e} {r.max_opt_diff:>14.2e}  {'ok' if worst <= tol else 'DISAGREES'}"
        )
        out.append({**r.__dict__, "ok": worst <= tol})
    return out


def run(args: argparse.Namespace) -> int:
    """Print the backend/device list and the agreement table; return 1 on disagreement."""
    check_count(args.steps, "--steps", example=10)  # before any output, not after the listing
    check_count(args.batch_size, "--batch-size", example=32)
    for flag, value in (("--tol", args.tol), ("--rtol", args.rtol)):
        if not (value >= 0 and math.isfinite(value)):
            raise InputError(f"{flag} {value} must be a finite number >= 0, e.g. 1e-5")
    check_output(args)
    with report_stream(args):
        result = _report(args)
    emit_json(args, result)
    if not result["agree"]:
        print(f"multigpu check: a backend differs from the reference by more than {args.tol}", file=sys.stderr)
    return 0 if result["agree"] else 1


def _report(args: argparse.Namespace) -> dict[str, Any]:
    """Print the listing and every table; return what ``--json`` prints."""
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
    ops = {name: op_agreement(backend(name), backend("numpy")) for name in others}
    print("\nops against the numpy reference (output and gradients, worst difference / the reference's scale):")
    print(f"  {'op':<34} " + " ".join(f"{name:>16}" for name in others))
    failed = False
    op_rows = []
    for i, case in enumerate(ops[others[0]]):
        cells = []
        for name in others:
            op = ops[name][i]
            worst = max(op.forward, op.gradient) / max(1.0, op.scale)
            failed |= worst > args.rtol
            cells.append(f"{worst:>11.1e} {'ok' if worst <= args.rtol else 'BAD':>4}")
            op_rows.append({"backend": name, **op.__dict__})
        print(f"  {case.op:<34} " + " ".join(cells))
    rows = agreement(
        models.lenet(),
        others,
        steps=args.steps,
        batch=args.batch_size,
        devices=_devices(args.devices),
        allreduce=args.allreduce,
    )
    print(
        f"\nagreement with the numpy reference: LeNet, {args.steps} steps, batch {args.batch_size}, "
        f"{args.allreduce} allreduce"
    )
    print(f"  {'backend':<8} {'devices':<14} {'max |dparam|':>13} {'max |dloss|':>12}  verdict")
    for r in rows:
        ok = r.max_param_diff <= args.tol and r.max_loss_diff <= args.tol
        failed |= not ok
        print(
            f"  {r.backend:<8} {','.join(r.devices):<14} {r.max_param_diff:>13.2e} {r.max_loss_diff:>12.2e}  "
            f"{'ok' if ok else 'DISAGREES'}"
        )
    sync = _sync_bn(wanted, _devices(args.devices), args.tol)
    resnet = [] if args.no_resnet else _resnet_step(others, _devices(args.devices), args.rtol)
    failed |= any(not r["ok"] for r in [*sync, *resnet])
    return {
        "tol": args.tol,
        "rtol": args.rtol,
        "steps": args.steps,
        "ops": op_rows,
        "rows": [r.__dict__ for r in rows],
        "sync_bn": sync,
        "resnet18_step": resnet,
        "agree": not failed,
    }
