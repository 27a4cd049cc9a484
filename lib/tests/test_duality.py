"""The duality table on engine tensors in the simulated world: text, adjoints, global maps."""

from functools import partial

import numpy as np
import pytest
from chainrule import Tensor, as_tensor, dist
from chainrule.parallel import duality
from chainrule.parallel.dist_adjoint import compare_with_single_process, distributed_adjoint_test
from chainrule.parallel.duality import DUALITY_TABLE, PER_RANK, REPLICATED

WORLD_SIZES = (1, 2, 3, 4)
TOL = 1e-12

# The syllabus's table, word for word: kept in DUALITY_TABLE as the syllabus's reasoning, a
# quotation; the library's own reasoning is another sentence, its derivation.
SYLLABUS_ROWS = [
    (
        "identity (value already replicated)",
        "all-reduce (sum)",
        "Replication is a fan-out; rule 1 says sum the incoming gradients.",
    ),
    (
        "all-reduce (sum of partial results)",
        "identity",
        "Each rank contributed one addend, so each receives the incoming gradient unchanged.",
    ),
    (
        "all-gather (assemble shards)",
        "reduce-scatter",
        "Concatenation forward routes gradients backward, and the summation over replicas "
        "rides along.",
    ),
    ("reduce-scatter", "all-gather", "The exact inverse of the row above."),
    (
        "all-to-all",
        "all-to-all (transposed)",
        "A permutation of data; its adjoint is the inverse permutation.",
    ),
    ("split / scatter", "all-gather", "Slicing forward, concatenating backward."),
]


def input_shape(row: duality.DualityRow) -> tuple[int, ...]:
    """A shape whose axis 0 splits evenly for every P in WORLD_SIZES where the row splits."""
    return (12, 3) if row.key in ("reduce_scatter", "all_to_all", "split") else (2, 3)


def random_inputs(row, world_size, seed=1, shape=None):
    rng = np.random.default_rng(seed)
    count = 1 if row.input_kind == REPLICATED else world_size
    return [rng.standard_normal(shape or input_shape(row)) for _ in range(count)]


def test_syllabus_rows_are_the_table_text_in_order():
    rows = [(r.forward, r.backward, r.syllabus_reasoning) for r in DUALITY_TABLE if r.in_syllabus]
    assert rows == SYLLABUS_ROWS


def test_the_librarys_reasoning_is_its_own_and_never_calls_reduce_scatter_an_inverse():
    for row in DUALITY_TABLE:
        assert row.reasoning and row.reasoning != row.syllabus_reasoning, row.key
        assert "inverse of" not in row.reasoning, row.key
    assert duality.duality_row("all_gather_replicated").syllabus_reasoning is None
    scatter = duality.duality_row("reduce_scatter").reasoning
    assert scatter.startswith("The transpose (adjoint) of the all-gather row, not its inverse")


def test_the_added_row_is_the_replicated_all_gather_with_split_backward():
    added = [r for r in DUALITY_TABLE if not r.in_syllabus]
    assert [r.key for r in added] == ["all_gather_replicated"]
    (row,) = added
    assert row.forward.startswith("all-gather") and row.backward.startswith("split")
    assert row.engine_fn is duality.gather_replicated
    assert (row.input_kind, row.output_kind) == (PER_RANK, REPLICATED)


def test_markdown_renders_every_row_and_can_leave_out_the_addition():
    full = duality.duality_table_markdown().splitlines()
    assert full[0] == "| Forward operation | Backward operation | Reasoning |"
    assert len(full) == 2 + len(DUALITY_TABLE)
    for row in DUALITY_TABLE:
        assert f"| {row.forward} | {row.backward} | {row.reasoning} |" in full
    assert "exact inverse" not in "\n".join(full)  # the syllabus's claim is not the library's
    syllabus_only = duality.duality_table_markdown(include_additions=False).splitlines()
    assert len(syllabus_only) == 2 + len(SYLLABUS_ROWS)
    assert [line.split(" | ")[0][2:] for line in syllabus_only[2:]] == [
        forward for forward, _, _ in SYLLABUS_ROWS
    ]


def test_rows_are_found_by_key_and_unknown_keys_name_the_choices():
    assert duality.duality_row("split").engine_fn is duality.split_to_ranks
    with pytest.raises(KeyError, match="identity"):
        duality.duality_row("no-such-row")


def test_f_and_f_bar_are_the_conjugate_pair():
    assert duality.f is duality.copy_to_ranks
    assert duality.f_bar is duality.reduce_from_ranks
    assert duality.duality_row("identity").engine_fn is duality.f
    assert duality.duality_row("all_reduce").engine_fn is duality.f_bar


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("row", DUALITY_TABLE, ids=lambda r: r.key)
def test_every_row_passes_the_adjoint_test(row, world_size):
    forward, backward = distributed_adjoint_test(
        row.engine_fn, [input_shape(row)], row.input_kind, row.output_kind, world_size
    )
    assert forward != 0.0
    assert backward == pytest.approx(forward, rel=TOL, abs=TOL)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("row", DUALITY_TABLE, ids=lambda r: r.key)
