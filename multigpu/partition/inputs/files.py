"""Reading the planner's input files: JSON (duplicate keys refused) or TOML, with one
message style for a file that cannot be read or parsed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from multigpu.partition.exceptions import ClusterError

__all__ = ["read_structured_file"]


def _rejecting_duplicates(error: type[ClusterError]) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                # json keeps the last duplicate silently; a repeated key is almost always a mistake.
                raise error(f"duplicate key {k!r} in a JSON object; keep one")
            out[k] = v
        return out

    return hook


def read_structured_file(path: Path, kind: str, error: type[ClusterError] = ClusterError) -> Any:
    """Parse ``path`` as JSON (``.json``) or TOML (``.toml``); ``error`` (ClusterError) on a bad file."""
    suffix = path.suffix.lower()
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise error(f"cannot read {kind} file {str(path)!r}: {e.strerror or e}") from None
    if suffix == ".json":
        try:
            return json.loads(raw.decode("utf-8"), object_pairs_hook=_rejecting_duplicates(error))
        except UnicodeDecodeError as e:
            raise error(f"{kind} file {str(path)!r} is not UTF-8 text ({e.reason}); save it as UTF-8 JSON") from None
        except json.JSONDecodeError as e:
            raise error(
                f"malformed JSON in {kind} file {str(path)!r} at line {e.lineno} "
                f"column {e.colno}: {e.msg}; fix the syntax"
            ) from None
    if suffix == ".toml":
        toml = _toml_module()
        try:
            return toml.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise error(f"{kind} file {str(path)!r} is not UTF-8 text ({e.reason}); save it as UTF-8 TOML") from None
        except toml.TOMLDecodeError as e:
            raise error(f"malformed TOML in {kind} file {str(path)!r}: {e}; fix the syntax") from None
    raise error(f"{kind} file {str(path)!r} has suffix {suffix or '(none)'!r}; name it .json or .toml")


def _toml_module() -> Any:
    try:
        import tomllib  # Python 3.11+

        return tomllib
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10 only
        try:
            import tomli

            return tomli
        except ModuleNotFoundError:
            raise ClusterError(
                "reading TOML needs Python 3.11+ or the 'tomli' package; pip install tomli, or use a .json cluster file"
            ) from None
