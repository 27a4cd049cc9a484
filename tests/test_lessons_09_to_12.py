"""Lessons 9-12 run headless from a fresh kernel, compute what they state (every number they show
is checked here), and leave live widgets and readable pictures."""

from __future__ import annotations

import pytest
from notebook_runner import lesson, output_texts, run_lesson

pytestmark = pytest.mark.slow

SMALLEST_TEXT = "__import__('chainrule.widgets.live_widget', fromlist=['_']).smallest_text_px({})"


def _images(nb) -> int:
    return len(output_texts(nb, "image/png"))


# Every transition's collectives, as the course states them: (forward, backward).
TRANSITIONS = {
    "Partial() → Replicate()": ("all-reduce", "none"),
    "Partial() → Replicate(), fanned out": ("all-reduce", "all-reduce"),
    "Shard(0) → Replicate()": ("all-gather", "none"),
    "Shard(1) → Replicate(), fanned out": ("all-gather", "reduce-scatter"),
    "Partial() → Shard(1)": ("reduce-scatter", "all-gather"),
    "Replicate() → Shard(0)": ("none", "all-gather"),
    "Shard(0) → Shard(1)": ("all-to-all", "all-to-all"),
    "Replicate() → Replicate(), fanned out": ("none", "all-reduce"),
    "Replicate() → Replicate()": ("none", "none"),
}


def test_lesson_9_placements_and_the_sharded_matmul():
    fetch = [
        "{k: bool((v[1] == M).all()) for k, v in placements_shown.items()}",
        "transition_rows",
        "transition_checks",
        "[(r[0], r[1], r[2]) for r in matmul_rows]",
        "{f'{a} · {b}': e for (a, b), e in matmul_errors.items()}",
        "case_bytes",
        "bytes_agree",
        "[(str(a.case), a.output_error, a.gradient_error) for a in dtensor_agreement]",
        "(setattr(matmul_widget.controls['b'], 'value', 'Shard(1)'), "
        "matmul_widget.last_result.plan.case, matmul_widget.last_result.plan.remedy)[1:]",
        "(setattr(matmul_widget.controls['a'], 'value', 'Shard(1)'), "
        "setattr(matmul_widget.controls['b'], 'value', 'Shard(0)'), "
        "setattr(matmul_widget.controls['then'], 'value', 'Shard(0)'), "
        "matmul_widget.last_result.seen_forward, matmul_widget.last_result.seen_backward, "
        "matmul_widget.last_result.error)[3:]",
    ]
    nb, v = run_lesson(lesson(9), fetch)
    assert v[fetch[0]] == dict.fromkeys(["Replicate()", "Shard(0)", "Shard(1)", "Partial()"], True)
    rows = {name: (forward, backward) for name, forward, _, backward in v["transition_rows"]}
    assert len(rows) == 16
    for name, expected in TRANSITIONS.items():
        assert rows[name] == expected, name
    assert set(v["transition_checks"]) == set(rows)
    for name, (forward, backward, seen) in v["transition_checks"].items():
        assert forward == pytest.approx(backward, rel=1e-10, abs=1e-12) and seen, name
    cases = {(a, b): case for a, b, case in v[fetch[3]]}
    assert cases[("Shard(0)", "Replicate()")] == cases[("Replicate()", "Shard(1)")] == "local"
    assert cases[("Shard(1)", "Replicate()")] == "all-gather first"
    assert cases[("Shard(1)", "Shard(0)")] == "partial sums"
    assert cases[("Shard(0)", "Shard(1)")] == "invalid"
    assert sum(c != "invalid" for c in cases.values()) == len(v[fetch[4]]) == 10
    assert max(v[fetch[4]].values()) < 1e-12
    MiB = 1 << 20
    per_rank = 3 / 4 * 64 * MiB / MiB  # P = 4, 4096² float32
    assert v["case_bytes"] == {
        "local, B fans out (data parallel)": [0, 2 * per_rank],
        "local, A fans out (column-parallel)": [0, 2 * per_rank],
        "all-gather B first, C sharded": [per_rank, per_rank],
        "partial sums, then reduce-scatter": [per_rank, per_rank],
        "partial sums, then all-reduce": [2 * per_rank, 0],
    }
    assert len(v["bytes_agree"]) == 10
    assert all(planned == traced for planned, traced in v["bytes_agree"].values())
    agreement = v[fetch[7]]
    assert len(agreement) == 16 and max(max(o, g) for _, o, g in agreement) < 1e-12
    case, remedy = v[fetch[8]]
    assert case == "invalid" and "all-gather" in remedy
    seen_forward, seen_backward, error = v[fetch[9]]
    assert (seen_forward, seen_backward) == (["reduce_scatter"], ["all_gather"]) and error < 1e-12
    markdown = "\n".join(output_texts(nb, "text/markdown"))
    assert "def redistribute" in markdown  # the mechanism on the page
    assert _images(nb) == 0  # the widget draws the blocks


