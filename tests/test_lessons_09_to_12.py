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
        # compute against communication
        "[(m.flops, m.memory_bandwidth, m.link_bandwidth, m.latency) "
        "for m in (NVLINK, INFINIBAND)]",
        "roofline",
        "{f'{k[0]}|{k[1]}': v for k, v in sharded_matmul.items()}",
        "matmul_thresholds",
        "collectives_agree",
        "(P_STEP, D_STEP, T_STEP)",
        "{f'{k[0]}|{k[1]}': (s.forward, s.backward, s.comm, s.serial, s.overlapped, s.hidden, "
        "s.efficiency) for k, s in step_times.items()}",
        "hide_tokens",
        "match_width",
        SMALLEST_TEXT.format("cost_picture"),
        "{f'{k[0]} {k[1]}': r for k, r in hand_ring.items()}",
        "deadlock",
        "(step_widget.controls['world_size'].value, NVLINK.latency, NVLINK.link_bandwidth)",
        "{k: (s.math, s.comm, s.overlapped, s.hidden) "
        "for k, s in step_widget.last_result.steps.items()}",
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
        assert again.is_a_fit is good
        name = op.replace("_", "-")
        verdict = f"{median_error:.0%} (median) and {max_error:.0%} (largest)"
        assert verdict in markdown
        # "a fit" only where the error allows it: at 90% it is never called one
        assert (f"{verdict}: not a fit" in markdown) is (not good)
        assert (f"{name}'s fitted model is within {verdict}" in markdown) is good
        assert f"{name}'s least-squares model misses" in markdown or good
        errors = f"{median_error:.0%} | {max_error:.0%} | {'yes' if good else 'no'} |"
        assert (
            f"| {name} | {alpha_fit * 1e6:.0f} | {bandwidth_fit / 1e9:.3g} | {errors}" in markdown
        )
        if max_error >= 0.9:
            assert not good
    # what the measurements show without a model: the bytes sent over the time of the call
    for P in (2, 3, 4):
        n, t = max((n, t) for op, p, n, t in measured if (op, p) == ("all_reduce", P))
        bus = cc.ring_bytes("all_reduce", n, P) / t
        assert f"{bus / 1e9:.3f} GB/s on {P}" in markdown
    # reduce-scatter against all-reduce, the same N: P all-reduces cost at least one; on a busy
    # machine a single ratio can fall below 1, their median cannot
    ratios = {int(P): r for P, r in v["rs_over_ar"].items()}
    seconds = {(op, P, n): t for op, P, n, t in measured}
    for P, r in ratios.items():
        sizes = sorted(n for op, p, n in seconds if op == "all_reduce" and p == P)
        assert r == pytest.approx(
            [seconds[("reduce_scatter", P, n)] / seconds[("all_reduce", P, n)] for n in sizes]
        )
    everything = [x for r in ratios.values() for x in r]
    assert statistics.median(everything) > 1.0
    assert f"Over all 12 pairs the median ratio is {statistics.median(everything):.2f}." in markdown
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
    _lesson_12_compute_against_communication(v, markdown)
    assert v[SMALLEST_TEXT.format("cost_picture")] >= 9
    # the widget prices the collectives on the NVLink machine, not on gloo's least squares
    assert v[fetch[-2]] == [4, 3e-6, 450e9]
    tokens, hidden, P, _, seconds_step = v[fetch[6]]
    widget_steps = v[
        "{k: (s.math, s.comm, s.overlapped, s.hidden) "
        "for k, s in step_widget.last_result.steps.items()}"
    ]
    for name, (t_math, t_comm, t_step, hides) in widget_steps.items():
        assert t_math == pytest.approx(12 * tokens * hidden * 4 * hidden / P / 989e12)
        assert t_comm == pytest.approx(seconds_step[name])
        assert t_step == pytest.approx(
            t_math / 3 + max(2 * t_math / 3, t_comm) if name == "data parallel" else t_math + t_comm
        )
        assert hides is (name == "data parallel" and t_comm <= 2 * t_math / 3)
    assert _images(nb) == 2  # the fit and compute against communication; the widget draws bars


