"""The duality table, one row at a time: each rank's values forward and gradients backward.

:func:`route` runs one row of :data:`chainrule.parallel.duality.DUALITY_TABLE` (its engine
implementation) on a simulated world of P ranks with small integer-valued arrays, seeds the
backward pass with integer-valued cotangents, and records which collectives ran in the forward
pass and which in the backward pass (from a :class:`chainrule.dist.Trace`, with a barrier as
the separator). Integers keep every sum exact, so the routing can be read off the numbers:

- per-rank input ``x_p[i] = 10(p+1) + i`` (tens digit: the rank it came from), replicated
  input ``x[i] = i + 1``;
- per-rank cotangent ``ȳ_p[i] = 100(p+1) + i``, replicated cotangent ``ȳ[i] = 100 + i``.

:func:`plot_routing` draws one row of boxes per rank (input, output, cotangent, gradient),
coloured by the rank a value came from (grey where values were added);
:func:`build_duality_widget` puts a row selector and a P slider on top.
"""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets  # type: ignore[import-untyped]
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from chainrule import dist
from chainrule.course.widgets.live_widget import LiveWidget, canvas
from chainrule.course.widgets.tables import html_table
from chainrule.engine.tensor import Tensor
from chainrule.parallel.duality import DUALITY_TABLE, REPLICATED, DualityRow, duality_row

RANK_COLOURS = (
    "#9ec5ec",
    "#f6c08f",
    "#9fd8a0",
    "#f0a3a3",
    "#c9b6e4",
    "#d6bfa8",
)  # light: black text stays readable
REPLICATED_COLOUR = "#bbbbbb"
MIXED_COLOUR = "#eeeeee"


@dataclass(frozen=True)
class Routing:
    """One row of the duality table run on P ranks (all lists are indexed by rank).

    ``inputs[p]``/``outputs[p]`` are the forward values on rank p, ``cotangents[p]`` the
    gradient fed into the output and ``gradients[p]`` the gradient that arrived at the input.
    ``forward_collectives`` and ``backward_collectives`` are the collectives the trace saw in
    each pass (empty when a pass needs no communication).
    """

    row: DualityRow
    world_size: int
    inputs: list[np.ndarray]
    outputs: list[np.ndarray]
    cotangents: list[np.ndarray]
    gradients: list[np.ndarray]
    forward_collectives: list[str]
    backward_collectives: list[str]


def example_input(row: DualityRow, rank: int, world_size: int, shard: int = 2) -> np.ndarray:
    """The integer-valued input of ``row`` on ``rank`` (see the module docstring)."""
    length = shard * world_size if row.splits_input else shard  # P slices of ``shard``
    if row.input_kind == REPLICATED:
        return np.arange(1.0, length + 1)
    return 10.0 * (rank + 1) + np.arange(length)


def example_cotangent(row: DualityRow, rank: int, shape: tuple[int, ...]) -> np.ndarray:
    """The integer-valued cotangent ``ȳ`` fed into the output of ``row`` on ``rank``."""
    size = int(np.prod(shape))
    if row.output_kind == REPLICATED:
        return (100.0 + np.arange(size)).reshape(shape)
    return (100.0 * (rank + 1) + np.arange(size)).reshape(shape)


def _route_on_rank(key: str, shard: int) -> tuple[np.ndarray, ...]:
    """SPMD: forward through the row, a barrier, then backward with the example cotangent."""
    row = duality_row(key)
    rank, world = dist.rank(), dist.world_size()
    x = Tensor(example_input(row, rank, world, shard), requires_grad=True)
    y = row.engine_fn(x)
    cotangent = example_cotangent(row, rank, y.shape)
    dist.barrier()  # the trace's separator between the forward and the backward pass
    y.backward(cotangent)
    assert x.grad is not None
    return x.data, y.data, cotangent, x.grad


def route(key: str, world_size: int, shard: int = 2) -> Routing:
    """Run the row ``key`` of the duality table on ``world_size`` simulated ranks."""
    row = duality_row(key)
    if not 1 <= world_size <= len(RANK_COLOURS):
        raise ValueError(f"choose between 1 and {len(RANK_COLOURS)} ranks, not {world_size}")
    trace = dist.Trace()
    results = dist.run(_route_on_rank, world_size, args=(key, shard), trace=trace)
    ops = trace.ops()
    split = ops.index("barrier")
    inputs, outputs, cotangents, gradients = (list(column) for column in zip(*results, strict=True))
    return Routing(
        row, world_size, inputs, outputs, cotangents, gradients, ops[:split], ops[split + 1 :]
    )


def collective_names(names: list[str]) -> str:
    """``["reduce_scatter"]`` as "reduce-scatter"; an empty list as "none (no communication)"."""
    return ", ".join(n.replace("_", "-") for n in names) or "none (no communication)"


# -- rendering --------------------------------------------------------------------------------


def _show(array: np.ndarray) -> str:
    return "[" + ", ".join(f"{v:g}" for v in np.ravel(array)) + "]"


def routing_table(routing: Routing) -> str:
    """HTML: the row's text, the collectives seen in each pass, and one line per rank."""
    row = routing.row
    head = (
        f"<p><b>Forward:</b> {row.forward} — collectives seen: "
        f"{collective_names(routing.forward_collectives)}<br>"
        f"<b>Backward:</b> {row.backward} — collectives seen: "
        f"{collective_names(routing.backward_collectives)}<br>"
        f"<i>{row.reasoning}</i></p>"
    )
    body = html_table(
        ["rank", "input x", "output y", "cotangent ȳ", "gradient x̄"],
        [
            [p, _show(x), _show(y), _show(c), _show(g)]
            for p, (x, y, c, g) in enumerate(
                zip(
                    routing.inputs,
                    routing.outputs,
                    routing.cotangents,
                    routing.gradients,
                    strict=True,
                )
            )
        ],
    )
    return head + body


