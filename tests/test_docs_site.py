"""The README's shape and the docs site: a short README whose first commands are what CI runs,
links that resolve, and a site that builds with ``mkdocs build --strict``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 250
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _first_block(text: str) -> list[str]:
    """The lines of the first fenced code block of ``text``."""
    body = text.split("```", 2)[1]
    return body.splitlines()[1:]  # the first line holds the language tag


def test_the_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines, at most {MAX_README_LINES}: "
        "move the detail into a page under docs/ and link it"
    )


def test_the_readmes_first_block_is_its_two_commands() -> None:
    code = [line for line in _first_block(README.read_text()) if line.strip()]
    comments = [line for line in code if line.startswith("#")]
    commands = [line for line in code if not line.startswith("#")]
    assert [c.split(".")[0] for c in comments] == ["# 1", "# 2"], comments
    assert commands[0].startswith("python3 -m venv .venv && . .venv/bin/activate && pip install ")
    assert commands[1] == "pytest"


def test_ci_installs_exactly_what_the_readme_says() -> None:
    """.ci/run's first install is the README's command 1 (``-q`` aside); in that environment it
    checks, lints, type-checks, builds the site and runs pytest; then it installs the second set
    exactly as the install guide says, in a fresh environment, and runs pytest there too."""
    readme_install = next(
        part.strip()
        for part in _first_block(README.read_text())[1].split("&&")
        if part.strip().startswith("pip install")
    )
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    ci_installs = [line.replace(" -q", "") for line in ci if line.startswith("pip install")]
    assert ci_installs[0] == readme_install, f".ci/run installs {ci_installs[0]!r}; the README says {readme_install!r}"
    assert "-c constraints.txt" in readme_install
    guide = (ROOT / "docs" / "guide" / "install.md").read_text()
    assert len(ci_installs) == 2 and "-c constraints-numpy2.txt" in ci_installs[1], ci_installs
    assert ci_installs[1] in guide, f".ci/run's second set, {ci_installs[1]!r}, is not what the install guide says"

    def at(predicate, start: int = 0) -> int:
        return next(i for i, line in enumerate(ci) if i >= start and predicate(line))

    venvs = [i for i, line in enumerate(ci) if line.startswith("python3 -m venv ")]
    first = at(lambda line: line.startswith("pip install"))
    second = at(lambda line: line.startswith("pip install"), first + 1)
    assert len(venvs) == 2 and venvs[0] < first < venvs[1] < second, "each set in a fresh virtual environment"
    steps = [
        at(lambda line, cmd=cmd: line.strip() == cmd or line.startswith(cmd + " "), first)
        for cmd in ("pip check", "ruff check", "ruff format", "mypy")
    ]
    build = at(lambda line: "mkdocs build --strict" in line, first)
    tests = at(lambda line: line.strip() == "pytest", first)
    slow = at(lambda line: line.strip() == "pytest -m slow", first)
    assert steps == sorted(steps) and steps[-1] < build < tests < slow < venvs[1], (
        "set 1: install, pip check, ruff, mypy, build the site, pytest, pytest -m slow"
    )
    assert (
        second
        < at(lambda line: line.strip() == "pip check", second)
        < at(lambda line: line.strip() == "pytest", second)
    )


@pytest.mark.parametrize("page", ["README.md", "CONTRIBUTING.md"])
def test_the_links_of_the_root_pages_resolve(page: str) -> None:
    """Links from the README and CONTRIBUTING into the repository point at files that exist
    (the site's own links are checked by the strict build)."""
    text = (ROOT / page).read_text()
    broken = [
        target
        for target in LINK.findall(text)
        if not target.startswith(("http://", "https://", "#")) and not (ROOT / target.split("#", 1)[0]).exists()
    ]
    assert not broken, f"{page} links to missing files: {broken}"


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """``mkdocs build --strict``: no broken link or anchor, no page missing from the nav, every
    generated part (CLI, errors, layers, API) built from the code."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    for command in ("check", "train", "partition", "profile", "run", "launch", "bench"):
        assert f'id="multigpu-{command}"' in cli, f"the CLI reference has no section for {command}"
    assert "--train-limit" in cli  # the help text itself, not a copy of it


def test_every_results_page_says_when_where_and_under_what_load_it_ran() -> None:
    """The results section holds only pages the harness wrote, each stamped with its date, its
    machine and the load during the run (no hand-made results pages)."""
    pages = sorted(p for p in (ROOT / "docs" / "results").glob("*.md") if p.name != "index.md")
    assert pages
    for page in pages:
        head = page.read_text()[:3000]
        assert re.search(r"Run on \d{4}-\d\d-\d\d", head), f"{page.name} says not when it ran"
        assert "Machine: " in head and "load average" in head.lower(), f"{page.name} lacks its machine or load"
        assert (page.with_suffix(".png")).is_file(), f"{page.name} has no plot beside it"
