"""A plan's stages: connected sets of layers on one device, grouped once for every user (the
planner's ``Plan.stages``, the report and its plot, the executor's ``ExecutionPlan`` and
the benchmarks).

The rule, in layer (topological) order: a layer **starts a stage** when it consumes the
graph's input or any of its inputs comes from another device; otherwise (every input is
a layer on its own device) it joins the latest stage among its inputs' stages. On a
chain this cuts the maximal runs of one device. On a DAG it gives stages that form a
DAG themselves: every stage a stage consumes from has a smaller index (so running the
stages in index order, each once its inputs are there, never waits on a later one).
The cost model charges a device's ``stage_overhead`` once per stage this rule starts.

Each ``Stage`` lists its ``members`` (layer indices, in layer order), the ``inputs`` it
consumes from outside itself (``(layer, stage)`` pairs; layer -1 and stage -1: the
graph's input at the source) and the stages it must wait for (``after``). An executor
runs a stage on its device once every stage in ``after`` is done, sending each
activation as soon as its layer is done (the Ray executor runs a stage in parts for
that: ``execution.plan.StageRoute``); an activation crosses to a device once, however
many layers there consume it (see ``Breakdown.transfers``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Stage", "split_stages", "stage_starts", "stages_summary"]


@dataclass(frozen=True)
class Stage:
    """Layers ``members`` on ``device`` (``first``..``last`` by name; ``start``/``stop``
    the first member and one past the last: the layers ``start..stop-1`` when the stage
    is contiguous, as on a chain); ``index`` is its position in the plan (0-based).
    ``inputs`` are the ``(layer, stage)`` pairs it consumes from outside itself (-1, -1:
    the graph's input), ``after`` the stages it waits for."""

    index: int
    device: str
    start: int
    stop: int
    first: str
    last: str
    members: tuple[int, ...] = ()
    inputs: tuple[tuple[int, int], ...] = ()
    after: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.members:
            object.__setattr__(self, "members", tuple(range(self.start, self.stop)))

    @property
    def layers(self) -> int:
        """How many layers the stage runs."""
        return len(self.members)

    @property
    def contiguous(self) -> bool:
        """True when the stage runs the layers ``start..stop-1`` and no others."""
        return self.layers == self.stop - self.start

    @property
    def span(self) -> str:
        """``"conv2..fc4"``, or the one layer's name."""
        return self.first if self.first == self.last else f"{self.first}..{self.last}"

    def label(self) -> str:
        """``"stage 2 (conv2..fc4) on device 'gpu1'"``: how messages name a stage."""
        return f"stage {self.index + 1} ({self.span}) on device {self.device!r}"


def _chain(n: int) -> list[tuple[int, ...]]:
    return [(i - 1,) if i else (-1,) for i in range(n)]


def stage_starts(assignment: Sequence[object], producers: Sequence[Sequence[int]]) -> list[bool]:
    """Per layer: True when it starts a stage (it consumes the graph's input, or an input
    of it comes from another device)."""
    return [any(p < 0 or assignment[p] != assignment[c] for p in prods) for c, prods in enumerate(producers)]


def split_stages(
    assignment: Sequence[str],
    layer_names: Sequence[str] | None = None,
    producers: Sequence[Sequence[int]] | None = None,
) -> list[Stage]:
    """Group ``assignment`` (one device name per layer) into stages by the module's rule.
    ``layer_names`` name the layers (default: their 1-based positions); ``producers`` are
    each layer's inputs as in ``Graph.producers`` (default: a chain, which cuts the
    maximal runs of equal device names)."""
    n = len(assignment)
    names = [str(i + 1) for i in range(n)] if layer_names is None else list(layer_names)
    prods = _chain(n) if producers is None else [tuple(p) for p in producers]
    starts = stage_starts(assignment, prods)
    stage_of = [-1] * n
    members: list[list[int]] = []
    for c in range(n):
        if starts[c]:
            stage_of[c] = len(members)
            members.append([c])
        else:
            stage_of[c] = max(stage_of[p] for p in prods[c])
            members[stage_of[c]].append(c)
    out = []
    for s, mem in enumerate(members):
        ins = sorted({(p, stage_of[p] if p >= 0 else -1) for c in mem for p in prods[c] if p < 0 or stage_of[p] != s})
        after = tuple(sorted({t for _, t in ins if t >= 0}))
        out.append(
            Stage(
                s, assignment[mem[0]], mem[0], mem[-1] + 1, names[mem[0]], names[mem[-1]], tuple(mem), tuple(ins), after
            )
        )
    return out


def stages_summary(assignment: Sequence[str], sep: str = ", ") -> str:
    """``"pi1 x3, desk-gpu x5"``: each maximal run of one device and its layer count, in
    layer order."""
    return sep.join(f"{s.device} x{s.layers}" for s in split_stages(assignment))
