"""``multigpu train``: the textbook experiment from the command line."""

from __future__ import annotations

import argparse
import warnings
from typing import Any

from multigpu.cli.parsers import add_alias, add_command, add_json_output, check_output, emit_json, report_stream
from multigpu.contract.devices import CPUFallbackWarning
from multigpu.contract.registry import PREFERRED, default_backend
from multigpu.distributed.rank import launched_backend
from multigpu.errors import InputError
from multigpu.models.zoo import MODELS
from multigpu.optim import OPTIMIZERS, SGD, AdamW, Optimizer
from multigpu.optim.schedules import SCHEDULES
from multigpu.parallel.allreduce import ALGORITHMS
from multigpu.parallel.buckets import DEFAULT_BUCKET_MB
from multigpu.parallel.data_parallel import DEFAULT_LR
from multigpu.training.trainer import DEFAULT_BATCH_SIZE, train

DESCRIPTION = """\
Train a model (LeNet, ResNet-18, ...) on Fashion-MNIST, or a GPT (--model gpt) on
English text (Debian's fortunes package, character-level; one line per epoch with the
validation loss), across devices with any
backend, with SGD (momentum, Nesterov, weight decay) or AdamW and per-device or
synchronized BatchNorm, and print one line per epoch: test accuracy, seconds per
epoch, devices. Every option and output path is checked before the data loads.
Exit status: 0 ok, 1 the run failed (e.g. the loss diverged), 2 bad input, 130 interrupted.
"""


def register(sub: Any) -> None:
    """Add the ``train`` sub-command."""
    p = add_command(
        sub, "train", run, help="train LeNet or ResNet-18 on Fashion-MNIST, data-parallel", description=DESCRIPTION
    )
    p.add_argument(
        "--backend",
        default=None,
        help=f"numpy, torch, mxnet or paddle (default: the one 'multigpu launch' was given, else "
        f"the first installed of {', '.join(PREFERRED)}; the first output line names it)",
    )
    devices = p.add_argument(
        "--devices", default="1", help="device count (CPU replicas when no GPU), or cpu:N / gpu:0,1 (default 1)"
    )
    add_alias(p, "--gpus", devices)
    p.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        metavar="N",
        help=f"global minibatch size, split across the devices (default {DEFAULT_BATCH_SIZE})",
    )
    p.add_argument("--lr", type=float, default=DEFAULT_LR, help=f"learning rate (default {DEFAULT_LR:g})")
    p.add_argument("--epochs", type=int, default=10, help="number of epochs (default 10)")
    p.add_argument(
        "--model",
        default="lenet",
        help=f"built-in model ({', '.join(sorted(MODELS))}), built for the data's shape and classes (default lenet)",
    )
    p.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        default="sgd",
        help="sgd (torch.optim.SGD's rule) or adamw (torch.optim.AdamW's); default sgd",
    )
    p.add_argument("--momentum", type=float, default=None, help="SGD momentum (default 0)")
    p.add_argument("--nesterov", action="store_true", help="Nesterov momentum (SGD, needs --momentum)")
    p.add_argument(
        "--weight-decay",
        type=float,
        default=None,
        help="weight decay: L2 in SGD (default 0), decoupled in AdamW (default 0.01)",
    )
    p.add_argument("--betas", default=None, metavar="B1,B2", help="AdamW's betas (default 0.9,0.999)")
    p.add_argument("--eps", type=float, default=None, help="AdamW's eps (default 1e-8)")
    p.add_argument(
        "--bucket-mb",
        type=float,
        default=DEFAULT_BUCKET_MB,
        metavar="MIB",
        help="with several processes, sum gradients in buckets of up to MIB MiB started during "
        "backward (the first 1 MiB; default %(default)g, as DDP)",
    )
    p.add_argument(
        "--no-buckets",
        action="store_true",
        help="with several processes, sum every gradient in one buffer after backward instead",
    )
    p.add_argument(
        "--sync-bn",
        action="store_true",
        help="synchronize BatchNorm statistics across devices and processes (default: per device)",
    )
    p.add_argument("--allreduce", choices=ALGORITHMS, default="fused", help="allreduce algorithm (default fused)")
    p.add_argument(
        "--data-dir",
        default=None,
        help="folder with the IDX files (default: search, then download); for --model gpt the fortunes "
        "files (default /usr/share/games/fortunes, Debian's fortunes package)",
    )
    p.add_argument(
        "--no-verify-data",
        action="store_true",
        help="load IDX files whose MD5 is not Fashion-MNIST's (your own subset or variant)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for init and shuffling (default 0)")
    p.add_argument("--scale-batch", action="store_true", help="multiply the batch by the device count")
    p.add_argument(
        "--lr-scaling",
        choices=["linear"],
        default=None,
        help="scale the lr by the global-batch multiplier (the device count with --scale-batch, else 1)",
    )
    p.add_argument("--warmup-epochs", type=float, default=0.0, help="linear warmup for --lr-scaling (epochs)")
    p.add_argument(
        "--lr-schedule",
        choices=SCHEDULES,
        default=None,
        help="multiply --lr per step: cosine (after --warmup-steps, a half cosine down to --lr-floor * lr "
        "at the last step) or constant (default: constant, or --lr-scaling's)",
    )
    p.add_argument("--warmup-steps", type=int, default=0, metavar="N", help="linear warmup from 0 over N steps")
    p.add_argument("--lr-floor", type=float, default=0.0, help="the cosine's end as a fraction of --lr (default 0)")
    p.add_argument("--train-limit", type=int, default=None, help="use only the first N training examples")
    p.add_argument("--test-limit", type=int, default=None, help="use only the first N test examples")
    p.add_argument("--checkpoint", default=None, metavar="DIR", help="save every epoch to DIR and resume from it")
    p.add_argument("--plot", default=None, metavar="PNG", help="write accuracy/loss curves (needs matplotlib)")
    add_json_output(p, "the result (accuracy and loss per epoch, settings, timing)", path_alias=True)
    p.add_argument("--quiet", action="store_true", help="no progress bars or per-epoch lines")


