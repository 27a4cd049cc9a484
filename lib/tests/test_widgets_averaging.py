"""Lesson 3's widget: local gradients, the three reductions, the table and the live view."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from chainrule.course.widgets.averaging import (
    WORKED_EXAMPLES,
    averaging_html,
    averaging_markdown,
    averaging_result,
    build_averaging_widget,
    equal_shard_sizes,
    example_gradient,
    format_examples,
    local_mean_gradient,
    parse_examples,
    parse_sizes,
    plot_averaging,
    split_into_shards,
)
from hypothesis import given
from hypothesis import strategies as st

coordinates = st.floats(-5, 5, allow_nan=False).map(lambda v: round(v, 2))
example_lists = st.lists(st.tuples(coordinates, coordinates), min_size=2, max_size=12)


def _closed_form_mean(examples, w):
    return float(np.mean([example_gradient(x, y, w) for x, y in examples]))


def test_example_gradient_is_the_derivative_of_half_squared_error():
    w = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    (0.5 * (w * 3.0 - 1.5) ** 2).backward()
    assert example_gradient(3.0, 1.5, 0.7) == pytest.approx(w.grad.item())


@given(example_lists, coordinates)
def test_engine_local_gradient_matches_closed_form_and_torch(examples, w):
    engine = local_mean_gradient(examples, w)
    assert engine == pytest.approx(_closed_form_mean(examples, w), abs=1e-9)
    xs, ys = (torch.tensor(c, dtype=torch.float64) for c in zip(*examples, strict=True))
    weight = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    (0.5 * (weight * xs - ys) ** 2).mean().backward()
    assert engine == pytest.approx(weight.grad.item(), abs=1e-9)


def test_worked_example_reproduces_the_syllabus_table():
    result = averaging_result(WORKED_EXAMPLES, None, 1.0)
    assert [s.examples for s in result.shards] == [WORKED_EXAMPLES[:2], WORKED_EXAMPLES[2:]]
    assert [s.local_mean for s in result.shards] == [
        _closed_form_mean(WORKED_EXAMPLES[:2], 1.0),
        _closed_form_mean(WORKED_EXAMPLES[2:], 1.0),
    ]
    # The syllabus's hand-computed values, checked against the code.
    assert [s.local_mean for s in result.shards] == [1.5, 7.0]
    assert result.mean_of_means == result.full_batch == 4.25
    assert result.equal_shards and result.mean_of_means_error == 0


@given(example_lists, st.integers(1, 4), coordinates)
def test_mean_of_means_is_exact_for_equal_shards(examples, ranks, w):
    examples = examples[: len(examples) - len(examples) % ranks] or examples[:ranks]
    if len(examples) < ranks:
        return
    result = averaging_result(examples, [len(examples) // ranks] * ranks, w)
    assert result.mean_of_means == pytest.approx(result.full_batch, abs=1e-9)


def test_unequal_shards_break_the_plain_mean():
    result = averaging_result(WORKED_EXAMPLES, [3, 1], 1.0)
    expected_plain = (_closed_form_mean(WORKED_EXAMPLES[:3], 1.0) + 8.0) / 2
    assert result.mean_of_means == pytest.approx(expected_plain)
    assert result.mean_of_means_error == pytest.approx(expected_plain - 4.25)
    assert result.mean_of_means_error != 0
    assert not result.equal_shards


def test_shard_helpers():
    assert equal_shard_sizes(4, 2) == [2, 2]
    assert equal_shard_sizes(5, 3) == [2, 2, 1]
    assert split_into_shards(WORKED_EXAMPLES, [1, 3]) == [WORKED_EXAMPLES[:1], WORKED_EXAMPLES[1:]]
    with pytest.raises(ValueError, match="add up to 3"):
        split_into_shards(WORKED_EXAMPLES, [2, 1])
    with pytest.raises(ValueError, match="at least one example"):
        split_into_shards(WORKED_EXAMPLES, [4, 0])
    with pytest.raises(ValueError):
        equal_shard_sizes(4, 0)


def test_parsing_round_trips_and_rejects_nonsense():
    text = format_examples(WORKED_EXAMPLES)
    assert text == "(1, 0), (2, 1), (3, 1), (4, 2)"
    assert parse_examples(text) == list(WORKED_EXAMPLES)
    assert parse_examples("(1.5,-2) (3e-1, .5)") == [(1.5, -2.0), (0.3, 0.5)]
    assert parse_sizes(" 3, 1 ") == [3, 1]
    for bad in ["", "(1, 2", "(1, 2), oops"]:
        with pytest.raises(ValueError):
            parse_examples(bad)
    with pytest.raises(ValueError):
        parse_sizes("2, two")


def test_markdown_table_is_built_from_the_computed_values():
    equal = averaging_markdown(averaging_result(WORKED_EXAMPLES, None, 1.0))
    lines = equal.splitlines()
    assert lines[2].startswith("| 0 | (1, 0), (2, 1) |") and "(1)(1) + (1)(2)" in lines[2]
    assert "(2)(3) + (2)(4)" in lines[3] and "=7.0$" in lines[3]
    assert "(1.5 + 7.0)=4.25" in lines[4]
    assert "1 + 2 + 6 + 8" in lines[5]
    unequal = averaging_markdown(averaging_result(WORKED_EXAMPLES, [3, 1], 1.0))
    assert "off by" in unequal
    # The exact reduction for unequal shards is the first exercise: no table gives it away.
    assert "eighted" not in unequal and "|B_p|/|B|" not in unequal
    shifted = averaging_markdown(averaging_result(WORKED_EXAMPLES, None, 2.0))
    assert shifted != equal and "(2)(1) + (3)(2)" in shifted
    assert "<table>" in averaging_html(averaging_result(WORKED_EXAMPLES, [1, 3], 1.0))


def test_plot_marks_the_full_batch_and_the_mean_of_means():
    result = averaging_result(WORKED_EXAMPLES, [3, 1], 1.0)
    (ax,) = plot_averaging(result).axes
    levels = sorted(line.get_ydata()[0] for line in ax.lines)
    assert levels == pytest.approx(sorted([result.full_batch, result.mean_of_means, 0.0]))
    assert [p.get_height() for p in ax.patches] == [s.local_mean for s in result.shards]


def test_at_w_zero_the_labels_stay_clear_of_the_title():
    (ax,) = plot_averaging(averaging_result([(1, 0), (2, 0)], None, 0.0)).axes
    low, high = ax.get_ylim()
    assert low < 0 < high  # all gradients are 0: the axis still has room
    assert ax.get_xticklabels()[0].get_text().startswith("rank 0")  # under the axis


def test_widget_follows_edits():
    widget = build_averaging_widget()
    assert set(widget.controls) == {"examples", "num_ranks", "shard_sizes", "w"}
    assert widget.last_result.full_batch == widget.last_result.mean_of_means
    first_png = widget.plot.value

    widget.controls["shard_sizes"].value = "3, 1"
    result = widget.last_result
    assert [s.size for s in result.shards] == [3, 1]
    assert result.mean_of_means_error != 0 and "off by" in widget.table.value
    assert widget.plot.value != first_png

    widget.controls["num_ranks"].value = 4
    assert widget.controls["shard_sizes"].value == "1, 1, 1, 1"
    assert len(widget.last_result.shards) == 4 and widget.error == ""

    widget.controls["shard_sizes"].value = "2, 2"
    assert "give 4 shard sizes" in widget.error and len(widget.last_result.shards) == 4
    assert widget.plot.layout.display == "none"  # no stale picture of the last good state

    widget.controls["examples"].value = "(1, 1), (2, 0), (0, 3), (5, 5), (1, 2), (2, 2)"
    assert widget.controls["shard_sizes"].value == "2, 2, 1, 1"
    assert widget.error == "" and widget.last_result.num_examples == 6

    widget.controls["w"].value = 0.5
    assert widget.last_result.w == 0.5
    assert widget.last_result.full_batch == pytest.approx(
        _closed_form_mean(parse_examples(widget.controls["examples"].value), 0.5)
    )


def test_the_ranks_slider_never_asks_for_more_ranks_than_examples(sweep):
    widget = build_averaging_widget()
    assert widget.controls["num_ranks"].max == len(WORKED_EXAMPLES)
    for name, _ in sweep(widget):
        if name == "num_ranks":
            sizes = parse_sizes(widget.controls["shard_sizes"].value)
            assert min(sizes) >= 1 and widget.error == ""
    widget.controls["examples"].value = "(1, 0), (2, 1)"
    assert widget.controls["num_ranks"].max == 2 and widget.controls["num_ranks"].value <= 2
    assert widget.error == ""
    widget.controls["examples"].value = ", ".join(f"({i}, 1)" for i in range(12))
    assert widget.controls["num_ranks"].max == 8


def test_the_table_from_the_ranks_shows_what_the_ranks_returned():
    from chainrule import dist
    from chainrule.course.widgets.averaging import averaging_result_from_ranks
    from chainrule.parallel import data_parallel

    shards = [WORKED_EXAMPLES[:3], WORKED_EXAMPLES[3:]]

    def on_a_rank():
        local = local_mean_gradient(shards[dist.rank()], 1.0)
        (averaged,) = data_parallel.average_gradients([np.array(local)])
        return local, float(averaged)

    ran = dist.run(on_a_rank, 2)
    result = averaging_result_from_ranks(
        shards,
        [g for g, _ in ran],
        [a for _, a in ran],
        local_mean_gradient(WORKED_EXAMPLES, 1.0),
        1.0,
    )
    assert [s.local_mean for s in result.shards] == [g for g, _ in ran] == [3.0, 8.0]
    assert result.mean_of_means == ran[0][1] and result.from_ranks
    recomputed = averaging_result(WORKED_EXAMPLES, [3, 1], 1.0)
    assert (
        averaging_markdown(result).split("\n\n")[0]
        == averaging_markdown(recomputed).split("\n\n")[0]
    )
    assert (
        averaging_markdown(result)
        .split("\n\n")[1]
        .startswith("Both ranks hold 5.5 after the all-reduce, bit for bit. Unequal shards (3, 1)")
    )
    # A number the ranks did not compute is what the table shows: nothing is recomputed.
    other = averaging_result_from_ranks(shards, [1.0, 2.0], [1.5, 1.5], 4.25, 1.0)
    assert "=1.0$" in averaging_markdown(other) and "=2.0$" in averaging_markdown(other)
    with pytest.raises(ValueError, match="different averages"):
        averaging_result_from_ranks(shards, [1.0, 2.0], [1.5, 1.5000001], 4.25, 1.0)
    with pytest.raises(ValueError, match="one of each per rank"):
        averaging_result_from_ranks(shards, [1.0], [1.5, 1.5], 4.25, 1.0)