def test_lesson_10_tensor_parallelism():
    fetch = [
        "mlp_errors",
        "attention_errors",
        "fan_out_each_error",
        "fan_out_each_backward",
        "layer_bytes",
        "TOKENS * D * 8",
        "{k: [(s.name, s.placement, s.forward, s.backward) for s in v] "
        "for k, v in block_stages.items()}",
        SMALLEST_TEXT.format("block_picture"),
    ]
    nb, v = run_lesson(lesson(10), fetch)
    for errors in (v["mlp_errors"], v["attention_errors"]):
        assert {"sim, P = 1", "sim, P = 2", "sim, P = 4"} <= set(errors)
        for error, forward, backward in errors.values():
            assert max(error.values()) < 1e-12
            assert forward == backward == ["all_reduce"]
        assert set(next(iter(errors.values()))[0]) >= {"y", "x"}
    assert v["fan_out_each_error"] < 1e-12
    assert v["fan_out_each_backward"] == ["all_reduce"] * 3
    activation = v["TOKENS * D * 8"]
    for forward, backward, forward_bytes, backward_bytes in v["layer_bytes"].values():
        assert forward == backward == ["all_reduce"]
        assert forward_bytes == backward_bytes == {"all_reduce": 2 * 3 / 4 * activation}
    stages = v[fetch[6]]
    assert [s[1] for s in stages["MLP"]] == ["Replicate", "Shard(1)", "Partial", "Replicate"]
    assert stages["MLP"][0][2:] == ["f: identity", "all-reduce"]
    assert stages["MLP"][2][2:] == ["f̄: all-reduce", "identity"]
    assert [s[1] for s in stages["attention"]] == [
        "Replicate", "Shard(1)", "Shard(1)", "Partial", "Replicate",
    ]  # fmt: skip
    assert v[fetch[7]] >= 9
    assert _images(nb) == 1


def test_lesson_11_sequence_parallelism():
    fetch = [
        "split_all_reduce_error",
        "{str(k): v for k, v in block_results.items()}",
        "memory",
        "{str(k): v for k, v in memory_gloo.items()}",
        "[(s.name, s.placement, s.forward, s.backward) for s in dist.run(record_stages, 4)[0]]",
        SMALLEST_TEXT.format("sp_picture"),
        SMALLEST_TEXT.format("memory_picture"),
    ]
    nb, v = run_lesson(lesson(11), fetch)
    assert v["split_all_reduce_error"] == 0.0
    results = v[fetch[1]]
    assert len(results) >= 4
    for key, (error, forward, backward, fwd_bytes, bwd_bytes) in results.items():
        assert error < 1e-12, key
        if "sequence" in key:
            assert forward == backward == ["all_gather", "reduce_scatter"], key
            twin = results[key.replace("sequence parallel", "tensor parallel")]
            assert (fwd_bytes, bwd_bytes) == (twin[3], twin[4]), key  # the same bytes
        else:
            assert forward == backward == ["all_reduce"], key
    memory = v["memory"]
    tp, sp = memory["tensor parallel"], memory["sequence parallel"]
    for P in ("1", "2", "4"):
        assert tp[P] == pytest.approx(tp["1"], rel=0.01)  # replicated: the same for any P
        assert tp[P] / sp[P] == pytest.approx(int(P), rel=0.02)  # drops by P
    for key, value in v[fetch[3]].items():
        P = int(key.rstrip(")").split(", ")[-1])
        side = "tensor" if "tensor" in key else "sequence"
        assert value == pytest.approx(tp["1"] / (1 if side == "tensor" else P), rel=0.02), key
    stages = v[fetch[4]]
    assert [s[1] for s in stages] == ["Shard(0)", "Shard(0)", "Shard(1)", "Partial", "Shard(0)"]
    assert stages[1][2:] == ["all-gather", "reduce-scatter"]
    assert stages[3][2:] == ["reduce-scatter", "all-gather"]
    assert v[fetch[5]] >= 9 and v[fetch[6]] >= 9
    assert _images(nb) == 2


def test_lesson_12_communication_costs():
    fetch = [
        "factors",
        "[(m.op, m.world_size, m.nbytes, m.seconds) for m in measurements]",
        "len(SIZES) * len(WORLDS) * len(OPS)",
        "FULL_SWEEP",
        "{k: (f.alpha, f.bandwidth) for k, f in fits.items()}",
        "step_check",
        "(step_widget.last_result.tokens, step_widget.last_result.hidden, "
        "step_widget.last_result.world_size, "
        "{k: step_widget.last_result.total_bytes(k) for k in step_widget.last_result.rows}, "
        "step_widget.last_result.seconds)",
        SMALLEST_TEXT.format("fit_picture"),
    ]
    nb, v = run_lesson(lesson(12), fetch)
    factors = v["factors"]
    for P, f in factors.items():
        P = int(P)
        assert f["all_reduce"] == pytest.approx(2 * (P - 1) / P)
        assert f["all_gather"] == f["reduce_scatter"] == pytest.approx((P - 1) / P)
    measured = v[fetch[1]]
    assert v["FULL_SWEEP"] is False
    assert len(measured) == v[fetch[2]] == 36
    assert {(op, P) for op, P, _, _ in measured} == {
        (op, P) for op in ("all_reduce", "all_gather", "reduce_scatter") for P in (2, 3, 4)
    }
    assert all(seconds > 0 for *_, seconds in measured)
    for alpha, bandwidth in v[fetch[4]].values():
        assert alpha > 0 and bandwidth > 0
    assert v["step_check"] == {
        "data parallel": [6144, 6144],  # 2·(3/4)·(8·8·32·2)·8 bytes: the weights' gradients
        "tensor parallel": [3072, 3072],  # 2 all-reduces of 16×8 float64
        "sequence parallel": [3072, 3072],  # the same bytes in four halves
    }
    tokens, hidden, P, total, seconds = v[fetch[6]]
    f = (P - 1) / P
    assert total["data parallel"] == 2 * f * 8 * hidden * hidden * 2
    assert total["tensor parallel"] == total["sequence parallel"] == 4 * f * tokens * hidden * 2
    assert all(s > 0 for s in seconds.values())
    assert v[fetch[7]] >= 9
    assert _images(nb) == 1  # the fit; the widget draws its own bars
