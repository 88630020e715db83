"""Checks shared by the cluster and graph readers: numbers and key sets.

Every check raises ``ClusterError`` (or the class given) with a message that names
the offending value and says how to fix it.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Collection, Mapping

from multigpu.partition.exceptions import ClusterError


def check_number(value: Any, what: str, *, minimum: float = 0.0, strict: bool = False,
                 unit: str = "", error: type[Exception] = ClusterError) -> float:
    """Return ``value`` as a finite float that is ``> minimum`` (``strict``) or ``>= minimum``.

    ``what`` names the value in the message (e.g. "device 'pi1': flops").
    """
    # bool is an int subclass in Python; "flops": true is a typo, not 1 FLOP/s.
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{what} must be a number{_unit(unit)}, got {value!r} "
                    f"({type(value).__name__}); write it as a plain number such as 1e9")
    v = float(value)
    if math.isnan(v):
        raise error(f"{what} is NaN; give a real number{_unit(unit)}")
    if math.isinf(v):
        raise error(f"{what} is {v}; give a finite number{_unit(unit)}")
    if strict and v <= minimum:
        raise error(f"{what} = {value!r} must be greater than {minimum:g}{_unit(unit)}")
    if not strict and v < minimum:
        raise error(f"{what} = {value!r} must be at least {minimum:g}{_unit(unit)}")
    return v


def _unit(unit: str) -> str:
    return f" (in {unit})" if unit else ""


def check_name(value: Any, what: str, error: type[Exception] = ClusterError) -> str:
    """Return ``value`` if it is a non-empty string; raise otherwise."""
    if not isinstance(value, str) or not value.strip():
        raise error(f"{what} must be a non-empty string, got {value!r}")
    return value


def check_keys(obj: Any, what: str, required: Collection[str], optional: Collection[str] = (),
               error: type[Exception] = ClusterError) -> Mapping[str, Any]:
    """Check that ``obj`` is a mapping holding all ``required`` keys and nothing else
    beyond ``optional``; return it."""
    if not isinstance(obj, Mapping):
        raise error(f"{what} must be an object/table, got {type(obj).__name__} {obj!r:.80}")
    allowed = list(required) + list(optional)
    unknown = [k for k in obj if k not in allowed]
    if unknown:
        raise error(f"{what} has unknown key {unknown[0]!r}; allowed keys are "
                    f"{', '.join(repr(k) for k in allowed)} (check the spelling)")
    missing = [k for k in required if k not in obj]
    if missing:
        raise error(f"{what} is missing the key {missing[0]!r}; required keys are "
                    f"{', '.join(repr(k) for k in required)}")
    return obj
