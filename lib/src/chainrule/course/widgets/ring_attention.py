"""Which (query chunk, key chunk) pairs each rank computes at each step of ring attention (the
context parallelism lesson).

:func:`ring_result` counts, for P ranks, a plain or zig-zag split and the causal mask or none,
the work of every rank at every ring step (:func:`chainrule.parallel.context.ring_work`) and
the share of time the ranks idle when each step lasts as long as its busiest rank.
:func:`plot_ring` draws two panels: on the left the attention matrix cut into chunks, each pair
coloured by the rank that computes it and labelled with the step at which it does (masked
pairs left white); on the right ranks × steps, each cell filled in proportion to the rank's
work in that step, the rest of the step hatched: the time that rank waits.
:func:`build_ring_widget` chooses P, the split and the mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets  # type: ignore[import-untyped]
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from chainrule.course.widgets.live_widget import LiveWidget, canvas
from chainrule.course.widgets.tables import html_table
from chainrule.parallel import context as cp

RANK_COLOURS = (
    "#9ec5ec", "#f6b26b", "#93c47d", "#e06666", "#b4a7d6", "#ffd966", "#76a5af", "#d5a6bd",
)  # fmt: skip
IDLE = "#eeeeee"
MATRIX_WIDTH = 380.0  # points: the attention matrix, whatever the number of chunks
GRID_WIDTH = 400.0  # points: ranks × steps
FONT = 10.0


@dataclass(frozen=True)
class RingResult:
    """Ring attention's work for ``world_size`` ranks: ``work[r, t]`` in full (n/P)² blocks,
    ``owner[q, k]`` the rank computing the pair of chunks (−1: masked) and ``step[q, k]``
    the ring step at which it does."""

    world_size: int
    layout: cp.Layout
    causal: bool
    work: np.ndarray
    owner: np.ndarray
    step: np.ndarray
    idle: float


def ring_result(world_size: int, layout: cp.Layout, causal: bool) -> RingResult:
    """Who computes which pair of chunks when, and the work per rank and step."""
    count = cp.chunk_count(world_size, layout)
    owner = np.full((count, count), -1)
    step = np.full((count, count), -1)
    for r in range(world_size):
        for t in range(world_size):
            for q, k, _ in cp.ring_pairs(r, t, world_size, layout, causal):
                owner[q, k], step[q, k] = r, t
    work = cp.ring_work(world_size, layout, causal)
    return RingResult(world_size, layout, causal, work, owner, step, cp.idle_share(work))


def render_table(result: RingResult) -> str:
    per_rank = result.work.sum(axis=1)
    steps = result.work.max(axis=0).sum()
    rows: list[list[object]] = [
        ["work per rank (blocks of (n/P)²)", ", ".join(f"{w:g}" for w in per_rank)],
        ["busiest rank / average", f"{per_rank.max() / per_rank.mean():.3f}"],
        ["time (Σ over steps of the busiest rank)", f"{steps:g}"],
        ["idle share of rank-time", f"{result.idle:.3f}"],
    ]
    mask = "causal" if result.causal else "no mask"
    layout = {"zigzag": "zig-zag"}.get(result.layout, result.layout)
    return html_table(["", f"P = {result.world_size}, {layout} split, {mask}"], rows)


def plot_ring(result: RingResult) -> Figure:
    """The attention matrix by chunks (owner's colour, step number) and ranks × steps."""
    P, count = result.world_size, result.owner.shape[0]
    cell = MATRIX_WIDTH / count
    top, gap = 46.0, 70.0
    height = top + MATRIX_WIDTH + 40
    width = 40 + MATRIX_WIDTH + gap + 50 + GRID_WIDTH + 10
    figure, ax = canvas(width, height)
    x0, y0 = 40.0, height - top
    for q in range(count):
        for k in range(count):
            r = result.owner[q, k]
            ax.add_patch(
                Rectangle(
                    (x0 + k * cell, y0 - (q + 1) * cell), cell, cell,
                    facecolor="white" if r < 0 else RANK_COLOURS[r % len(RANK_COLOURS)],
                    edgecolor="#999999", lw=0.5,
                )
            )  # fmt: skip
            if r >= 0:
                ax.text(x0 + (k + 0.5) * cell, y0 - (q + 0.5) * cell, str(result.step[q, k]),
                        ha="center", va="center", fontsize=FONT)  # fmt: skip
    ax.text(x0, y0 + 26, "attention by chunks: colour = rank, number = ring step",
            fontsize=FONT, va="center")  # fmt: skip
    ax.text(x0 + MATRIX_WIDTH / 2, y0 + 9, "key chunk →", ha="center", va="center", fontsize=FONT)
    ax.text(x0 - 10, y0 - MATRIX_WIDTH / 2, "query chunk ↓", ha="center", va="center",
            rotation=90, fontsize=FONT)  # fmt: skip

    gx = x0 + MATRIX_WIDTH + gap + 50
    column = GRID_WIDTH / P
    row = min(40.0, MATRIX_WIDTH / P)
    scale = result.work.max() or 1.0
    for t in range(P):
        longest = result.work[:, t].max()
        ax.text(gx + (t + 0.5) * column, y0 + 9, f"step {t}", ha="center", va="center",
                fontsize=FONT)  # fmt: skip
        for r in range(P):
            y = y0 - (r + 1) * row
            if t == 0:
                ax.text(gx - 6, y + row / 2, f"rank {r}", ha="right", va="center", fontsize=FONT)
            busy = result.work[r, t] / scale * column
            ax.add_patch(Rectangle((gx + t * column, y + 2), busy, row - 4,
                                   facecolor=RANK_COLOURS[r % len(RANK_COLOURS)],
                                   edgecolor="#555555", lw=0.5))  # fmt: skip
            wait = (longest - result.work[r, t]) / scale * column
            if wait > 0:
                ax.add_patch(Rectangle((gx + t * column + busy, y + 2), wait, row - 4,
                                       facecolor=IDLE, edgecolor="#bbbbbb", hatch="///",
                                       lw=0.4))  # fmt: skip
            ax.text(gx + (t + 0.5) * column, y + row / 2, f"{result.work[r, t]:g}",
                    ha="center", va="center", fontsize=FONT)  # fmt: skip
    ax.text(gx - 50, y0 + 26, f"work per rank and step (hatched: waiting); idle share "
            f"{result.idle:.3f}", fontsize=FONT, va="center")  # fmt: skip
    return figure


def build_ring_widget(
    world_size: int = 4, layout: cp.Layout = "plain", causal: bool = True
) -> LiveWidget:
    """A slider for P, a choice of split and of mask (causal or none); the table and the two
    panels."""
    controls = {
        "world_size": ipywidgets.IntSlider(value=world_size, min=2, max=8, description="ranks P"),
        "layout": ipywidgets.Dropdown(
            options=[("plain", "plain"), ("zig-zag", "zigzag")], value=layout, description="split"
        ),
        "causal": ipywidgets.Dropdown(
            options=[("causal", True), ("none", False)], value=causal, description="mask"
        ),
    }
    return LiveWidget(controls, ring_result, render_table, plot_ring)
