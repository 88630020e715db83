"""Print the conformance table: each bad call x each adapter -> the exception it raises.

    .venv/bin/python tests/conformance_table.py [--raw] [--out FILE.md]

The first table is what every caller gets (``multigpu.backend(name)``: the adapter
behind the contract); ``--raw`` adds what each adapter does on its own, without the
contract (the adapters now rely on it, so this shows what the contract prevents,
crashes included). Raw calls run in a child process per adapter, restarted after a
crash. The adapters are every installed backend plus the third-party one
registered by entry point.
"""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).parent))

import multigpu  # noqa: E402

from conformance_cases import CASES, CPU, THIRD_PARTY, third_party_on_path  # noqa: E402


def outcome(call: Callable[[Any], Any], be: Any) -> str:
    """The exception class raised by ``call(be)``, or ``no error``; async errors are forced out."""
    try:
        out = call(be)
        for t in out if isinstance(out, list) else [out]:
            if isinstance(t, be.tensor_type):
                be.to_numpy(t)  # MXNet reports errors at the next read
        be.synchronize(CPU)
    except Exception as exc:  # noqa: BLE001 - the point is to see which one
        return type(exc).__name__
    return "no error"


def raw_outcomes(name: str) -> list[str]:
    """Each case on the bare adapter ``name``, in child processes that may crash."""
    results: list[str] = []
    while len(results) < len(CASES):
        child = subprocess.run([sys.executable, __file__, "--child", name, "--start", str(len(results))],
                               capture_output=True, text=True)
        results += [line.split("\t", 1)[1] for line in child.stdout.splitlines() if "\t" in line]
        if child.returncode != 0 and len(results) < len(CASES):
            sig = -child.returncode
            what = signal.Signals(sig).name if 0 < sig < 64 else f"exit {child.returncode}"
            results.append(f"process killed ({what})")
    return results


def table(adapters: list[str], raw: bool) -> list[list[str]]:
    """Rows of [bad call, outcome per adapter]."""
    columns = [raw_outcomes(name) if raw else [outcome(c.call, multigpu.backend(name)) for c in CASES]
               for name in adapters]
    return [[case.name + (" (issue)" if case.issue else ""), *(col[i] for col in columns)]
            for i, case in enumerate(CASES)]


def markdown(adapters: list[str], rows: list[list[str]], title: str) -> str:
    """A markdown table."""
    lines = [f"### {title}", "", "| bad call | " + " | ".join(adapters) + " |",
             "|---|" + "---|" * len(adapters)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> int:
    """Print (or write) the tables."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--raw", action="store_true", help="also show each adapter without the contract")
    p.add_argument("--out", default=None, help="write the markdown here instead of printing it")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    third_party_on_path()
    warnings.simplefilter("ignore")
    if args.child:
        bare = multigpu.backend(args.child).adapter
        for i in range(args.start, len(CASES)):
            print(f"{i}\t{outcome(CASES[i].call, bare)}", flush=True)
        return 0
    adapters = [*multigpu.available_backends()]
    assert THIRD_PARTY in adapters, "the third-party distribution was not found"
    text = markdown(adapters, table(adapters, raw=False),
                    "Through the contract (multigpu.backend(name)): the exception each bad call raises")
    if args.raw:
        text += "\n" + markdown(adapters, table(adapters, raw=True),
                                "Each adapter alone, without the contract (what issue 10 found)")
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
