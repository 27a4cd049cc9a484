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


@pytest.mark.parametrize(("P", "m"), [(8, 16), (2, 4)])
def test_every_action_is_labelled_with_its_micro_batch(P, m):
    """Narrow slots (m ≥ 10 at P = 8) keep the micro-batch's number; the colour says F or B."""
    figure = ps.plot_schedule(ps.schedule_result(P, m, "1f1b"))
    labels = [t.get_text() for t in figure.axes[0].texts if t.get_text().lstrip("FB").isdigit()]
    expected = [str(i) for i in range(m)] * 2 * P
    if m < 10:
        expected = [f"{k}{i}" for k in "FB" for i in range(m)] * P
    assert sorted(labels) == sorted(expected)
