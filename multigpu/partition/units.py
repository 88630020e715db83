"""Figures with readable units, for reports and messages: seconds, bytes, joules."""

from __future__ import annotations

import math

__all__ = ["fmt_bytes", "fmt_energy", "fmt_time"]


def _scaled(x: float, unit: str) -> str:
    """``x`` with the unit, milli- or micro-unit that keeps the figure readable."""
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    for prefix, scale in (("", 1.0), ("m", 1e-3)):
        if x >= scale:
            return f"{x / scale:.4g} {prefix}{unit}"
    return f"{x * 1e6:.4g} u{unit}"


def fmt_time(s: float) -> str:
    """Seconds with a readable unit (s, ms, us)."""
    return _scaled(s, "s")


def fmt_bytes(b: float) -> str:
    """Bytes with a decimal unit (B, KB, MB, GB)."""
    if b == 0:
        return "0"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= size:
            return f"{b / size:.4g} {unit}"
    return f"{b:.4g} B"


def fmt_energy(j: float) -> str:
    """Joules with a readable unit (J, mJ, uJ)."""
    return _scaled(j, "J")
