"""Lessons 4-7: stored clean, run headless from a fresh kernel in under a minute, compute the
numbers the syllabus states, and leave live widgets that respond to their controls."""

from __future__ import annotations

import re
from fractions import Fraction

import nbformat
import numpy as np
import pytest
from notebook_runner import REPO, markdown_text, output_texts, run_lesson

COURSE = REPO / "course"
LESSONS = {
    "exactness": COURSE / "04_where_exactness_breaks.ipynb",
    "accumulation": COURSE / "05_gradient_accumulation.ipynb",
    "duality": COURSE / "06_duality_table.ipynb",
    "graph": COURSE / "07_distributed_graph.ipynb",
}
EXERCISES = sorted(p.name for p in (REPO / "source" / "check_yourself").glob("ex*.ipynb"))
TOKENS = (900, 300)  # the syllabus's given token counts
WORKED_EXAMPLES = [(1, 0), (2, 1), (3, 1), (4, 2)]  # the syllabus's given examples, with w = 1


def _outputs(nb: nbformat.NotebookNode, mime: str) -> str:
    return "\n".join(output_texts(nb, mime))


_markdown = markdown_text


def _images(nb: nbformat.NotebookNode) -> int:
    return sum(
        "image/png" in output.get("data", {})
        for cell in nb.cells
        for output in cell.get("outputs", [])
    )


# -- stored form -------------------------------------------------------------------------------


def test_the_lessons_point_to_the_exercises_of_their_topics():
    def targets(key):
        return set(re.findall(r"check_yourself/(ex\d)_", _markdown(LESSONS[key])))

    assert targets("exactness") == {"ex2", "ex3"}
    assert targets("duality") == {"ex4", "ex5"}
    assert "ex1" in targets("accumulation") and "ex1" in targets("graph")


def test_lessons_say_which_backend_real_processes_use():
    code = "\n".join(
        c.source
        for c in nbformat.read(LESSONS["graph"], as_version=4).cells
        if c.cell_type == "code"
    )
    assert "dist.available_backends()" in code and "backend=real_backend" in code


# -- executed -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_lesson_4_where_exactness_breaks():
    fetch = [
        "[str(w) for w in weights.naive]",
        "str(weights.exact)",
        "[str(r) for r in weights.relative]",
        "token_errors",
        "forward_change",
        "gaps",
        "norm_errors",
        "torch_norm",
        "clipped_on_ranks[0][1]",
        "cosine",
        "dropout_error",
        "{k: v[0] for k, v in epoch_results.items()}",
        "reference_w",
        "len(set(sums.values()))",
        "bits",
        "float(drift_same.divergence.max())",
        "float(drift_own.divergence[-1])",
        "drift_same.first_divergent_step",
        "(setattr(token_widget.controls['T_1'], 'value', 900), "
        "[str(w) for w in token_widget.last_result.naive])[1]",
        "(setattr(drift_widget.controls['world_size'], 'value', 2), "
        "drift_widget.last_result[1].first_divergent_step)[1]",
    ]
    nb, v = run_lesson(LESSONS["exactness"], fetch)
    values = [v[name] for name in fetch]
    naive, exact, relative, token_errors = values[:4]
    P, total = len(TOKENS), sum(TOKENS)
    assert naive == [str(Fraction(1, P * t)) for t in TOKENS]
    assert exact == str(Fraction(1, total))
    assert relative == [str(Fraction(total, P * t)) for t in TOKENS]
    assert token_errors["plain mean of local means"] > 1e-3
    assert token_errors["token-weighted, by hand"] < 1e-12
    assert token_errors["token-weighted, data_parallel"] < 1e-12

    forward_change, gaps, norm_errors = values[4:7]
    assert forward_change["batch_norm"] > 0.1 and forward_change["rms_norm"] < 1e-12
    assert min(gaps["batch_norm"][1:]) > 1e-3 and max(gaps["rms_norm"]) < 1e-12
    assert norm_errors["local batch norm"] > 1e-3
    assert norm_errors["synchronised batch norm"] < 1e-12 and norm_errors["RMSNorm"] < 1e-12

    torch_norm, ranks_norm, cosine = values[7:10]
    assert ranks_norm == pytest.approx(torch_norm, abs=1e-12) and cosine < 0.99

    dropout_error, epoch_ws, reference_w = values[10:13]
    assert "already returned" in dropout_error
    for ws in epoch_ws.values():
        assert ws[0] == ws[1] == pytest.approx(reference_w, abs=1e-12)

    distinct_sums, bits, same_max, own_last, same_first = values[13:18]
    assert distinct_sums > 1
    assert len(set(bits["True"])) == 1 and len(set(bits["False"])) > 1
    assert same_max == 0.0 and same_first is None and own_last > 0

    token_widget_after, drift_widget_after = values[18:20]
    assert token_widget_after == [str(Fraction(1, P * TOKENS[0]))] * 2
    assert drift_widget_after is None  # two ranks: a + b = b + a, no drift

    markdown = _outputs(nb, "text/markdown")
    assert "| Situation | What goes wrong | Fix |" in markdown
    assert "already returned" in _outputs(nb, "text/plain")
    assert _images(nb) >= 5


