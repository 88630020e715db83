"""One spelling for each option across the commands, the old spellings accepted with a note,
and ``--json`` printing / ``--out`` writing the result in every command that has them."""

from __future__ import annotations

import argparse
import json

import pytest

from multigpu.cli import main
from multigpu.cli.main import build_parser
from multigpu.cli.parsers import DeprecatedAlias, JsonFlag

#: Names that mean the same option; a command may use at most the one kept.
SYNONYMS = (
    {"--batch", "--batch-size", "--batch_size", "--bs"},
    {"--gpus", "--devices", "--num-gpus", "--ngpus"},
    {"--graph", "--model", "--network"},
    {"--nproc", "--nproc-per-node", "--nprocs"},
    {"--json", "--json-out", "--json-path"},
)


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser, the lab's actions included, by name ("lab up")."""
    out: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    out[f"{name} {sub}".strip()] = p
                    walk(p, f"{name} {sub}".strip())

    walk(build_parser(), "")
    return out


def _options(parser: argparse.ArgumentParser, deprecated: bool = False) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if a.option_strings and a.dest != "help" and isinstance(a, DeprecatedAlias) == deprecated
    ]


def test_every_dest_has_one_spelling_across_commands():
    spellings: dict[str, set[tuple[str, ...]]] = {}
    dests: dict[str, set[str]] = {}
    for parser in _parsers().values():
        for action in _options(parser):
            spellings.setdefault(action.dest, set()).add(tuple(action.option_strings))
            for option in action.option_strings:
                dests.setdefault(option, set()).add(action.dest)
    assert {d: s for d, s in spellings.items() if len(s) > 1} == {}
    assert {o: d for o, d in dests.items() if len(d) > 1} == {}
    assert all(len(s) == 1 for (s,) in spellings.values()), "one option string per option, no short aliases"


def test_no_two_synonyms_are_current_spellings():
    current = {o for p in _parsers().values() for a in _options(p) for o in a.option_strings}
    for group in SYNONYMS:
        assert len(current & group) <= 1, sorted(current & group)


def test_the_shared_options_are_spelled_as_torch_and_keras_users_expect():
    parsers = _parsers()
    has = {name: {o for a in _options(p) for o in a.option_strings} for name, p in parsers.items()}
    for command in ("train", "check", "partition", "profile", "run"):
        assert "--batch-size" in has[command], command
    for command in ("train", "check"):
        assert "--devices" in has[command]
    for command in ("train", "partition", "profile", "run"):
        assert "--model" in has[command]
    assert "--nproc-per-node" in has["launch"]
    for command, options in has.items():  # every --json prints, and --out sits beside it
        if "--json" in options:
            assert "--out" in options, command


def test_every_deprecated_spelling_names_its_replacement_in_help():
    seen = set()
    for name, parser in _parsers().items():
        for alias in _options(parser, deprecated=True):
            new = next(a for a in _options(parser) if a.dest == alias.dest)
            assert alias.new == new.option_strings[0] and "deprecated" in alias.help, (name, alias.option_strings)
            seen.add((name, alias.option_strings[0], alias.new))
    assert seen >= {
        ("train", "--gpus", "--devices"),
        ("check", "--batch", "--batch-size"),
        ("partition", "--graph", "--model"),
        ("partition", "--batch", "--batch-size"),
        ("profile", "--batch", "--batch-size"),
        ("run", "--batch", "--batch-size"),
        ("launch", "--nproc", "--nproc-per-node"),
    }


@pytest.mark.parametrize(
    "argv, dest, value, note",
    [
        (["train", "--gpus", "cpu:2"], "devices", "cpu:2", "--gpus is deprecated"),
        (["check", "--batch", "8"], "batch_size", 8, "--batch is deprecated"),
        (["partition", "--graph", "lenet", "--cluster", "lab"], "model", "lenet", "--graph is deprecated"),
        (["partition", "--batch", "4", "--cluster", "lab"], "batch_size", 4, "use --batch-size"),
        (["launch", "--nproc", "3", "--", "train"], "nproc_per_node", 3, "use --nproc-per-node"),
        (["train", "--json", "r.json"], "out", "r.json", "--json PATH is deprecated"),
        (["check", "--json", "r.json"], "out", "r.json", "use --out PATH"),
    ],
)
def test_an_old_spelling_still_parses_with_a_note(capsys, argv, dest, value, note):
    args = build_parser().parse_args(argv)
    assert getattr(args, dest) == value
    assert note in capsys.readouterr().err


def test_json_alone_is_a_flag_in_train_and_check():
    for command in ("train", "check"):
        args = build_parser().parse_args([command, "--json"])
        assert args.json is True and args.out is None
        action = next(a for a in _parsers()[command]._actions if "--json" in a.option_strings)
        assert isinstance(action, JsonFlag)
    args = build_parser().parse_args(["train", "--devices", "2"])
    assert args.json is False and args.devices == "2"


def test_partition_prints_with_json_and_writes_with_out(capsys, tmp_path):
    out = tmp_path / "plan.json"
    assert main(["partition", "--model", "lenet", "--cluster", "lab", "--no-baselines", "--out", str(out)]) == 0
    report = capsys.readouterr().out
    assert "assignment" not in report.splitlines()[0] and json.loads(out.read_text())["assignment"]
    assert main(["partition", "--model", "lenet", "--cluster", "lab", "--no-baselines", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["assignment"] == json.loads(out.read_text())["assignment"]


def test_partition_without_a_model_is_bad_input(capsys):
    assert main(["partition", "--cluster", "lab"]) == 2
    assert "give --model" in capsys.readouterr().err
