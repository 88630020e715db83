"""``multigpu run``: run a plan's stages on their devices, classify, time every part."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from multigpu.cli.parsers import add_alias, add_command, add_json_output, check_output, emit_json
from multigpu.errors import InputError, PlanError

EXIT_OK, EXIT_FAILED = 0, 1

DESCRIPTION = """\
Run each stage of a plan on its device: one Ray actor per device (a local Ray
instance unless --address joins a cluster), each on the backend, framework device,
threads and Ray resources its cluster entry names; the driver (this process, the
cluster's source) runs the stages placed on it. Parameters are shipped to the
workers first and reported apart. Prints the class of each input (with
--images), the accuracy, and each part's measured time: every stage's compute,
every hop (timed at both ends) and end to end; --stream pipelines the inputs and
prints items/s beside the predicted 1/bottleneck; --compare prints the cost
model's prediction beside every measured figure.

--model takes a built-in name or an ONNX file (`from_onnx`, at --batch-size where
its batch axis is dynamic): the file's weights and BatchNorm statistics are the
parameters unless --params gives others.

--plan takes the file `multigpu partition --out FILE` writes (the JSON its --json
prints), a JSON list of device names, or the names inline: t1,t1,p1 or t1*5,p1*5.
Exit status: 0 ok, 1 a worker died or timed out (or --check found a difference),
2 bad input."""


def register(sub: Any) -> None:
    """Add the ``run`` sub-command."""
    p = add_command(
        sub,
        "run",
        run,
        help="run a partition plan on Ray workers; time each stage and hop",
        description=DESCRIPTION,
        raw=True,
    )
    p.add_argument(
        "--model",
        default="lenet",
        metavar="NAME|FILE.onnx",
        help="built-in model: lenet, alexnet, resnet18 or resnet18_textbook (default lenet), or an ONNX file, "
        "imported with its own weights (needs onnx; one input of floats, e.g. images)",
    )
    p.add_argument(
        "--params",
        default=None,
        metavar="DIR|FILE",
        help="a `multigpu train --checkpoint` folder or .npz (default: the seeded random init; "
        "an ONNX file's own weights)",
    )
    p.add_argument("--plan", required=True, metavar="FILE|DEV,DEV,...", help="one device per layer (see above)")
    p.add_argument("--cluster", required=True, metavar="FILE", help="cluster file whose devices name a backend")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--images", default=None, metavar="fashion-mnist:test:0-99", help="real images: split and inclusive row range"
    )
    src.add_argument("--random", type=int, default=None, metavar="N", help="N random inputs")
    batch = p.add_argument(
        "--batch-size",
        type=int,
        default=1,
        metavar="N",
        help="inputs per item, one forward pass (default 1); a short last item is run but not timed",
    )
    add_alias(p, "--batch", batch)
    p.add_argument("--stream", action="store_true", help="pipeline the items through the stages")
    p.add_argument("--compare", action="store_true", help="print predicted against measured time")
    p.add_argument(
        "--check", action="store_true", help="also run the model unpartitioned in this process and compare the outputs"
    )
    p.add_argument(
        "--engine",
        choices=("tasks", "compiled"),
        default="tasks",
        help="tasks: actor calls (default); compiled: a Ray Compiled Graph",
    )
    p.add_argument("--address", default=None, help="join this Ray cluster (default: start a local one)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a stage may take per item (default 60)")
    p.add_argument("--warmup", type=int, default=1, help="untimed items first (default 1)")
    p.add_argument("--data-dir", default=None, help="folder with the Fashion-MNIST IDX files")
    p.add_argument("--seed", type=int, default=0, help="seed of --random and of the default parameters")
    add_json_output(p, "the run (stages, timings, recognition, check)")


def parse_plan(text: str) -> Any:
    """A plan file's path, or inline names: ``a,a,b`` or ``a*2,b``."""
    if Path(text).is_file():
        return text
    if not re.fullmatch(r"[^,*\s]+(\*\d+)?(,[^,*\s]+(\*\d+)?)*", text.strip()):
        raise PlanError(
            f"--plan {text!r} is neither a file nor a list of device names; give the file "
            f"`multigpu partition --out FILE` writes, or names such as t1*5,p1*5"
        )
    out: list[str] = []
    for part in text.strip().split(","):
        name, _, count = part.partition("*")
        out += [name] * (int(count) if count else 1)
    return out


def run(args: argparse.Namespace) -> int:
    """Run the plan and print the report (or JSON); return the exit status."""
    from multigpu.execution import run_partitioned
    from multigpu.execution.inputs import load_images, load_params, load_state, random_inputs
    from multigpu.execution.runner import resolve_cluster

    check_output(args)
    model, own_params, own_state = _model(args.model, args.batch_size)
    params = load_params(args.params) if args.params else own_params
    params = model.init_params(args.seed) if params is None else model.check_params(params)
    state = load_state(args.params, model) if args.params else None
    if state is None and own_state:
        state = own_state
    if model.batch_norms and state is None:
        state = model.init_state()
        if args.params:
            print(
                f"note: --params holds no BatchNorm statistics, so {model.name} normalizes with its initial "
                f"ones (mean 0, variance 1); give the `multigpu train --checkpoint` folder",
                file=sys.stderr,
            )
    plan = parse_plan(args.plan)
    cluster = resolve_cluster(args.cluster)
    if args.images:
        images = load_images(args.images, model, args.data_dir)
    else:
        images = random_inputs(model, args.random if args.random is not None else 8, args.seed)
    result = run_partitioned(
        model,
        params,
        plan,
        images.x,
        cluster,
        batch=args.batch_size,
        stream=args.stream,
        engine=args.engine,
        address=args.address,
        timeout=args.timeout,
        warmup=args.warmup,
        state=state,
    )
    check = _check(model, params, images.x, result.outputs, cluster, state) if args.check else None
    if not args.params and own_params is None:
        print("note: no --params, so the seeded random init is used: the classes mean nothing", file=sys.stderr)
    pred = result.predictions()
    recog = _recognition(images, pred)
    if args.json or args.out is not None:
        out = result.to_dict()
        out["inputs"] = images.source
        out["recognition"] = recog
        out["check"] = check
        emit_json(args, out)
    if not args.json:
        print(
            f"{model.name}: {images.source} through {len(result.stages)} stage(s): "
            + " | ".join(f"{s.first}..{s.last} on {s.device} ({_backend(cluster, s.device)})" for s in result.stages)
        )
        if recog is not None:
            shown = recog["items"][:10]
            print(
                "recognition: "
                + ", ".join(
                    f"#{r['index']} {r['class']}" + ("" if r["correct"] else f" (true: {r['true']})") for r in shown
                )
                + (" ..." if len(recog["items"]) > 10 else "")
            )
            print(f"accuracy: {recog['accuracy']:.3f} ({recog['correct']}/{recog['total']})")
        print(result.format_timing())
        if args.compare:
            print(result.format_compare())
        if check is not None:
            print(
                f"check against the unpartitioned model ({check['backend']}, in this process): "
                f"{check['same']}/{check['total']} predictions identical, largest output difference "
                f"{check['max_abs_diff']:.3g}"
            )
    if check is not None and check["same"] != check["total"]:
        print(
            "multigpu run: error: the partitioned run's predictions differ from the unpartitioned model's",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return EXIT_OK


def _model(name: str, batch: int) -> tuple[Any, list[np.ndarray] | None, list[np.ndarray] | None]:
    """The model ``--model`` names, with the parameters and state an ONNX file brings (None for a built-in)."""
    from multigpu.execution.runner import resolve_model

    if not name.lower().endswith(".onnx"):
        return resolve_model(name), None, None
    from multigpu.models import from_onnx

    # NOTE: an ONNX file carries its weights, so they are the parameters, where a built-in model has only an init.
    imp = from_onnx(name, batch=batch)  # OnnxError (exit 2) for a missing, non-ONNX or unsupported file
    ints = [k for k, spec in imp.model.inputs.items() if spec.dtype != "float32"]
    if ints or len(imp.model.inputs) != 1:
        raise InputError(
            f"--model {name}: the run command feeds one input of floats (images or --random), and this model "
            f"takes {list(imp.model.inputs)}"
            + (f" ({', '.join(ints)} integer)" if ints else "")
            + "; run it from Python with multigpu.execution.run_partitioned(model, params, plan, {name: array}, "
            "cluster)"
        )
    return imp.model, imp.params, imp.state


def _backend(cluster: Any, device: str) -> str:
    return cluster.devices[cluster.index(device)].backend or "?"


def _recognition(images: Any, pred: np.ndarray) -> dict[str, Any] | None:
    if images.labels is None:
        return None
    names = images.classes
    items = [
        {"index": i, "class": names[int(p)], "true": names[int(t)], "correct": bool(p == t)}
        for i, (p, t) in enumerate(zip(pred, images.labels))
    ]
    correct = sum(r["correct"] for r in items)
    return {"accuracy": correct / len(items), "correct": correct, "total": len(items), "items": items}


def _check(
    model: Any, params: Any, x: np.ndarray, outputs: np.ndarray, cluster: Any, state: Any = None
) -> dict[str, Any]:
    """Run the model unpartitioned on the driver's backend here; compare."""
    from multigpu.contract.protocol import Device
    from multigpu.contract.registry import backend as get_backend

    name = cluster.devices[cluster.source_index].backend or "numpy"
    be = get_backend(name)
    dev = Device("cpu", 0)
    ps = [be.from_numpy(p, dev) for p in params]
    st = None if state is None else [be.from_numpy(a, dev) for a in state]
    ref = np.concatenate(
        [
            be.to_numpy(model.forward(be, ps, be.from_numpy(x[i : i + 64], dev), state=st)).reshape(
                len(x[i : i + 64]), -1
            )
            for i in range(0, len(x), 64)
        ]
    )
    same = int(np.sum(ref.argmax(1) == outputs.argmax(1)))
    return {"backend": name, "same": same, "total": len(ref), "max_abs_diff": float(np.abs(ref - outputs).max())}
