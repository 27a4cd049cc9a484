"""Lesson 14's routing widget: loads against capacity, drops, padding and bytes."""

import numpy as np
from chainrule.course.widgets import expert_routing as er
from chainrule.course.widgets.live_widget import figure_png, smallest_text_px


def test_the_view_adds_up():
    view = er.routing_view(1.0, 2, 2, 1.0, 16)
    r = view.report
    assert r.capacity == 4 and r.num_experts == 4 and r.world_size == 2
    assert r.load.sum() == 2 * 16
    assert (r.kept + (r.load - r.kept)).sum() == 32
    assert np.all(r.kept <= r.capacity)
    assert r.bytes_per_all_to_all == 0.5 * 4 * 4 * er.WIDTH * 8


def test_skew_makes_the_loads_uneven_and_capacity_drops_tokens():
    even = er.routing_view(1.0, 4, 2, 0.0, 64).report
    skewed = er.routing_view(1.0, 4, 2, 3.0, 64).report
    assert skewed.expert_load.max() > even.expert_load.max()
    assert skewed.dropped.sum() > even.dropped.sum()
    roomy = er.routing_view(3.0, 4, 2, 3.0, 64).report
    assert roomy.dropped.sum() < skewed.dropped.sum()
    assert roomy.padding.sum() > skewed.padding.sum()


def test_picture_and_table_are_readable():
    view = er.routing_view(0.5, 4, 4, 2.0, 64)
    figure = er.plot_routing(view)
    assert smallest_text_px(figure, figure_png(figure)) >= 9
    texts = {t.get_text() for t in figure.axes[0].texts}
    assert {"rank 0", "rank 3"} <= texts
    table = er.routing_table(view)
    assert "dropped" in table and "bytes sent per all-to-all" in table


def test_widget_at_both_ends(sweep):
    widget = er.build_expert_routing_widget()
    for name, value in sweep(widget):
        assert widget.error == "", (name, value)
        r = widget.last_result.report
        assert r.world_size == widget.controls["world_size"].value
        assert r.tokens_per_rank == widget.controls["tokens_per_rank"].value
        assert r.load.sum() == r.world_size * r.tokens_per_rank


def test_counts_take_the_number_they_count():
    assert [er.count(n, "slot") for n in (0, 1, 2)] == ["0 slots", "1 slot", "2 slots"]
    view = er.routing_view(0.125, 1, 1, 0.0, 8)  # one rank, one expert, C = 1, E · C = 1
    assert view.report.capacity == 1
    table = er.routing_table(view)
    assert "E = 1 expert," in table and "= 1 slot per expert" in table
    assert "E · C = 1 slot of" in table
    title = er.plot_routing(view).axes[0].get_title()
    assert title.startswith("1 rank × 1 expert, capacity C = 1")


def test_no_count_of_one_takes_a_plural_at_any_end(sweep):
    widget = er.build_expert_routing_widget()
    plurals = ("1 experts", "1 slots", "1 ranks", "1 tokens")
    for name, value in sweep(widget):
        title = er.plot_routing(widget.last_result).axes[0].get_title()
        for text in (widget.table.value, title):
            assert not any(p in text for p in plurals), (name, value, text)
