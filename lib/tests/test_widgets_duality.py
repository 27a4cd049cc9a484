"""The duality widget's computation: every row routes values and gradients as the table says."""

import numpy as np
import pytest
from chainrule import Tensor
from chainrule.course.widgets import duality as dw
from chainrule.parallel.duality import DUALITY_TABLE, REPLICATED

KEYS = [row.key for row in DUALITY_TABLE]

# The backward collective each row's text names, as the trace spells it.
BACKWARD_OPS = {
    "all-reduce (sum)": ["all_reduce"],
    "identity": [],
    "reduce-scatter": ["reduce_scatter"],
    "all-gather": ["all_gather"],
    "all-to-all (transposed)": ["all_to_all"],
    "split (each rank keeps its own slice)": [],
}


def _chunks(a, parts):
    return np.split(np.asarray(a), parts)


def expected_gradients(key, cotangents, world):
    """Each row's VJP written out with numpy, from the two rules (independent of the library)."""
    total = np.sum(cotangents, axis=0) if len(cotangents) > 1 else cotangents[0]
    if key == "identity":  # fan-out: sum the P cotangents
        return [total] * world
    if key == "all_reduce":  # one addend each: the cotangent unchanged
        return [cotangents[p] for p in range(world)]
    if key == "all_gather":  # fan-out then concat: sum, then route slice q to rank q
        return _chunks(total, world)
    if key == "reduce_scatter":  # every rank's input fed every slice: concatenate the slices
        return [np.concatenate(cotangents)] * world
    if key == "all_to_all":  # inverse permutation: piece p of every rank's cotangent to rank p
        return [np.concatenate([_chunks(c, world)[p] for c in cotangents]) for p in range(world)]
    if key == "split":  # slicing forward, concatenating backward
        return [np.concatenate(cotangents)] * world
    if key == "all_gather_replicated":  # concat of one replicated value: just the slice
        return _chunks(cotangents[0], world)
    raise KeyError(key)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("key", KEYS)
def test_routing_matches_the_two_rules(key, world):
    routing = dw.route(key, world)
    row = routing.row
    assert routing.world_size == world and len(routing.gradients) == world
    # Forward: the single-process global map on the same inputs.
    xs = [routing.inputs[0]] if row.input_kind == REPLICATED else routing.inputs
    outs = [y.data for y in row.global_fn([Tensor(x) for x in xs], world)]
    for p in range(world):
        expected = outs[0] if row.output_kind == REPLICATED else outs[p]
        np.testing.assert_array_equal(routing.outputs[p], expected)
    # Backward: the VJP written out by hand.
    for got, want in zip(
        routing.gradients, expected_gradients(key, routing.cotangents, world), strict=True
    ):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("key", KEYS)
def test_adjoint_identity_holds_with_the_counting_conventions(key):
    routing = dw.route(key, 3)
    row = routing.row

    def inner(a, b, kind):
        terms = [float(np.vdot(x, y)) for x, y in zip(a, b, strict=True)]
        return terms[0] if kind == REPLICATED else sum(terms)

    forward = inner(routing.cotangents, routing.outputs, row.output_kind)
    backward = inner(routing.gradients, routing.inputs, row.input_kind)
    assert forward == backward


@pytest.mark.parametrize("key", KEYS)
def test_the_trace_sees_the_backward_collective_the_table_names(key):
    routing = dw.route(key, 2)
    assert routing.backward_collectives == BACKWARD_OPS[routing.row.backward]
    forward_moves = routing.row.key not in ("identity", "split")
    assert bool(routing.forward_collectives) == forward_moves


def test_example_values_are_integer_coded():
    row = next(r for r in DUALITY_TABLE if r.key == "all_gather")
    np.testing.assert_array_equal(dw.example_input(row, 2, 4), [30.0, 31.0])
    np.testing.assert_array_equal(dw.example_cotangent(row, 1, (3,)), [200.0, 201.0, 202.0])
    split = next(r for r in DUALITY_TABLE if r.key == "split")
    np.testing.assert_array_equal(dw.example_input(split, 3, 2), [1.0, 2.0, 3.0, 4.0])


def test_route_refuses_impossible_worlds():
    with pytest.raises(ValueError):
        dw.route("all_gather", 0)
    with pytest.raises(KeyError):
        dw.route("gather_everything", 2)


def test_collective_names_reads_like_the_table():
    assert dw.collective_names(["reduce_scatter"]) == "reduce-scatter"
    assert dw.collective_names([]).startswith("none")


def test_table_and_plot_show_every_rank():
    routing = dw.route("all_to_all", 3)
    html = dw.routing_table(routing)
    assert html.count("<tr>") == 1 + 3
    assert "all-to-all (transposed)" in html
    figure = dw.plot_routing(routing)
    texts = [t.get_text() for t in figure.axes[0].texts]
    assert {"rank 0", "rank 1", "rank 2"} <= set(texts)
    assert "300" in texts and "14" in texts


def test_widget_follows_the_selected_row_and_world_size():
    widget = dw.build_duality_widget()
    assert widget.last_result.row.key == "all_gather"
    assert "reduce-scatter" in widget.table.value
    before = bytes(widget.plot.value)
    widget.controls["key"].value = "split"
    assert widget.last_result.row.key == "split"
    assert widget.last_result.backward_collectives == ["all_gather"]
    assert widget.last_result.row.reasoning in widget.table.value  # the library's reasoning
    assert "Slicing forward" not in widget.table.value  # the syllabus's words are not shown
    widget.controls["world_size"].value = 4
    assert len(widget.last_result.gradients) == 4
    np.testing.assert_array_equal(widget.last_result.gradients[3][:2], [100.0, 101.0])
    assert bytes(widget.plot.value) != before


def test_widget_offers_the_syllabus_rows_and_reads_at_four_ranks(sweep):
    widget = dw.build_duality_widget("identity", 2)
    keys = [key for _, key in widget.controls["key"].options]
    assert "all_gather_replicated" not in keys and len(keys) == 6
    for name, value in sweep(widget):
        assert widget.last_result.world_size == widget.controls["world_size"].value
        assert widget.last_result.row.key == widget.controls["key"].value, (name, value)
    widget.controls["world_size"].value = 4
    for key in keys:  # the widest picture of every row fits the page at 4 ranks
        widget.controls["key"].value = key
        png = bytes(widget.plot.value)
        assert int.from_bytes(png[16:20], "big") <= 940
