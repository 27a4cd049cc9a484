"""Lesson 12's pictures and its bytes-per-step widget."""

import pytest
from chainrule.costs import comm_cost as cc
from chainrule.course.widgets import comm_cost as cw


def test_step_bytes_follow_from_the_placements():
    T, d, P = 1024, 256, 4
    f = (P - 1) / P
    data = cw.step_communication("data parallel", T, d, 4 * d, P)
    assert [(p, op, on) for p, op, on, _ in data] == [
        ("backward", "all_reduce", "W₁"),
        ("backward", "all_reduce", "W₂"),
    ]
    assert sum(b for *_, b in data) == 2 * f * 8 * d * d * 2
    tensor = cw.step_communication("tensor parallel", T, d, 4 * d, P)
    assert [(p, op) for p, op, _, _ in tensor] == [
        ("backward", "all_reduce"),
        ("forward", "all_reduce"),
    ]
    sequence = cw.step_communication("sequence parallel", T, d, 4 * d, P)
    assert [(p, op, on) for p, op, on, _ in sequence] == [
        ("forward", "all_gather", "X"),
        ("forward", "reduce_scatter", "Y"),
        ("backward", "all_gather", "Y"),
        ("backward", "reduce_scatter", "X"),
    ]
    assert sum(b for *_, b in sequence) == sum(b for *_, b in tensor) == 4 * f * T * d * 2


def test_step_cost_times_are_the_model_of_each_collective():
    cost = cw.step_cost(10, 512, 4, alpha=1e-4, bandwidth=1e9)
    for name, comm in cost.rows.items():
        expected = sum(
            cc.alpha_beta_time(op, b / cc.bytes_factor(op, 4), 4, 1e-4, 1e9) for _, op, _, b in comm
        )
        assert cost.seconds[name] == pytest.approx(expected)
    assert "MiB per rank" in cw.step_table(cost)


def test_fits_are_drawn_per_collective():
    measurements = [
        cc.Measurement(op, P, n, cc.alpha_beta_time(op, n, P, 3e-4, 1e9))
        for op in ("all_reduce", "all_gather", "reduce_scatter")
        for P in (2, 4)
        for n in (1 << 10, 1 << 20)
    ]
    fits = {op: cc.fit(measurements, op) for op in ("all_reduce", "all_gather")}
    figure = cw.plot_fits(measurements, fits, against={"reduce_scatter": "all_reduce"})
    titles = [ax.get_title() for ax in figure.axes]
    assert len(titles) == 3 and "α = 300 µs" in titles[0]
    assert "off by 0% (median), 0% (max)" in titles[0]  # the fit's error is on the picture
    assert titles[2].startswith("reduce-scatter: no fit") and "all-reduce" in titles[2]
    # a least-squares line far from its points is drawn, but not called a fit
    noisy = [
        cc.Measurement(
            m.op,
            m.world_size,
            m.nbytes,
            m.seconds * (10 if (m.world_size == 2) == (m.nbytes > 1 << 10) else 1),
        )
        for m in measurements
    ]
    loose = cc.fit(noisy, "all_reduce")
    assert not loose.is_a_fit and fits["all_reduce"].is_a_fit
    title = cw.plot_fits(noisy, {"all_reduce": loose}).axes[0].get_title()
    assert title.startswith("all-reduce: least squares, not a fit\noff by ") and "α" not in title
    # the unfitted panel: its own points (filled) and the other collective's (open, dotted)
    lines = figure.axes[2].get_lines()
    assert [line.get_markerfacecolor() == "none" for line in lines] == [False, True] * 2


def test_step_table_is_compact():
    table = cw.step_table(cw.step_cost(12, 2048, 4, alpha=1e-4, bandwidth=1e9))
    assert table.count("white-space: nowrap") == 5  # no header wraps
    assert "line-height: 1.35" in table  # not the widget's taller line
    assert "<td" in table and "all-gather of X, reduce-scatter of Y" in table


def test_widget_at_both_ends(sweep):
    widget = cw.build_step_cost_widget(3e-4, 1e9)
    for name, value in sweep(widget):
        cost = widget.last_result
        assert cost.tokens == 2 ** widget.controls["log2_tokens"].value, (name, value)
        assert cost.world_size == widget.controls["world_size"].value
        assert cost.total_bytes("tensor parallel") == cost.total_bytes("sequence parallel")


def test_with_a_processor_the_table_sets_the_arithmetic_against_the_collectives():
    from chainrule.costs import compute_cost as kc

    cost = cw.step_cost(16, 1024, 8, alpha=3e-6, bandwidth=450e9, flops=989e12)
    assert cost.steps is not None
    machine = kc.Machine("", 989e12, float("inf"), link_bandwidth=450e9, latency=3e-6)
    for name, step in cost.steps.items():
        assert step == kc.step_time(name, 1 << 16, 1024, 4096, 8, machine)
        assert step.comm == pytest.approx(cost.seconds[name])  # the same collectives priced
    table = cw.step_table(cost)
    assert table.count("white-space: nowrap") == 8 and "T_math, ms" in table
    assert "<td" in table and ">yes<" in table and ">no<" in table  # data parallel hides here
    assert cw.step_cost(14, 1024, 8, alpha=3e-6, bandwidth=450e9).steps is None


def test_widget_with_a_processor_at_both_ends(sweep):
    widget = cw.build_step_cost_widget(3e-6, 450e9, flops=989e12)
    for name, value in sweep(widget):
        cost = widget.last_result
        assert cost.steps is not None, (name, value)
        assert all(s.math > 0 and s.overlapped >= s.math for s in cost.steps.values())
        assert "T_math, ms" in widget.table.value
