"""Expert routing against capacity (lesson 14): loads, drops, padding and the bytes moved.

:func:`routing_view` routes every rank's tokens through a router of a given skew (the bias of
:func:`chainrule.parallel.expert.init_expert_weights`: 0 gives roughly even loads, larger values
send more tokens to the first experts) and reports, with
:func:`chainrule.parallel.expert.dispatch_report`, what each expert receives against its P·C slots.
:func:`plot_routing` draws one bar per expert: the tokens it computes, the padding that fills its
slots up, and the tokens dropped above them; :func:`routing_table` lists per rank the drops, the
padding and the bytes each all-to-all sends. :func:`build_expert_routing_widget` puts both under
sliders for the capacity factor, the number of ranks, the experts per rank, the skew and the tokens
per rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets  # type: ignore[import-untyped]
import numpy as np
from matplotlib.figure import Figure

from chainrule.course.widgets.live_widget import LiveWidget
from chainrule.course.widgets.tables import html_table
from chainrule.parallel import expert as ex

WIDTH = 8
"""d, the width of the tokens the widget routes (float64: 8 bytes a number)."""

KEPT, PADDING, DROPPED = "#4c78a8", "#d9d9d9", "#e45756"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun in the number it takes: "1 expert", "2 experts", "0 slots"."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


@dataclass(frozen=True)
class RoutingView:
    """The report of one setting of the controls, and the setting."""

    report: ex.DispatchReport
    capacity_factor: float
    skew: float


def routing_view(
    capacity_factor: float,
    world_size: int,
    experts_per_rank: int,
    skew: float,
    tokens_per_rank: int,
    seed: int = 0,
) -> RoutingView:
    """Route ``tokens_per_rank`` random tokens on each of ``world_size`` ranks to
    ``world_size · experts_per_rank`` experts, with capacity factor and router skew."""
    E = world_size * experts_per_rank
    weights = ex.init_expert_weights(WIDTH, WIDTH, E, skew=skew, seed=seed)
    x = np.random.default_rng(seed).standard_normal((world_size, tokens_per_rank, WIDTH))
    report = ex.dispatch_report(ex.routings_of(weights, x, capacity_factor), WIDTH)
    return RoutingView(report, float(capacity_factor), float(skew))


def plot_routing(view: RoutingView) -> Figure:
    """One bar per expert, grouped by the rank that holds it: kept tokens, padding up to the
    P·C slots the expert receives, and the dropped tokens above (all ranks together)."""
    r = view.report
    E, slots = r.num_experts, r.slots_per_expert
    kept, dropped = r.expert_kept, r.expert_load - r.expert_kept
    figure = Figure(figsize=(7.6, 3.2))
    ax = figure.add_subplot()
    where = np.arange(E) + np.arange(E) // (E // r.world_size) * 0.6  # a gap between ranks
    ax.bar(where, kept, color=KEPT, label="kept")
    ax.bar(where, slots - kept, bottom=kept, color=PADDING, label="padding")
    ax.bar(where, dropped, bottom=slots, color=DROPPED, hatch="//", label="dropped")
    ax.axhline(slots, color="black", lw=1, ls="--")
    top = max(float(slots + dropped.max()), 1.0)
    ax.text(
        1.01,
        slots,
        f"P·C = {slots}",
        transform=ax.get_yaxis_transform(),
        ha="left",
        va="center",
        fontsize=9,
    )
    ax.set_xticks(where, [f"e{e}" for e in range(E)], fontsize=9)
    share = E // r.world_size
    for p in range(r.world_size):
        middle = where[p * share : (p + 1) * share].mean()
        ax.text(
            middle,
            -0.16,
            f"rank {p}",
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="top",
            fontsize=9,
        )
    ax.set_ylim(0, 1.25 * top)
    ax.set_ylabel("tokens (all ranks)", fontsize=9)
    ax.tick_params(labelsize=9)
    ax.set_title(
        f"{count(r.world_size, 'rank')} × {count(share, 'expert')}, "
        f"capacity C = {r.capacity} per rank and expert",
        fontsize=9,
    )
    ax.legend(fontsize=9, frameon=False, ncols=3, loc="upper right")
    figure.tight_layout()
    return figure


def routing_table(view: RoutingView) -> str:
    """HTML: the capacity, then per rank its drops, padding and bytes per all-to-all."""
    r = view.report
    share = r.num_experts // r.world_size
    rows = []
    for p in range(r.world_size):
        own = slice(p * share, (p + 1) * share)
        away = int(r.kept[p].sum() - r.kept[p][own].sum())
        rows.append(
            (
                p,
                r.tokens_per_rank,
                away,
                int(r.dropped[p]),
                int(r.padding[p]),
                f"{r.bytes_per_all_to_all:,.0f}",
                f"{r.padding_bytes[p]:,.0f}",
            )
        )
    head = (
        f"<p>E = {count(r.num_experts, 'expert')}, T = {count(r.tokens_per_rank, 'token')} per "
        f"rank, capacity C = ⌈{view.capacity_factor:g} · T / E⌉ = {count(r.capacity, 'slot')} "
        f"per expert on each rank; each buffer holds E · C = "
        f"{count(r.num_experts * r.capacity, 'slot')} of d = {r.d} float64. "
        f"One step (dispatch and combine, forward and backward) is 4 all-to-alls: "
        f"{4 * r.bytes_per_all_to_all:,.0f} bytes sent per rank.</p>"
    )
    return head + html_table(
        [
            "rank",
            "tokens",
            "kept, sent to other ranks",
            "dropped",
            "padding slots",
            "bytes sent per all-to-all",
            "of which padding",
        ],
        rows,
    )


def build_expert_routing_widget() -> LiveWidget:
    """Sliders for the capacity factor, ranks, experts per rank, router skew; tokens per rank."""
    controls = {
        "capacity_factor": ipywidgets.FloatSlider(
            value=1.0, min=0.25, max=3.0, step=0.25, description="capacity factor c"
        ),
        "world_size": ipywidgets.IntSlider(value=2, min=1, max=4, description="ranks P"),
        "experts_per_rank": ipywidgets.IntSlider(
            value=2, min=1, max=4, description="experts per rank"
        ),
        "skew": ipywidgets.FloatSlider(
            value=1.0, min=0.0, max=3.0, step=0.25, description="router skew"
        ),
        "tokens_per_rank": ipywidgets.Dropdown(
            options=[8, 16, 32, 64], value=16, description="tokens per rank T"
        ),
    }
    return LiveWidget(controls, routing_view, routing_table, plot_routing)
