"""The start page and lessons 1-3 run headless from a fresh kernel, compute the numbers the
syllabus states, and draw graphs that can be read on the page."""

from __future__ import annotations

import numpy as np
import pytest
from notebook_runner import assert_readable, lesson, output_texts, readability_fetch, run_lesson

WORKED_EXAMPLES = [(1, 0), (2, 1), (3, 1), (4, 2)]  # the syllabus's given inputs, with w = 1


def _grad_of_mean_squares(examples, w):
    """d/dw of (1/n) Σ ½(wx − y)², by the closed form (wx − y)x."""
    return float(np.mean([(w * x - y) * x for x, y in examples]))


@pytest.mark.slow
def test_start_page_runs_and_checks_the_installation():
    nb, values = run_lesson(lesson(0), ["smoke", "backends", "has_gpu", "lesson_backend"])
    assert values["smoke"] == [float(sum(r + 1 for r in range(4)))] * 4
    assert "sim" in values["backends"] and values["lesson_backend"] in values["backends"]
    report_text = "\n".join(output_texts(nb, "text/markdown"))
    assert "Collective backends available" in report_text and "| numpy |" in report_text
    if not values["has_gpu"]:
        assert report_text.count("No GPU here") == 1  # said once, after the explanation
    assert report_text.count("the lessons use") + report_text.count("the lessons run") == 1


@pytest.mark.slow
def test_lesson_1_reverse_mode():
    fetch = [
        "rows",
        "x_bar",
        "full_jacobian",
        "m_cross",
        "hidden",
        "mirror",
        "x0.grad",
        "x0.data",
        "W1.data",
        "W2.data",
        "vjp_steps",
        "forward_order",
        "backward_order",
        "timing.reverse_seconds < timing.forward_seconds",
        "type(chain_cost_widget).__name__",
        *readability_fetch(["chain_drawing"]),
    ]
    nb, v = run_lesson(lesson(1), fetch)
    np.testing.assert_allclose(v["x_bar"], v["full_jacobian"][0])
    for widths, right, sum_right, left, sum_left, same in v["rows"]:
        assert widths[-1] == 1 and same and right == sum_right and left == sum_left
        assert right == sum(widths[k] * widths[k - 1] for k in range(1, len(widths)))
        assert left == sum(widths[0] * widths[k - 1] * widths[k] for k in range(1, len(widths)))
        assert left > right
    assert v["m_cross"] == pytest.approx(v["hidden"][0]) and v["mirror"]
    assert v["timing.reverse_seconds < timing.forward_seconds"]

    x0, w1, w2 = (np.array(v[k]) for k in ("x0.data", "W1.data", "W2.data"))
    x2 = np.tanh(w1 @ x0)
    expected = w1.T @ ((1 - x2**2) * (w2.T @ (w2 @ x2)))  # ∇ of ½‖W2 tanh(W1 x0)‖²
    np.testing.assert_allclose(v["x0.grad"], expected)
    assert all(v["vjp_steps"].values()) and len(v["vjp_steps"]) == 5
    assert v["backward_order"] == v["forward_order"][::-1]
    assert v["forward_order"][0] == "matmul"
    assert v["type(chain_cost_widget).__name__"] == "LiveWidget"
    assert_readable(v, ["chain_drawing"])
    assert len(output_texts(nb, "image/png")) == 1  # the graph; the widget draws its own


@pytest.mark.slow
def test_lesson_2_split_graphs():
    drawings = ["fan_out_drawing", "concat_drawing", "batch_drawing"]
    fetch = [
        "fan_out",
        "widths",
        "B",
        "max_errors",
        "v.grad",
        "v_value",
        "W.data",
        "c",
        "branch_sum",
        "slices_are_gradients",
        "routing",
        "split_is_concat",
        "x_unused.grad",
        "w_vec.grad",
        "w.grad",
        "X",
        "y",
        "w0",
        "b0",
        *readability_fetch(drawings),
    ]
    nb, v = run_lesson(lesson(2), fetch)
    assert v["fan_out"] == [["v", 3]]
    assert v["widths"] == {"w": v["B"], "b": v["B"]}  # the weight and the bias tie
    shown = "\n".join(output_texts(nb, "text/markdown"))
    assert f"| w | {v['B']} |" in shown and f"| b | {v['B']} |" in shown
    assert all(error < 1e-6 for error in v["max_errors"].values())

    value, weight, c = np.array(v["v_value"]), np.array(v["W.data"]), np.array(v["c"])
    expected = weight.T @ (weight @ value) + (1 - np.tanh(value) ** 2) * c + np.exp(value)
    np.testing.assert_allclose(v["v.grad"], expected)
    np.testing.assert_allclose(v["branch_sum"], expected)
    assert v["slices_are_gradients"] and v["split_is_concat"] and v["routing"] == ["concat"]
    assert v["x_unused.grad"][2:] == [0.0, 0.0, 0.0]

    X, y = np.array(v["X"]), np.array(v["y"])
    expected_w = X.T @ (X @ np.array(v["w0"]) + v["b0"] - y) / len(y)
    np.testing.assert_allclose(v["w_vec.grad"], expected_w)
    np.testing.assert_allclose(v["w.grad"], expected_w)
    assert_readable(v, drawings)
    assert len(output_texts(nb, "image/png")) == 3