def test_every_row_matches_its_global_map_on_one_process(row, world_size):
    inputs = random_inputs(row, world_size)
    error = compare_with_single_process(
        row.engine_fn, row.global_fn, inputs, row.input_kind, row.output_kind, world_size
    )
    assert error.output <= TOL
    assert error.gradient <= TOL


@pytest.mark.parametrize(
    "split_axis, concat_axis, shape", [(1, 0, (2, 12)), (0, 1, (12, 2)), (1, 1, (3, 12))]
)
def test_all_to_all_with_different_axes(split_axis, concat_axis, shape):
    row = duality.duality_row("all_to_all")
    fn = partial(duality.all_to_all_ranks, split_axis=split_axis, concat_axis=concat_axis)
    global_fn = partial(duality.global_all_to_all, split_axis=split_axis, concat_axis=concat_axis)
    for world_size in (2, 3):
        forward, backward = distributed_adjoint_test(fn, [shape], PER_RANK, PER_RANK, world_size)
        assert backward == pytest.approx(forward, rel=TOL)
        inputs = random_inputs(row, world_size, shape=shape)
        error = compare_with_single_process(fn, global_fn, inputs, PER_RANK, PER_RANK, world_size)
        assert max(error) <= TOL


@pytest.mark.parametrize("key", ["all_gather", "all_gather_replicated", "reduce_scatter", "split"])
def test_rows_along_axis_one(key):
    row = duality.duality_row(key)
    fn = partial(row.engine_fn, axis=1)
    global_fn = partial(row.global_fn, axis=1)
    shape = (3, 12) if key in ("reduce_scatter", "split") else (3, 2)
    forward, backward = distributed_adjoint_test(fn, [shape], row.input_kind, row.output_kind, 3)
    assert backward == pytest.approx(forward, rel=TOL)
    inputs = random_inputs(row, 3, shape=shape)
    error = compare_with_single_process(fn, global_fn, inputs, row.input_kind, row.output_kind, 3)
    assert max(error) <= TOL


# -- the harness can fail: wrong pairings are caught ----------------------------------------


def identity_both_ways(x):
    """A broken f: identity forward and identity backward (forgets the all-reduce)."""
    x = as_tensor(x)
    return Tensor.from_op(x.data, (x,), lambda g: (g,), "broken_f")


def all_reduce_both_ways(x):
    """A broken f̄: all-reduce forward and all-reduce backward."""
    x = as_tensor(x)
    out = np.asarray(dist.all_reduce(x.data))
    return Tensor.from_op(out, (x,), lambda g: (np.asarray(dist.all_reduce(g)),), "broken_f_bar")


def all_to_all_without_return_trip(x):
    """All-to-all forward whose backward keeps the gradient where it is (identity)."""
    x = as_tensor(x)
    out = np.asarray(dist.all_to_all(x.data))
    return Tensor.from_op(out, (x,), lambda g: (g,), "broken_all_to_all")


MUTANTS = {
    "f-without-all-reduce": (identity_both_ways, "identity"),
    "f_bar-with-all-reduce": (all_reduce_both_ways, "all_reduce"),
    # a split where the per-rank downstream needs a reduce-scatter
    "gather-with-split": (duality.gather_replicated, "all_gather"),
    # a reduce-scatter where the replicated downstream needs a split: P times too much
    "gather-with-reduce-scatter": (duality.gather_from_ranks, "all_gather_replicated"),
    "all-to-all-without-return-trip": (all_to_all_without_return_trip, "all_to_all"),
}


@pytest.mark.parametrize("name", MUTANTS)
def test_a_wrong_backward_fails_both_checks(name):
    fn, key = MUTANTS[name]
    row = duality.duality_row(key)
    world_size = 3
    shape = input_shape(row)
    forward, backward = distributed_adjoint_test(
        fn, [shape], row.input_kind, row.output_kind, world_size, check_replication=False
    )
    assert backward != pytest.approx(forward, rel=1e-6)
    inputs = random_inputs(row, world_size, shape=shape)
    error = compare_with_single_process(
        fn, row.global_fn, inputs, row.input_kind, row.output_kind, world_size
    )
    assert error.output <= TOL  # the forward is right ...
    assert error.gradient > 1e-6  # ... and the wrong backward is caught


def test_gather_rows_differ_by_exactly_the_factor_p_on_replicated_downstream():
    """Replicated downstream counted once: reduce-scatter adds P equal cotangents."""
    world_size = 4
    weights = np.random.default_rng(0).standard_normal(8)

    def step(gather):
        x = Tensor(np.full(2, dist.rank() + 1.0), requires_grad=True)
        (gather(x) * weights).sum().backward()  # the same loss on every rank
        return x.grad

    split = dist.run(step, world_size, args=(duality.gather_replicated,))
    summed = dist.run(step, world_size, args=(duality.gather_from_ranks,))
    for rank in range(world_size):
        np.testing.assert_allclose(split[rank], weights[2 * rank : 2 * rank + 2])
        np.testing.assert_allclose(summed[rank], world_size * split[rank])


