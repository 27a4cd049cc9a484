"""Lesson 12's picture of compute against communication: readable, and its curves the model's."""

import pytest
from chainrule.costs import compute_cost as kc
from chainrule.course.widgets import roofline as rf
from chainrule.course.widgets.live_widget import smallest_text_px

CHIP = kc.Machine("chip", 1e15, 3e12, link_bandwidth=4e11, latency=3e-6)
SLOW = kc.Machine("slow link", 1e15, 3e12, link_bandwidth=5e10, latency=1e-5)


def test_the_ratios_cross_one_at_the_thresholds_when_latency_is_left_out():
    free = kc.Machine("no latency", 1e15, 3e12, link_bandwidth=5e10, latency=0.0)
    tokens = kc.data_parallel_tokens_to_hide(8, free)
    assert rf.data_parallel_ratio(tokens, 1024, 8, free) == pytest.approx(1.0, rel=1e-3)
    width = kc.tensor_parallel_width_to_match(4, free) / 4  # d, with f = 4d
    assert rf.tensor_parallel_ratio(4096, int(width), 4, free) == pytest.approx(1.0, rel=1e-3)
    # latency only adds: the ratio with α is above the one without
    assert rf.data_parallel_ratio(tokens, 1024, 8, SLOW) > 1.0


def test_three_readable_panels_one_line_per_link_and_size():
    figure = rf.plot_compute_against_communication(CHIP, {"fast": CHIP, "slow": SLOW})
    roof, data, tensor = figure.axes
    assert smallest_text_px(figure) >= 9
    assert "min(F, I·B)" in roof.get_title()
    assert [t.get_text() for t in roof.texts][-5:] == ["x + y", "64³", "256³", "1024³", "16384³"]
    assert len([ln for ln in data.get_lines() if ln.get_label() in ("fast", "slow")]) == 2
    labels = [ln.get_label() for ln in tensor.get_lines() if ln.get_label().startswith("P = ")]
    assert labels == [f"P = {P}, {link}" for link in ("fast", "slow") for P in (2, 4, 8)]
