"""Lesson 1's widget: chain widths, both association orders counted, the view."""

from __future__ import annotations

import numpy as np
import pytest
from chainrule.costs.chain_cost import forward_accumulate, random_jacobians, reverse_accumulate
from chainrule.course.widgets.chain_cost import (
    build_chain_cost_widget,
    chain_cost_html,
    chain_cost_markdown,
    chain_cost_report,
    chain_widths,
    plot_chain_cost,
)
from matplotlib.figure import Figure


def _counted_multiply_adds(widths, accumulate):
    """Run the accumulation with a matmul that counts a·b·c per (a,b)@(b,c) product."""
    total = 0

    def counting_matmul(left, right):
        nonlocal total
        total += left.shape[0] * left.shape[1] * right.shape[1]
        return left @ right

    jacobians = random_jacobians(widths, np.random.default_rng(0))
    result = accumulate(jacobians, matmul=counting_matmul)
    return total, result, jacobians


def test_chain_widths():
    assert chain_widths(3, 8, 1) == (8, 8, 8, 1)
    assert chain_widths(1, 8, 5, input_size=2) == (2, 5)
    assert chain_widths(4, 16, 3, input_size=1) == (1, 16, 16, 16, 3)
    with pytest.raises(ValueError):
        chain_widths(0, 8, 1)
    with pytest.raises(ValueError):
        chain_widths(2, 0, 1)


@pytest.mark.parametrize("args", [(3, 6, 1, None), (2, 5, 4, 3), (4, 7, 9, 2), (1, 3, 3, 3)])
def test_report_counts_what_an_instrumented_multiplication_counts(args):
    report = chain_cost_report(*args)
    reverse_count, reverse_jac, jacobians = _counted_multiply_adds(
        report.widths, reverse_accumulate
    )
    forward_count, forward_jac, _ = _counted_multiply_adds(report.widths, forward_accumulate)
    assert report.reverse_flops == reverse_count
    assert report.forward_flops == forward_count
    full = jacobians[0]
    for jac in jacobians[1:]:
        full = jac @ full
    np.testing.assert_allclose(reverse_jac, full)
    np.testing.assert_allclose(forward_jac, full)


def test_curves_cross_at_the_input_size():
    report = chain_cost_report(3, 12, 1, input_size=20, largest_output=50)
    assert report.crossover == pytest.approx(20)
    sizes = np.array(report.output_sizes)
    diff = np.array(report.reverse_curve) - np.array(report.forward_curve)
    assert (diff[sizes < 20] < 0).all() and (diff[sizes > 20] > 0).all()
    assert sizes.min() == 1 and sizes.max() == 50


def test_which_order_is_cheaper_and_by_how_much():
    scalar = chain_cost_report(4, 10, 1)
    assert scalar.cheaper == "reverse mode"
    assert scalar.flop_ratio == pytest.approx(10)  # d_0 sweeps versus one
    wide_output = chain_cost_report(4, 10, 30)
    assert wide_output.cheaper == "forward mode"
    assert chain_cost_report(4, 10, 10).cheaper.startswith("neither")
    scalar_input = chain_cost_report(4, 10, 1, input_size=1)
    assert scalar_input.cheaper.startswith("neither")


def test_text_renderings_show_the_counts():
    report = chain_cost_report(2, 4, 1)
    text = chain_cost_markdown(report)
    assert f"{report.reverse_flops:,}" in text and f"{report.forward_flops:,}" in text
    assert "m = 4" in text
    assert f"{report.forward_flops:,}" in chain_cost_html(report)


def test_plot_draws_both_curves():
    report = chain_cost_report(3, 8, 2, largest_output=20)
    figure = plot_chain_cost(report)
    assert isinstance(figure, Figure)
    (ax,) = figure.axes  # counts only: no machine-dependent timing panel
    reverse_line, forward_line = ax.lines[:2]
    assert list(reverse_line.get_ydata()) == list(report.reverse_curve)
    assert list(forward_line.get_ydata()) == list(report.forward_curve)


def test_widget_recomputes_when_a_slider_moves():
    widget = build_chain_cost_widget(n_layers=2, width=8, output_size=1)
    assert set(widget.controls) == {"n_layers", "width", "output_size", "input_size"}
    first = widget.last_result
    assert first.widths == (8, 8, 1)
    first_table, first_png = widget.table.value, widget.plot.value
    assert first_png

    widget.controls["output_size"].value = 20
    assert widget.last_result.widths == (8, 8, 20)
    assert widget.last_result.cheaper == "forward mode"
    assert f"{widget.last_result.reverse_flops:,}" in widget.table.value
    assert widget.table.value != first_table and widget.plot.value != first_png

    widget.controls["n_layers"].value = 5
    assert widget.last_result.widths == (8, 8, 8, 8, 8, 20)
    widget.controls["input_size"].value = 30
    assert widget.last_result.crossover == pytest.approx(30)
    assert widget.last_result.cheaper == "reverse mode"


def test_every_control_at_both_ends_gives_a_readable_picture(sweep):
    widget = build_chain_cost_widget()
    for name, value in sweep(widget):
        assert widget.error == "", (name, value)
        report = widget.last_result
        assert report.widths[-1] == widget.controls["output_size"].value