def test_shards_that_do_not_split_evenly_are_refused():
    with pytest.raises(dist.RankError, match="equal chunks"):
        dist.run(lambda: duality.split_to_ranks(Tensor(np.zeros(5))), 2)


def test_the_adjoint_helper_refuses_replicated_values_that_differ_across_ranks():
    with pytest.raises(dist.RankError, match="the output is declared replicated"):
        distributed_adjoint_test(identity_both_ways, [(3,)], PER_RANK, REPLICATED, 2)
    with pytest.raises(dist.RankError, match="gradient of a replicated input is declared"):
        distributed_adjoint_test(identity_both_ways, [(3,)], REPLICATED, PER_RANK, 2)


def test_the_adjoint_helper_checks_its_arguments():
    with pytest.raises(ValueError, match="input_kind"):
        distributed_adjoint_test(duality.f, [(3,)], "sharded", PER_RANK, 2)
    with pytest.raises(ValueError, match="replicated input"):
        distributed_adjoint_test(duality.f, [(3,), (4,)], REPLICATED, PER_RANK, 2)
    with pytest.raises(ValueError, match="one per rank"):
        distributed_adjoint_test(duality.f_bar, [(3,)] * 3, PER_RANK, REPLICATED, 2)


def _run_row(row):
    x = Tensor(np.ones((4, 2)), requires_grad=True)
    y = row.engine_fn(x)
    dist.barrier()  # the trace's separator between the passes
    y.backward(np.ones(y.shape))


@pytest.mark.parametrize("row", DUALITY_TABLE, ids=lambda r: r.key)
def test_each_row_runs_the_collectives_it_declares(row):
    trace = dist.Trace()
    dist.run(_run_row, 2, args=(row,), trace=trace)
    ops = trace.ops()
    cut = ops.index("barrier")
    assert (tuple(ops[:cut]), tuple(ops[cut + 1 :])) == (row.forward_ops, row.backward_ops)


def _row_in_groups(key):
    """The row on two groups of two ranks each: the same values as on a world of two."""
    group = dist.grid(2, 2).tp_group
    x = Tensor(np.arange(8.0).reshape(4, 2) * (dist.rank() + 1), requires_grad=True)
    y = duality.duality_row(key).engine_fn(x, group=group)
    y.backward(np.arange(float(np.prod(y.shape))).reshape(y.shape))
    return y.data, x.grad


def _row_alone(key, rank):
    x = Tensor(np.arange(8.0).reshape(4, 2) * (rank + 1), requires_grad=True)
    y = duality.duality_row(key).engine_fn(x)
    y.backward(np.arange(float(np.prod(y.shape))).reshape(y.shape))
    return y.data, x.grad


@pytest.mark.parametrize("row", DUALITY_TABLE, ids=lambda r: r.key)
def test_every_row_takes_a_group(row):
    grouped = dist.run(_row_in_groups, 4, args=(row.key,))
    # ranks 2 and 3 form the second group: they see rank 2's and 3's values as ranks 0 and 1
    alone = dist.run(lambda: _row_alone(row.key, dist.rank() + 2), 2)
    for (y, g), (y_alone, g_alone) in zip(grouped[2:], alone, strict=True):
        np.testing.assert_array_equal(y, y_alone)
        np.testing.assert_array_equal(g, g_alone)


COUNTS = [[0, 2, 1], [3, 0, 1], [1, 1, 0]]  # rank i sends COUNTS[i][j] rows to rank j


def _uneven(send_known):
    r = dist.rank()
    x = Tensor(np.arange(sum(COUNTS[r]) * 2.0).reshape(-1, 2) + 10 * r, requires_grad=True)
    receive = None if not send_known else [row[r] for row in COUNTS]
    y = duality.all_to_all_ranks(x, send_counts=COUNTS[r], recv_counts=receive)
    y.backward(y.data * 2 + 1)  # the cotangent of each row names the row
    return x.data, y.data, x.grad


@pytest.mark.parametrize("send_known", [True, False])
def test_the_uneven_all_to_all_row_sends_every_gradient_row_back_where_it_came_from(send_known):
    results = dist.run(_uneven, 3, args=(send_known,))
    for r, (x, y, grad) in enumerate(results):
        expected = np.concatenate(
            [np.split(results[j][0], np.cumsum(COUNTS[j])[:-1])[r] for j in range(3)]
        )
        np.testing.assert_array_equal(y, expected)
        np.testing.assert_array_equal(grad, x * 2 + 1)  # each row's cotangent came back to it
