"""Placements, redistribution and placed matrix products on the simulated world.

Every redistribution keeps the global value, passes the adjoint test with the placements'
counting conventions and runs the collectives the duality table names; every placement of the
two operands of a matrix product either gives the one-process product and gradients or is
refused with a remedy that works.
"""

import itertools

import numpy as np
import pytest
from chainrule import Tensor, dist
from chainrule.engine import ops
from chainrule.parallel import sharded as sh
from chainrule.parallel.placement import (
    Partial,
    Replicate,
    Shard,
    all_placements,
    parse_placement,
    transition,
)

R, S0, S1, PA = Replicate(), Shard(0), Shard(1), Partial()

# The transitions and their duals as the course states them: (forward, backward) collectives.
EXPECTED = {
    (PA, R, False): ((("all_reduce",)), ()),
    (S0, R, False): (("all_gather",), ()),  # a split: each rank keeps its slice
    (S0, R, True): (("all_gather",), ("reduce_scatter",)),
    (PA, S1, False): (("reduce_scatter",), ("all_gather",)),
    (R, S0, False): ((), ("all_gather",)),
    (S0, S1, False): (("all_to_all",), ("all_to_all",)),
    (R, R, True): ((), ("all_reduce",)),
    (R, R, False): ((), ()),
    (PA, R, True): (("all_reduce",), ("all_reduce",)),
}


def global_value(parts, placement):
    """The global value from every rank's local part."""
    if isinstance(placement, Shard):
        return np.concatenate(parts, axis=placement.axis)
    if isinstance(placement, Partial):
        return np.sum(parts, axis=0)
    return parts[0]


def local_part(value, addends, placement, rank, world):
    if isinstance(placement, Partial):
        return addends[rank]
    if isinstance(placement, Shard):
        return np.split(value, world, axis=placement.axis)[rank]
    return value


def cotangent_part(cotangent, addends, placement, fan_out, rank, world):
    """The cotangent of an output placed so: its slice, the replicated whole, or an addend."""
    if fan_out:
        return addends[rank]
    return local_part(cotangent, None, placement, rank, world)


def test_placements_parse_and_print():
    assert parse_placement("Shard(1)") == S1 and parse_placement("replicate") == R
    assert parse_placement(" partial ") == PA and parse_placement(S0) is S0
    assert [str(p) for p in all_placements()] == [
        "Replicate()",
        "Shard(0)",
        "Shard(1)",
        "Partial()",
    ]
    with pytest.raises(ValueError, match="unknown placement"):
        parse_placement("shard(x)")


@pytest.mark.parametrize(("source", "target", "fan_out"), list(EXPECTED))
def test_each_transition_is_the_row_the_table_names(source, target, fan_out):
    step = transition(source, target, fan_out)
    assert (step.forward_ops, step.backward_ops) == EXPECTED[(source, target, fan_out)]
    # What the transition declares is what its duality rows run, forward and backward.
    trace = dist.Trace()
    dist.run(_run_transition, 2, args=(step,), trace=trace)
    ops = trace.ops()
    cut = ops.index("barrier")
    assert (tuple(ops[:cut]), tuple(ops[cut + 1 :])) == (step.forward_ops, step.backward_ops)


def _run_transition(step):
    y = step.apply(Tensor(np.ones((4, 4)), requires_grad=True))
    dist.barrier()  # the trace's separator between the passes
    y.backward(np.ones(y.shape))


def test_nothing_redistributes_to_partial_and_fan_out_needs_a_replicated_target():
    with pytest.raises(ValueError, match="only as the result of a computation"):
        transition(R, PA)
    with pytest.raises(ValueError, match="fan_out applies to a Replicate target"):
        transition(R, S0, fan_out=True)
    assert transition(PA, PA).steps == ()


def _redistribute_on_rank(source, target, fan_out, shape, seed):
    rank, world = dist.rank(), dist.world_size()
    rng = np.random.default_rng(seed)
    value, cotangent = rng.standard_normal(shape), rng.standard_normal(shape)
    addends = [rng.standard_normal(shape) for _ in range(world)]
    g_addends = [rng.standard_normal(shape) for _ in range(world)]
    x = sh.from_local(local_part(value, addends, source, rank, world), source, requires_grad=True)
    y = sh.redistribute(x, target, fan_out=fan_out)
    g = cotangent_part(cotangent, g_addends, target, fan_out, rank, world)
    dist.barrier()
    y.local.backward(g)
    dist.barrier()
    return x.local.data, y.local.data, g, x.grad


