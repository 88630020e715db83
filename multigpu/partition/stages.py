"""A plan's stages: consecutive layers on one device, grouped once for every user (the
planner's ``Plan.stages``, the report, the executor's ``ExecutionPlan`` and the benchmarks).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

__all__ = ["Stage", "split_stages", "stages_summary"]


@dataclass(frozen=True)
class Stage:
    """Layers ``start..stop-1`` (named ``first``..``last``) on ``device``; ``index`` is the
    stage's position in the plan (0-based)."""

    index: int
    device: str
    start: int
    stop: int
    first: str
    last: str

    @property
    def layers(self) -> int:
        """How many layers the stage runs."""
        return self.stop - self.start

    @property
    def span(self) -> str:
        """``"conv2..fc4"``, or the one layer's name."""
        return self.first if self.first == self.last else f"{self.first}..{self.last}"

    def label(self) -> str:
        """``"stage 2 (conv2..fc4) on device 'gpu1'"``: how messages name a stage."""
        return f"stage {self.index + 1} ({self.span}) on device {self.device!r}"


def split_stages(assignment: Sequence[str], layer_names: Optional[Sequence[str]] = None) -> list[Stage]:
    """Cut ``assignment`` (one device name per layer) into stages: maximal runs of equal
    device names, in layer order. ``layer_names`` name the layers (default: their
    1-based positions)."""
    names = [str(i + 1) for i in range(len(assignment))] if layer_names is None else list(layer_names)
    stages: list[Stage] = []
    start = 0
    for i in range(1, len(assignment) + 1):
        if i == len(assignment) or assignment[i] != assignment[start]:
            stages.append(Stage(len(stages), assignment[start], start, i, names[start], names[i - 1]))
            start = i
    return stages


def stages_summary(assignment: Sequence[str], sep: str = ", ") -> str:
    """``"pi1 x3, desk-gpu x5"``: each stage's device and layer count, in order."""
    return sep.join(f"{s.device} x{s.layers}" for s in split_stages(assignment))
