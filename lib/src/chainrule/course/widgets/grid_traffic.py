"""Lesson 15's widget: one training step of the capstone on a dp × tp grid of 4 ranks, traced.

Choose the grid's shape and the sequences per step; one step runs on the simulated world with a
:class:`~chainrule.dist.Trace`, and the widget shows what each rank sent in its row (tensor
parallelism: activations) and in its column (data parallelism: gradients), by the ring model,
next to the step's loss and its distance from one process. A collective over a group of one rank
(a row at ``tp = 1``, a column at ``dp = 1``) moves nothing: it is neither counted nor drawn.
"""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets  # type: ignore[import-untyped]
import numpy as np
from matplotlib.figure import Figure

from chainrule import dist
from chainrule.costs.comm_cost import event_bytes
from chainrule.course.widgets.live_widget import LiveWidget
from chainrule.course.widgets.tables import html_table
from chainrule.parallel import transformer as tf

LAYOUTS = {
    "1 × 4 (tensor parallel only)": (1, 4),
    "2 × 2": (2, 2),
    "4 × 1 (data parallel only)": (4, 1),
}
"""The grids of 4 ranks, as (dp, tp)."""


@dataclass(frozen=True)
class GridStep:
    """One traced step: per rank the collectives that met other ranks (a group of one rank moves
    nothing and is not counted) and the bytes sent in its row and column."""

    dp: int
    tp: int
    sequences: int
    tokens_per_row: int
    collectives: list[int]
    row_bytes: list[float]
    column_bytes: list[float]
    loss: float
    gap: float  # |loss on the grid − loss of one process|


def grid_step(
    config: tf.Config,
    weights: dict[str, np.ndarray],
    ids: np.ndarray,
    dp: int,
    tp: int,
    sequences: int,
) -> GridStep:
    """Run one step of the capstone on a ``dp × tp`` grid (simulated) and on one process."""
    if sequences % dp:
        raise ValueError(f"{sequences} sequences do not split into {dp} equal parts")
    if config.heads % tp:
        raise ValueError(f"{config.heads} heads do not split into {tp} tensor-parallel parts")
    windows = tf.batches(ids, 1, sequences, config.context, seed=1)
    training = tf.Training(config, weights, windows)
    trace = dist.Trace()
    losses = dist.run(tf.train_on_grid, dp * tp, args=(training, dp, tp), trace=trace)
    one = tf.train_one_process(training)
    rows = {tuple(d * tp + t for t in range(tp)) for d in range(dp)}
    collectives, row_bytes, column_bytes = [], [], []
    for rank in range(dp * tp):
        mine = [e for e in trace if rank in e.ranks and len(e.ranks) > 1]  # met another rank
        collectives.append(len(mine))
        row_bytes.append(sum(event_bytes(e) for e in mine if e.ranks in rows))
        column_bytes.append(sum(event_bytes(e) for e in mine if e.ranks not in rows))
    return GridStep(
        dp, tp, sequences, sequences // dp * config.context, collectives, row_bytes,
        column_bytes, losses[0][0], abs(losses[0][0] - one[0]),
    )  # fmt: skip


def grid_table(step: GridStep) -> str:
    """HTML: the step's loss against one process, then each rank's collectives and bytes."""
    alone = []  # the groups of one rank: their all-reduces move nothing
    if step.tp == 1:
        alone.append("a row is one rank: f and f̄ exchange nothing")
    if step.dp == 1:
        alone.append("a column is one rank: the gradients' and the loss's average exchange nothing")
    note = f" Here {'; '.join(alone)}, so they are not counted." if alone else ""
    head = (
        f"<p>{step.dp} × {step.tp} grid, {step.sequences} sequences per step "
        f"({step.tokens_per_row} tokens per row). Loss {step.loss:.6f}, "
        f"{step.gap:.1e} from one process.{note}</p>"
    )
    rows = [
        (
            r,
            step.collectives[r],
            f"{step.row_bytes[r] / 1024:.1f}",
            f"{step.column_bytes[r] / 1024:.1f}",
        )
        for r in range(step.dp * step.tp)
    ]
    header = ["rank", "collectives", "KiB sent in its row (activations)",
              "KiB sent in its column (gradients)"]  # fmt: skip
    return head + html_table(header, rows)


def plot_grid_step(step: GridStep) -> Figure:
    """Stacked bars: KiB each rank sends per step, in its row and in its column."""
    figure = Figure(figsize=(6.4, 2.6))
    ax = figure.add_subplot()
    ranks = [f"rank {r}" for r in range(step.dp * step.tp)]
    row = np.array(step.row_bytes) / 1024
    column = np.array(step.column_bytes) / 1024
    ax.barh(ranks, row, color="#e39b54", label="row: tensor parallel (activations)")
    ax.barh(ranks, column, left=row, color="#7a9cc6", label="column: data parallel (gradients)")
    ax.set_xlabel("KiB sent per rank in one step (ring model)", fontsize=10)
    ax.set_xlim(0, 1.1 * max(float((row + column).max()), 1.0))
    ax.legend(fontsize=9, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    ax.tick_params(labelsize=10)
    ax.invert_yaxis()
    figure.tight_layout()
    return figure


def build_grid_traffic_widget(
    config: tf.Config, weights: dict[str, np.ndarray], ids: np.ndarray
) -> LiveWidget:
    """A dropdown for the grid of 4 ranks and a slider for the sequences per step (4 to 32)."""

    def compute(layout: str, sequences: int) -> GridStep:
        dp, tp = LAYOUTS[layout]
        return grid_step(config, weights, ids, dp, tp, sequences)

    controls = {
        "layout": ipywidgets.Dropdown(
            options=list(LAYOUTS), value="2 × 2", description="grid dp × tp"
        ),
        "sequences": ipywidgets.IntSlider(
            value=8, min=4, max=32, step=4, description="sequences per step"
        ),
    }
    return LiveWidget(controls, compute, grid_table, plot_grid_step)