def _colour(value: float, sources: dict[float, str]) -> str:
    return sources.get(float(value), MIXED_COLOUR)


def _sources(arrays: list[np.ndarray], kind: str) -> dict[float, str]:
    """Value → colour of the rank that holds it (or the replicated colour)."""
    if kind == REPLICATED:
        return {float(v): REPLICATED_COLOUR for v in np.ravel(arrays[0])}
    return {float(v): RANK_COLOURS[p] for p, a in enumerate(arrays) for v in np.ravel(a)}


# Sizes of the routing picture, in points (1/72 inch; the PNG has 100 pixels per inch).
BOX_W, BOX_H, ROW_GAP = 27.0, 16.0, 5.0
NUMBER_PT, LABEL_PT = 8.0, 9.0
LEFT, ARROW = 46.0, 46.0


def plot_routing(routing: Routing) -> Figure:
    """Two panels, one line of boxes per rank: forward ``x → y`` above, backward ``ȳ → x̄``
    below.

    A box's colour is the rank its value came from: inputs and cotangents are coloured by
    their own rank (grey when replicated), outputs and gradients by the input (cotangent)
    they equal, and light grey when they are a sum of several values. Every number is 8 pt
    (11 pixels) and the picture stays within the page at 4 ranks.
    """
    row, P = routing.row, routing.world_size
    panels = [
        (
            "forward",
            ("input x", routing.inputs, _sources(routing.inputs, row.input_kind)),
            ("output y", routing.outputs, _sources(routing.inputs, row.input_kind)),
        ),
        (
            "backward",
            ("cotangent ȳ", routing.cotangents, _sources(routing.cotangents, row.output_kind)),
            ("gradient x̄", routing.gradients, _sources(routing.cotangents, row.output_kind)),
        ),
    ]
    length = [max(np.size(a) for a in arrays) for _, (_, arrays, _), _ in panels]
    length_out = [max(np.size(a) for a in arrays) for _, _, (_, arrays, _) in panels]
    left_w = max(length) * BOX_W
    right_w = max(length_out) * BOX_W
    width = LEFT + left_w + ARROW + right_w + 8
    panel_h = 18 + P * (BOX_H + ROW_GAP)
    title_h = 22
    height = title_h + 2 * panel_h + 6
    figure, ax = canvas(width, height)
    ax.text(
        width / 2,
        height - title_h / 2,
        f"{row.forward}  →  backward: {collective_names(routing.backward_collectives)}",
        ha="center",
        va="center",
        fontsize=LABEL_PT + 1,
        fontweight="bold",
    )
    for k, (name, (in_title, ins, in_src), (out_title, outs, out_src)) in enumerate(panels):
        top = height - title_h - k * panel_h
        x_in, x_out = LEFT, LEFT + left_w + ARROW
        ax.text(x_in + 24, top - 9, in_title, fontsize=LABEL_PT, va="center")
        ax.text(x_out, top - 9, out_title, fontsize=LABEL_PT, va="center")
        for p in range(P):
            y = top - 18 - (p + 1) * (BOX_H + ROW_GAP) + ROW_GAP
            ax.text(
                LEFT - 6, y + BOX_H / 2, f"rank {p}", ha="right", va="center", fontsize=LABEL_PT
            )
            for x0, values, sources in ((x_in, ins[p], in_src), (x_out, outs[p], out_src)):
                for i, v in enumerate(np.ravel(values)):
                    ax.add_patch(_box(x0 + i * BOX_W, y, _colour(v, sources)))
                    ax.text(
                        x0 + (i + 0.5) * BOX_W,
                        y + BOX_H / 2,
                        f"{v:g}",
                        ha="center",
                        va="center",
                        fontsize=NUMBER_PT,
                    )
            ax.annotate(
                "",
                (x_out - 6, y + BOX_H / 2),
                (LEFT + left_w + 6, y + BOX_H / 2),
                arrowprops={"arrowstyle": "->", "color": "#555555"},
            )
        ax.text(
            4,
            top - 9,
            name.capitalize(),
            ha="left",
            va="center",
            fontsize=LABEL_PT,
            fontweight="bold",
        )
    return figure


def _box(x: float, y: float, colour: str) -> Rectangle:
    return Rectangle(
        (x + 1, y), BOX_W - 2, BOX_H, facecolor=colour, edgecolor="black", linewidth=0.5
    )


def build_duality_widget(key: str = "all_gather", world_size: int = 2) -> LiveWidget:
    """Controls ``key`` (a row of the syllabus's table, by its forward operation) and
    ``world_size`` (1 to 4 ranks).

    ``last_result`` is the :class:`Routing`; the table names the collectives seen in each
    pass and lists every rank's arrays, the plot draws them as coloured boxes.
    """
    controls = {
        "key": ipywidgets.Dropdown(
            options=[(r.forward, r.key) for r in DUALITY_TABLE if r.in_syllabus],
            value=key,
            description="forward",
        ),
        "world_size": ipywidgets.IntSlider(value=world_size, min=1, max=4, description="ranks P"),
    }
    return LiveWidget(controls, route, routing_table, plot_routing)
