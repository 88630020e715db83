"""Every runnable code block of the README, CONTRIBUTING and the docs pages runs, so the docs
cannot drift from the code.

Which blocks run: fenced blocks tagged ``python``, ``bash``, ``sh`` or ``shell``. Blocks tagged
anything else (``text``, ``console``, ``json``, ``toml``, ...) are shown, not run. A comment on
the line just before a block says more (several keys are separated by ``;``):

* ``<!-- snippet: skip REASON -->``: not run; the reason is required, and it is the rest of the
  comment (no other key goes with it);
* ``<!-- snippet: slow -->``: run, and marked ``slow`` (it trains, profiles or starts processes);
* ``<!-- snippet: continue -->``: run after the runnable block before it on the same page, in the
  same Python namespace and the same folder (a chain runs as one test);
* ``<!-- snippet: needs NAME ... -->``: skipped, with the reason, where a backend, ``ray``,
  ``matplotlib`` or the real ``fashion-mnist`` files are not installed.

Each chain runs in a fresh Python process in an empty temporary folder (shell blocks with
``bash -euo pipefail`` from inside it), with ``multigpu`` on PATH. The generated pages
(``docs/results/``, written by ``multigpu bench``, and the conformance table) hold no code.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import multigpu

ROOT = Path(__file__).resolve().parents[1]
#: Pages written by programs (``multigpu bench``, ``tests/conformance_table.py``): they hold no code.
GENERATED = ("docs/results/*.md", "docs/reference/conformance.md")
HAND_WRITTEN = ("docs/results/index.md",)
RUNNABLE = {"python": "python", "py": "python", "bash": "shell", "sh": "shell", "shell": "shell"}
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")
MARKER = re.compile(r"^\s*<!--\s*snippet:\s*(?P<body>.*?)\s*-->\s*$")
KEYS = ("skip", "slow", "continue", "needs")
TIMEOUT = {False: 120, True: 600}  # seconds per chain: fast, slow


@dataclass
class Block:
    path: str
    line: int  # of the first code line, 1-based
    kind: str  # "python" or "shell"
    code: str
    keys: dict[str, str]


@dataclass
class Chain:
    blocks: list[Block] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.blocks[0].path}:{self.blocks[0].line}"

    @property
    def slow(self) -> bool:
        return any("slow" in b.keys for b in self.blocks)

    @property
    def needs(self) -> list[str]:
        return sorted({n for b in self.blocks for n in b.keys.get("needs", "").split()})


def pages() -> list[Path]:
    """The pages whose blocks run: README, CONTRIBUTING and every docs page but the generated ones."""
    found = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
    rel = [(p, p.relative_to(ROOT)) for p in found if p.is_file()]
    return [p for p, r in rel if str(r) in HAND_WRITTEN or not any(r.match(g) for g in GENERATED)]


def parse_keys(body: str) -> dict[str, str]:
    """``"slow; needs torch"`` -> ``{"slow": "", "needs": "torch"}``; ``"skip REASON"`` -> ``{"skip": REASON}``."""
    if body.split(" ", 1)[0] == "skip":
        return {"skip": body[4:].strip()}
    keys = {}
    for item in filter(None, (part.strip() for part in body.split(";"))):
        key, _, value = item.partition(" ")
        keys[key] = value.strip()
    return keys


def blocks(path: Path) -> list[tuple[str, int, str, dict[str, str]]]:
    """Every fenced block of ``path``: (language, first code line, code, marker keys)."""
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m["indent"]), m["fence"], m["lang"].lower()
        prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(prev)
        start, i = i + 1, i + 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            i += 1
        code = "\n".join(line[indent:] for line in lines[start:i])
        out.append((lang, start + 1, code, parse_keys(marker["body"]) if marker else {}))
        i += 1
    return out


def chains() -> list[Chain]:
    """The runnable blocks grouped into chains (a block with ``continue`` joins the one before)."""
    found: list[Chain] = []
    for path in pages():
        rel = str(path.relative_to(ROOT))
        last = None
        for lang, line, code, keys in blocks(path):
            if lang not in RUNNABLE or "skip" in keys:
                continue
            block = Block(rel, line, RUNNABLE[lang], code, keys)
            if "continue" in keys and last is not None:
                last.blocks.append(block)
            else:
                last = Chain([block])
                found.append(last)
    return found


def missing(need: str) -> bool:
    """True when what a block needs is not installed here."""
    if need == "fashion-mnist":
        from multigpu.data import find_fashion_mnist

        return find_fashion_mnist() is None
    if need in multigpu.registered_backends():
        return need not in multigpu.available_backends()
    return importlib.util.find_spec(need) is None


NEEDS = {"fashion-mnist", "ray", "matplotlib", *multigpu.registered_backends()}

# Runs one chain: Python blocks share a namespace, shell blocks run with bash; a traceback
# names the page and its line, since each block is compiled under the page's name.
RUNNER = r"""
import json, subprocess, sys
ns = {"__name__": "__main__"}
for b in json.load(sys.stdin):
    print(f"--- {b['path']}:{b['line']}", flush=True)
    if b["kind"] == "python":
        exec(compile("\n" * (b["line"] - 1) + b["code"], b["path"], "exec"), ns)
    else:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", b["code"]])
        if done.returncode:
            sys.exit(f"{b['path']}:{b['line']}: the shell block exited {done.returncode}")
