"""Lesson 13 (ZeRO and fully sharded data parallelism) runs headless from a fresh kernel,
computes what it states (every number it shows is checked here), and leaves a live widget and
a readable picture."""

from __future__ import annotations

import numpy as np
import pytest
from chainrule.parallel import zero
from notebook_runner import lesson, output_texts, run_lesson

pytestmark = pytest.mark.slow

SMALLEST_TEXT = (
    "__import__('chainrule.course.widgets.live_widget', fromlist=['_']).smallest_text_px({})"
)


def test_lesson_13_zero_and_fully_sharded_data_parallelism():
    fetch = [
        "paper_rows",
        "(PSI, layout.padded, layout.chunk, layout_rows)",
        "stage3_ops",
        "reshard_rows",
        "(GATHER_TEXT := (str(zero.GATHER), zero.GATHER.forward_text, zero.GATHER.backward_text))",
        "memory_check",
        "(MEM_PSI, largest_bucket)",
        "comm_rows",
        "gloo_bytes",
        "train_errors",
        "(ref_losses, GLOO, gloo_errors, GLOO_TOLERANCE, roundings, update_size)",
        "(memory_widget.last_result.psi, memory_widget.last_result.world_size, "
        "[memory_widget.last_result.total(s) for s in zero.STAGES], "
        "[memory_widget.last_result.sent_bytes(s) for s in zero.STAGES])",
        SMALLEST_TEXT.format("memory_picture"),
        "fit_rows",
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
    assert v[fetch[4]] == ["Shard(0) → Replicate(), fanned out", "all-gather", "reduce-scatter"]
    # resharding, per layer from the last: θ gathered again (padded to 3), ring bytes, x and y
    assert v["reshard_rows"] == [
        [k, f"{a} → {b}", padded, f"{2 / 3 * 8 * padded:g}", 8 * 4 * (a + b)]
        for k, (a, b), padded in ((2, (16, 3), 51), (1, (16, 16), 273), (0, (5, 16), 96))
    ]

    memory = {
        int(st): {int(p): m for p, m in by_p.items()} for st, by_p in v["memory_check"].items()
    }
    mem_psi, largest = v["(MEM_PSI, largest_bucket)"]
    largest = {int(p): b for p, b in largest.items()}
    layers = zero.mlp([32, 192, 192, 192, 192, 192, 8])
    assert mem_psi == zero.num_parameters(layers) == 156_104
    ranks = (1, 2, 3, 4, 6, 8)
    for st, by_p in memory.items():
        assert sorted(by_p) == list(ranks)
        for p, (model, held, peak) in by_p.items():
            padded = sum(lay.padded for lay in zero.layouts(layers, st, p))
            assert model == sum(zero.memory_model(padded, p, st, (8, 8, 8)))
            assert 0 <= held - model < 8_000, (st, p)  # the model, plus a few kB of Python objects
            assert peak > held
        if st == 0:
            assert all(abs(by_p[p][1] - 24 * mem_psi) <= 24 * 8 + 8_000 for p in ranks)  # flat
        else:
            held_by_p = [by_p[p][1] for p in ranks]
            assert held_by_p == sorted(held_by_p, reverse=True) and held_by_p[0] > held_by_p[-1]
    for p in ranks:
        if p > 1:
            held_at = [memory[st][p][1] for st in zero.STAGES]
            assert held_at == sorted(held_at, reverse=True) and len(set(held_at)) == 4
        peak = {st: memory[st][p][2] for st in zero.STAGES}
        extra = {st: memory[st][p][2] - memory[st][p][1] for st in zero.STAGES}
        assert peak[2] < peak[1], p  # stage 2 never holds the whole gradient
        chunk = -(-mem_psi // p)
        assert 0 <= extra[0] - 8 * mem_psi < 8_000  # a second gradient-sized buffer
        assert 0 <= extra[1] - 3 * 8 * chunk < 8_000  # three chunks next to the full gradient
        bucket = largest[p]
        activations = 8 * 24 // p * sum(lay.d_in + lay.d_out for lay in layers)  # every x and y
        assert bucket <= extra[2] < bucket + bucket / p + activations + 8_000  # one bucket
        assert 2 * bucket <= extra[3] < 3 * bucket + activations  # about two layers' buffers
        assert bucket == 8 * p * -(-(192 * 192 + 192) // p)
    stage3_peaks = [memory[3][p][2] for p in ranks]
    assert stage3_peaks == sorted(stage3_peaks, reverse=True)
    assert stage3_peaks[-1] > 2 * memory[3][8][1]  # the transient dominates at P = 8

    f = 3 / 4
    assert v["comm_rows"] == [
        [0, "backward: all-reduce of g", f"{2 * f:.4g}", "1"],
        [1, "step: reduce-scatter of g; step: all-gather of θ", f"{2 * f:.4g}", "1"],
        [2, "backward: reduce-scatter of g; step: all-gather of θ", f"{2 * f:.4g}", "1"],
        [3, "forward: all-gather of θ; backward: all-gather of θ; backward: reduce-scatter of g",
         f"{3 * f:.4g}", "1.5"],
    ]  # fmt: skip

    ref_losses, gloo, gloo_errors, tolerance, roundings, update_size = v[fetch[10]]
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
        elements = {"0": 420, "1": 420}
        for s, (ops, traced, model) in v["gloo_bytes"].items():
            assert traced == model, s
            if s == "3":  # layers of 96, 272, 51 elements, padded to multiples of 3
                assert ops == ["all_gather"] * 3 + layer_backward * 3
                assert traced == pytest.approx(3 * three * 8 * (96 + 273 + 51))
            elif s == "2":  # one bucket per layer, reduce-scattered in the backward
                assert ops == ["reduce_scatter"] * 3 + ["all_gather"] * 3
                assert traced == pytest.approx(2 * three * 8 * (96 + 273 + 51))
            else:
                assert ops == (["all_reduce"] if s == "0" else ["reduce_scatter", "all_gather"])
                assert traced == pytest.approx(2 * three * 8 * elements[s])
        assert set(gloo_errors) == {"0", "1", "2", "3"}
        assert all(0 <= e < tolerance for e in gloo_errors.values())

    widget_psi, widget_p, totals, sent = v[fetch[11]]
    assert (widget_psi, widget_p) == (7.5e9, 64)
    assert totals == pytest.approx(list(paper.values()))
    f64 = 63 / 64
    assert sent == pytest.approx([2 * f64 * 2 * 7.5e9] * 3 + [3 * f64 * 2 * 7.5e9])
    assert v[fetch[12]] >= 9
    fits = {(row[0], row[1]): row[2:] for row in v["fit_rows"]}
    adam, sgd = "mixed-precision Adam", "SGD with momentum, fp32"
    for opt, per_param, unsharded in ((adam, 16, (16, 4, 2)), (sgd, 12, (12, 8, 4))):
        for st in (0, 1, 2):  # what P cannot divide already exceeds 80 GB
            assert fits[(opt, st)] == ["never", "never", f"{unsharded[st] * 70:,}"]
        exact = -(-per_param * 70 // 80)  # the smallest P with per_param · 70 GB / P ≤ 80 GB
        assert fits[(opt, 3)] == [16, exact, "0"] and exact == (14 if opt == adam else 11)
    assert len(output_texts(nb, "image/png")) == 1  # the memory picture; the widget draws its own
    markdown = "\n".join(output_texts(nb, "text/markdown"))
    assert "def reduce_gradients" in markdown and "def resharded_layer" in markdown
    assert "def bucketed_layer" in markdown and "def backward" in markdown
