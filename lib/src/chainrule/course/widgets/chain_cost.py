"""Lesson 1's widget: the two association orders of a chain of Jacobians, counted.

A chain of ``n`` layers with input size ``d_0``, hidden width ``w`` and output size ``m`` has
widths ``d = (d_0, w, …, w, m)`` and Jacobians ``J_k`` of shape ``(d_k, d_{k-1})``. The whole
Jacobian ``J = J_n ⋯ J_1`` can be accumulated in two orders (see :mod:`chainrule.costs.chain_cost`):

- reverse mode (right to left in ``x̄_0 = J_1ᵀ ⋯ J_nᵀ x̄_n``), ``m`` VJP sweeps:
  ``Σ_k m·d_k·d_{k-1}`` multiply-adds, i.e. ``Σ_k d_k·d_{k-1}`` for a scalar loss;
- forward accumulation (from the input side), ``d_0`` JVP sweeps: ``Σ_k d_0·d_{k-1}·d_k``.

Both are linear in the number of sweeps, so they cross where ``m = d_0``: reverse mode wins
whenever the output is smaller than the input, which for a scalar loss is always.
:func:`chain_cost_report` computes both counts over a range of output sizes and
:func:`build_chain_cost_widget` puts sliders on top. The counts are exact; timings, which depend
on the machine and on what else it runs, are taken once in the lesson with
:func:`chainrule.costs.chain_cost.time_chain` (the median of repeats), not on every slider move.
"""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets  # type: ignore[import-untyped]
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, FuncFormatter, LogLocator

from chainrule.costs.chain_cost import crossover, forward_flops, reverse_flops
from chainrule.course.widgets.live_widget import LiveWidget
from chainrule.course.widgets.tables import html_table, markdown_table


def chain_widths(
    n_layers: int, width: int, output_size: int, input_size: int | None = None
) -> tuple[int, ...]:
    """``(d_0, w, …, w, m)``: ``n_layers`` Jacobians, hidden width ``w``, output size ``m``.

    ``input_size`` defaults to ``width`` (every layer as wide as the input).
    """
    if n_layers < 1:
        raise ValueError(f"a chain needs at least one layer, got n_layers={n_layers}")
    if min(width, output_size, width if input_size is None else input_size) < 1:
        raise ValueError("widths must be positive")
    d_0 = width if input_size is None else input_size
    return (d_0, *([width] * (n_layers - 1)), output_size)


@dataclass(frozen=True)
class ChainCostReport:
    """The counted cost of both orders for one chain, and their curves over the output size.

    ``output_sizes`` with ``reverse_curve``/``forward_curve`` are multiply-add counts as the
    output size varies (all other widths fixed).
    """

    widths: tuple[int, ...]
    reverse_flops: int
    forward_flops: int
    crossover: float
    output_sizes: tuple[int, ...]
    reverse_curve: tuple[int, ...]
    forward_curve: tuple[int, ...]

    @property
    def output_size(self) -> int:
        return self.widths[-1]

    @property
    def input_size(self) -> int:
        return self.widths[0]

    @property
    def flop_ratio(self) -> float:
        """``forward / reverse`` multiply-adds: how many times cheaper reverse mode is."""
        return self.forward_flops / self.reverse_flops

    @property
    def cheaper(self) -> str:
        """Which order costs fewer multiply-adds here."""
        if self.reverse_flops == self.forward_flops:
            return "neither (they are equal)"
        return "reverse mode" if self.reverse_flops < self.forward_flops else "forward mode"


def chain_cost_report(
    n_layers: int,
    width: int,
    output_size: int,
    input_size: int | None = None,
    largest_output: int | None = None,
) -> ChainCostReport:
    """Count both orders for the chain ``chain_widths(n_layers, width, output_size,
    input_size)`` and sweep the output size from 1 to ``largest_output`` (default: twice the
    larger of ``d_0`` and ``m``)."""
    widths = chain_widths(n_layers, width, output_size, input_size)
    before_output = widths[:-1]
    largest = largest_output or 2 * max(widths[0], output_size)
    sizes = tuple(sorted({*np.unique(np.geomspace(1, largest, 60).round().astype(int)), 1}))
    return ChainCostReport(
        widths=widths,
        reverse_flops=reverse_flops(widths),
        forward_flops=forward_flops(widths),
        crossover=crossover(before_output),
        output_sizes=tuple(int(m) for m in sizes),
        reverse_curve=tuple(reverse_flops((*before_output, m)) for m in sizes),
        forward_curve=tuple(forward_flops((*before_output, m)) for m in sizes),
    )


