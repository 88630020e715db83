"""``allreduce``: naive, ring, fused and native on LeNet's gradients and on 4 KB..64 MB buffers.

Each framework runs in its own process. For every device count (GPUs when the
framework sees that many, else CPU replicas) the algorithms run alternately:

* LeNet's gradients, laid out as ``value_and_grad`` returns them (one flat
  [grads..., loss] buffer per device): ``fused`` sums those buffers
  (``allreduce_flat``, the step's path); ``naive``, ``ring`` and ``native`` run per
  parameter on views of them (``allreduce_grads``); ``fused (tensor API)`` is
  ``allreduce_grads(..., "fused")`` on per-parameter tensors (flatten, sum, write back).
* One buffer per device of 4 KB to 64 MB: every algorithm on that one tensor.

``fused (tensor API)`` runs on the same per-parameter views as naive; it flattens
them into a new buffer, sums, and writes the sums back.

Before timing, each algorithm runs once on random values and every replica is
checked to read the exact sum. Reported: median time (quartiles), the bus bandwidth
of nccl-tests (algbw x 2(n-1)/n, algbw = bytes / time), and the fused speed-up over
per-parameter naive (median of per-round ratios). On CPU replicas ``fused`` is one
reduce into the first buffer that every replica then reads (``flat_schedule``
"shared"): nothing needs to move between replicas that share host memory.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from multigpu.benchmarks.harness import (
    Options,
    Result,
    Table,
    device_spec,
    fmt_ms,
    interleaved,
    isolated,
    progress_bar,
    ratio,
    summary,
)

TITLE = "Allreduce: naive, ring, fused, native on LeNet's gradients and 4 KB-64 MB buffers"
IN_QUICK = True

SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20)  # bytes of float32
QUICK_SIZES = (4 << 10, 1 << 20, 16 << 20)
TARGET_VS_NAIVE, TARGET_VS_NATIVE, TARGET_GPU_SPEEDUP = 1.0, 1.5, 3.0


def _algorithms(be: Any) -> list[str]:
    return ["naive", "ring", "fused", "fused (tensor API)"] + (["native"] if hasattr(be, "native_allreduce") else [])


def _check(
    be: Any, devices: list[Any], shapes: list[tuple[int, ...]], algo: str, run: Callable[[list[Any]], list[Any]]
) -> None:
    """Run ``algo`` once on random flat buffers; raise unless every replica reads the exact sum."""
    rng = np.random.default_rng(len(devices))
    size = int(sum(np.prod(s) for s in shapes))
    host = [rng.standard_normal(size).astype(np.float32) for _ in devices]
    flats = [be.from_numpy(h, d) for h, d in zip(host, devices)]
    want = np.sum(host, axis=0, dtype=np.float64)
    for i, got in enumerate(run(flats)):
        err = float(np.abs(be.to_numpy(got).reshape(-1) - want).max())
        if err > 1e-4 * max(1.0, float(np.abs(want).max())):
            raise AssertionError(f"{be.name} {algo} on {len(devices)} devices: replica {i} is off the sum by {err:g}")


def _cases(be: Any, devices: list[Any], shapes: list[tuple[int, ...]]) -> dict[str, Callable[[list[Any]], list[Any]]]:
    """Each algorithm as a function of one flat buffer per device -> the buffer each replica reads."""
    from multigpu.parallel.allreduce import allreduce_flat, allreduce_grads

    def per_param(algo: str) -> Callable[[list[Any]], list[Any]]:
        def run(flats: list[Any]) -> list[Any]:
            views = [be.unflatten(f, shapes) for f in flats]
            allreduce_grads(be, views, devices, algo)
            return flats

        return run

    cases: dict[str, Callable[[list[Any]], list[Any]]] = {
        "naive": per_param("naive"),
        "ring": per_param("ring"),
        "fused": lambda flats: allreduce_flat(be, flats, devices),
        "fused (tensor API)": per_param("fused"),
    }
    if hasattr(be, "native_allreduce"):
        cases["native"] = per_param("native")
    return cases


def _timed(
    be: Any, devices: list[Any], shapes: list[tuple[int, ...]], repeat: int, warmup: int, tick: Callable[[], None]
) -> dict[str, list[float]]:
    """Check every algorithm, then time them alternately on buffers that persist across calls."""
    from multigpu.parallel.allreduce import allreduce_flat, allreduce_grads

    size = int(sum(np.prod(s) for s in shapes))
    cases = _cases(be, devices, shapes)
    for name, run in cases.items():
        _check(be, devices, shapes, name, run)

    def sync() -> None:
        for d in devices:
            be.synchronize(d)

    # One set of buffers serves every algorithm (each sums in place). They hold zeros: the
    # value does not change the speed of an add or a copy, and repeated sums stay finite.
    flats = [be.from_numpy(np.zeros(size, np.float32), d) for d in devices]
    views = [be.unflatten(f, shapes) for f in flats]  # made once, as the step makes them once per step
    timed: dict[str, Callable[[], Any]] = {}
    for name in cases:
        if name == "fused":
            timed[name] = lambda: allreduce_flat(be, flats, devices)
        else:
            algo = "fused" if name == "fused (tensor API)" else name
            timed[name] = (lambda a: lambda: allreduce_grads(be, views, devices, a))(algo)
    return interleaved(timed, repeat=repeat, warmup=warmup, sync=sync, progress=tick, reverse_odd_rounds=True)


def measure(
    framework: str,
    lenet_counts: tuple[int, ...],
    buffer_counts: tuple[int, ...],
    sizes: tuple[int, ...],
    repeat: int,
    warmup: int,
    progress: bool,
) -> dict[str, Any]:
    """In a fresh process: time every algorithm on LeNet's gradients and on each buffer size."""
    import multigpu
    from multigpu import models
    from multigpu.contract.devices import CPUFallbackWarning, resolve_devices

    be = multigpu.backend(framework)
    shapes = [*models.lenet().param_shapes, (1,)]  # value_and_grad's layout: grads then the loss
    jobs = [("lenet", n, None) for n in lenet_counts] + [("buffer", n, s) for n in buffer_counts for s in sizes]
    bar = progress_bar(sum(_rounds(kind, s, repeat) for kind, _, s in jobs), f"allreduce {framework}", progress)
    out: dict[str, Any] = {"algorithms": _algorithms(be), "lenet": {}, "buffer": {}}
    for kind, n, size in jobs:
        spec, dev_kind = device_spec(be, n)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CPUFallbackWarning)
            devices = resolve_devices(be, spec)
        shp: list[tuple[int, ...]] = shapes if size is None else [(size // 4,)]
        samples = _timed(be, devices, shp, _rounds(kind, size, repeat), warmup, bar.update)
        rec = {"n": n, "kind": dev_kind, "bytes": 4 * int(sum(np.prod(s) for s in shp)), "samples": samples}
        if kind == "lenet":
            out["lenet"][n] = rec
        else:
            out["buffer"].setdefault(n, {})[size] = rec
    bar.close()
    return out


def _rounds(kind: str, size: Any, repeat: int) -> int:
    # Big buffers take long per call; fewer rounds still give a median and quartiles.
    return repeat if kind == "lenet" or size <= (1 << 20) else max(5, repeat // 4)


def busbw(nbytes: int, seconds: float, n: int) -> float:
    """nccl-tests bus bandwidth in GB/s: (bytes / time) x 2(n-1)/n."""
    return nbytes / seconds * 2 * (n - 1) / n / 1e9


def run(opts: Options) -> Result:
    """Time every algorithm per framework (each in its own process) and tabulate."""
    repeat, warmup = opts.repeats(40, 8), opts.repeats(3, 1)
    lenet_counts = opts.repeats((2, 3, 4, 6, 8), (2, 4))
    buffer_counts = opts.repeats((2, 4, 8), (2, 4))
    sizes = SIZES if not opts.quick else QUICK_SIZES
    data: dict[str, Any] = {}
    lenet_rows, buf_rows = [], []
    for fw in opts.frameworks():
        data[fw] = got = isolated(
            f"{__package__}.allreduce:measure", fw, lenet_counts, buffer_counts, sizes, repeat, warmup, opts.progress
        )
        for n, rec in got["lenet"].items():
            s = rec["samples"]
            speedup = ratio(s["naive"], s["fused"])
            rec["fused_speedup_over_naive"] = speedup
            cells = [
                fmt_ms(summary(s[a]), 3) if a in s else "-"
                for a in ("naive", "ring", "fused", "fused (tensor API)", "native")
            ]
            vs_native = ratio(s["fused"], s["native"]) if "native" in s else None
            rec["fused_over_native"] = vs_native
            if rec["kind"] == "gpu":
                met = speedup["median"] >= TARGET_GPU_SPEEDUP
            else:
                met = 1 / speedup["median"] <= TARGET_VS_NAIVE and (
                    vs_native is None or vs_native["median"] <= TARGET_VS_NATIVE
                )
            lenet_rows.append(
                [
                    fw,
                    f"{n} {rec['kind'].upper()}",
                    *cells,
                    f"{speedup['median']:.2f}x ({speedup['q1']:.2f}-{speedup['q3']:.2f})",
                    "-" if vs_native is None else f"{vs_native['median']:.2f}",
                    "yes" if met else "**no**",
                ]
            )
        for n, per_size in got["buffer"].items():
            for size, rec in per_size.items():
                s = rec["samples"]
                cells = []
                for a in ("naive", "ring", "fused", "native"):
                    if a not in s:
                        cells.append("-")
                        continue
                    med = summary(s[a])["median"]
                    cells.append(f"{1e3 * med:.3f} ms, {busbw(rec['bytes'], med, n):.2f} GB/s")
                buf_rows.append([fw, f"{n} {rec['kind'].upper()}", _size(size), *cells])
    notes = [
        f"LeNet: {repeat} alternating rounds after {warmup} warm-up; buffers over 1 MB: a quarter of that "
        "(at least 5). Times are median (quartiles) in ms, every device synchronized inside the timed region.",
        "speed-up = naive / fused per round (median, quartiles). Targets on CPU replicas: fused no slower than "
        f"naive and at most {TARGET_VS_NATIVE:g}x native; on GPUs fused at least {TARGET_GPU_SPEEDUP:g}x "
        "faster than naive.",
        "fused = allreduce_flat on the flat [grads..., loss] buffers value_and_grad returns (the step's path); "
        "on CPU replicas one reduce into the first buffer, which every replica reads. fused (tensor API) = "
        "allreduce_grads(..., 'fused') on the per-parameter views: flatten, sum, write back. Timed buffers "
        "hold zeros (speed does not depend on the values; sums stay finite); each algorithm is first checked "
        "on random values.",
        "bus bandwidth = bytes / time x 2(n-1)/n (nccl-tests). On CPU replicas a transfer is a memory copy "
        "on the same host, so these are host memory figures, not links.",
        "MXNet offers no native allreduce here (its kvstore aborts beside torch or paddle; see the adapter).",
    ]
    tables = [
        Table(
            "LeNet's gradients (129,068 floats + the loss, 8 tensors): time per allreduce",
            [
                "backend",
                "devices",
                "naive ms",
                "ring ms",
                "fused ms",
                "fused (tensor API) ms",
                "native ms",
                "fused speed-up over naive",
                "fused / native",
                "targets met",
            ],
            lenet_rows,
        ),
        Table(
            "One buffer per device: time and bus bandwidth",
            ["backend", "devices", "size", "naive", "ring", "fused", "native"],
            buf_rows,
        ),
    ]
    return Result(
        "allreduce",
        TITLE,
        tables,
        data,
        settings={
            "repeat": repeat,
            "warmup": warmup,
            "lenet_devices": lenet_counts,
            "buffer_devices": buffer_counts,
            "sizes": sizes,
        },
        notes=notes,
        plot=lambda fig: _plot(fig, data),
    )


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KB"


def _plot(fig: Any, data: dict[str, Any]) -> None:
    fws = list(data)
    axes = fig.subplots(2, max(1, len(fws)), squeeze=False)
    for j, fw in enumerate(fws):
        got = data[fw]
        ax = axes[0][j]
        counts = list(got["lenet"])
        for a in got["algorithms"]:
            ax.plot(
                counts, [1e3 * summary(got["lenet"][n]["samples"][a])["median"] for n in counts], marker="o", label=a
            )
        ax.set(title=f"{fw}: LeNet gradients", xlabel="devices", ylabel="ms per allreduce", yscale="log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax = axes[1][j]
        if got["buffer"]:
            n = max(got["buffer"])
            sizes = list(got["buffer"][n])
            for a in got["algorithms"]:
                if a == "fused (tensor API)":
                    continue
                bw = [
                    busbw(got["buffer"][n][s]["bytes"], summary(got["buffer"][n][s]["samples"][a])["median"], n)
                    for s in sizes
                ]
                ax.plot([s / 2**20 for s in sizes], bw, marker="o", label=a)
            ax.set(
                title=f"{fw}: one buffer, {n} devices",
                xlabel="MB per device",
                ylabel="bus bandwidth GB/s",
                xscale="log",
            )
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.set_size_inches(4 * max(1, len(fws)) + 2, 8)
    fig.tight_layout()