CASES = [
    (s, t, f)
    for s in all_placements()
    for t in (R, S0, S1)
    for f in ((False, True) if t == R else (False,))
]


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize(("source", "target", "fan_out"), CASES, ids=str)
def test_redistribute_keeps_the_value_passes_the_adjoint_test_and_runs_its_rows(
    source, target, fan_out, world
):
    shape = (2 * world, 3 * world)
    trace = dist.Trace()
    results = dist.run(
        _redistribute_on_rank, world, args=(source, target, fan_out, shape, 7), trace=trace
    )
    xs, ys, gs, grads = (list(c) for c in zip(*results, strict=True))
    np.testing.assert_allclose(global_value(ys, target), global_value(xs, source), atol=1e-12)
    # ⟨ȳ, J x⟩ against ⟨J^T ȳ, x⟩: a per-rank inner product sums over ranks, a replicated one
    # (counted once) is taken once; a partial value's gradient is the whole cotangent.
    out_side = (
        sum(float(np.vdot(g, y)) for g, y in zip(gs, ys, strict=True))
        if fan_out or not isinstance(target, Replicate)
        else float(np.vdot(gs[0], ys[0]))
    )
    in_side = (
        float(np.vdot(grads[0], xs[0]))
        if isinstance(source, Replicate)
        else sum(float(np.vdot(g, x)) for g, x in zip(grads, xs, strict=True))
    )
    if isinstance(source, Partial):
        for grad in grads[1:]:
            np.testing.assert_allclose(grad, grads[0], atol=1e-12)  # replicated gradient
        in_side = float(np.vdot(grads[0], global_value(xs, source)))
    assert in_side == pytest.approx(out_side, rel=1e-10, abs=1e-10)
    ops_seen = trace.ops()
    first = ops_seen.index("barrier")
    step = transition(source, target, fan_out)
    assert tuple(ops_seen[:first]) == step.forward_ops
    assert tuple(ops_seen[first + 1 : -1]) == step.backward_ops


def test_a_fanned_out_value_is_not_redistributed_again_nor_a_loss():
    def spmd():
        x = sh.fan_out(sh.distribute(np.ones((2, 2)), R))
        with pytest.raises(sh.ShardingError, match="already fans out"):
            sh.redistribute(x, S0)
        with pytest.raises(ValueError, match="counted once per rank"):
            x.full()
        assert sh.redistribute(x, R, fan_out=True) is x

    dist.run(spmd, 2)


# -- the matrix product on every pair of placements ------------------------------------------------


def _matmul_on_rank(pa, pb, A, B, G):
    rank, world = dist.rank(), dist.world_size()
    rng = np.random.default_rng(3)
    a_add = [A / world + rng.standard_normal(A.shape) for _ in range(world)]
    a_add[-1] = A - sum(a_add[:-1])
    b_add = [B / world + rng.standard_normal(B.shape) for _ in range(world)]
    b_add[-1] = B - sum(b_add[:-1])
    a = sh.from_local(local_part(A, a_add, pa, rank, world), pa, requires_grad=True)
    b = sh.from_local(local_part(B, b_add, pb, rank, world), pb, requires_grad=True)
    try:
        c = sh.matmul(a, b)
    except sh.ShardingError as error:
        return str(error)
    full = c.full()  # the product, counted once
    (full * Tensor(G)).sum().backward()
    return full.data, a.full_grad(), b.full_grad(), str(c.placement)


PAIRS = list(itertools.product(all_placements(), all_placements()))


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize(("pa", "pb"), PAIRS, ids=str)
def test_matmul_of_every_placement_pair_is_exact_or_refused_with_a_remedy(pa, pb, world):
    rng = np.random.default_rng(world)
    A, B = rng.standard_normal((2 * world, 3 * world)), rng.standard_normal((3 * world, world))
    G = rng.standard_normal((2 * world, world))
    plan = sh.plan_matmul(pa, pb)
    results = dist.run(_matmul_on_rank, world, args=(pa, pb, A, B, G))
    if not plan.valid:
        assert all(isinstance(r, str) and plan.remedy in r for r in results), results
        return
    for value, ga, gb, placement in results:
        np.testing.assert_allclose(value, A @ B, atol=1e-12)
        np.testing.assert_allclose(ga, G @ B.T, atol=1e-12)
        np.testing.assert_allclose(gb, A.T @ G, atol=1e-12)
        assert placement == str(plan.output)


def test_the_four_cases():
    cases = {(str(a), str(b)): sh.plan_matmul(a, b).case for a, b in PAIRS}
    assert cases[("Replicate()", "Replicate()")] == "local"
    assert cases[("Shard(0)", "Replicate()")] == "local"  # data parallel
    assert cases[("Replicate()", "Shard(1)")] == "local"  # column-parallel
    assert cases[("Shard(1)", "Replicate()")] == "all-gather first"
    assert cases[("Shard(0)", "Shard(0)")] == "all-gather first"
    assert cases[("Shard(1)", "Shard(0)")] == "partial sums"  # row-parallel
    assert cases[("Shard(0)", "Shard(1)")] == "invalid"
    plan = sh.plan_matmul(R, S1)
    assert plan.fan_outs == ("A",) and plan.output == S1
    assert sh.plan_matmul(S0, R).fan_outs == ("B",)
    gathered = sh.plan_matmul(S0, S0)  # B gathered for per-rank rows of A: fanned out
    assert gathered.before["B"].fan_out and gathered.before["B"].backward_ops == ("reduce_scatter",)
    assert sh.plan_matmul(S1, R).before["A"].backward_ops == ()  # gathered, counted once


