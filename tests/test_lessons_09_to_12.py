"""Lessons 9-12 run headless from a fresh kernel, compute what they state (every number they show
is checked here), and leave live widgets and readable pictures."""

from __future__ import annotations

import pytest
from notebook_runner import lesson, output_texts, run_lesson

pytestmark = pytest.mark.slow

SMALLEST_TEXT = (
    "__import__('chainrule.course.widgets.live_widget', fromlist=['_']).smallest_text_px({})"
)


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
        "[(op, P, *row) for (op, P), row in ring_rows.items()]",
        "remedy_runs",
        "{rows: {r: list(m) for r, m in moved.items()} for rows, moved in remedy_bytes.items()}",
        "[(rows, fewer(m, sum), fewer(m, lambda m: m[0])) for rows, m in remedy_bytes.items()]",
        "[I_R, J_R, K_R]",
        "(setattr(matmul_widget.controls['a'], 'value', 'Replicate()'), "
        "setattr(matmul_widget.controls['then'], 'value', 'as computed'), "
        "setattr(matmul_widget.controls['world_size'], 'value', 4), "
        "setattr(matmul_widget.controls['log2_rows'], 'value', 6), "
        "[(r.name, r.bytes_forward, r.bytes_backward, r.checked, r.error) "
        "for r in matmul_widget.last_result.remedies], "
        "'Fewer bytes per step: <b>reduce C</b>' in matmul_widget.table.value, "
        "setattr(matmul_widget.controls['log2_rows'], 'value', 14), "
        "'Fewer bytes per step: <b>gather B</b>' in matmul_widget.table.value)[4:]",
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
        "1: local, B fans out (data parallel)": [0, 2 * per_rank],
        "1: local, A fans out (column-parallel)": [0, 2 * per_rank],
        "2: A by rows, gather B (fanned out)": [per_rank, per_rank],
        "2: A replicated, gather B": [per_rank, 0],
        "2: A replicated, slice A, all-reduce C": [2 * per_rank, per_rank],
        "3: partial sums, then reduce-scatter": [per_rank, per_rank],
        "3: partial sums, then all-reduce": [2 * per_rank, 0],
    }
    # A reduce-scatter of the partial C halves the forward bytes, not the step's.
    steps = {k: sum(b) for k, b in v["case_bytes"].items()}
    reduced = ("3: partial sums, then reduce-scatter", "3: partial sums, then all-reduce")
    assert steps[reduced[0]] == steps[reduced[1]]
    # The ring, counted message by message: P − 1 steps and (P−1)/P·N per rank for a gather or
    # a reduce-scatter, twice both for an all-reduce; the same as the model and the trace.
    ring = v["[(op, P, *row) for (op, P), row in ring_rows.items()]"]
    assert {(op, P) for op, P, *_ in ring} == {
        (op, P) for op in ("all_gather", "reduce_scatter", "all_reduce") for P in (2, 3, 4, 8)
    }
    for op, P, taken, model_steps, sent, model, traced, gap in ring:
        times = 2 if op == "all_reduce" else 1
        assert taken == model_steps == times * (P - 1), (op, P)
        assert sent == [times * (P - 1) / P * 48 * 8] * P, (op, P)
        assert model == traced == sent[0] and gap < 1e-12, (op, P)
    # Case 2's two remedies, run: values and both gradients, and the bytes each pass moved.
    I, J, K = v["[I_R, J_R, K_R]"]
    f = 3 / 4 * 8  # P = 4, float64
    expected = {
        "gather B": [[["all_gather"], []], [f * J * K, 0]],
        "reduce C": [[["all_reduce"], ["all_gather"]], [2 * f * I * K, f * I * J]],
    }
    for remedy, (ops_seen, traced, counted, error) in v["remedy_runs"].items():
        assert [ops_seen, traced] == expected[remedy] and counted == traced, remedy
        assert error < 1e-12, remedy
    moved = v[fetch[12]]
    for rows, by_remedy in moved.items():
        rows = int(rows)
        assert by_remedy["gather B"] == [per_rank, 0]
        assert by_remedy["reduce C"] == [2 * per_rank * rows / 4096, per_rank * rows / 4096]
    assert v[fetch[13]] == [
        [256, "reduce C", "reduce C"],  # few rows: the partial result is small
        [1536, "gather B", "reduce C"],  # the forward alone points the wrong way
        [16384, "gather B", "gather B"],
    ]
    widget_remedies, reduce_fewer, _, gather_fewer = v[fetch[15]]
    f32 = 3 / 4 * 4  # the widget: P = 4, float32, A 64 × 1024, B 1024 × 1024
    assert widget_remedies == [
        ["gather B", f32 * 1024 * 1024, 0, True, 0.0],
        ["reduce C", 2 * f32 * 64 * 1024, f32 * 64 * 1024, True, 0.0],
    ]
    assert reduce_fewer and gather_fewer
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
    prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "lesson 12" not in prose.split("### What a collective moves")[0]  # taught before use
    assert "row-parallel" in prose and "halves the forward" in prose


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
        "{str(k): v for k, v in layer_memory.items()}",
        "norm_ranks",
        "{str(k): v for k, v in gamma_extra.items()}",
        "(D, sorted(reference))",
    ]
    nb, v = run_lesson(lesson(11), fetch)
    markdown = "\n".join(output_texts(nb, "text/markdown"))
    # Korthikanti et al.'s count for a GPT-3 layer: sbh(10 + 24/t + 5as/(ht)), 10sbh replicated
    h, a = 12288, 96
    layers = {tuple(int(n) for n in k.strip("()").split(", ")): m for k, m in v[fetch[7]].items()}
    for (t, s), m in layers.items():
        assert m["total"] == pytest.approx(s * h * (10 + 24 / t + 5 * a * s / (h * t)))
        assert m["replicated"] == 10 * s * h
        assert m["share"] == pytest.approx(10 * s * h / m["total"])
        assert m["sequence parallel"] == pytest.approx(s * h / t * (34 + 5 * a * s / h))
    assert layers[(8, 2048)]["share"] == pytest.approx(10 / 23)  # 5as/(ht) = 10 at t = 8
    assert layers[(8, 8192)]["share"] < layers[(8, 2048)]["share"] < 0.5  # not most; falls with s
    shares = [layers[(t, 2048)]["share"] for t in (1, 2, 4, 8)]
    assert shares == sorted(shares)  # grows with t
    assert layers[(8, 2048)]["share, scores recomputed"] == pytest.approx(10 / 13)
    assert "replicated part is 43% of the layer's" in markdown and "falls to 19%" in markdown
    assert "77% at $t = 8$" in markdown and "from 552 to 342 MiB" in markdown
    # the norm's weight: each rank's gradient is a partial sum, the all-reduce makes it whole
    for before, after in v["norm_ranks"]:
        assert before > 0.5 and after < 1e-12
    D, gradients = v[fetch[10]]
    assert "gamma" in gradients  # the block's error covers γ's gradient
    assert v["split_all_reduce_error"] == 0.0
    results = v[fetch[1]]
    assert len(results) >= 4
    for key, (error, forward, backward, fwd_bytes, bwd_bytes) in results.items():
        assert error < 1e-12, key
        if "sequence" in key:
            assert forward == ["all_gather", "reduce_scatter"], key
            assert backward == ["all_gather", "reduce_scatter", "all_reduce"], key  # + γ's
            twin = results[key.replace("sequence parallel", "tensor parallel")]
            P = int(key.strip("()").split(", ")[1])
            assert fwd_bytes == twin[3], key  # the same bytes forward
            assert bwd_bytes == twin[4] + 2 * (P - 1) / P * D * 8, key  # and γ's all-reduce
        else:
            assert forward == backward == ["all_reduce"], key
    for key, extra in v[fetch[9]].items():
        P = int(key.strip("()").split(", ")[1])
        assert extra == 2 * (P - 1) / P * D * 8, key
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

    from chainrule.costs import comm_cost as cc

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