@pytest.mark.slow
def test_lesson_5_gradient_accumulation():
    fetch = [
        "{k: c.max_error for k, c in checks.items()}",
        "torch_diff",
        "forgot_ratio",
        "K_TORCH",
        "FP16_MAX",
        "S",
        "float(np.abs(pool).max())",
        "fp16.overflow_after",
        "fp16.overflow_first",
        "fp16.error_first",
        "[bool(np.isfinite(v)) for v in after16]",
        "[bool(np.isfinite(v)) for v in first16]",
        "traffic",
        "(setattr(fp16_widget.controls['log2_scale'], 'value', 8), "
        "fp16_widget.last_result.overflow_after)[1]",
    ]
    nb, v = run_lesson(LESSONS["accumulation"], fetch)
    values = [v[name] for name in fetch]
    checks, torch_diff, forgot_ratio, k = values[:4]
    assert set(checks) == {"1", "2", "4", "8"} and max(checks.values()) < 1e-12
    assert torch_diff < 1e-12 and forgot_ratio == pytest.approx(k, abs=1e-9)

    fp16_max, scale, peak, overflow_after, overflow_first, error_first = values[4:10]
    assert fp16_max == float(np.finfo(np.float16).max)
    assert scale * peak <= fp16_max < 2 * scale * peak
    assert overflow_after is not None and overflow_first is None and error_first < 1e-3
    after_finite, first_finite = values[10:12]
    assert not all(after_finite) and all(first_finite)

    traffic, widget_overflow = values[12:14]
    assert traffic == {str(k): [k, 1] for k in (1, 2, 4, 8)}
    assert widget_overflow is None  # a small loss scale never overflows
    assert _images(nb) >= 2


@pytest.mark.slow
def test_lesson_6_duality_table():
    from chainrule.duality import DUALITY_TABLE, duality_table_markdown

    fetch = [
        "row_checks",
        "{str(k): v for k, v in gather_ratio.items()}",
        "tp_errors",
        "(setattr(duality_widget.controls['key'], 'value', 'split'), "
        "duality_widget.last_result.backward_collectives)[1]",
    ]
    nb, v = run_lesson(LESSONS["duality"], fetch)
    row_checks, gather_ratio, tp_errors, widget_backward = (v[name] for name in fetch)
    assert set(row_checks) == {row.key for row in DUALITY_TABLE}
    expected_backward = {
        "identity": ["all_reduce"],
        "all_reduce": [],
        "all_gather": ["reduce_scatter"],
        "reduce_scatter": ["all_gather"],
        "all_to_all": ["all_to_all"],
        "split": ["all_gather"],
        "all_gather_replicated": [],
    }
    for key, (forward, backward, out_error, grad_error, seen) in row_checks.items():
        assert forward == pytest.approx(backward, rel=1e-12, abs=1e-12)
        assert out_error < 1e-12 and grad_error < 1e-12
        assert seen == expected_backward[key]
    assert gather_ratio["('per-rank', 'reduce-scatter')"] == pytest.approx(1.0)
    assert gather_ratio["('replicated', 'split')"] == pytest.approx(1.0)
    assert gather_ratio["('replicated', 'reduce-scatter')"] == pytest.approx(3.0)
    for world in ("1", "2", "4"):
        assert tp_errors[world] < 1e-12
    assert min(tp_errors[k] for k in tp_errors if k.startswith("without")) > 1e-3
    assert widget_backward == ["all_gather"]
    assert duality_table_markdown(include_additions=False) in _outputs(nb, "text/markdown")
    assert _images(nb) >= 1 + len(DUALITY_TABLE)


@pytest.mark.slow
def test_lesson_7_distributed_graph():
    fetch = [
        "float(global_step.theta.grad)",
        "[float(P * c.grad) for c in global_step.copies]",
        "slice_grads",
        "backends",
        "real_backend",
        "on_processes",
        "on_simulated",
        "single_process",
        "mlp_gaps",
    ]
    nb, v = run_lesson(LESSONS["graph"], fetch)
    theta_grad, local, slice_grads, backends, real_backend = (v[name] for name in fetch[:5])
    on_processes, on_simulated, single_process, mlp_gaps = (v[name] for name in fetch[5:])

    def local_gradient(examples):
        return float(np.mean([(x - y) * x for x, y in examples]))  # (wx − y)x at w = 1

    rank_examples = [WORKED_EXAMPLES[:2], WORKED_EXAMPLES[2:]]
    full = local_gradient(WORKED_EXAMPLES)
    assert local == [pytest.approx(local_gradient(e)) for e in rank_examples]
    assert theta_grad == pytest.approx(full)
    assert slice_grads == [pytest.approx(full)] * 2
    assert real_backend in backends and ("nccl" in backends) == (real_backend == "nccl")
    assert on_processes == on_simulated
    assert [p[0] for p in on_processes] == [pytest.approx(local_gradient(e)) for e in rank_examples]
    assert [p[1] for p in on_processes] == [pytest.approx(full)] * 2
    assert single_process == pytest.approx(full)
    assert max(mlp_gaps.values()) < 1e-14
    assert f"real processes will use: {real_backend}" in _outputs(nb, "text/plain")
    assert _images(nb) >= 2