def test_plan_communication_counts_ring_bytes():
    plan = sh.plan_matmul(S0, S0)
    sizes = {"A": 800, "B": 1200}
    assert plan.communication(sizes, 4) == [
        ("forward", "all_gather", "B", 900.0),
        ("backward", "reduce_scatter", "B", 900.0),
    ]
    assert sh.plan_matmul(R, S1).communication(sizes, 4) == [
        ("backward", "all_reduce", "A", 1200.0)
    ]


# -- blocks built from placements, against one process ------------------------------------------


def _mlp_on_rank(X, W1, W2, T, sequence_parallel):
    x = sh.distribute(X, S0 if sequence_parallel else R, requires_grad=True)
    w1 = sh.distribute(W1, S1, requires_grad=True)
    w2 = sh.distribute(W2, S0, requires_grad=True)
    h = sh.redistribute(x, R, fan_out=True) if sequence_parallel else x
    hidden = sh.elementwise(Tensor.tanh, sh.matmul(h, w1))
    y = sh.redistribute(sh.matmul(hidden, w2), S0 if sequence_parallel else R)
    dist.barrier()
    loss = ops.mse_loss(y.local, sh.distribute(T, y.placement).local.data, reduction="sum")
    loss.backward()
    dist.barrier()
    return [y.full().data, x.full_grad(), w1.full_grad(), w2.full_grad()]


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tensor_and_sequence_parallel_mlp_match_one_process(sequence_parallel):
    rng = np.random.default_rng(0)
    X, W1, W2, T = (rng.standard_normal(s) for s in [(6, 4), (4, 6), (6, 4), (6, 4)])
    x, w1, w2 = (Tensor(a, requires_grad=True) for a in (X, W1, W2))
    y = (x @ w1).tanh() @ w2
    ops.mse_loss(y, T, reduction="sum").backward()
    reference = [y.data, x.grad, w1.grad, w2.grad]
    for world in (2, 3):
        trace = dist.Trace()
        results = dist.run(_mlp_on_rank, world, args=(X, W1, W2, T, sequence_parallel), trace=trace)
        for result in results:
            for got, want in zip(result, reference, strict=True):
                np.testing.assert_allclose(got, want, atol=1e-12)
        ops_seen = trace.ops()
        first = ops_seen.index("barrier")
        second = ops_seen.index("barrier", first + 1)
        if sequence_parallel:
            assert ops_seen[:first] == ["all_gather", "reduce_scatter"]
            assert ops_seen[first + 1 : second] == ["all_gather", "reduce_scatter"]
        else:
            assert ops_seen[:first] == ["all_reduce"]
            assert ops_seen[first + 1 : second] == ["all_reduce"]


def test_add_elementwise_and_local_map_respect_placements():
    def spmd():
        h = sh.distribute(np.ones((4, 4)), S1, requires_grad=True)
        bias = sh.distribute(np.arange(4.0), S0, requires_grad=True)
        assert (h + bias).placement == S1
        rows = sh.distribute(np.ones((4, 4)), S0, requires_grad=True)
        row_bias = sh.distribute(np.arange(4.0), R, requires_grad=True)
        biased = rows + row_bias
        assert biased.placement == S0
        (biased.local * (dist.rank() + 1)).sum().backward()  # a per-rank loss term each
        total = sum(range(1, dist.world_size() + 1)) * 4 // dist.world_size()
        np.testing.assert_array_equal(row_bias.grad, np.full(4, float(total)))  # summed
        partial = sh.from_local(np.ones((2, 2)), PA)
        with pytest.raises(sh.ShardingError, match="added P"):
            sh.add(partial, sh.distribute(np.ones((2, 2)), R))
        with pytest.raises(sh.ShardingError, match="f\\(Σ x_p\\)"):
            sh.elementwise(Tensor.tanh, partial)
        with pytest.raises(sh.ShardingError, match="per-rank result"):
            sh.local_map(lambda t: t, h, placement=R)
        return True

    assert dist.run(spmd, 2) == [True, True]


def test_a_replicated_bias_over_a_sharded_axis_is_refused():
    def spmd():
        h = sh.distribute(np.ones((4, 4)), S1)
        with pytest.raises(sh.ShardingError, match="spans the sharded axis"):
            sh.add(h, sh.distribute(np.ones(4), R))
        return True

    assert dist.run(spmd, 2) == [True, True]


def test_a_transitions_collectives_are_known_inside_a_run_without_starting_a_world():
    def describe():
        step = transition(S0, R, fan_out=True)
        return step.forward_text, step.backward_text

    assert dist.run(describe, 2) == [("all-gather", "reduce-scatter")] * 2
