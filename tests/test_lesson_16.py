"""Lesson 16 (pipeline parallelism) runs headless from a fresh kernel and computes what it states:
the send and recv rows adjoint-tested and exact on 2 to 4 ranks, the pipelined gradients equal to
one process, the bubble of both schedules measured against (P − 1)/(m + P − 1), the activations
each stage holds (in micro-batches and bytes), the pipeline bit for bit gradient accumulation, and
float32 on gloo inside the tolerance the lesson derives."""

from __future__ import annotations

import re

import pytest
from notebook_runner import lesson, output_texts, run_lesson

pytestmark = pytest.mark.slow

FETCH = [
    "{str(P): row for P, row in adjoint_rows.items()}",
    "[written_error, written_sends, schedule_errors, reference_loss]",
    "{name: [[r.order, r.peak_activations, r.loss] for r in results] "
    "for name, results in runs.items()}",
    "bubble_rows",
    "[per_micro_batch, peaks, written_peak_bytes, memory_rows, M, P]",
    "accumulation_rows",
    "[gloo_equals_loop, gloo_dtype, k, float32_tolerance, gloo_error, dropped_error, u, "
    "GLOO_P, GLOO_M, LAYERS_PER_STAGE, WIDTH, ROWS]",
    "[pipeline_widget.last_result.stages, pipeline_widget.last_result.micro_batches, "
    "pipeline_widget.last_result.name, pipeline_widget.last_result.bubble]",
]


@pytest.fixture(scope="module")
def executed():
    return run_lesson(lesson(16), FETCH)


@pytest.fixture(scope="module")
def shown(executed):
    nb, _ = executed
    return "\n".join(output_texts(nb, "text/markdown"))


def test_send_and_recv_are_adjoint_and_exact_on_two_to_four_ranks(executed, shown):
    _, v = executed
    rows = v[FETCH[0]]
    assert sorted(rows) == ["2", "3", "4"]
    for P, (forward, backward, output, gradient, (sent, returned)) in rows.items():
        P = int(P)
        assert forward != 0 and backward == pytest.approx(forward, rel=1e-12, abs=1e-12)
        assert output == 0.0 and gradient == 0.0  # values move, nothing is added
        assert sorted(map(tuple, sent)) == [(r, r + 1) for r in range(P - 1)]
        assert sorted(map(tuple, returned)) == [(r + 1, r) for r in range(P - 1)]
        assert f"| {P} | {forward:.12f} | {backward:.12f} | 0.0e+00 | 0.0e+00 |" in shown
    assert "| send (to another rank) | recv (of the gradient, from that rank) |" in shown
    assert "| recv (from another rank) | send (of the gradient, back to that rank) |" in shown


def test_the_pipelined_gradients_equal_one_process(executed, shown):
    _, v = executed
    written_error, sends, schedule_errors, loss = v[FETCH[1]]
    assert written_error < 1e-14 and sends == [48, 48]  # 2 (P − 1) m with P = 4, m = 8
    assert sorted(schedule_errors) == ["1f1b", "gpipe"]
    assert all(error < 1e-14 for error in schedule_errors.values())
    runs = v[FETCH[2]]
    for name, stages in runs.items():
        assert stages[-1][2] == pytest.approx(loss, rel=1e-14)
        assert f"| {name} | {schedule_errors[name]:.1e} | {stages[-1][2]:.12f} |" in shown
    assert f"| largest gradient error vs. one process (float64) | {written_error:.1e} |" in shown
    gpipe = [f"F{i}" for i in range(8)] + [f"B{i}" for i in range(8)]
    assert all(order == gpipe for order, _, _ in runs["gpipe"])
    for s, (order, peak, _) in enumerate(runs["1f1b"]):
        assert sorted(order) == sorted(gpipe) and peak == 4 - s
        warmup = 3 - s  # P − 1 − s forwards, then one forward and one backward in turn
        assert order[: warmup + 2] == [f"F{i}" for i in range(warmup + 1)] + ["B0"]


def test_the_measured_bubble_is_the_formula(executed, shown):
    _, v = executed
    rows = v[FETCH[3]]
    assert [(P, m) for P, m, *_ in rows] == [(P, m) for P in (2, 4, 8) for m in (1, 4, 16)]
    for P, m, slots, model_slots, gpipe, one_f_one_b, formula in rows:
        assert formula == (P - 1) / (m + P - 1)
        assert slots == model_slots == 2 * (m + P - 1)
        assert gpipe == pytest.approx(formula, abs=1e-12)
        assert one_f_one_b == pytest.approx(formula, abs=1e-12)
        row = f"| {P} | {m} | {slots} | {model_slots} | {gpipe:.4f} | {one_f_one_b:.4f} | "
        assert row + f"{formula:.4f} |" in shown


def test_activation_memory_per_stage(executed, shown):
    _, v = executed
    per_micro_batch, peaks, written_peak_bytes, memory_rows, M, P = v[FETCH[4]]
    assert (M, P) == (8, 4)
    assert peaks == {"gpipe": [M] * P, "1f1b": [P - s for s in range(P)]}
    # one micro-batch of 8 rows × 16 float64 enters each layer, its product and tanh kept: at
    # least 2 layers × 3 arrays of 1024 bytes and the stage's input
    assert all(b >= 7 * 8 * 16 * 8 for b in per_micro_batch)
    assert written_peak_bytes == [M * b for b in per_micro_batch]
    for s, row in enumerate(memory_rows):
        b = per_micro_batch[s]
        assert row == [s, b, M, M * b, M * b, P - s, (P - s) * b]
        assert "| " + " | ".join(map(str, row)) + " |" in shown


def test_micro_batches_are_gradient_accumulation(executed, shown):
    _, v = executed
    rows = v[FETCH[5]]
    assert [m for m, _, _ in rows] == [1, 2, 4, 8]
    for m, loop, whole in rows:
        assert loop == 0.0 and whole < 1e-14  # bit for bit the loop; the batch to rounding
        assert f"| {m} | 0.0e+00 | {whole:.1e} |" in shown


def test_float32_on_gloo_within_the_derived_tolerance(executed, shown):
    _, v = executed
    equal, dtype, k, tolerance, error, dropped, u, P, m, layers, width, rows = v[FETCH[6]]
    assert equal is True and dtype == "float32" and u == 2.0**-24
    assert k == 2 * P * layers * (width + 2) + (rows * width + 2) + rows + m
    assert tolerance == k * u
    assert 0 < error < tolerance  # float32's rounding of the accumulation loop
    assert dropped > 100 * tolerance  # a forgotten micro-batch lands far outside
    for label, value in [
        ("k (roundings on the longest chain)", str(k)),
        ("tolerance k·u", f"{tolerance:.1e}"),
        ("measured: largest error vs. float64, relative", f"{error:.1e}"),
        ("a micro-batch forgotten: its error", f"{dropped:.1e}"),
        ("bit for bit the float32 accumulation loop of one process", "True"),
    ]:
        assert f"| {label} | {value} |" in shown


def test_the_widget_shows_the_chosen_schedule(executed):
    _, v = executed
    stages, micro, name, bubble = v[FETCH[7]]
    assert (stages, micro, name) == (4, 8, "1f1b") and bubble == pytest.approx(3 / 11)


def test_the_check_yourself_answers_are_right():
    """The first question's answer: the smallest m with (P − 1)/(m + P − 1) < 1/10 at P = 4."""
    import nbformat

    last = nbformat.read(lesson(16), as_version=4).cells[-1].source
    smallest = next(m for m in range(1, 100) if 3 / (m + 3) < 0.1)
    assert smallest == 28 and re.search(r"m \\ge 28", last)
