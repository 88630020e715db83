"""``multigpu profile``: measure layers and links on real workers and write a cluster file."""

from __future__ import annotations

import argparse
import json
from typing import Any

from multigpu.cli.parsers import add_alias, add_command
from multigpu.errors import PlanError

EXIT_OK = 0

DESCRIPTION = """\
Measure, on the workers a run would use, each layer's forward time (warm-up, then
--repeats passes, device synchronized; median and spread) and each link's cost
through the Ray engine (payloads of several sizes; latency + bytes/bandwidth fitted),
and write them as a cluster file: every device gets "layer_times" (per graph, e.g.
"lenet(batch=1)"), "stage_overhead", its effective "flops" and its "host" (the machine
its worker runs on; "hosts" gives each machine's usable cores); every pair a link.
What Ray adds to that hardware goes in the file's "engine" section: each device's
"transfer_cpu" (CPU per transfer it sends or receives, measured as process CPU time
while payloads stream through the engine), the driver's "relay" figure (CPU per hop
between two workers, which Ray's actor calls route through it), "warm_pass", and the
inline threshold with each link's latency below it.
`multigpu partition --cluster FILE` and `multigpu run --cluster FILE` then use the
measured figures.

Devices: --backends torch,paddle --threads 1,2 profiles every combination (named
e.g. torch-1t); --worker mxnet:cpu:1 adds one (BACKEND[:DEVICE][:THREADS]); or
--cluster FILE profiles the devices a cluster file describes (its source is the
driver; the other devices need "backend", and "resources" to pin them to nodes).
The driver is this process: it holds the input and may run layers itself
(--driver-backend, default the first worker's; "none" for a driver that runs none).
Exit status: 0 ok, 1 a worker died or timed out, 2 bad input."""


