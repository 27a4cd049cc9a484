"""Lesson 13 (ZeRO and fully sharded data parallelism) runs headless from a fresh kernel,
computes what it states (every number it shows is checked here), and leaves a live widget and
a readable picture."""

from __future__ import annotations

import numpy as np
import pytest
from chainrule import zero
from notebook_runner import lesson, output_texts, run_lesson

pytestmark = pytest.mark.slow

SMALLEST_TEXT = "__import__('chainrule.widgets.live_widget', fromlist=['_']).smallest_text_px({})"


def test_lesson_13_zero_and_fully_sharded_data_parallelism():
    fetch = [
        "paper_rows",
        "(PSI, layout.padded, layout.chunk, layout_rows)",
        "stage3_ops",
        "(GATHER_TEXT := (str(zero.GATHER), zero.GATHER.forward_text, zero.GATHER.backward_text))",
        "memory_check",
        "comm_rows",
        "gloo_bytes",
        "train_errors",
        "(ref_losses, GLOO, gloo_errors, GLOO_TOLERANCE, roundings, update_size)",
        "(memory_widget.last_result.psi, memory_widget.last_result.world_size, "
        "[memory_widget.last_result.total(s) for s in zero.STAGES], "
        "[memory_widget.last_result.sent_bytes(s) for s in zero.STAGES])",
        SMALLEST_TEXT.format("memory_picture"),
    ]
    nb, v = run_lesson(lesson(13), fetch)
    psi, P = 7.5e9, 64
    paper = {int(s): sum(parts) for s, parts in v["paper_rows"].items()}
    assert paper == pytest.approx(
        {0: 16 * psi, 1: 4 * psi + 12 * psi / P, 2: 2 * psi + 14 * psi / P, 3: 16 * psi / P}
    )
    parts = {int(s): p for s, p in v["paper_rows"].items()}
    assert parts[0] == [2 * psi, 2 * psi, 12 * psi]
    assert parts[1] == pytest.approx([2 * psi, 2 * psi, 12 * psi / P])
    assert parts[2] == pytest.approx([2 * psi, 2 * psi / P, 12 * psi / P])
    assert parts[3] == pytest.approx([2 * psi / P, 2 * psi / P, 12 * psi / P])

    psi_small, padded, chunk, layout_rows = v[fetch[1]]
    assert psi_small == 419 and all(psi_small % p for p in range(2, psi_small))  # prime
    assert (padded, chunk) == (420, 105)
    assert layout_rows == [[p, f"[{105 * p}, {105 * (p + 1)})", int(p == 3)] for p in range(4)]

    layer_backward = ["all_gather", "reduce_scatter"]
    assert v["stage3_ops"] == {
        "resharded (FSDP's default)": ["all_gather"] * 3 + layer_backward * 3,
        "kept from the forward": ["all_gather"] * 3 + ["reduce_scatter"] * 3,
    }
    assert v[fetch[3]] == ["Shard(0) → Replicate(), fanned out", "all-gather", "reduce-scatter"]

    memory = v["memory_check"]
    largest_layer = 16 * 16 + 16  # 272 elements, float64, padded to a multiple of P
    for s, by_p in memory.items():
        for p, (measured, model, gathered) in by_p.items():
            assert measured == model, (s, p)  # the arrays hold what the model says
            assert gathered == (8 * (-(-largest_layer // int(p)) * int(p)) if s == "3" else 0)
        ranks = sorted(by_p, key=int)
        if s == "0":
            assert all(abs(by_p[p][0] - 24 * 419) <= 24 * 8 for p in ranks)  # flat in P
        else:
            states = [by_p[p][0] for p in ranks]
            assert states == sorted(states, reverse=True) and states[0] > states[-1], s
    for p in ("2", "3", "4", "6", "8"):
        at = [memory[s][p][0] for s in ("0", "1", "2", "3")]
        assert at == sorted(at, reverse=True) and len(set(at)) == 4
    assert memory["3"]["8"][2] > memory["3"]["8"][0]  # the gathered layer dominates at P = 8

    f = 3 / 4
    assert v["comm_rows"] == [
        [0, "backward: all-reduce of g", f"{2 * f:.4g}", "1"],
        [1, "step: reduce-scatter of g; step: all-gather of θ", f"{2 * f:.4g}", "1"],
        [2, "step: reduce-scatter of g; step: all-gather of θ", f"{2 * f:.4g}", "1"],
        [3, "forward: all-gather of θ; backward: all-gather of θ; backward: reduce-scatter of g",
         f"{3 * f:.4g}", "1.5"],
    ]  # fmt: skip

    ref_losses, gloo, gloo_errors, tolerance, roundings, update_size = v[fetch[8]]
    layers = zero.mlp([5, 16, 16, 3])
    rng = np.random.default_rng(1)
    params = zero.init_params(layers, rng)
    batches = [(rng.standard_normal((24, 5)), rng.standard_normal((24, 3))) for _ in range(4)]
    losses, _ = zero.train_one_process(layers, params, batches, 0.2, 0.8)
    assert ref_losses == pytest.approx(losses, rel=1e-12) and ref_losses[-1] < ref_losses[0]
    params32 = [[a.astype(np.float32) for a in layer] for layer in params]
    batches32 = [(x.astype(np.float32), y.astype(np.float32)) for x, y in batches]
    _, trained32 = zero.train_one_process(layers, params32, batches32, 0.2, 0.8)
    moved = max(
        float(np.abs(a - b).max())
        for la, lb in zip(trained32, params32, strict=True)
        for a, b in zip(la, lb, strict=True)
    )
    assert update_size == pytest.approx(moved)
    assert len(v["train_errors"]) == 16
    for key, (param_error, loss_error) in v["train_errors"].items():
        assert param_error < 1e-12 and loss_error < 1e-12, key
    assert tolerance == 1e-5 and roundings == pytest.approx(1e-5 * 2**24)
    assert update_size > 100 * tolerance  # a wrong reduction would show
    if gloo:
        three = 2 / 3
        elements = {"0": 420, "1": 420, "2": 420}
        for s, (ops, traced, model) in v["gloo_bytes"].items():
            assert traced == model, s
            if s == "3":  # layers of 96, 272, 51 elements, padded to multiples of 3
                assert ops == ["all_gather"] * 3 + layer_backward * 3
                assert traced == pytest.approx(3 * three * 8 * (96 + 273 + 51))
            else:
                assert ops == (["all_reduce"] if s == "0" else ["reduce_scatter", "all_gather"])
                assert traced == pytest.approx(2 * three * 8 * elements[s])
        assert set(gloo_errors) == {"0", "1", "2", "3"}
        assert all(0 <= e < tolerance for e in gloo_errors.values())

    widget_psi, widget_p, totals, sent = v[fetch[9]]
    assert (widget_psi, widget_p) == (7.5e9, 64)
    assert totals == pytest.approx(list(paper.values()))
    f64 = 63 / 64
    assert sent == pytest.approx([2 * f64 * 2 * 7.5e9] * 3 + [3 * f64 * 2 * 7.5e9])
    assert v[fetch[10]] >= 9
    assert len(output_texts(nb, "image/png")) == 1  # the memory picture; the widget draws its own
    markdown = "\n".join(output_texts(nb, "text/markdown"))
    assert "def reduce_gradients" in markdown and "def resharded_layer" in markdown
