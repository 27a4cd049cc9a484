"""The sharded-matmul widget: every choice of placements is planned, costed, run and drawn."""

import itertools

import pytest
from chainrule.comm_cost import ring_bytes
from chainrule.widgets import sharded_matmul as smw


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


def test_widget_follows_its_controls_at_both_ends(sweep):
    widget = smw.build_sharded_matmul_widget()
    assert widget.last_result.plan.case == "local"
    for name, value in sweep(widget):
        result = widget.last_result
        assert result.world_size == widget.controls["world_size"].value, (name, value)
        assert str(result.plan.a) == widget.controls["a"].value
        assert str(result.plan.b) == widget.controls["b"].value
        png = bytes(widget.plot.value)
        assert int.from_bytes(png[16:20], "big") <= 940  # fits the page at four ranks
    with pytest.raises(ValueError, match="between 2 and 4"):
        smw.matmul_case("Shard(0)", "Replicate()", world_size=5)
