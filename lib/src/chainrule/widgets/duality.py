"""The duality table, one row at a time: each rank's values forward and gradients backward.

:func:`route` runs one row of :data:`chainrule.duality.DUALITY_TABLE` (its engine
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

import ipywidgets
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from chainrule import dist
from chainrule.duality import DUALITY_TABLE, REPLICATED, DualityRow, duality_row
from chainrule.tensor import Tensor
from chainrule.widgets.live import LiveWidget, html_table

RANK_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")
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


def plot_routing(routing: Routing) -> Figure:
    """One line of boxes per rank: x → y forward, then ȳ → x̄ backward.

    A box's colour is the rank its value came from: inputs and cotangents are coloured by
    their own rank (grey when replicated), outputs and gradients by the input (cotangent)
    they equal, and light grey when they are a sum of several values.
    """
    row, P = routing.row, routing.world_size
    columns = [
        ("input x", routing.inputs, _sources(routing.inputs, row.input_kind)),
        ("output y", routing.outputs, _sources(routing.inputs, row.input_kind)),
        ("cotangent ȳ", routing.cotangents, _sources(routing.cotangents, row.output_kind)),
        ("gradient x̄", routing.gradients, _sources(routing.cotangents, row.output_kind)),
    ]
    widths = [max(np.size(a) for a in arrays) for _, arrays, _ in columns]
    gap = 1.5
    starts = np.concatenate([[0], np.cumsum(np.array(widths) + gap)[:-1]])
    figure = Figure(figsize=(0.55 * (sum(widths) + gap * 3) + 1.2, 0.7 * P + 1.3))
    ax = figure.subplots()
    for c, ((title, arrays, sources), x0) in enumerate(zip(columns, starts, strict=True)):
        ax.text(x0 + widths[c] / 2, P + 0.15, title, ha="center", va="bottom", fontsize=9)
        for p, array in enumerate(arrays):
            y0 = P - 1 - p
            for i, v in enumerate(np.ravel(array)):
                ax.add_patch(_box(x0 + i, y0, _colour(v, sources)))
                ax.text(x0 + i + 0.5, y0 + 0.4, f"{v:g}", ha="center", va="center", fontsize=7)
    for p in range(P):
        ax.text(-0.3, P - 1 - p + 0.4, f"rank {p}", ha="right", va="center", fontsize=9)
    arrow = {"arrowstyle": "->", "color": "black"}
    for a, b, label in ((0, 1, "forward"), (2, 3, "backward")):
        xa, xb = starts[a] + widths[a] + 0.15, starts[b] - 0.15
        ax.annotate("", (xb, P / 2 - 0.1), (xa, P / 2 - 0.1), arrowprops=arrow)
        ax.text((xa + xb) / 2, P / 2, label, ha="center", va="bottom", fontsize=7)
    ax.set_xlim(-1.8, starts[-1] + widths[-1] + 0.2)
    ax.set_ylim(-0.3, P + 0.7)
    ax.axis("off")
    ax.set_title(
        f"{row.forward}  →  backward: {collective_names(routing.backward_collectives)}",
        fontsize=10,
    )
    return figure


def _box(x: float, y: float, colour: str) -> Rectangle:
    return Rectangle((x + 0.04, y), 0.92, 0.8, facecolor=colour, edgecolor="black", linewidth=0.5)


def build_duality_widget(key: str = "all_gather", world_size: int = 2) -> LiveWidget:
    """Controls ``key`` (a row of the table, by its forward operation) and ``world_size``.

    ``last_result`` is the :class:`Routing`; the table names the collectives seen in each
    pass and lists every rank's arrays, the plot draws them as coloured boxes.
    """
    controls = {
        "key": ipywidgets.Dropdown(
            options=[(r.forward, r.key) for r in DUALITY_TABLE], value=key, description="forward"
        ),
        "world_size": ipywidgets.IntSlider(value=world_size, min=2, max=4, description="ranks P"),
    }
    return LiveWidget(controls, route, routing_table, plot_routing)
