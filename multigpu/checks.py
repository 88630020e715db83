"""Checks of the numbers and counts a user passes, with one message style for all.

Every public function of multigpu that takes a count, a size, a rate or a time
checks it here, so the same mistake reads the same wherever it is made:

    batch_size=0 must be a positive integer, e.g. 256
    lr=nan must be a finite number, e.g. 0.2
    device 'pi1': flops=-1.0 must be greater than 0 (in FLOP/s)

The exception class says the kind of mistake: ``InputError`` for an argument (the
default), ``ClusterError`` for a value in a cluster or graph file, and so on; the
caller passes it as ``error``. A bool is never a number here (``True`` is a typo,
not 1), and numpy scalars count as numbers.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from multigpu.errors import InputError


def _hint(example: Any) -> str:
    return "" if example is None else f", e.g. {example}"


def _unit(unit: str) -> str:
    return f" (in {unit})" if unit else ""


def is_count(value: Any) -> bool:
    """True for a Python or numpy integer that is not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """True for a finite Python or numpy real number that is not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


def check_count(
    value: Any,
    what: str,
    *,
    minimum: int = 1,
    maximum: int | None = None,
    example: Any = None,
    error: type[Exception] = InputError,
) -> int:
    """Return ``value`` as an int; raise ``error`` unless it is an integer in ``minimum..maximum``.

    ``what`` names the value in the message (``"batch_size"``, ``"--nproc"``).
    """
    if not is_count(value) or value < minimum or (maximum is not None and value > maximum):
        if maximum is not None:
            need = f"an integer from {minimum} to {maximum}"
        elif minimum == 1:
            need = "a positive integer"
        elif minimum == 0:
            need = "a non-negative integer"
        else:
            need = f"an integer of at least {minimum}"
        raise error(f"{what}={value!r} must be {need}{_hint(example)}")
    return int(value)


def check_number(
    value: Any,
    what: str,
    *,
    minimum: float | None = None,
    strict: bool = False,
    maximum: float | None = None,
    unit: str = "",
    example: Any = None,
    error: type[Exception] = InputError,
) -> float:
    """Return ``value`` as a finite float; raise ``error`` unless it lies in the range.

    The range is ``> minimum`` with ``strict``, else ``>= minimum`` (no lower bound
    when ``minimum`` is None), and ``<= maximum``. ``unit`` is named in the message.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(
            f"{what}={value!r} must be a number{_unit(unit)}, not {type(value).__name__}; "
            f"write it as a plain number{_hint(1e9 if example is None else example)}"
        )
    v = float(value)
    if not math.isfinite(v):
        raise error(f"{what}={value!r} must be a finite number{_unit(unit)}{_hint(example)}")
    if minimum is not None and (v <= minimum if strict else v < minimum):
        bound = "greater than" if strict else "at least"
        raise error(f"{what}={value!r} must be {bound} {minimum:g}{_unit(unit)}{_hint(example)}")
    if maximum is not None and v > maximum:
        raise error(f"{what}={value!r} must be at most {maximum:g}{_unit(unit)}{_hint(example)}")
    return v


def check_positive(
    value: Any, what: str, *, unit: str = "", example: Any = None, error: type[Exception] = InputError
) -> float:
    """Return ``value`` as a float; raise ``error`` unless it is a finite number above 0."""
    return check_number(value, what, minimum=0.0, strict=True, unit=unit, example=example, error=error)
