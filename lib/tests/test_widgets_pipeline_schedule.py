"""The pipeline lesson's widget: the schedule drawn as stages × slots, its bubble against the
formula and each stage's peak activations, readable at every setting of its controls."""

import pytest
from chainrule.course.widgets import pipeline_schedule as ps
from chainrule.course.widgets.live_widget import figure_png, smallest_text_px


def test_every_control_at_both_ends(sweep):
    widget = ps.build_pipeline_widget()
    for _name, _value in sweep(widget):
        result = widget.last_result
        assert result.bubble == pytest.approx(result.formula, abs=1e-12)
        P, m = result.stages, result.micro_batches
        expected = [m] * P if result.name == "gpipe" else [min(P - s, m) for s in range(P)]
        assert result.peak_activations == expected


def test_the_largest_setting_stays_readable_and_shows_the_bubble():
    result = ps.schedule_result(8, 16, "gpipe")
    figure = ps.plot_schedule(result)
    assert smallest_text_px(figure, figure_png(figure)) >= 9
    html = ps.render_table(result)
    assert "0.3043" in html and "16, 16" in html  # 7/23
