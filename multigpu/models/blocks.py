"""Blocks: compose a model as in torch, Gluon or Paddle, then flatten it into named nodes.

* a list (or :class:`Chain`) applies its items one after the other (``nn.Sequential``);
* :class:`Parallel` feeds one input to several branches and joins their outputs by
  ``"add"`` or ``"concat"`` along channels (Gluon's ``HybridConcurrent``): Inception's
  towers, or DenseNet's ``concat(x, f(x))`` with an :class:`~multigpu.models.layers.Identity`
  branch;
* :class:`Residual` is ``main(x) + shortcut(x)``, the shortcut the identity unless given
  (a ResNet block's main path and its 1x1 projection).

Names nest as in torch: a named block prefixes its children (``layer1.0.conv1``); an
unnamed layer gets its kind and a count within its block (``conv2d1``, ``relu2``), so a
plain list of layers is named as ``Sequential`` names it. A join is named ``add`` or
``concat`` (with a count) inside its block, unless the block is given ``join_name``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from multigpu.errors import ModelError
from multigpu.models.layers import Add, Concat, Identity, Layer
from multigpu.models.node import INPUT, Node

JOINS = {"add": Add, "concat": Concat}


@dataclass(frozen=True)
class Chain:
    """Items applied one after the other; ``name`` prefixes their node names."""

    items: Sequence[Any]
    name: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "items", tuple(self.items))
        if not self.items:
            raise ModelError(f"Chain {self.name!r} is empty; give it at least one layer or block")


@dataclass(frozen=True)
class Parallel:
    """Branches that all take the same input, joined by ``"add"`` or ``"concat"`` (channels)."""

    branches: Sequence[Any]
    join: str = "concat"
    name: str | None = None
    join_name: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "branches", tuple(self.branches))
        if self.join not in JOINS:
            raise ModelError(f"Parallel {self.name!r}: join={self.join!r} is unknown; use 'add' or 'concat'")
        if len(self.branches) < 2:
            raise ModelError(
                f"Parallel {self.name!r} has {len(self.branches)} branch(es); a join needs at least 2 "
                "(use a Chain for one path)"
            )


class Residual(Parallel):
    """``main(x) + shortcut(x)``; the shortcut is the identity when None (ResNet's basic block
    without projection)."""

    def __init__(self, main: Any, shortcut: Any = None, name: str | None = None, join_name: str | None = None):
        Parallel.__init__(self, (main, Identity() if shortcut is None else shortcut), "add", name, join_name)


Block = Layer | Chain | Parallel | Sequence[Any]


class _Builder:
    def __init__(self, model: str):
        self.model = model
        self.nodes: list[Node] = []
        self.counts: dict[tuple[str, str], int] = {}

    def _auto(self, prefix: str, kind: str) -> str:
        n = self.counts[prefix, kind] = self.counts.get((prefix, kind), 0) + 1
        return f"{prefix}{kind}{n}"

    def add(self, item: Any, prefix: str, source: str) -> str:
        """Add ``item``'s nodes consuming ``source``; return the name of its output."""
        if isinstance(item, Identity):
            return source  # an identity adds no node
        if isinstance(item, Layer):
            name = prefix + item.name if item.name else self._auto(prefix, item.kind)
            self.nodes.append(Node(name, item, (source,)))
            return name
        if isinstance(item, (list, tuple)):
            item = Chain(item)
        if isinstance(item, Chain):
            inner = f"{prefix}{item.name}." if item.name else prefix
            for part in item.items:
                source = self.add(part, inner, source)
            return source
        if isinstance(item, Parallel):
            inner = f"{prefix}{item.name}." if item.name else prefix
            outs = [self.add(branch, inner, source) for branch in item.branches]
            if len(set(outs)) < len(outs):
                raise ModelError(
                    f"model {self.model!r}: block {inner or item.join!r} has two identity branches; "
                    "a join needs distinct inputs"
                )
            name = inner + item.join_name if item.join_name else self._auto(inner, item.join)
            self.nodes.append(Node(name, JOINS[item.join](name=name), tuple(outs)))
            return name
        raise ModelError(
            f"model {self.model!r}: {item!r} is neither a layer nor a block (Chain, Parallel, Residual "
            "or a list of them)"
        )


def flatten(body: Block, model: str = "model", source: str = INPUT) -> list[Node]:
    """The nodes of ``body`` in order, the first consuming ``source`` (the model's main input)."""
    builder = _Builder(model)
    builder.add(body, "", source)
    if not builder.nodes:
        raise ModelError(f"model {model!r} has no layers (an identity alone computes nothing)")
    return builder.nodes
