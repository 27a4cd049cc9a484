"""The expert-parallel layer: equal to one process on every backend, drops that carry no
gradient, and a dispatch whose backward is its adjoint (the transposed all-to-all)."""

import numpy as np
import pytest
from chainrule import Tensor, dist
from chainrule.costs.comm_cost import event_bytes
from chainrule.parallel import expert as ex
from chainrule.parallel.dist_adjoint import distributed_adjoint_test

D, HIDDEN, TOKENS = 4, 6, 10


def _case(world_size, experts_per_rank=3, skew=1.5, seed=0):
    E = world_size * experts_per_rank
    weights = ex.init_expert_weights(D, HIDDEN, E, skew=skew, seed=seed)
    rng = np.random.default_rng(100 + seed)
    x = rng.standard_normal((world_size, TOKENS, D))
    cotangent = rng.standard_normal((world_size, TOKENS, D))
    return weights, x, cotangent


def test_capacity_is_the_ceiling_of_c_t_over_e():
    assert ex.expert_capacity(8, 4, 1.0) == 2
    assert ex.expert_capacity(10, 4, 1.0) == 3
    assert ex.expert_capacity(10, 4, 1.1) == 3  # 2.75, not 2.7500000000000004 → 3 anyway
    assert ex.expert_capacity(10, 5, 1.1) == 3  # 11/5 = 2.2 read exactly
    assert ex.expert_capacity(20, 4, 0.2) == 1
    with pytest.raises(ValueError, match="positive"):
        ex.expert_capacity(8, 4, 0.0)


def test_routing_fills_slots_in_token_order_and_drops_the_rest():
    probabilities = np.eye(3)[[0, 0, 1, 0, 2, 0]]
    r = ex.route(probabilities, capacity=2)
    assert r.expert.tolist() == [0, 0, 1, 0, 2, 0]
    assert r.slot.tolist() == [0, 1, 0, 2, 0, 3]
    assert r.kept.tolist() == [True, True, True, False, True, False]
    assert r.load.tolist() == [4, 1, 1] and r.kept_per_expert.tolist() == [2, 1, 1]
    assert r.dropped == 2 and r.padding == 3 * 2 - 4
    assert r.slot_token.tolist() == [[0, 1], [2, 6], [4, 6]]  # 6: the zero row (padding)
    assert r.token_slot.tolist() == [0, 1, 2, 6, 4, 6]  # 6 = E·C: the zero row (dropped)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_equals_one_process_with_uneven_loads_and_drops(world_size):
    weights, x, cotangent = _case(world_size, seed=world_size)
    ranks = dist.run(ex.expert_parallel_step, world_size, args=(weights, x, cotangent, 1.0))
    one = ex.one_process_step(weights, x, cotangent, 1.0)
    report = ex.dispatch_report(ex.routings_of(weights, x, 1.0), D)
    assert report.dropped.sum() > 0 and report.padding.sum() > 0  # drops and padding
    assert report.expert_load.max() > 2 * report.expert_load.mean()  # uneven loads
    for p, rank in enumerate(ranks):
        (routing,) = rank.routings
        assert routing.expert.tolist() == one.routings[p].expert.tolist()
        assert routing.kept.tolist() == one.routings[p].kept.tolist()
    differences = ex.largest_differences(ranks, one)
    assert set(differences) == {"y", "x", "router", "router_bias", "w1", "w2"}
    assert max(differences.values()) < 1e-12, differences
    assert all(np.abs(g).max() > 0 for g in one.grads.as_tuple())  # every gradient is tested


@pytest.mark.parametrize("capacity_factor", [0.5, 1.0, 2.0, 4.0])
def test_equals_one_process_at_every_capacity(capacity_factor):
    weights, x, cotangent = _case(2, experts_per_rank=2, skew=0.5, seed=7)
    ranks = dist.run(ex.expert_parallel_step, 2, args=(weights, x, cotangent, capacity_factor))
    one = ex.one_process_step(weights, x, cotangent, capacity_factor)
    assert max(ex.largest_differences(ranks, one).values()) < 1e-12


def test_the_groups_decide_the_drops():
    weights, x, _ = _case(2, experts_per_rank=2, skew=1.0, seed=3)
    leaves = [Tensor(a) for a in weights.as_tuple()]
    _, by_rank = ex.one_process_moe(x.reshape(-1, D), *leaves, capacity_factor=0.8, groups=2)
    _, whole = ex.one_process_moe(x.reshape(-1, D), *leaves, capacity_factor=0.8, groups=1)
    kept_by_rank = np.concatenate([r.kept for r in by_rank])
    assert whole[0].capacity == 2 * by_rank[0].capacity  # the same slots in total...
    assert kept_by_rank.tolist() != whole[0].kept.tolist()  # ...but other tokens dropped


def test_gloo_equals_sim():
    if "gloo" not in dist.available_backends():
        pytest.skip("gloo is not available")
    for world_size in (2, 3):
        weights, x, cotangent = _case(world_size, seed=11)
        sim = dist.run(ex.expert_parallel_step, world_size, args=(weights, x, cotangent, 1.0))
        gloo = dist.run(
            ex.expert_parallel_step, world_size, backend="gloo", args=(weights, x, cotangent, 1.0)
        )
        assert (
            max(
                ex.largest_differences(
                    gloo, ex.one_process_step(weights, x, cotangent, 1.0)
                ).values()
            )
            < 1e-12
        )
        for a, b in zip(sim, gloo, strict=True):
            assert np.abs(a.y - b.y).max() < 1e-12
            assert np.abs(a.x_grad - b.x_grad).max() < 1e-12
            for ga, gb in zip(a.grads.as_tuple(), b.grads.as_tuple(), strict=True):
                assert np.abs(ga - gb).max() < 1e-12


