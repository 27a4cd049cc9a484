"""The context parallelism lesson's widget: which pairs of chunks each rank computes at each
ring step, the work per rank and the idle share, readable at every setting of its controls."""

import numpy as np
import pytest
from chainrule.course.widgets import ring_attention as ra
from chainrule.course.widgets.live_widget import figure_png, smallest_text_px


def check(result):
    P, count = result.world_size, result.owner.shape[0]
    computed = result.owner >= 0
    if result.causal:
        assert (computed == np.tri(count, dtype=bool)).all()  # the lower triangle, no more
    else:
        assert computed.all()
    assert (result.step[computed] < P).all()
    # a rank computes only its own query chunks
    for q in range(count):
        owners = set(result.owner[q][computed[q]].tolist())
        assert len(owners) == 1
    if result.layout == "zigzag" or not result.causal:
        assert result.idle == 0.0
    else:
        assert result.idle == pytest.approx((P - 1) / (2 * P - 1), abs=1e-15)


def test_every_control_at_both_ends(sweep):
    widget = ra.build_ring_widget()
    moved = set()
    for name, _value in sweep(widget):
        moved.add(name)
        result = widget.last_result
        assert result.causal is widget.controls["causal"].value
        check(result)
    assert moved == set(widget.controls)


def test_the_largest_setting_stays_readable_and_counts_the_plain_split():
    for layout in ("plain", "zigzag"):
        result = ra.ring_result(8, layout, True)
        figure = ra.plot_ring(result)
        assert smallest_text_px(figure, figure_png(figure)) >= 9
    html = ra.render_table(ra.ring_result(8, "plain", True))
    assert "0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5" in html and "0.467" in html  # 7/15
    assert "1.875" in html  # 7.5 / 4
