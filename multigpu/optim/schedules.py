"""Learning-rate schedules: a multiplier of the base rate per optimizer step, as torch's ``LambdaLR``.

A schedule is a callable ``factor(step)`` (step counting from 0) returning the multiplier of
the base learning rate for that step. :func:`warmup_cosine` is the one transformers train
with: a linear ramp from 0 over ``warmup`` steps, then a half cosine down to ``floor`` times
the base rate at ``total`` steps. :func:`make_schedule` builds one from a name.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from multigpu.checks import check_count, check_number
from multigpu.errors import InputError

#: Names ``make_schedule`` knows.
SCHEDULES = ("constant", "cosine")

Schedule = Callable[[int], float]


def warmup_cosine(step: int, total: int, warmup: int = 0, floor: float = 0.0) -> float:
    """Return the multiplier at ``step``: ``(step + 1) / warmup`` during the warmup, then
    ``floor + (1 - floor) * (1 + cos(pi * progress)) / 2`` with progress running from 0 after the
    warmup to 1 at ``total`` (and ``floor`` after it)."""
    if step < warmup:
        return (step + 1) / warmup
    span = max(total - warmup, 1)
    progress = min((step - warmup) / span, 1.0)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_schedule(spec: str | Schedule | None, total: int, warmup: int = 0, floor: float = 0.0) -> Schedule:
    """Return the schedule ``spec`` names over ``total`` steps: None or ``"constant"`` (1, after the
    warmup's ramp), ``"cosine"`` (:func:`warmup_cosine`) or a callable ``factor(step)`` itself.

    Raises InputError for an unknown name, a negative warmup or a floor outside [0, 1].
    """
    check_count(warmup, "warmup_steps", minimum=0, example=100)
    check_number(floor, "lr_floor", minimum=0.0, maximum=1.0, example=0.1)
    if callable(spec):
        return spec
    if spec is None or spec == "constant":
        return lambda step: (step + 1) / warmup if step < warmup else 1.0
    if spec == "cosine":
        return lambda step: warmup_cosine(step, total, warmup, floor)
    raise InputError(
        f"lr_schedule={spec!r} is unknown; use one of {list(SCHEDULES)} or a function of the step "
        "returning the multiplier of lr (torch's LambdaLR)"
    )