def register(sub: Any) -> None:
    """Add the ``profile`` sub-command."""
    p = add_command(
        sub,
        "profile",
        run,
        help="measure per-layer times and link costs; write a cluster file",
        description=DESCRIPTION,
        raw=True,
    )
    p.add_argument(
        "--model",
        action="append",
        default=None,
        metavar="lenet|alexnet",
        help="model to profile (repeatable; default lenet)",
    )
    backends = p.add_argument(
        "--backends", default=None, metavar="B[,B...]", help="comma-separated worker backends, e.g. torch,paddle"
    )
    # `--backend` names one backend in train and check; here the option takes a list, spelled as check's.
    add_alias(p, "--backend", backends)
    p.add_argument("--device", default="cpu", help="framework device of those workers: cpu or gpu:N (default cpu)")
    p.add_argument("--threads", default=None, metavar="N[,N...]", help="math threads per worker, e.g. 1,2")
    p.add_argument(
        "--worker",
        action="append",
        default=[],
        metavar="BACKEND[:DEVICE][:THREADS]",
        help="one more worker (repeatable), e.g. mxnet:cpu:1",
    )
    p.add_argument(
        "--cluster",
        default=None,
        metavar="FILE",
        help="profile the devices of this cluster file instead (its source is the driver)",
    )
    p.add_argument("--driver-name", default="driver", help="name of the driver device (default driver)")
    p.add_argument(
        "--driver-backend",
        default=None,
        metavar="B|none",
        help="backend of the driver's own stages (default: the first worker's; none: it runs none)",
    )
    p.add_argument("--driver-threads", type=int, default=None, metavar="N", help="math threads of the driver")
    batch = p.add_argument(
        "--batch-size", type=int, default=1, metavar="N", help="inputs per timed forward pass (default 1)"
    )
    add_alias(p, "--batch", batch)
    p.add_argument("--repeats", type=int, default=20, help="timed passes per device and model (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed passes first (default 3)")
    p.add_argument("--link-repeats", type=int, default=15, help="timed transfers per size and route (default 15)")
    p.add_argument(
        "--sizes",
        default=None,
        metavar="BYTES[,BYTES...]",
        help="payload sizes of the link probes, e.g. 65536,1048576 (default: spanning the models' "
        "activations; larger ones resolve a fast link's bandwidth)",
    )
    p.add_argument(
        "--cpu-items",
        type=int,
        default=60,
        help="payloads streamed per size and route to measure transfer CPU (default 60)",
    )
    p.add_argument(
        "--stream-items",
        type=int,
        default=24,
        help="payloads streamed to each worker to measure what the engine's messages add to a "
        "transfer on a link a stream fills (default 24)",
    )
    p.add_argument(
        "--engine",
        choices=("tasks", "compiled"),
        default="tasks",
        help="Ray engine whose hops to measure: tasks (actor calls, default) or compiled (a Compiled Graph)",
    )
    p.add_argument("--address", default=None, help="join this Ray cluster (default: start a local one)")
    p.add_argument("--out", required=True, metavar="FILE", help="write the cluster file (the measurements) to FILE")
    p.add_argument("--json", action="store_true", help="print the measurements as one JSON object on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _workers(args: argparse.Namespace) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if args.backends:
        threads: list[int | None] = [None]
        if args.threads:
            try:
                threads = [int(t) for t in args.threads.split(",") if t.strip()]
            except ValueError:
                raise PlanError(f"--threads {args.threads!r} must list whole numbers, e.g. 1,2") from None
        for b in [b.strip() for b in args.backends.split(",") if b.strip()]:
            for t in threads:
                out.append(_worker(b, args.device, t))
    elif args.threads:
        raise PlanError("--threads needs --backends (or use --worker BACKEND:DEVICE:THREADS)")
    for spec in args.worker:
        out.append(_parse_worker(spec))
    names = [w["name"] for w in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise PlanError(f"two workers would both be named {dup[0]!r}; give each backend/device/threads once")
    return out


def _parse_worker(spec: str) -> dict[str, Any]:
    """``torch``, ``torch:1``, ``torch:cpu:1``, ``torch:gpu:0:4`` -> a worker dict."""
    parts = spec.split(":")
    backend, rest = parts[0], parts[1:]
    device = "cpu"
    if rest and rest[0] == "cpu":
        rest = rest[1:]
    elif rest and rest[0] in ("gpu", "cuda") and len(rest) >= 2 and rest[1].isdigit():
        device, rest = f"gpu:{rest[1]}", rest[2:]
    if not backend or len(rest) > 1 or (rest and not rest[0].isdigit()):
        raise PlanError(
            f"--worker {spec!r} is not BACKEND[:DEVICE][:THREADS]; e.g. torch, torch:cpu:1, mxnet:2, torch:gpu:0"
        )
    return _worker(backend, device, int(rest[0]) if rest else None)


def _worker(backend: str, device: str, threads: int | None) -> dict[str, Any]:
    name = backend + ("" if device == "cpu" else "-" + device.replace(":", "")) + (f"-{threads}t" if threads else "")
    return {"name": name, "backend": backend, "device": device, "threads": threads}


def run(args: argparse.Namespace) -> int:
    """Profile and write the cluster file; return the exit status."""
    from multigpu.data.files import check_writable
    from multigpu.execution.profiler import json_path, profile
    from multigpu.partition import load_cluster

    check_writable(json_path(args.out), "--out")  # before minutes of profiling, not after
    models = args.model or ["lenet"]
    sizes = None
    if args.sizes:
        try:
            sizes = [int(float(x)) for x in args.sizes.split(",") if x.strip()]
        except ValueError:
            raise PlanError(f"--sizes {args.sizes!r} must list byte counts, e.g. 65536,1048576") from None
    measure: dict[str, Any] = {
        "batch": args.batch_size,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "link_repeats": args.link_repeats,
        "cpu_items": args.cpu_items,
        "stream_items": args.stream_items,
        "engine": args.engine,
        "address": args.address,
        "progress": not args.quiet,
        "sizes": sizes,
    }
    if args.cluster:
        if args.backends or args.worker:
            raise PlanError("give the workers either with --cluster or with --backends/--worker, not both")
        result = profile(models, cluster=load_cluster(args.cluster), **measure)
    else:
        workers = _workers(args)
        if not workers:
            raise PlanError(
                "no workers to profile; give --backends torch (and --threads 1,2), "
                "--worker BACKEND[:DEVICE][:THREADS], or --cluster FILE"
            )
        driver_backend = args.driver_backend or workers[0]["backend"]
        driver: dict[str, Any] = {
            "name": args.driver_name,
            "backend": None if driver_backend == "none" else driver_backend,
        }
        if args.driver_threads is not None and driver["backend"] is not None:
            driver["threads"] = args.driver_threads
        result = profile(models, workers, driver=driver, **measure)
    path = result.write(args.out)
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(result.format())
        print(f"wrote {path}")
    return EXIT_OK