def test_dropped_tokens_get_no_router_or_expert_gradient():
    world_size = 3
    weights, x, cotangent = _case(world_size, seed=5)
    routings = ex.routings_of(weights, x, 1.0)
    dropped = np.stack([~r.kept for r in routings])  # (P, T)
    assert dropped.sum() > 0 and (~dropped).sum() > 0
    only_dropped = cotangent * dropped[..., None]  # a loss that reads dropped tokens only
    ranks = dist.run(ex.expert_parallel_step, world_size, args=(weights, x, only_dropped, 1.0))
    for p, rank in enumerate(ranks):
        for grad in rank.grads.as_tuple():
            assert np.all(grad == 0.0)  # not small: zero
        assert np.array_equal(rank.x_grad, only_dropped[p])  # the residual's gradient alone
    # and with every token in the loss, the dropped tokens' cotangents change nothing
    changed = cotangent + 5.0 * dropped[..., None]
    a = ex.one_process_step(weights, x, cotangent, 1.0)
    b = ex.one_process_step(weights, x, changed, 1.0)
    for ga, gb in zip(a.grads.as_tuple(), b.grads.as_tuple(), strict=True):
        assert np.array_equal(ga, gb)
    assert np.array_equal(b.x_grad - a.x_grad, changed - cotangent)


def _dispatch_on_rank(x):
    """The dispatch of this rank's tokens, for a fixed routing of its own (uneven, drops)."""
    E, T = 2 * dist.world_size(), x.shape[0]
    logits = np.random.default_rng(dist.rank()).standard_normal((T, E)) + np.linspace(2, 0, E)
    routing = ex.route(logits, ex.expert_capacity(T, E, 1.0))
    buffer = ex.dispatch(x, routing)
    from chainrule.parallel import duality

    return duality.all_to_all_ranks(buffer, split_axis=0, concat_axis=1)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_dispatch_adjoint_identity_summed_over_ranks(world_size):
    forward, backward = distributed_adjoint_test(
        _dispatch_on_rank, [(TOKENS, D)], "per_rank", "per_rank", world_size, seed=world_size
    )
    assert forward == pytest.approx(backward, rel=1e-12, abs=1e-12)
    assert abs(forward) > 1e-3


def test_backward_of_each_all_to_all_swaps_its_axes_and_bytes_match_the_report():
    world_size = 4
    weights, x, cotangent = _case(world_size, experts_per_rank=2, seed=2)
    trace = dist.Trace()
    dist.run(ex.expert_parallel_step, world_size, args=(weights, x, cotangent, 1.0), trace=trace)
    moves = [
        (e.kwargs["split_axis"], e.kwargs["concat_axis"]) for e in trace if e.op == "all_to_all"
    ]
    # forward: dispatch (experts → slots), combine (slots → experts); backward: the reverse
    assert moves == [(0, 1), (1, 0), (0, 1), (1, 0)]
    assert [e.op for e in trace].count("all_reduce") == 2  # the replicated router's gradient
    report = ex.dispatch_report(ex.routings_of(weights, x, 1.0), D)
    for e in trace:
        if e.op == "all_to_all":
            assert event_bytes(e) == report.bytes_per_all_to_all
    C, E = report.capacity, report.num_experts
    assert report.bytes_per_all_to_all == (world_size - 1) / world_size * E * C * D * 8
    assert report.padding.tolist() == [E * C - k for k in report.kept.sum(axis=1)]
    assert (report.load - report.kept).sum(axis=1).tolist() == report.dropped.tolist()


def test_experts_must_split_evenly_over_the_ranks():
    weights, x, cotangent = _case(3, experts_per_rank=1)
    with pytest.raises(dist.RankError, match="equal chunks"):
        dist.run(ex.expert_parallel_step, 2, args=(weights, x[:2], cotangent[:2], 1.0))


def _dropless_on_rank(weights, x, cotangent):
    rank, P = dist.rank(), dist.world_size()
    router, router_bias, w1, w2 = (
        Tensor(a, requires_grad=True) for a in weights.shard(rank, P).as_tuple()
    )
    x_leaf = Tensor(x[rank], requires_grad=True)
    y, arriving = ex.dropless_moe(x_leaf, router, router_bias, w1, w2)
    (y * cotangent[rank]).sum().backward()
    return y.data, x_leaf.grad, w1.grad, router.grad, arriving


@pytest.mark.parametrize("world_size", [2, 4])
def test_dropless_routing_is_the_layer_with_room_for_every_token(world_size):
    E, T, d = 2 * world_size, 5, 3
    weights = ex.init_expert_weights(d, 4, E, skew=2.0, seed=7)  # uneven loads, some zero
    rng = np.random.default_rng(8)
    x, cotangent = rng.standard_normal((2, world_size, T, d))
    ranks = dist.run(_dropless_on_rank, world_size, args=(weights, x, cotangent))
    one = ex.one_process_step(weights, x, cotangent, capacity_factor=E)  # C = T: no drop
    assert all(r.dropped == 0 for r in one.routings)
    for p, (y, x_grad, w1_grad, router_grad, arriving) in enumerate(ranks):
        np.testing.assert_allclose(y, one.y[p], atol=1e-12)
        np.testing.assert_allclose(x_grad, one.x_grad[p], atol=1e-12)
        np.testing.assert_allclose(
            w1_grad, one.grads.w1[ex.experts_of_rank(p, E, world_size)], atol=1e-12
        )
        np.testing.assert_allclose(router_grad, one.grads.router, atol=1e-12)
        loads = [r.load for r in one.routings]
        np.testing.assert_array_equal(
            arriving, [load[ex.experts_of_rank(p, E, world_size)] for load in loads]
        )
