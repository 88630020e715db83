"""Call a Python function inside a lab host and bring its result back:
``python -m multigpu.lab.call IN OUT`` loads ``(target, args, kwargs)`` from the pickle
IN, calls ``target`` ("module:function"), and pickles the result (or the exception) to OUT.
``Lab.call`` runs it in a host."""

from __future__ import annotations

import importlib
import pickle
import sys
import traceback
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Run the call described in ``argv[0]``; write the outcome to ``argv[1]``."""
    target, args, kwargs = pickle.loads(Path(argv[0]).read_bytes())
    module, _, name = target.partition(":")
    try:
        result = ("ok", getattr(importlib.import_module(module), name)(*args, **kwargs))
    except BaseException as exc:  # noqa: BLE001 - carried back to the caller, which re-raises it
        result = ("error", (type(exc).__name__, str(exc), traceback.format_exc()))
    Path(argv[1]).write_bytes(pickle.dumps(result))
    return 0 if result[0] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
