"""The start page and lessons 1-3: stored clean, run headless from a fresh kernel in under a
minute, and compute the numbers the syllabus states."""

from __future__ import annotations

import re

import numpy as np
import pytest
from notebook_runner import REPO, markdown_text, output_texts, run_lesson

COURSE = REPO / "course"
LESSONS = {
    "start": COURSE / "00_start.ipynb",
    "reverse": COURSE / "01_reverse_mode.ipynb",
    "split": COURSE / "02_split_graphs.ipynb",
    "averaging": COURSE / "03_averaging_is_exact.ipynb",
}
EXERCISES = sorted(p.name for p in (REPO / "source" / "check_yourself").glob("ex*.ipynb"))
WORKED_EXAMPLES = [(1, 0), (2, 1), (3, 1), (4, 2)]  # the syllabus's given inputs, with w = 1


_outputs = output_texts


_markdown = markdown_text


def _grad_of_mean_squares(examples, w):
    """d/dw of (1/n) Σ ½(wx − y)², by the closed form (wx − y)x."""
    return float(np.mean([(w * x - y) * x for x, y in examples]))


# -- stored form -------------------------------------------------------------------------------


def test_start_page_links_every_lesson_and_exercise():
    text = _markdown(LESSONS["start"])
    lesson_links = re.findall(r"\]\((\d\d_[a-z_]+\.ipynb)\)", text)
    assert [name[:2] for name in lesson_links] == ["01", "02", "03", "04", "05", "06", "07"]
    for name in lesson_links:
        assert (COURSE / name).is_file(), f"the start page links to a missing {name}"
    exercise_links = re.findall(r"\(\.\./release/check_yourself/([^)]+)\)", text)
    assert EXERCISES and sorted(exercise_links) == EXERCISES
    for name in exercise_links:
        assert (REPO / "release" / "check_yourself" / name).is_file(), f"missing release {name}"
    assert "Validate" in text and "Assignment List" in text and "Submit" in text


# -- executed -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_start_page_runs_and_checks_the_installation():
    nb, values = run_lesson(LESSONS["start"], ["smoke", "backends", "has_gpu", "lesson_backend"])
    assert values["smoke"] == [float(sum(r + 1 for r in range(4)))] * 4
    assert "sim" in values["backends"] and values["lesson_backend"] in values["backends"]
    report_text = "\n".join(_outputs(nb, "text/markdown"))
    assert "Collective backends available" in report_text and "| numpy |" in report_text
    if not values["has_gpu"]:
        assert "No GPU here" in report_text


@pytest.mark.slow
def test_lesson_1_reverse_mode():
    fetch = [
        "rows",
        "m_cross",
        "hidden",
        "x0.grad",
        "x0.data",
        "W1.data",
        "W2.data",
        "forward_order",
        "backward_order",
        "type(chain_cost_widget).__name__",
    ]
    nb, v = run_lesson(LESSONS["reverse"], fetch)
    for widths, right, left in v["rows"]:
        assert widths[-1] == 1
        assert right == sum(widths[k] * widths[k - 1] for k in range(1, len(widths)))
        assert left == sum(widths[0] * widths[k - 1] * widths[k] for k in range(1, len(widths)))
        assert left > right
    assert v["m_cross"] == pytest.approx(v["hidden"][0])

    x0, w1, w2 = (np.array(v[k]) for k in ("x0.data", "W1.data", "W2.data"))
    x2 = np.tanh(w1 @ x0)
    x3 = w2 @ x2
    expected = w1.T @ ((1 - x2**2) * (w2.T @ x3))  # ∇ of ½‖W2 tanh(W1 x0)‖²
    np.testing.assert_allclose(v["x0.grad"], expected)
    assert v["backward_order"] == v["forward_order"][::-1]
    assert v["forward_order"][0] == "matmul"
    assert v["type(chain_cost_widget).__name__"] == "LiveWidget"
    assert len(_outputs(nb, "image/png")) >= 2  # the static cost plot and the graph