def optimizer_from(args: argparse.Namespace) -> Optimizer:
    """The optimizer the flags describe; InputError for a flag the optimizer does not take."""
    if args.optimizer == "sgd":
        for flag, value in (("--betas", args.betas), ("--eps", args.eps)):
            if value is not None:
                raise InputError(f"{flag} is an AdamW setting; use it with --optimizer adamw")
        return SGD(
            momentum=0.0 if args.momentum is None else args.momentum,
            nesterov=args.nesterov,
            weight_decay=0.0 if args.weight_decay is None else args.weight_decay,
        )
    if args.momentum is not None or args.nesterov:
        raise InputError("--momentum and --nesterov are SGD settings; AdamW takes --betas")
    kwargs: dict[str, Any] = {}
    if args.betas is not None:
        try:
            kwargs["betas"] = tuple(float(v) for v in args.betas.split(","))
        except ValueError:
            raise InputError(f"--betas {args.betas!r} must be two numbers, e.g. 0.9,0.999") from None
    if args.eps is not None:
        kwargs["eps"] = args.eps
    if args.weight_decay is not None:
        kwargs["weight_decay"] = args.weight_decay
    return AdamW(**kwargs)


def run(args: argparse.Namespace) -> int:
    """Train and report; return 0, or raise a MultigpuError (see ``multigpu.cli`` for exit codes)."""
    optimizer = optimizer_from(args)  # before any output
    check_output(args)  # before any epoch, not after the last one
    backend = args.backend or launched_backend()
    if backend is None:
        backend = default_backend()
        with report_stream(args):
            print(
                f"backend: {backend} (the first installed of {', '.join(PREFERRED)}; choose with --backend)",
                flush=True,
            )
    devices: Any = int(args.devices) if args.devices.isdigit() else args.devices
    with report_stream(args), warnings.catch_warnings():
        warnings.simplefilter("ignore", CPUFallbackWarning)  # train() prints a note instead
        result = train(
            args.model,
            backend=backend,
            devices=devices,
            batch_size=args.batch_size,
            lr=args.lr,
            num_epochs=args.epochs,
            allreduce=args.allreduce,
            data_dir=args.data_dir,
            seed=args.seed,
            progress=not args.quiet,
            plot=args.plot,
            checkpoint=args.checkpoint,
            scale_batch=args.scale_batch,
            lr_scaling=args.lr_scaling,
            warmup_epochs=args.warmup_epochs,
            lr_schedule=args.lr_schedule,
            warmup_steps=args.warmup_steps,
            lr_floor=args.lr_floor,
            train_limit=args.train_limit,
            test_limit=args.test_limit,
            verify_data=not args.no_verify_data,
            optimizer=optimizer,
            sync_bn=args.sync_bn,
            bucket_mb=None if args.no_buckets else args.bucket_mb,
        )
    if result.rank != 0:
        return 0  # in a multi-process job rank 0 reports and writes for every rank
    with report_stream(args):
        if result.val_loss:  # a token model
            print(
                f"final val loss {result.val_loss[-1]:.3f} (best {min(result.val_loss):.3f}), "
                f"{sum(result.sec_per_epoch) / len(result.sec_per_epoch):.1f} sec/epoch on {result.devices} "
                f"({result.backend})"
            )
            emit_json(args, result.to_dict())
            return 0
        print(
            f"final test acc {result.test_acc[-1]:.3f} (best {max(result.test_acc):.3f}), "
            f"{sum(result.sec_per_epoch) / len(result.sec_per_epoch):.1f} sec/epoch, "
            f"{result.samples_per_sec:.0f} samples/sec on {result.devices} ({result.backend})"
        )
    emit_json(args, result.to_dict())
    return 0
