"""The sharded-matmul widget: every choice of placements is planned, costed, run and drawn."""

import itertools

import pytest
from chainrule.costs.comm_cost import ring_bytes
from chainrule.course.widgets import sharded_matmul as smw


@pytest.mark.parametrize(("a", "b"), list(itertools.product(smw.PLACEMENT_CHOICES, repeat=2)))
def test_every_pair_is_planned_run_and_drawn(a, b):
    case = smw.matmul_case(a, b, world_size=3)
    html = smw.case_table(case)
    assert case.plan.case in html
    if not case.plan.valid:
        assert case.output is None and case.error is None and "Remedy" in html
        assert case.seen_forward == case.seen_backward == []
    else:
        assert case.error < 1e-12
        # What the trace saw is what the plan said.
        assert case.seen_forward == [op for p, op, _, _ in case.communication if p == "forward"]
        assert case.seen_backward == [op for p, op, _, _ in case.communication if p == "backward"]
    figure = smw.plot_blocks(case)
    texts = {t.get_text() for t in figure.axes[0].texts}
    assert {"r0", "r1", "r2"} & texts or {"all", "Σ"} & texts


def test_then_redistributes_c_and_counts_its_bytes():
    case = smw.matmul_case("Shard(1)", "Shard(0)", "Replicate()", world_size=4, sizes=(8, 8, 8))
    assert case.output == smw.parse_placement("Replicate()")
    assert case.communication == [("forward", "all_reduce", "C", ring_bytes("all_reduce", 256, 4))]
    assert case.seen_forward == ["all_reduce"] and case.seen_backward == []
    sharded = smw.matmul_case("Shard(1)", "Shard(0)", "Shard(1)", world_size=2)
    assert sharded.seen_forward == ["reduce_scatter"] and sharded.seen_backward == ["all_gather"]


def test_the_invalid_case_draws_only_the_diagonal_of_c():
    case = smw.matmul_case("Shard(0)", "Shard(1)", world_size=4)
    texts = [t.get_text() for t in smw.plot_blocks(case).axes[0].texts]
    assert texts.count("✕") == 4 * 4 - 4
    assert any("only the diagonal blocks" in t for t in texts)


CASE_TWO = [
    (a, b)
    for a, b in itertools.product(smw.PLACEMENT_CHOICES, repeat=2)
    if smw.sh.plan_matmul(a, b).case == "all-gather first"
]


def test_case_two_is_the_four_pairs_with_one_operand_sharded_along_j():
    assert sorted(CASE_TWO) == sorted(
        [("Replicate()", "Shard(0)"), ("Shard(0)", "Shard(0)"), ("Shard(1)", "Replicate()"),
         ("Shard(1)", "Shard(1)")]
    )  # fmt: skip


@pytest.mark.parametrize(("a", "b"), CASE_TWO)
@pytest.mark.parametrize("then", [None, *smw.THEN_CHOICES[1:]])
def test_both_remedies_of_case_two_run_exactly_and_move_what_they_count(a, b, then):
    for P in (2, 4):
        gather, reduce = smw.case_two_remedies(a, b, then, P, sizes=(2 * P, 3 * P, 4 * P))
        plan = smw.sh.plan_matmul(a, b)
        target = plan.output if then is None else smw.parse_placement(then)
        for remedy in (gather, reduce):
            assert remedy.output == target and remedy.error == 0.0, remedy
            # The traced run (float64) moved the bytes the model counts for its matrices;
            # counted here in float32, so every count is half the traced one.
            assert remedy.checked, remedy
            assert (2 * remedy.bytes_forward, 2 * remedy.bytes_backward) == remedy.traced
        (gathered,) = plan.before
        assert gather.name == f"gather {gathered}" and reduce.name == "reduce C"
        assert not any(
            on == gathered and op == "all_gather" for _, op, on, _ in reduce.communication
        )