@pytest.mark.slow
def test_lesson_2_split_graphs():
    fetch = [
        "fan_out",
        "widths",
        "B",
        "max_errors",
        "v.grad",
        "v_value",
        "W.data",
        "c",
        "u.grad",
        "v1.grad",
        "v2.grad",
        "n1",
        "w_vec.grad",
        "w.grad",
        "X",
        "y",
        "w0",
        "b0",
    ]
    nb, v = run_lesson(LESSONS["split"], fetch)
    assert v["fan_out"] == [["v", 3]]
    assert v["widths"] == {"w": v["B"], "b": v["B"]}
    assert all(error < 1e-6 for error in v["max_errors"].values())

    value, weight, c = np.array(v["v_value"]), np.array(v["W.data"]), np.array(v["c"])
    expected = weight.T @ (weight @ value) + (1 - np.tanh(value) ** 2) * c + np.exp(value)
    np.testing.assert_allclose(v["v.grad"], expected)

    u_grad, n1 = np.array(v["u.grad"]), v["n1"]
    assert v["v1.grad"] == u_grad[:n1].tolist() and v["v2.grad"] == u_grad[n1:].tolist()

    X, y = np.array(v["X"]), np.array(v["y"])
    residual = X @ np.array(v["w0"]) + v["b0"] - y
    expected_w = X.T @ residual / len(y)
    np.testing.assert_allclose(v["w_vec.grad"], expected_w)
    np.testing.assert_allclose(v["w.grad"], expected_w)
    assert len(_outputs(nb, "image/png")) >= 3  # fan-out, concat and batch graphs


@pytest.mark.slow
def test_lesson_3_averaging_is_exact():
    fetch = [
        "local_grads",
        "averaged",
        "full_batch",
        "plain_mean",
        "weighted_mean",
        "all_reduce_count",
        "fan_outs",
        "P",
        "rank_grads",
        "grad_L",
        "X",
        "Y",
        "theta0",
        "type(averaging_widget).__name__",
    ]
    nb, v = run_lesson(LESSONS["averaging"], fetch)
    w = 1.0
    rank_0, rank_1 = WORKED_EXAMPLES[:2], WORKED_EXAMPLES[2:]
    expected_local = [_grad_of_mean_squares(rank_0, w), _grad_of_mean_squares(rank_1, w)]
    full = _grad_of_mean_squares(WORKED_EXAMPLES, w)
    assert v["local_grads"] == pytest.approx(expected_local)
    assert v["averaged"] == pytest.approx([full, full]) and v["full_batch"] == pytest.approx(full)
    assert v["averaged"][0] == v["averaged"][1]
    assert np.mean(expected_local) == pytest.approx(full)  # the syllabus's identity

    uneven_local = [
        _grad_of_mean_squares(WORKED_EXAMPLES[:3], w),
        _grad_of_mean_squares(WORKED_EXAMPLES[3:], w),
    ]
    assert v["plain_mean"] == pytest.approx(np.mean(uneven_local))
    assert v["plain_mean"] != pytest.approx(full)
    assert v["weighted_mean"] == pytest.approx(full)

    X, Y, theta = np.array(v["X"]), np.array(v["Y"]), np.array(v["theta0"])
    grad = X.T @ (X @ theta - Y) / len(Y)
    np.testing.assert_allclose(v["grad_L"], grad)
    for rank_grad in v["rank_grads"]:
        np.testing.assert_allclose(rank_grad, grad)
    assert v["all_reduce_count"] == 1 and v["fan_outs"] == {"θ": v["P"]}

    tables = "\n".join(_outputs(nb, "text/markdown"))
    for value in [*expected_local, full, np.mean(uneven_local)]:
        shown = f"{value:.1f}" if value == int(value) else f"{value:g}"
        assert f"={shown}$" in tables
    assert v["type(averaging_widget).__name__"] == "LiveWidget"