@pytest.mark.slow
def test_lesson_3_averaging_is_exact():
    import re

    fetch = [
        "local_grads",
        "averaged",
        "uneven",
        "[s.local_mean for s in worked_table.shards]",
        "worked_table.mean_of_means",
        "worked_table.from_ranks",
        "[s.local_mean for s in uneven_table.shards]",
        "uneven_table.mean_of_means",
        "uneven_table.from_ranks",
        "full_batch",
        "by_hand",
        "plain_mean_uneven",
        "fan_outs",
        "all_reduce_count",
        "P",
        "rank_grads",
        "grad_L",
        "expressions",
        "plain_error",
        "X",
        "Y",
        "theta0",
        "type(averaging_widget).__name__",
        *readability_fetch(["global_drawing"]),
    ]
    nb, v = run_lesson(lesson(3), fetch)
    w = 1.0
    rank_0, rank_1 = WORKED_EXAMPLES[:2], WORKED_EXAMPLES[2:]
    expected_local = [_grad_of_mean_squares(rank_0, w), _grad_of_mean_squares(rank_1, w)]
    full = _grad_of_mean_squares(WORKED_EXAMPLES, w)
    assert v["local_grads"] == pytest.approx(expected_local) == v["by_hand"]
    assert v["averaged"] == pytest.approx([full, full]) and v["full_batch"] == pytest.approx(full)
    assert v["averaged"][0] == v["averaged"][1]
    assert np.mean(expected_local) == pytest.approx(full)  # the syllabus's identity

    uneven = [
        _grad_of_mean_squares(WORKED_EXAMPLES[:3], w),
        _grad_of_mean_squares(WORKED_EXAMPLES[3:], w),
    ]
    assert v["plain_mean_uneven"] == pytest.approx(np.mean(uneven))
    assert v["plain_mean_uneven"] != pytest.approx(full)

    X, Y, theta = np.array(v["X"]), np.array(v["Y"]), np.array(v["theta0"])
    grad = X.T @ (X @ theta - Y) / len(Y)
    np.testing.assert_allclose(v["grad_L"], grad)
    for expression in v["expressions"].values():
        np.testing.assert_allclose(expression, grad)
    for rank_grad in v["rank_grads"]:
        np.testing.assert_array_equal(rank_grad, v["rank_grads"][0])
        np.testing.assert_allclose(rank_grad, grad)
    assert v["plain_error"] > 1e-3
    assert v["all_reduce_count"] == 1 and v["fan_outs"] == {"θ": v["P"]}
    assert_readable(v, ["global_drawing"])

    tables = "\n".join(output_texts(nb, "text/markdown"))
    for value in [*expected_local, *uneven, full, np.mean(uneven)]:
        shown = f"{value:.1f}" if value == int(value) else f"{value:g}"
        assert f"={shown}$" in tables
    # The worked tables hold what the ranks returned, not a recomputation on one process.
    assert v["[s.local_mean for s in worked_table.shards]"] == v["local_grads"]
    assert v["worked_table.mean_of_means"] == v["averaged"][0]
    assert v["[s.local_mean for s in uneven_table.shards]"] == [g for g, _ in v["uneven"]]
    assert v["uneven_table.mean_of_means"] == v["uneven"][0][1] == v["uneven"][1][1]
    assert v["worked_table.from_ranks"] and v["uneven_table.from_ranks"]
    assert tables.count("Both ranks hold") == 2
    # Every row of the table of expressions keeps its value and its verdict: a | in an
    # expression is escaped, not a cell boundary.
    rows = [line for line in tables.splitlines() if line.startswith("| (1/")]
    assert len(rows) == len(v["expressions"])
    for row in rows:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        assert len(cells) == 3 and cells[1].startswith("[") and cells[2] == "True", row
    assert v["type(averaging_widget).__name__"] == "LiveWidget"