"""

CHAINS = chains()


@pytest.mark.parametrize(
    "chain", [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.slow else []) for c in CHAINS]
)
def test_the_block_runs(chain: Chain, tmp_path: Path) -> None:
    absent = [n for n in chain.needs if missing(n)]
    if absent:
        pytest.skip(f"{chain.id} needs {', '.join(absent)}, not installed here")
    env = {
        **os.environ,
        "MPLBACKEND": "Agg",
        "PYTHONUNBUFFERED": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    payload = json.dumps([b.__dict__ for b in chain.blocks])
    try:
        done = subprocess.run(
            [sys.executable, "-c", RUNNER],
            input=payload,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT[chain.slow],
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{chain.id}: still running after {TIMEOUT[chain.slow]} s; make it smaller or mark it slow")
    assert done.returncode == 0, (
        f"{chain.id} failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    )


def test_the_markers_are_well_formed() -> None:
    """Every marker uses known keys, a skip says why, needs names something checkable, and a
    continuation has a runnable block to continue."""
    problems = []
    for path in pages():
        rel = str(path.relative_to(ROOT))
        seen_runnable = False
        for lang, line, _, keys in blocks(path):
            where = f"{rel}:{line - 1}"
            problems += [f"{where}: unknown key {k!r}; use one of {KEYS}" for k in keys if k not in KEYS]
            if "skip" in keys and not keys["skip"]:
                problems.append(f"{where}: 'skip' needs a reason, e.g. <!-- snippet: skip trains for minutes -->")
            if keys and lang not in RUNNABLE:
                problems.append(f"{where}: a marker on a {lang or 'untagged'} block, which never runs")
            unknown = set(keys.get("needs", "").split()) - NEEDS
            if unknown:
                problems.append(f"{where}: needs {sorted(unknown)}; known: {sorted(NEEDS)}")
            if "continue" in keys and not seen_runnable:
                problems.append(f"{where}: 'continue' with no runnable block before it on the page")
            seen_runnable |= lang in RUNNABLE and "skip" not in keys
    assert not problems, "\n".join(problems)


def test_the_readme_and_the_guide_have_runnable_blocks() -> None:
    """The extraction finds what the pages hold (a parser that found nothing would pass every run)."""
    ran = {c.blocks[0].path for c in CHAINS} | {b.path for c in CHAINS for b in c.blocks}
    assert "README.md" in ran
    guide = {str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "guide").glob("*.md")}
    assert guide and guide <= ran, f"guide pages without a runnable block: {sorted(guide - ran)}"