def test_the_reduction_of_a_row_sharded_weight_is_megatrons_row_parallel_layer():
    # A replicated, B by rows: gather B (P−1)/P·|B|, or slice A (its gradient all-gathered)
    # and all-reduce the partial C, 2(P−1)/P·|C|; counted by hand for P = 4, float32.
    I, J, K, P = 64, 1024, 512, 4
    gather, reduce = smw.case_two_remedies("Replicate()", "Shard(0)", None, P, (I, J, K))
    f = (P - 1) / P * 4
    assert [(p, op, on) for p, op, on, _ in gather.communication] == [
        ("forward", "all_gather", "B")
    ]
    assert (gather.bytes_forward, gather.bytes_backward) == (f * J * K, 0)
    assert [(p, op, on) for p, op, on, _ in reduce.communication] == [
        ("forward", "all_reduce", "C"),
        ("backward", "all_gather", "A"),
    ]
    assert (reduce.bytes_forward, reduce.bytes_backward) == (2 * f * I * K, f * I * J)
    assert reduce.steps == "slice A to Shard(1), partial sums, all-reduce C to Replicate()"


def test_an_all_to_all_is_counted_on_one_ranks_slice():
    # B by columns → by rows for the reduction: the all-to-all moves (P−1)/P of one rank's
    # slice |B|/P, forward and backward (it was counted on the whole of B before).
    I, J, K, P = 64, 256, 512, 4
    _, reduce = smw.case_two_remedies("Shard(1)", "Shard(1)", None, P, (I, J, K), itemsize=4)
    moved = [(p, op, on, b) for p, op, on, b in reduce.communication if on == "B"]
    share = (P - 1) / P * J * K * 4 / P
    assert moved == [("forward", "all_to_all", "B", share), ("backward", "all_to_all", "B", share)]


def test_only_case_two_has_the_two_remedies():
    with pytest.raises(ValueError, match="not case 2"):
        smw.case_two_remedies("Shard(1)", "Shard(0)")
    assert smw.matmul_case("Shard(0)", "Replicate()").remedies is None
    for a, b in [("Replicate()", "Shard(0)"), ("Shard(1)", "Replicate()")]:
        html = smw.case_table(smw.matmul_case(a, b))
        assert "Case 2 has two remedies" in html and "Fewer bytes per step" in html
    # With the other operand sharded along its free dimension the widget names the
    # reduction's all-to-all but leaves its count (the exercise's work) undone.
    for a, b, other in [("Shard(0)", "Shard(0)", "A"), ("Shard(1)", "Shard(1)", "B")]:
        case = smw.matmul_case(a, b, "Shard(1)")
        assert case.remedies is None
        html = smw.case_table(case)
        assert f"all-to-all of {other}" in html and "Fewer bytes" not in html


def test_the_widget_names_the_remedy_that_moves_fewer_bytes_for_its_rows():
    widget = smw.build_sharded_matmul_widget("Replicate()", "Shard(0)", 4, log2_rows=6)
    # 64 rows: the partial C (and A's gradient) are small against the 1024 × 1024 weight.
    assert "Fewer bytes per step: <b>reduce C</b>" in widget.table.value
    widget.controls["log2_rows"].value = 14  # 16384 rows: gathering B is cheaper
    assert "Fewer bytes per step: <b>gather B</b>" in widget.table.value
    assert "forward pass alone: <b>gather B</b>" in widget.table.value
    # In between the passes disagree: at 512 rows the forward all-reduce of C (2·512·1024)
    # equals the gather of B, and the backward all-gather of A tips the step to gathering.
    widget.controls["log2_rows"].value = 9
    assert "Fewer bytes per step: <b>gather B</b>" in widget.table.value
    assert "forward pass alone: the two move the same" in widget.table.value


def test_widget_follows_its_controls_at_both_ends(sweep):
    widget = smw.build_sharded_matmul_widget()
    assert widget.last_result.plan.case == "local"
    for name, value in sweep(widget):
        result = widget.last_result
        assert result.world_size == widget.controls["world_size"].value, (name, value)
        assert str(result.plan.a) == widget.controls["a"].value
        assert str(result.plan.b) == widget.controls["b"].value
        assert result.sizes == (2 ** widget.controls["log2_rows"].value, 1024, 1024)
        slices = result.plan.case == "all-gather first" and "Replicate()" in (
            str(result.plan.a),
            str(result.plan.b),
        )
        assert (result.remedies is not None) == slices, (name, value)
        png = bytes(widget.plot.value)
        assert int.from_bytes(png[16:20], "big") <= 940  # fits the page at four ranks
    with pytest.raises(ValueError, match="between 2 and 4"):
        smw.matmul_case("Shard(0)", "Replicate()", world_size=5)
