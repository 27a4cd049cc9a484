"""A pipeline schedule drawn as stages × time slots (the pipeline lesson).

:func:`schedule_result` places a schedule of :mod:`chainrule.parallel.pipeline` in time
(:func:`~chainrule.parallel.pipeline.timeline`) and measures its bubble and each stage's peak
activations; :func:`plot_schedule` draws one row per stage, one column per slot: a forward as
a blue box, a backward as an orange one, each labelled with its micro-batch, and the idle slots,
the bubble, hatched grey. :func:`build_pipeline_widget` chooses P, m and the schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets  # type: ignore[import-untyped]
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from chainrule.course.widgets.live_widget import LiveWidget, canvas
from chainrule.course.widgets.tables import html_table
from chainrule.parallel import pipeline as pp

#: How each schedule is named on the page.
SHOWN = {"1f1b": "1F1B", "gpipe": "GPipe"}
COLOURS = {"F": "#9ec5ec", "B": "#f6b26b", "idle": "#eeeeee"}
MAX_WIDTH = 900.0  # points: the figure's width whatever the number of slots
MIN_FONT = 9.0  # points: the smallest label


@dataclass(frozen=True)
class ScheduleResult:
    """A schedule of ``stages`` × ``micro_batches`` placed in time, and what it measures."""

    name: str
    stages: int
    micro_batches: int
    timeline: pp.Timeline
    bubble: float
    formula: float
    peak_activations: list[int]


def schedule_result(stages: int, micro_batches: int, schedule: str) -> ScheduleResult:
    """The schedule ``schedule`` for P stages and m micro-batches, placed in time."""
    line = pp.timeline(pp.SCHEDULES[schedule](stages, micro_batches))
    return ScheduleResult(
        schedule,
        stages,
        micro_batches,
        line,
        line.bubble,
        pp.bubble_formula(stages, micro_batches),
        line.peak_activations(),
    )


def render_table(result: ScheduleResult) -> str:
    rows: list[list[object]] = [
        ["slots (makespan)", result.timeline.makespan],
        ["bubble measured", f"{result.bubble:.4f}"],
        ["(P − 1)/(m + P − 1)", f"{result.formula:.4f}"],
        ["peak activations per stage", ", ".join(map(str, result.peak_activations))],
    ]
    title = (
        f"{SHOWN.get(result.name, result.name)}: P = {result.stages}, m = {result.micro_batches}"
    )
    return html_table(["", title], rows)


def plot_schedule(result: ScheduleResult) -> Figure:
    """Stages down, slots across; forwards blue, backwards orange, the bubble hatched."""
    line = result.timeline
    slots, P = line.makespan, line.stages
    label_width, row_height = 60.0, 26.0
    cell = max(12.0, min(40.0, (MAX_WIDTH - label_width) / slots))
    font = max(MIN_FONT, min(12.0, cell * 0.55))
    width, height = label_width + slots * cell + 10, (P + 1.4) * row_height
    figure, ax = canvas(width, height)
    for s, row in enumerate(line.slots):
        y = height - (s + 2.4) * row_height
        ax.text(
            label_width - 6,
            y + row_height / 2,
            f"stage {s}",
            ha="right",
            va="center",
            fontsize=font,
        )
        busy = set()
        for action, start in row:
            for t in range(start, start + line.lengths[action.kind]):
                busy.add(t)
            x = label_width + start * cell
            ax.add_patch(
                Rectangle(
                    (x, y + 2),
                    cell * line.lengths[action.kind],
                    row_height - 4,
                    facecolor=COLOURS[action.kind],
                    edgecolor="#555555",
                    lw=0.6,
                )
            )
            # "F12" where it fits, the micro-batch alone (the colour says F or B) where not
            wide = cell >= 2 * font or result.micro_batches < 10
            ax.text(
                x + cell / 2,
                y + row_height / 2,
                f"{action.kind}{action.micro}" if wide else str(action.micro),
                ha="center",
                va="center",
                fontsize=max(MIN_FONT, font * (0.8 if cell < 2 * font else 1)),
            )
        for t in range(slots):
            if t not in busy:
                ax.add_patch(Rectangle((label_width + t * cell, y + 2), cell, row_height - 4,
                                       facecolor=COLOURS["idle"], edgecolor="#bbbbbb",
                                       hatch="///", lw=0.4))  # fmt: skip
    ax.text(label_width, height - 0.6 * row_height,
            f"{SHOWN.get(result.name, result.name)}: bubble {result.bubble:.3f} "
            f"= (P−1)/(m+P−1) = {result.formula:.3f}   "
            "blue: forward, orange: backward (labelled by micro-batch), grey: idle",
            va="center", fontsize=max(MIN_FONT, 10.0))  # fmt: skip
    return figure


def build_pipeline_widget(
    stages: int = 4, micro_batches: int = 8, schedule: str = "1f1b"
) -> LiveWidget:
    """Sliders for P and m, a choice of schedule; the table and the picture of the schedule."""
    controls = {
        "stages": ipywidgets.IntSlider(value=stages, min=2, max=8, description="stages P"),
        "micro_batches": ipywidgets.IntSlider(
            value=micro_batches, min=1, max=16, description="micro-batches m"
        ),
        "schedule": ipywidgets.Dropdown(
            options=[(shown, name) for name, shown in SHOWN.items()],
            value=schedule,
            description="schedule",
        ),
    }
    return LiveWidget(controls, schedule_result, render_table, plot_schedule)