# -- rendering ---------------------------------------------------------------------------------


def _table_rows(report: ChainCostReport) -> tuple[list[str], list[list[str]]]:
    header = ["Order", "Multiply-adds"]
    rows = [
        ["reverse mode: Σ m·d_k·d_(k-1)", f"{report.reverse_flops:,}"],
        ["forward accumulation: Σ d_0·d_(k-1)·d_k", f"{report.forward_flops:,}"],
    ]
    return header, rows


def _verdict(report: ChainCostReport) -> str:
    ratio = report.flop_ratio
    if report.cheaper == "reverse mode":
        comparison = f"reverse mode is {ratio:.3g}× cheaper"
    elif report.cheaper == "forward mode":
        comparison = f"forward accumulation is {1 / ratio:.3g}× cheaper"
    else:
        comparison = "the two orders cost the same"
    return (
        f"Widths d = {list(report.widths)}: {comparison}. "
        f"The orders cross at output size m = {report.crossover:g} (= d_0)."
    )


def chain_cost_markdown(report: ChainCostReport) -> str:
    """The report as a Markdown table and a one-line verdict."""
    header, rows = _table_rows(report)
    return markdown_table(header, rows) + "\n\n" + _verdict(report)


def chain_cost_html(report: ChainCostReport) -> str:
    """The report as an HTML table and a one-line verdict (the widget's text)."""
    header, rows = _table_rows(report)
    return html_table(header, rows) + f"<p>{_verdict(report)}</p>"


def plot_chain_cost(report: ChainCostReport) -> Figure:
    """Multiply-adds of both orders against the output size m (log-log), with the crossover
    ``m = d_0`` and the current m."""
    figure = Figure(figsize=(7.5, 3.6))
    ax = figure.subplots()
    figure.subplots_adjust(left=0.11, right=0.97, bottom=0.15, top=0.9)
    ax.plot(report.output_sizes, report.reverse_curve, label="reverse mode (VJPs)")
    ax.plot(report.output_sizes, report.forward_curve, label="forward accumulation")
    ax.axvline(report.crossover, color="grey", linestyle="--", label="crossover m = d_0")
    ax.axvline(report.output_size, color="black", linewidth=0.8, label="current m")
    ax.set_xscale("log")
    ax.set_yscale("log")
    # Plain-text tick labels ("10k", "2M") instead of mathtext powers: faster to draw.
    ax.minorticks_off()
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0), numticks=8))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_major_formatter(EngFormatter(sep=""))
    ax.set_xlabel("output size m")
    ax.set_ylabel("multiply-adds")
    ax.legend(fontsize="small")
    ax.set_title(f"Counted: widths {list(report.widths[:-1])} + [m]")
    return figure


def build_chain_cost_widget(
    n_layers: int = 4,
    width: int = 64,
    output_size: int = 1,
    input_size: int | None = None,
    max_width: int = 128,
) -> LiveWidget:
    """Sliders for the number of layers, their width, the output size m and the input size
    d_0 (default: the width); shows the table, the verdict and the plot for the chain.

    ``widget.controls`` has keys ``n_layers``, ``width``, ``output_size``, ``input_size``;
    ``widget.last_result`` is the :class:`ChainCostReport`, ``widget.table.value`` its HTML,
    ``widget.plot.value`` the PNG of :func:`plot_chain_cost`.
    """

    def slider(description: str, value: int, low: int, high: int) -> ipywidgets.IntSlider:
        return ipywidgets.IntSlider(
            value=value, min=low, max=high, description=description, continuous_update=False
        )

    controls = {
        "n_layers": slider("layers n", n_layers, 1, 8),
        "width": slider("width", width, 1, max_width),
        "output_size": slider("output size m", output_size, 1, 2 * max_width),
        "input_size": slider("input size d_0", input_size or width, 1, max_width),
    }

    def compute(n_layers: int, width: int, output_size: int, input_size: int) -> ChainCostReport:
        return chain_cost_report(
            n_layers, width, output_size, input_size, largest_output=2 * max_width
        )

    return LiveWidget(controls, compute, chain_cost_html, plot_chain_cost)
