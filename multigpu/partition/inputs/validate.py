"""Checks shared by the cluster and graph readers: names, key sets, and numbers through
``multigpu.checks``.

Every check raises ``ClusterError`` (or the class given) with a message that names
the offending value and says how to fix it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from multigpu import checks
from multigpu.partition.exceptions import ClusterError


def check_number(value: Any, what: str, **limits: Any) -> float:
    """``multigpu.checks.check_number`` for a value read from a file: at least 0 unless told
    otherwise, and ``ClusterError`` unless another class is given."""
    limits.setdefault("minimum", 0.0)
    limits.setdefault("error", ClusterError)
    return checks.check_number(value, what, **limits)


def check_number_fields(obj: Any, what: str, **fields: Mapping[str, Any]) -> None:
    """Check each named field of the frozen dataclass ``obj`` with ``check_number`` (its limits
    given per field, e.g. ``flops={"strict": True, "unit": "FLOP/s"}``) and store the float back;
    the message names the field as ``"{what}: {field}"``."""
    for attr, limits in fields.items():
        object.__setattr__(obj, attr, check_number(getattr(obj, attr), f"{what}: {attr}", **limits))


def check_number_map(value: Any, owner: str, field: str, key_what: str, empty: str, unit: str) -> dict[str, float]:
    """``value`` (the ``field`` of ``owner``) as a dict of names to positive finite numbers:
    ClusterError ``empty`` unless it is a non-empty mapping, else one naming
    ``"{owner}: {key_what}"`` (a bad name) or ``"{owner}: {field}[key]"`` (a bad number)."""
    if not isinstance(value, Mapping) or not value:
        raise ClusterError(empty)
    out = {}
    for key, amount in value.items():
        check_name(key, f"{owner}: {key_what}")
        out[key] = check_number(amount, f"{owner}: {field}[{key!r}]", strict=True, unit=unit)
    return out


def check_name(value: Any, what: str, error: type[Exception] = ClusterError) -> str:
    """Return ``value`` if it is a non-empty string; raise otherwise."""
    if not isinstance(value, str) or not value.strip():
        raise error(f"{what} must be a non-empty string, got {value!r}")
    return value


def check_keys(
    obj: Any,
    what: str,
    required: Collection[str],
    optional: Collection[str] = (),
    error: type[Exception] = ClusterError,
) -> Mapping[str, Any]:
    """Check that ``obj`` is a mapping holding all ``required`` keys and nothing else
    beyond ``optional``; return it."""
    if not isinstance(obj, Mapping):
        raise error(f"{what} must be an object/table, got {type(obj).__name__} {obj!r:.80}")
    allowed = list(required) + list(optional)
    unknown = [k for k in obj if k not in allowed]
    if unknown:
        raise error(
            f"{what} has unknown key {unknown[0]!r}; allowed keys are "
            f"{', '.join(repr(k) for k in allowed)} (check the spelling)"
        )
    missing = [k for k in required if k not in obj]
    if missing:
        raise error(
            f"{what} is missing the key {missing[0]!r}; required keys are {', '.join(repr(k) for k in required)}"
        )
    return obj
