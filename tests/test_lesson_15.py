"""Lesson 15 (the capstone) runs headless from a fresh kernel and computes what it states: the
2 × 2 grid's groups, the float64 loss curve of four simulated ranks equal to one process, the
float32 gloo curve within the tolerance the lesson derives, and the bytes of one step per rank."""

from __future__ import annotations

import pytest
from notebook_runner import lesson, output_texts, run_lesson

pytestmark = pytest.mark.slow


def test_lesson_15_a_transformer_on_four_ranks_equals_one_process():
    fetch = [
        "places",
        "sim_gap",
        "ranks_agree",
        "[len(one_process), STEPS]",
        "float(one_process[0] - one_process[-1])",
        "[float32_rounding, tolerance, gloo_gap, summed_gap]",
        "[2.0**-24]",
        "{str(r): [len(per_rank[r]), row, column] for r, (row, column) in sent.items()}",
        "[expected_row, expected_column, tokens_per_row, sharded_parameters]",
        "[one_process_seconds, sim_seconds, gloo_seconds]",
        "[len(ids), len(chars), parameter_count]",
        "(setattr(grid_widget.controls['layout'], 'value', '4 × 1 (data parallel only)'), "
        "grid_widget.last_result.row_bytes, grid_widget.last_result.gap)[1:]",
    ]
    nb, v = run_lesson(lesson(15), fetch)
    assert v["places"] == [
        [0, 0, 0, [0, 1], [0, 2]],
        [1, 0, 1, [0, 1], [1, 3]],
        [2, 1, 0, [2, 3], [0, 2]],
        [3, 1, 1, [2, 3], [1, 3]],
    ]
    assert v["sim_gap"] < 1e-10 and v["ranks_agree"]
    assert v["[len(one_process), STEPS]"] == [40, 40]
    assert v["float(one_process[0] - one_process[-1])"] > 1.0  # it learns
    rounding, tolerance, gloo_gap, summed_gap = v[fetch[5]]
    assert 0 < rounding < 1e-4 and tolerance == 4 * rounding and gloo_gap <= tolerance
    assert summed_gap > 1e-2  # a wrong program lands far outside the tolerance
    expected_row, expected_column, tokens, sharded = v[fetch[8]]
    # 2 layers × 4 all-reduces of (tokens, width) float64 activations on 2 ranks: 2·(1/2)·n each
    assert tokens == 8 // 2 * 16 and expected_row == 4 * 2 * tokens * 32 * 8
    assert expected_column == sharded * 8 + 8
    for collectives, row, column in v[fetch[7]].values():
        assert collectives == 4 * 2 + 2 and row == expected_row and column == expected_column
    assert sum(v[fetch[9]]) < 60
    characters, vocabulary, parameters = v[fetch[10]]
    assert characters > 5000 and 40 < vocabulary < 120 and parameters > 10000
    row_bytes, gap = v[fetch[11]]
    assert row_bytes == [0, 0, 0, 0] and gap < 1e-12
    texts = "\n".join(output_texts(nb, "text/markdown"))
    assert "tolerance 4δ" in texts and f"{int(expected_row)} bytes" in texts
    assert len([t for t in output_texts(nb, "text/markdown") if "data:image/png" in t]) == 1
