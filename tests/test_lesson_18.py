"""Lesson 18 (activation recomputation) runs headless from a fresh kernel, computes what it
states (every number it shows is checked here against an independent count), and leaves a live
widget and readable pictures."""

from __future__ import annotations

import math

import pytest
from notebook_runner import lesson, output_texts, run_lesson

pytestmark = pytest.mark.slow

SMALLEST_TEXT = (
    "__import__('chainrule.course.widgets.live_widget', fromlist=['_']).smallest_text_px({})"
)
WIDTH, ROWS = 16, 32
ARRAY = ROWS * WIDTH * 8  # one (rows, width) float64 array of the measured MLP
PER_LAYER_OPS = 4  # transpose, matmul, add, tanh


def segment_lengths(depth: int, segments: int) -> list[int]:
    bounds = [round(i * depth / segments) for i in range(segments + 1)]
    return [b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def mlp_expected(depth: int, segments: int) -> tuple[int, int]:
    """Stored and peak bytes: a layer keeps three arrays, a checkpointed segment its output,
    the loss Σ y² keeps y² and one float64; one segment is rebuilt at a time."""
    *checkpointed, last = segment_lengths(depth, segments)
    stored = (len(checkpointed) + 3 * last + 1) * ARRAY + 8
    return stored, stored + 3 * max(checkpointed, default=0) * ARRAY


@pytest.fixture(scope="module")
def executed():
    fetch = [
        "mlp_rows",
        "growth_rows",
        "[(n, m.saved_bytes, m.forward_ops, m.recomputed_ops) for n, (m, _) in small.items()]",
        "small_same",
        "sqrt_rows",
        "{L: t.lowest_peak for L, t in trades.items()}",
        "{L: {k: m.peak_bytes for k, m in t.by_segments.items()} for L, t in trades.items()}",
        "flop_rows",
        "mlp_grads_identical",
        "mode_rows",
        "(len(transformer_same), all(transformer_same.values()))",
        "selective_rows",
        "(ours, measured_core, gpt3_flops, gpt3_memory_saved, linear_part, attention_part)",
        "fsdp_rows",
        "(plain_drawing.smallest_text_px(), recomputed_drawing.smallest_text_px())",
        "(recompute_widget.last_result.depth, recompute_widget.last_result.segments, "
        "recompute_widget.last_result.chosen.peak_bytes)",
        SMALLEST_TEXT.format("recompute_widget.render_figure(recompute_widget.last_result)"),
    ]
    nb, values = run_lesson(lesson(18), fetch)
    return nb, values, fetch


def test_activations_grow_with_rows_depth_and_tokens_and_parameters_do_not(executed):
    _, v, fetch = executed
    assert [(d, n) for d, n, *_ in v["mlp_rows"]] == [(4, 32), (4, 256), (16, 32), (16, 256)]
    for depth, rows, params, kept in v["mlp_rows"]:
        assert params == depth * (WIDTH * WIDTH + WIDTH) * 8
        assert kept == (3 * depth + 1) * rows * WIDTH * 8 + 8
    batch, heads, layers = 4, 4, 2
    previous = 0
    for tokens, params, kept, core, _ in v["growth_rows"]:
        assert core == layers * 4 * batch * heads * tokens * tokens * 8
        assert kept > previous and kept > params and core < kept
        previous = kept
    params = [row[1] for row in v["growth_rows"]]
    assert params[-1] - params[0] == (128 - 16) * 32 * 8  # only the position embeddings grow


def test_the_two_layer_example_keeps_one_array_less_for_two_operations_again(executed):
    _, v, fetch = executed
    array = 3 * 8
    assert v[fetch[2]] == [["plain", 4 * array + 8, 5, 0], ["checkpoint", 3 * array + 8, 5, 2]]
    assert v["small_same"] is True
    assert all(px >= 9 for px in v[fetch[14]])


def test_full_recomputation_measured_against_the_count_and_the_square_root_rule(executed):
    _, v, fetch = executed
    lowest, peaks = v[fetch[5]], v[fetch[6]]
    for L in (4, 16, 36):
        by_k = {int(k): p for k, p in peaks[str(L)].items()}
        assert by_k == {k: mlp_expected(L, k)[1] for k in range(1, L + 1)}
        best = min(by_k, key=lambda k: (by_k[k], k))
        assert lowest[str(L)] == best
        assert by_k[2] > by_k[1]  # two segments: a rebuilt half next to the stored half
        near = min(L, round(math.sqrt(6 * L)))  # the flat minimum near √(6L)
        assert by_k[near] <= 1.1 * by_k[best]
    assert peaks["36"][str(lowest["36"])] / peaks["4"][str(lowest["4"])] < 36 / 4 / 2
    for L, k, stored, peak, extra, k_star in v["sqrt_rows"]:
        k = int(k.split()[0])
        assert (stored, peak) == mlp_expected(L, k)
        recomputed = PER_LAYER_OPS * sum(segment_lengths(L, k)[:-1])
        assert extra == f"{recomputed / (PER_LAYER_OPS * L + 2):.0%}"
        assert k_star == f"{math.sqrt(6 * L):.1f}"
    matmul = 2 * ROWS * WIDTH * WIDTH
    for L, k, forward, recomputed, share in v["flop_rows"]:
        assert forward == L * matmul
        assert recomputed == sum(segment_lengths(L, k)[:-1]) * matmul
        assert share == f"{recomputed / (3 * forward):.1%}"
        assert recomputed / (3 * forward) < 1 / 3
    assert v["mlp_grads_identical"] == {"4": True, "16": True, "36": True}


def test_selective_recomputation_removes_exactly_the_attention_core(executed):
    _, v, fetch = executed
    rows = {(T, mode): (stored, peak) for T, mode, stored, peak, _ in v["mode_rows"]}
    for T in (16, 32, 64, 128):
        assert rows[T, "full"][0] < rows[T, "selective"][0] < rows[T, "none"][0]
        assert (
            rows[T, "full"][1] < rows[T, "none"][1] and rows[T, "selective"][1] < rows[T, "none"][1]
        )
    assert v[fetch[10]] == [12, True]
    for T, removed, counted, equal in v["selective_rows"]:
        assert removed == counted == 2 * (4 * 4 * 4 * T * T + 4 * T * 32) * 8 and equal
        assert removed == rows[T, "none"][0] - rows[T, "selective"][0]
    ours, measured, gpt3_flops, gpt3_memory, linear, attention = v[fetch[12]]
    for T in ("16", "32", "64", "128"):
        assert ours[T] == pytest.approx(int(T) / (int(T) + 2 * 32 + 64))
        assert measured[T] < ours[T] and measured[T] > 0.85 * ours[T]  # the head's product
    assert gpt3_flops == pytest.approx(2048 / (2048 + 6 * 12288))
    assert f"{gpt3_flops:.1%}" == "2.7%"
    assert (linear, attention) == (34, 80.0) and f"{gpt3_memory:.0%}" == "70%"
    shares = {(T, mode): share for T, mode, _, _, share in v["mode_rows"]}
    assert shares[16, "none"] == "0.0%" and shares[16, "full"] > shares[16, "selective"]


def test_lesson_13s_resharded_layer_is_the_checkpointed_gathered_layer(executed):
    _, v, fetch = executed
    padded, rows, d_out = 36, 4, 5  # a 6 → 5 layer has 35 parameters, padded for 2 ranks
    y_bytes = rows * d_out * 8
    kept_all = padded * 8 + 4 * y_bytes + 8  # θ gathered, product, + b, tanh, y², the loss
    regathered = "all-gather, all-gather, reduce-scatter"
    assert v["fsdp_rows"] == [
        ["gather_layer (kept)", "all-gather, reduce-scatter", kept_all, 0, "0.0e+00"],
        ["resharded_layer", regathered, 2 * y_bytes + 8, 1, v["fsdp_rows"][1][4]],
        ["checkpoint(gathered, θ_p, x)", regathered, 2 * y_bytes + 8, 9, "0.0e+00"],
    ]
    assert float(v["fsdp_rows"][1][4]) < 1e-14


def test_the_widget_and_its_picture(executed):
    nb, v, fetch = executed
    depth, segments, peak = v[fetch[15]]
    assert (depth, segments) == (16, 4) and peak == mlp_expected(16, 4)[1]
    assert v[fetch[16]] >= 9
    assert len(output_texts(nb, "image/png")) == 2  # the two graphs; the widget draws its own
    markdown = "\n".join(output_texts(nb, "text/markdown"))
    for source in ("def saved_bytes", "def checkpoint(", "def checkpoint_sequential"):
        assert source in markdown