def _lesson_12_compute_against_communication(v, markdown):
    machines = v[next(k for k in v if k.startswith("[(m.flops"))]
    (F, HBM, NVL, ALPHA_NVL), (F_IB, _, IB, ALPHA_IB) = machines
    assert (F, HBM, NVL, ALPHA_NVL, IB, ALPHA_IB) == (989e12, 3.35e12, 450e9, 3e-6, 50e9, 10e-6)
    assert F_IB == F
    # the roofline: x + y does 1 FLOP per 6 bytes, a square product n/3 FLOPs per byte (bf16)
    roof = v["roofline"]
    assert roof["x + y (n = 2²⁰)"][0] == pytest.approx(1 / 6)
    for n in (64, 256, 1024, 4096, 16384):
        intensity, attained, seconds = roof[f"{n} × {n} product"]
        assert intensity == pytest.approx(n / 3)
        assert attained == pytest.approx(min(F, n / 3 * HBM))
        assert seconds == pytest.approx(max(2 * n**3 / F, 6 * n * n / HBM))
    assert "ridge of this machine is 295 FLOPs per byte" in markdown
    assert "from $n$ = 886 on" in markdown and "0.56 TFLOP/s, 0.06% of the peak" in markdown
    assert "2,198 FLOPs per byte on NVLink and 19,780 on InfiniBand" in markdown
    # the sharded matmul: the gather of W (8192², bf16) against 2·rows·8192² FLOPs, P = 8
    K = 8192
    links = {"H100 SXM, NVLink": (NVL, ALPHA_NVL), "H100 SXM, InfiniBand": (IB, ALPHA_IB)}
    for key, (t_math, t_comm, overlapped, serial) in v[
        "{f'{k[0]}|{k[1]}': v for k, v in sharded_matmul.items()}"
    ].items():
        link, rows = key.split("|")
        B, alpha = links[link]
        assert t_math == pytest.approx(2 * int(rows) * K * K / F)
        assert t_comm == pytest.approx(7 * alpha + 7 / 8 * K * K * 2 / B)
        assert overlapped == max(t_math, t_comm) and serial == pytest.approx(t_math + t_comm)
    thresholds = v["matmul_thresholds"]
    for link, (B, _) in links.items():
        assert thresholds[link] == pytest.approx(7 / 8 * F / B)
    assert "hides from 1,923 rows per rank on NVLink and from 17,308 rows" in markdown
    # the three parallelisms: collectives from the placements, times by the α–β model
    assert v["collectives_agree"] == dict.fromkeys(
        ["data parallel", "tensor parallel", "sequence parallel"], True
    )
    P, d, T = v["(P_STEP, D_STEP, T_STEP)"]
    f = 4 * d
    steps = v[next(k for k in v if k.startswith("{f'{k[0]}|{k[1]}': (s.forward"))]
    for key, (forward, backward, comm, serial, overlapped, hidden, share) in steps.items():
        link, name = key.split("|")
        B, alpha = links[link]
        assert forward == pytest.approx(4 * T * d * f / P / F)
        assert backward == pytest.approx(8 * T * d * f / P / F)
        if name == "data parallel":
            expected = 2 * (2 * (P - 1) * alpha + 2 * (P - 1) / P * d * f * 2 / B)
            assert overlapped == pytest.approx(forward + max(backward, comm))
            assert hidden is (comm <= backward)
        else:
            # two all-reduces, or four all-gathers and reduce-scatters: the same time
            expected = 4 * ((P - 1) * alpha + (P - 1) / P * T * d * 2 / B)
            assert overlapped == pytest.approx(serial) and not hidden
        assert comm == pytest.approx(expected), key
        assert serial == pytest.approx(forward + backward + comm)
        assert share == pytest.approx((forward + backward) / overlapped)
        math_ms, comm_ms = (forward + backward) * 1e3, comm * 1e3
        row = f"| {link.split(', ')[1]} | {name} | {math_ms:.2f} | {comm_ms:.2f} |"
        assert row in markdown, row
    nv, ib = "H100 SXM, NVLink", "H100 SXM, InfiniBand"
    assert steps[f"{nv}|data parallel"][5] and steps[f"{ib}|data parallel"][5]
    assert "are hidden on NVLink and on InfiniBand" in markdown
    hide, width = v["hide_tokens"], v["match_width"]
    for link, (B, _) in links.items():
        assert hide[link] == pytest.approx((P - 1) / P * F / B)
        assert width[link] == pytest.approx((P - 1) * 2 / 3 * F / B / 4)
    tensor_share = {
        k: steps[f"{k}|tensor parallel"][2] / (sum(steps[f"{k}|tensor parallel"][:2]))
        for k in (nv, ib)
    }
    assert tensor_share[nv] < 1 < tensor_share[ib]
    assert (
        f"cost {tensor_share[nv]:.0%} of its arithmetic on NVLink but {tensor_share[ib]:.0%}"
        in markdown
    )
    assert f"$d \\ge$ {width[ib]:,.0f}" in markdown and f"$d \\ge$ {width[nv]:,.0f}" in markdown
    # the ring all-reduce written from send and recv
    ring = v["{f'{k[0]} {k[1]}': r for k, r in hand_ring.items()}"]
    assert set(ring) == {"sim 2", "sim 3", "sim 4", "sim 5", "gloo 3"}
    for key, (gap, messages, sent, model, steps_) in ring.items():
        P_ = int(key.split()[1])
        assert gap < 1e-12
        assert messages == [2 * (P_ - 1)] * P_ and steps_ == 2 * (P_ - 1)
        assert sent == [2 * (P_ - 1) / P_ * 480] * P_ and model == 2 * (P_ - 1) / P_ * 480
    assert v["deadlock"].startswith(
        "deadlock: rank 0 waits in send #0 to rank 1, rank 1 waits in send #0 to rank 2, "
        "rank 2 waits in send #0 to rank 0"
    )
