"""A picture of a plan: the layer graph drawn left to right, each layer a dot coloured by its
device, cut edges (an activation that crosses to another device) drawn red and dashed,
the input and the sink as squares on their devices' colours. Long graphs wrap into rows.

matplotlib is the optional ``plot`` extra, imported only here and only when drawing.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from multigpu.partition.inputs.cluster import Cluster
from multigpu.partition.inputs.graph import Graph
from multigpu.partition.solvers.planner import Plan
from multigpu.partition.units import fmt_time
from multigpu.training.plotting import require_matplotlib

__all__ = ["layout", "plot_plan"]

ROW = 60  # layer columns (depths) per row before the drawing wraps


def layout(graph: Graph, row: int = ROW) -> np.ndarray:
    """(n + 2, 2) positions: the input (row 0), each layer, the sink (last). A layer's
    column is its depth (the longest path from the input); layers of one depth stack
    vertically; a graph deeper than ``row`` wraps into rows of equal length below."""
    n = graph.n
    depth = np.zeros(n, dtype=int)
    for i, prods in enumerate(graph.producers):
        depth[i] = 1 + max((depth[p] if p >= 0 else 0) for p in prods)
    depth_all = np.concatenate([[0], depth, [depth.max() + 1]])
    lane = np.zeros(n + 2)
    width = 1 + max(np.bincount(depth_all).max(), 1)
    for d in np.unique(depth_all):
        members = np.flatnonzero(depth_all == d)
        lane[members] = np.arange(len(members)) - (len(members) - 1) / 2
    columns = depth_all.max() + 1
    row = -(-columns // -(-columns // row))  # as many columns in each row as it takes
    col, band = depth_all % row, depth_all // row
    return np.column_stack([col.astype(float), -band * (width + 1.5) - lane])


def plot_plan(plan: Plan, graph: Graph, cluster: Cluster, path: str | os.PathLike[str]) -> None:
    """Write a PNG of ``plan`` (see the module docstring); MissingDependencyError without matplotlib."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only: no display is needed or wanted
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyArrowPatch

    n = graph.n
    pos = layout(graph)
    colors = plt.get_cmap("tab10" if cluster.k <= 10 else "tab20")
    dev = np.array([cluster.index(d) for d in plan.assignment])
    node_dev = np.concatenate([[cluster.source_index], dev, [cluster.sink_index]])
    cols, bands = int(pos[:, 0].max()) + 1, int(round(-pos[:, 1].min())) + 2
    fig, ax = plt.subplots(figsize=(min(2.0 + 0.45 * cols, 24), min(1.5 + 0.32 * bands, 30)))

    edges = [(p + 1, c + 1) for c, prods in enumerate(graph.producers) for p in prods] + [(n, n + 1)]
    for a, b in edges:
        cut = node_dev[a] != node_dev[b]
        style: dict[str, Any] = dict(
            color="crimson" if cut else "0.55", lw=1.8 if cut else 0.8, ls="--" if cut else "-", zorder=2 if cut else 1
        )
        (xa, ya), (xb, yb) = pos[a], pos[b]
        if ya != yb and xb < xa:
            # The edge wraps to the next row: along the row's end, down, and in from the left.
            right, left = cols - 0.4, -0.6
            ax.plot([xa, right, right, left, left, xb], [ya, ya, (ya + yb) / 2, (ya + yb) / 2, yb, yb], **style)
        elif xb - xa > 1.5 and ya == yb:
            # A skip over several layers of one row (a shortcut): an arc above the row, not along it.
            ax.add_patch(
                FancyArrowPatch(
                    (xa, ya),
                    (xb, yb),
                    arrowstyle="-",
                    connectionstyle="arc3,rad=-0.25",
                    color=style["color"],
                    lw=style["lw"],
                    ls=style["ls"],
                    zorder=style["zorder"],
                )
            )
        else:
            ax.plot([xa, xb], [ya, yb], **style)
    ax.scatter(
        pos[1:-1, 0],
        pos[1:-1, 1],
        s=46,
        c=[colors(d % colors.N) for d in dev],
        edgecolors="k",
        linewidths=0.4,
        zorder=3,
    )
    for i, label in ((0, "input"), (n + 1, "sink")):
        ax.scatter(
            pos[i][0], pos[i][1], s=70, marker="s", color=colors(node_dev[i] % colors.N), edgecolors="k", zorder=3
        )
        ax.annotate(label, pos[i], textcoords="offset points", xytext=(0, 7), ha="center", fontsize=7)
    if n <= 40:
        for i, name in enumerate(graph.names):
            ax.annotate(name, pos[i + 1], textcoords="offset points", xytext=(0, -11), ha="center", fontsize=6)
    else:  # label where each stage starts
        for s in plan.stages:
            ax.annotate(
                graph.names[s.start],
                pos[s.start + 1],
                textcoords="offset points",
                xytext=(0, -11),
                ha="center",
                fontsize=5.5,
            )
    used = sorted(set(dev.tolist()) | {cluster.source_index, cluster.sink_index})
    handles = [
        Line2D([], [], marker="o", ls="", color=colors(d % colors.N), markeredgecolor="k", label=cluster.names[d])
        for d in used
    ]
    handles.append(Line2D([], [], color="crimson", ls="--", lw=1.8, label="cut edge (crosses devices)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_title(
        f"{graph.name} on {cluster.name}: {plan.objective} plan ({plan.solver}), {len(plan.stages)} stages, "
        f"{len(plan.breakdown.transfers)} transfers; time {fmt_time(plan.time)}, makespan "
        f"{fmt_time(plan.makespan)}, bottleneck {fmt_time(plan.bottleneck)}",
        fontsize=9,
    )
    ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
