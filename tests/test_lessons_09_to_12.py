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
        "{k: (f.alpha, f.bandwidth, f.median_relative_error, f.max_relative_error) "
        "for k, f in fits.items()}",
        "step_check",
        "(step_widget.last_result.tokens, step_widget.last_result.hidden, "
        "step_widget.last_result.world_size, "
        "{k: step_widget.last_result.total_bytes(k) for k in step_widget.last_result.rows}, "
        "step_widget.last_result.seconds)",
        SMALLEST_TEXT.format("fit_picture"),
        "scaling",
        "a2a_links",
        "works",
        "rs_over_ar",
        "(ALPHA, BANDWIDTH, GRADIENTS, ONE_RANK_COMPUTE)",
    ]
    nb, v = run_lesson(lesson(12), fetch)
    import statistics

    from chainrule import comm_cost as cc

    markdown = "\n".join(output_texts(nb, "text/markdown"))
    factors = v["factors"]
    for P, f in factors.items():
        P = int(P)
        assert f["all_reduce"] == pytest.approx(2 * (P - 1) / P)
        assert f["all_gather"] == f["reduce_scatter"] == pytest.approx((P - 1) / P)
    # more ranks: the latency term grows linearly, compute per rank shrinks, the share grows
    alpha, bandwidth, N, compute = v[fetch[12]]
    scaling = {int(P): s for P, s in v["scaling"].items()}
    for P, s in scaling.items():
        assert s["latency"] == pytest.approx(2 * (P - 1) * alpha)
        assert s["transfer"] == pytest.approx(2 * (P - 1) / P * N / bandwidth)
        assert s["transfer"] < 2 * N / bandwidth
        assert s["compute"] == pytest.approx(compute / P)
        assert f"| {P} | {s['latency'] * 1e3:.2f} | {s['transfer'] * 1e3:.2f} |" in markdown
    shares = [scaling[P]["share"] for P in sorted(scaling)]
    assert shares == sorted(shares) and shares[0] < 0.01 and shares[-1] > 0.9
    largest = scaling[1024]
    assert f"{largest['latency'] / largest['compute']:.0f} times the compute" in markdown
    # the all-to-all: the switch's link carries (P−1)/P·N, a ring's P/8·N, a torus's √P/8·N
    for P, links in v["a2a_links"].items():
        P = int(P)
        assert links["switch"] == pytest.approx((P - 1) / P)
        assert links["ring"] == pytest.approx(P / 8) and links["torus"] == pytest.approx(P**0.5 / 8)
    assert v["a2a_links"]["64"]["ring"] / v["a2a_links"]["64"]["switch"] > 8
    # gloo: what it runs (exact), and the measurements
    assert v["works"] == {
        "all_reduce": [["all_reduce", [3072]]],
        "all_gather": [["all_gather", [1024]]],
        "reduce_scatter": [["all_reduce", [1024]]] * 3,  # P all-reduces, one per slice
        "reduce_scatter_single": [["all_reduce", [3072]]],  # one of the whole tensor
    }
    measured = v[fetch[1]]
    assert v["FULL_SWEEP"] is False
    assert len(measured) == v[fetch[2]] == 36
    assert {(op, P) for op, P, _, _ in measured} == {
        (op, P) for op in ("all_reduce", "all_gather", "reduce_scatter") for P in (2, 3, 4)
    }
    assert all(seconds > 0 for *_, seconds in measured)
    # the ring fits: only the two rings, their errors as the lesson's own fit computes them
    rows = [cc.Measurement(*m) for m in measured]
    fits = v[fetch[4]]
    assert set(fits) == {"all_reduce", "all_gather"}  # no ring bandwidth for gloo's reduce-scatter
    for op, (alpha_fit, bandwidth_fit, median_error, max_error) in fits.items():
        again = cc.fit(rows, op)
        assert (alpha_fit, bandwidth_fit) == pytest.approx((again.alpha, again.bandwidth))
        assert (median_error, max_error) == pytest.approx(
            (again.median_relative_error, again.max_relative_error)
        )
        good = median_error <= 0.10 and max_error <= 0.25
        name = op.replace("_", "-")
        verdict = f"{median_error:.0%} (median) and {max_error:.0%} (largest)"
        assert f"{name}'s fitted model" in markdown and verdict in markdown
        # "a fit" only where the error allows it
        assert (f"{verdict}: not a fit" in markdown) is (not good)
        assert f"| {name} | {alpha_fit * 1e6:.0f} | {bandwidth_fit / 1e9:.3g} |" in markdown
    # reduce-scatter against all-reduce, the same N: P all-reduces cost at least one; on a busy
    # machine a single ratio can fall below 1, their median cannot
    ratios = {int(P): r for P, r in v["rs_over_ar"].items()}
    seconds = {(op, P, n): t for op, P, n, t in measured}
    for P, r in ratios.items():
        sizes = sorted(n for op, p, n in seconds if op == "all_reduce" and p == P)
        assert r == pytest.approx(
            [seconds[("reduce_scatter", P, n)] / seconds[("all_reduce", P, n)] for n in sizes]
        )
    assert statistics.median(x for r in ratios.values() for x in r) > 1.0
    assert v["step_check"] == {
        "data parallel": [6144, 6144],  # 2·(3/4)·(8·8·32·2)·8 bytes: the weights' gradients
        "tensor parallel": [3072, 3072],  # 2 all-reduces of 16×8 float64
        "sequence parallel": [3072, 3072],  # the same bytes in four halves
    }
    tokens, hidden, P, total, seconds_step = v[fetch[6]]
    f = (P - 1) / P
    assert total["data parallel"] == 2 * f * 8 * hidden * hidden * 2
    assert total["tensor parallel"] == total["sequence parallel"] == 4 * f * tokens * hidden * 2
    assert all(s > 0 for s in seconds_step.values())
    assert v[fetch[7]] >= 9
    assert _images(nb) == 1  # the fit; the widget draws its own bars
