"""The recomputation lesson's widget: activation bytes and extra forward work against the number
of checkpointed segments, measured on the engine, equal to what the segments' lengths give, and
readable at every setting of its controls."""

from chainrule.course.widgets import recompute_trade as rt
from chainrule.course.widgets.live_widget import figure_png, smallest_text_px

ACTIVATION = rt.ROWS * rt.WIDTH * 8  # one (rows, width) float64 array


def expected(depth: int, segments: int) -> tuple[int, int, int]:
    """Stored bytes, peak bytes and operations run again, from the segments' lengths: a layer
    keeps three arrays (x Wᵀ, + b, tanh), a checkpointed segment only its output; the loss Σ y²
    keeps y² and one float64; the backward rebuilds one segment at a time."""
    bounds = [round(i * depth / segments) for i in range(segments + 1)]
    lengths = [b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    *checkpointed, last = lengths
    stored = (len(checkpointed) + 3 * last + 1) * ACTIVATION + 8
    peak = stored + 3 * max(checkpointed, default=0) * ACTIVATION
    return stored, peak, 4 * sum(checkpointed)


def test_every_control_at_both_ends(sweep):
    widget = rt.build_recompute_widget()
    for _name, _value in sweep(widget):
        result = widget.last_result
        asked = widget.controls["segments"].value
        assert result.requested == asked and result.segments == min(asked, result.depth)
        assert (f"k = {asked} is more than" in widget.table.value) == (asked > result.depth)
        for k, m in result.by_segments.items():
            assert (m.saved_bytes, m.peak_bytes, m.recomputed_ops) == expected(result.depth, k)
            assert m.forward_ops == 4 * result.depth + 2
        best = result.lowest_peak
        assert f"Lowest peak at {best} segment{'s' if best > 1 else ''};" in widget.table.value


def test_more_segments_than_layers_means_one_layer_per_segment():
    widget = rt.build_recompute_widget(depth=16, segments=12)
    widget.controls["depth"].value = 5
    assert widget.values() == {"depth": 5, "segments": 12} and not widget.error
    assert widget.last_result.segments == 5
    assert widget.last_result.chosen == widget.last_result.by_segments[5]


def test_the_gradients_do_not_depend_on_the_segments_and_the_deepest_picture_is_readable():
    _, plain = rt.mlp_step(12, None)
    for k in (1, 3, 12):
        _, grads = rt.mlp_step(12, k)
        assert all((a == b).all() for a, b in zip(grads, plain, strict=True))
    figure = rt.plot_trade(rt.trade(rt.MAX_DEPTH, 1))
    assert smallest_text_px(figure, figure_png(figure)) >= 9
