"""Lesson 15 (the capstone) runs headless from a fresh kernel and computes what it states: the
2 × 2 grid's groups, the float64 loss curve of four simulated ranks equal to one process, the
float32 gloo curve within the tolerance the lesson derives, and the bytes of one step per rank."""

from __future__ import annotations

import numpy as np
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
        "[float32_parameter_rounding, parameter_tolerance, gloo_parameter_gap, "
        "summed_parameter_gap]",
        "[sim_gap_units, sim_parameter_units, len(parameter_units), len(training.weights), "
        "one_process.tolist(), sim_curve.tolist()]",
        "[replicas_agree(grid_ranks, TP), replicas_agree(gloo_ranks, TP), len(one_process32)]",
        "(lambda s: [s.collectives, s.column_bytes[0] > 0])(gw.grid_step(config, training.weights, "
        "ids, 1, 4, 8))",
        "[2.0**-24]",
        "{str(r): [len(per_rank[r]), row, column] for r, (row, column) in sent.items()}",
        "[expected_row, expected_column, tokens_per_row, sharded_parameters]",
        "[one_process_seconds, sim_seconds, gloo_seconds]",
        "[len(ids), len(chars), parameter_count]",
        "(setattr(grid_widget.controls['layout'], 'value', '4 × 1 (data parallel only)'), "
        "grid_widget.last_result.collectives, grid_widget.last_result.row_bytes, "
        "grid_widget.last_result.gap)[1:]",
    ]
    nb, v = run_lesson(lesson(15), fetch)
    assert v["places"] == [
        [0, 0, 0, [0, 1], [0, 2]],
        [1, 0, 1, [0, 1], [1, 3]],
        [2, 1, 0, [2, 3], [0, 2]],
        [3, 1, 1, [2, 3], [1, 3]],
    ]
    texts = "\n".join(output_texts(nb, "text/markdown"))
    sim_units, parameter_units, measured, parameters, one, sim = v[fetch[7]]
    one, sim = np.array(one), np.array(sim)
    # "within a few units of float64's last digit": the loss and every parameter, < 10 units
    eps = np.finfo(np.float64).eps
    assert sim_units == pytest.approx(float((np.abs(sim - one) / (eps * np.abs(one))).max()))
    assert v["sim_gap"] == float(np.abs(sim - one).max()) and v["ranks_agree"]
    assert sim_units < 10 and parameter_units < 10 and measured == parameters
    assert f"| {sim_units:.1f} |" in texts and f"| {parameter_units:.1f} |" in texts
    grid_agree, gloo_agree, orders = v[fetch[8]]
    assert grid_agree and gloo_agree and orders == 5
    assert v["[len(one_process), STEPS]"] == [40, 40]
    assert v["float(one_process[0] - one_process[-1])"] > 1.0  # it learns
    # the yardstick: 4 × the largest distance of five one-process float32 runs from float64
    rounding, tolerance, gloo_gap, summed_gap = v[fetch[5]]
    assert 0 < rounding < 1e-4 and tolerance == 4 * rounding and 0 < gloo_gap <= tolerance
    assert summed_gap > 1000 * tolerance  # a wrong program lands far outside the tolerance
    assert f"| {gloo_gap:.1e} |" in texts and f"| {tolerance:.1e} |" in texts
    rounding, tolerance, gloo_gap, summed_gap = v[fetch[6]]
    assert 0 < rounding < 1e-4 and tolerance == 4 * rounding and 0 < gloo_gap <= tolerance
    assert summed_gap > 1000 * tolerance
    assert f"| {gloo_gap:.1e} |" in texts and f"| {tolerance:.1e} |" in texts
    expected_row, expected_column, tokens, sharded = v[fetch[12]]
    # 2 layers × 4 all-reduces of (tokens, width) float64 activations on 2 ranks: 2·(1/2)·n each
    assert tokens == 8 // 2 * 16 and expected_row == 4 * 2 * tokens * 32 * 8
    assert expected_column == sharded * 8 + 8
    for collectives, row, column in v[fetch[11]].values():
        assert collectives == 4 * 2 + 2 and row == expected_row and column == expected_column
    assert sum(v[fetch[13]]) < 60
    characters, vocabulary, parameters = v[fetch[14]]
    assert characters > 5000 and 40 < vocabulary < 120 and parameters > 10000
    collectives, row_bytes, gap = v[fetch[15]]
    # at 4 × 1 a row is one rank: f and f̄ move nothing and are not counted
    assert collectives == [2] * 4 and row_bytes == [0, 0, 0, 0] and gap < 1e-12
    collectives, column_sends = v[fetch[9]]
    assert collectives == [4 * 2] * 4 and not column_sends  # at 1 × 4, nor the column's
    assert "tolerance: 4δ and 4δ_θ" in texts and f"{int(expected_row)} bytes" in texts
    assert len([t for t in output_texts(nb, "text/markdown") if "data:image/png" in t]) == 1
