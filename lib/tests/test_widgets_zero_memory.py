"""Lesson 13's widget: memory per rank and traffic per step of the four ZeRO stages."""

import pytest
from chainrule.course.widgets import zero_memory as zm
from chainrule.course.widgets.live_widget import figure_png, smallest_text_px
from chainrule.parallel import zero

ADAM = next(iter(zm.OPTIMIZERS))


def test_memory_is_the_papers_model():
    psi, P = 7.5e9, 64
    result = zm.zero_memory(psi, P, ADAM)
    totals = [result.total(s) for s in zero.STAGES]
    assert totals == pytest.approx([16 * psi, 4 * psi + 12 * psi / P, 2 * psi + 14 * psi / P,
                                    16 * psi / P])  # fmt: skip
    assert result.held[2] == pytest.approx((2 * psi, 2 * psi / P, 12 * psi / P))


def test_traffic_is_two_then_three_times_the_parameters():
    psi, P = 1.5e9, 8
    result = zm.zero_memory(psi, P, ADAM)
    f = (P - 1) / P
    for s in (0, 1, 2):
        assert result.sent_bytes(s) == pytest.approx(2 * f * 2 * psi)  # fp16: 2 bytes each
    assert result.sent_bytes(3) == pytest.approx(3 * f * 2 * psi)
    table = zm.zero_table(result)
    assert "1.5×" in table and "all-gather θ, all-gather θ, reduce-scatter g" in table
    assert "reduce-scatter g, all-gather θ" in table  # stages 1 and 2


def test_table_is_one_line_per_row():
    table = zm.zero_table(zm.zero_memory(7.5e9, 64, ADAM))
    assert table.count("white-space: nowrap") == table.count("<td style") + table.count("<th style")
    assert table.count("<tr>") == 1 + len(zero.STAGES)


def test_one_rank_sends_nothing_and_the_table_says_so():
    result = zm.zero_memory(1.5e9, 1, ADAM)
    assert all(result.sent_bytes(s) == 0 for s in zero.STAGES)
    table = zm.zero_table(result)
    assert "nothing is communicated, 0 bytes sent" in table
    assert "reduce-scatter" not in table and "all-gather" not in table and "all-reduce" not in table
    assert "1 rank," in table
    with pytest.raises(ValueError, match="unknown optimizer"):
        zm.zero_memory(1.5e9, 2, "lion")


def test_picture_is_readable_at_the_extremes():
    for psi, P in ((1.5e9, 1024), (175e9, 1), (175e9, 1024), (1.5e9, 1)):
        for optimizer in zm.OPTIMIZERS:
            figure = zm.plot_zero_memory(zm.zero_memory(psi, P, optimizer))
            assert smallest_text_px(figure, figure_png(figure)) >= 9, (psi, P, optimizer)


def test_smallest_fitting_ranks():
    psi = 70e9
    sgd = list(zm.OPTIMIZERS)[1]
    assert [zm.smallest_fitting_ranks(psi, s, ADAM) for s in zero.STAGES] == [None] * 3 + [16]
    assert zm.smallest_fitting_ranks(psi, 3, ADAM, range(1, 1025)) == 14  # 1120 GB / 80 GB
    assert zm.smallest_fitting_ranks(psi, 3, sgd, range(1, 1025)) == 11  # 840 GB / 80 GB = 10.5
    assert zm.smallest_fitting_ranks(1.5e9, 0, ADAM) == 1  # 24 GB on one device


def test_widget_at_both_ends(sweep):
    widget = zm.build_zero_memory_widget()
    for name, value in sweep(widget):
        result = widget.last_result
        assert result.world_size == widget.controls["ranks"].value, (name, value)
        assert result.world_size in zm.RANK_CHOICES
        assert result.psi == widget.controls["billions"].value * 1e9
        totals = [result.total(s) for s in zero.STAGES]
        assert totals == sorted(totals, reverse=True)
