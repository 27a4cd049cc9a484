"""Pictures of a parallel block: its stages with their placements, and the collectives between.

A block is drawn as one line of boxes per path through it (the MLP, the attention), left to
right in the order of the forward pass. Each box names a tensor and its placement, coloured by
the placement; an arrow between two boxes carries the collective of that step in the forward
pass above it and in the backward pass below it (``f``: identity forward, all-reduce
backward; ``f̄``: all-reduce forward, identity backward). Used by lessons 10 and 11, with the
placements read from the placed tensors of a run (:func:`stage`).

:func:`plot_memory` draws the activation memory per rank that lesson 11 measures, as bars.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

from chainrule.course.widgets.live_widget import canvas
from chainrule.parallel.placement import Partial, Replicate, Shard
from chainrule.parallel.sharded import ShardedTensor

PLACEMENT_COLOURS = {
    "Replicate": "#d9d9d9",
    "Replicate, fanned out": "#f6d28f",
    "Shard": "#9ec5ec",
    "Partial": "#ddd0ee",
}


@dataclass(frozen=True)
class Stage:
    """One box: a tensor's name and placement, and the step that leads to the next box."""

    name: str
    placement: str
    forward: str = ""  # the collective after this stage, forward ("" for none)
    backward: str = ""  # and in the backward pass

    @property
    def colour(self) -> str:
        for key in ("Replicate, fanned out", "Replicate", "Shard", "Partial"):
            if self.placement.startswith(key):
                return PLACEMENT_COLOURS[key]
        return "#ffffff"


def stage(name: str, x: ShardedTensor, forward: str = "", backward: str = "") -> Stage:
    """The box of a placed tensor of a run: its placement as the tensor itself says."""
    placement = x.placement
    if isinstance(placement, Replicate):
        text = "Replicate, fanned out" if x.fanned_out else "Replicate"
    elif isinstance(placement, Shard):
        text = f"Shard({placement.axis})"
    else:
        assert isinstance(placement, Partial)
        text = "Partial"
    return Stage(name, text, forward, backward)


# Sizes in points (1/72 inch; the PNG has 100 pixels per inch).
BOX_W, BOX_H, ARROW_W, ROW_H, TEXT_PT = 86.0, 34.0, 74.0, 70.0, 9.0


def plot_block(paths: Mapping[str, Sequence[Stage]], title: str = "") -> Figure:
    """One line of boxes per path (name → stages); collectives over and under the arrows."""
    longest = max(len(stages) for stages in paths.values())
    labels = [
        label for stages in paths.values() for st in stages for label in (st.forward, st.backward)
    ]
    # Each arrow is wide enough for the longest collective's name (about 0.6 em per letter).
    arrow_w = max(ARROW_W, 0.6 * TEXT_PT * max(map(len, labels), default=0) + 12)
    left = 76.0
    width = left + longest * BOX_W + (longest - 1) * arrow_w + 10
    height = len(paths) * ROW_H + (26 if title else 6) + 22
    figure, ax = canvas(width, height)
    if title:
        ax.text(width / 2, height - 12, title, ha="center", va="center",
                fontsize=TEXT_PT + 2, fontweight="bold")  # fmt: skip
    for row, (path, stages) in enumerate(paths.items()):
        y = height - (26 if title else 6) - (row + 0.5) * ROW_H
        ax.text(4, y, path, ha="left", va="center", fontsize=TEXT_PT, fontweight="bold")
        for i, st in enumerate(stages):
            x = left + i * (BOX_W + arrow_w)
            ax.add_patch(
                FancyBboxPatch(
                    (x, y - BOX_H / 2), BOX_W, BOX_H, boxstyle="round,pad=0,rounding_size=4",
                    facecolor=st.colour, edgecolor="black", linewidth=0.7,
                )
            )  # fmt: skip
            ax.text(x + BOX_W / 2, y + 7, st.name, ha="center", va="center", fontsize=TEXT_PT)
            ax.text(x + BOX_W / 2, y - 8, st.placement.replace(", fanned out", " (f)"),
                    ha="center", va="center", fontsize=TEXT_PT - 0.5, style="italic")  # fmt: skip
            if i + 1 < len(stages):
                x1, x2 = x + BOX_W + 3, x + BOX_W + arrow_w - 3
                ax.annotate("", (x2, y), (x1, y),
                            arrowprops={"arrowstyle": "->", "color": "#333333"})  # fmt: skip
                if st.forward:
                    ax.text((x1 + x2) / 2, y + 9, st.forward, ha="center", va="center",
                            fontsize=TEXT_PT, color="#1f4e96")  # fmt: skip
                if st.backward:
                    ax.text((x1 + x2) / 2, y - 10, st.backward, ha="center", va="center",
                            fontsize=TEXT_PT, color="#a33b20")  # fmt: skip
    ax.text(4, 9, "above an arrow: forward collective     below: backward collective",
            ha="left", va="center", fontsize=TEXT_PT)  # fmt: skip
    return figure


def plot_memory(
    measured: Mapping[str, Mapping[int, float]], unit: str = "MiB", title: str = ""
) -> Figure:
    """Bars: activation memory per rank (``measured[label][P]``) for each P, one bar per label."""
    labels = list(measured)
    worlds = sorted({P for values in measured.values() for P in values})
    figure = Figure(figsize=(6.4, 3.2))
    ax = figure.add_subplot()
    width = 0.8 / len(labels)
    colours = ["#7a9cc6", "#e39b54", "#76b37a", "#c96b6b"]
    for k, label in enumerate(labels):
        xs = [i + (k - (len(labels) - 1) / 2) * width for i in range(len(worlds))]
        values = [measured[label].get(P, 0.0) for P in worlds]
        bars = ax.bar(xs, values, width, label=label, color=colours[k % len(colours)])
        ax.bar_label(bars, fmt="%.2g", fontsize=9)
    ax.set_xticks(range(len(worlds)), [f"P = {P}" for P in worlds], fontsize=10)
    ax.set_ylabel(f"{unit} per rank", fontsize=10)
    ax.tick_params(axis="y", labelsize=9)
    if title:
        ax.set_title(title, fontsize=10)
    top = max(v for values in measured.values() for v in values.values())
    ax.set_ylim(0, 1.35 * top)
    ax.legend(fontsize=9, frameon=False, loc="upper center", ncol=len(labels))
    figure.tight_layout()
    return figure
