"""The thin live view shared by the lessons' widgets."""

import json
import re

import ipywidgets
from chainrule.course.widgets.live_widget import CONTROL_WIDTH, LiveWidget, figure_png
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
        lambda r: f"<p>{r}</p>",
        render_figure if with_plot else None,
    )


def shown_state(widget):
    match = re.search(r'data-values="([^"]*)" data-error="([^"]*)"', widget.table.value)
    return json.loads(match.group(1).replace("&quot;", '"')), match.group(2)


def test_changing_a_control_recomputes_and_redraws():
    widget = _square_widget()
    assert widget.last_result == 9 and "<p>9</p>" in widget.table.value
    before = bytes(widget.plot.value)
    widget.controls["n"].value = 5
    assert widget.last_result == 25 and "<p>25</p>" in widget.table.value
    assert bytes(widget.plot.value) != before
    assert widget.values() == {"n": 5} and shown_state(widget) == ({"n": 5}, "")


def test_an_impossible_value_says_why_and_hides_the_plot():
    widget = _square_widget()
    widget.controls["n"].value = -1
    assert widget.last_result == 9
    assert widget.error == "n must not be negative"
    assert "n must not be negative" in widget.table.value
    assert widget.plot.layout.display == "none"  # no stale picture under the message
    assert shown_state(widget) == ({"n": -1}, "n must not be negative")
    widget.controls["n"].value = 2
    assert widget.error == "" and widget.last_result == 4
    assert widget.plot.layout.display is None


def test_controls_are_wide_enough_to_use():
    widget = _square_widget()
    slider = widget.controls["n"]
    assert slider.layout.width == CONTROL_WIDTH and slider.style.description_width == "initial"


def test_without_a_figure_there_is_no_plot():
    widget = _square_widget(with_plot=False)
    assert widget.plot is None and len(widget.children) == 2


def test_png():
    figure = Figure()
    figure.subplots().plot([0, 1])
    assert figure_png(figure).startswith(b"\x89PNG")
