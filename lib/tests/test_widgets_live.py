"""The thin live view shared by the widgets of lessons 4-7."""

import ipywidgets
from chainrule.widgets.live import LiveWidget, figure_png, html_table, markdown_table
from matplotlib.figure import Figure


def _square_widget(with_plot=True):
    def compute(n):
        if n < 0:
            raise ValueError("n must not be negative")
        return n * n

    def render_figure(result):
        figure = Figure()
        figure.subplots().bar([0], [result])
        return figure

    return LiveWidget(
        {"n": ipywidgets.IntSlider(value=3, min=-2, max=10)},
        compute,
        lambda r: html_table(["n²"], [[r]]),
        render_figure if with_plot else None,
    )


def test_changing_a_control_recomputes_and_redraws():
    widget = _square_widget()
    assert widget.last_result == 9 and "<td" in widget.table.value and ">9<" in widget.table.value
    before = bytes(widget.plot.value)
    widget.controls["n"].value = 5
    assert widget.last_result == 25 and ">25<" in widget.table.value
    assert bytes(widget.plot.value) != before
    assert widget.values() == {"n": 5}


def test_an_impossible_value_keeps_the_last_result_and_says_why():
    widget = _square_widget()
    widget.controls["n"].value = -1
    assert widget.last_result == 9
    assert widget.error == "n must not be negative"
    assert "n must not be negative" in widget.table.value
    widget.controls["n"].value = 2
    assert widget.error == "" and widget.last_result == 4


def test_without_a_figure_there_is_no_plot():
    widget = _square_widget(with_plot=False)
    assert widget.plot is None and len(widget.children) == 2


def test_tables_and_png():
    assert markdown_table(["a", "b"], [[1, 2]]).splitlines() == [
        "| a | b |",
        "|---|---|",
        "| 1 | 2 |",
    ]
    html = html_table(["a"], [[1], [2]])
    assert html.count("<tr>") == 3 and html.count("<th ") == 1
    figure = Figure()
    figure.subplots().plot([0, 1])
    assert figure_png(figure).startswith(b"\x89PNG")
