"""Context parallelism: ring attention (plain and zig-zag, with and without the causal mask) and
Ulysses attention equal one process's attention, forward and backward, on the simulated world
(float64, to rounding) and on gloo (torch autograd Functions and engine rows, one world); the
ring's backward moves the gradients of K and V the other way; the causal work per rank."""

import numpy as np
import pytest
import torch
from chainrule import Tensor, dist
from chainrule.parallel import context as cp
from chainrule.parallel import context_torch as ct

TOL = 1e-12
H, N, D = 4, 24, 3  # 24 cuts into P and 2P chunks for P = 1, 2, 3, 4 (P = 6 for plain)
VARIANTS = [  # (kind, layout, causal)
    ("ring", "plain", False),
    ("ring", "plain", True),
    ("ring", "zigzag", False),
    ("ring", "zigzag", True),
    ("ulysses", "plain", False),
    ("ulysses", "plain", True),
]


def inputs(seed=0, heads=H):
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal((heads, N, D)) for _ in range(4)
    ]  # q, k, v and the output's gradient


def reference(q, k, v, g, causal):
    """One process: the output and the gradients of q, k, v."""
    leaves = [Tensor(x, requires_grad=True) for x in (q, k, v)]
    out = cp.attention(*leaves, causal=causal)
    out.backward(g)
    return [out.data] + [x.grad for x in leaves]


def engine_rank(q, k, v, g, kind, layout, causal):
    r, P = dist.rank(), dist.world_size()
    leaves = [Tensor(cp.shard_sequence(x, r, P, layout), requires_grad=True) for x in (q, k, v)]
    if kind == "ring":
        out = cp.ring_attention(*leaves, causal=causal, layout=layout)
    else:
        out = cp.ulysses_attention(*leaves, causal=causal)
    out.backward(cp.shard_sequence(g, r, P, layout))
    return [out.data] + [x.grad for x in leaves]


def torch_rank(q, k, v, g, kind, layout, causal):
    r, P = dist.rank(), dist.world_size()
    leaves = [
        torch.tensor(cp.shard_sequence(x, r, P, layout), requires_grad=True) for x in (q, k, v)
    ]
    if kind == "ring":
        out = ct.ring_attention(*leaves, causal=causal, layout=layout)
    else:
        out = ct.ulysses_attention(*leaves, causal=causal)
    out.backward(torch.tensor(cp.shard_sequence(g, r, P, layout)))
    return [out.detach().numpy()] + [x.grad.numpy() for x in leaves]


def largest_error(per_rank, layout, expected):
    """The largest difference between the ranks' results, put back in sequence order, and
    one process's."""
    got = [cp.unshard_sequence([rank[i] for rank in per_rank], layout) for i in range(4)]
    return max(float(np.abs(a - b).max()) for a, b in zip(got, expected, strict=True))


# -- layouts and the work of the causal mask ------------------------------------------------------


def test_the_zigzag_split_pairs_each_front_chunk_with_its_mirror():
    assert [cp.sequence_chunks(r, 4, "zigzag") for r in range(4)] == [
        [0, 7],
        [1, 6],
        [2, 5],
        [3, 4],
    ]
    assert [cp.sequence_chunks(r, 4, "plain") for r in range(4)] == [[0], [1], [2], [3]]
    x = np.arange(2 * 16 * 1.0).reshape(2, 16, 1)
    for layout in ("plain", "zigzag"):
        parts = [cp.shard_sequence(x, r, 4, layout) for r in range(4)]
        assert np.array_equal(cp.unshard_sequence(parts, layout), x)
    assert cp.shard_sequence(x, 1, 4, "zigzag")[0, :, 0].tolist() == [2, 3, 12, 13]
    with pytest.raises(ValueError, match="does not cut into 8 equal chunks"):
        cp.shard_sequence(np.zeros((12, 1)), 0, 4, "zigzag")
    with pytest.raises(ValueError, match="layout must be"):
        cp.chunk_count(4, "diagonal")


@pytest.mark.parametrize("P", [2, 3, 4, 8])
def test_a_plain_causal_split_idles_ranks_and_the_zigzag_split_does_not(P):
    plain, zigzag = cp.ring_work(P, "plain"), cp.ring_work(P, "zigzag")
    assert plain.sum(axis=1).tolist() == [r + 0.5 for r in range(P)]  # rank r: r + ½ blocks
    assert zigzag.sum(axis=1).tolist() == [P / 2] * P
    assert plain.sum() == zigzag.sum() == P * P / 2  # the same work, the lower triangle
    assert (zigzag == 0.5).all()  # two half-size blocks at every step, on every rank
    assert cp.idle_share(plain) == pytest.approx((P - 1) / (2 * P - 1), abs=1e-15)
    assert cp.idle_share(zigzag) == 0.0
    assert (cp.ring_work(P, "plain", causal=False) == 1.0).all()


def test_the_pairs_a_rank_computes_follow_the_mask():
    assert cp.ring_pairs(0, 0, 2, "plain", True) == [(0, 0, "diagonal")]
    assert cp.ring_pairs(0, 1, 2, "plain", True) == []  # rank 1's keys come after rank 0's queries
    assert cp.ring_pairs(1, 1, 2, "plain", True) == [(1, 0, "full")]
    assert cp.ring_pairs(0, 1, 2, "zigzag", True) == [(3, 1, "full"), (3, 2, "full")]
    assert cp.ring_source(0, 1, 4) == 3 and cp.ring_source(3, 2, 4) == 1


# -- the merge of partial softmaxes ----------------------------------------------------------------


def test_two_partial_softmaxes_merge_into_the_whole_one():
    rng = np.random.default_rng(3)
    q, k, v = (
        rng.standard_normal((5, 3)),
        rng.standard_normal((8, 3)) * 4,
        rng.standard_normal((8, 2)),
    )
    whole = cp.attention(q, k, v).data
    a = cp.block_attention(q, k[:3], v[:3])
    b = cp.block_attention(q, k[3:], v[3:])
    for merged in (cp.merge_partials(a, b), cp.merge_partials(b, a)):
        assert np.abs(merged[0].data - whole).max() <= TOL
        scores = q @ k.T / np.sqrt(3)
        assert np.abs(merged[1].data[:, 0] - np.log(np.exp(scores).sum(axis=1))).max() <= TOL
    mask = cp.causal_mask(3)
    assert mask[0].tolist() == [0.0, -np.inf, -np.inf] and mask[2].tolist() == [0.0] * 3


# -- equal to one process --------------------------------------------------------------------------


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_every_variant_equals_one_process_on_the_simulated_world(P):
    q, k, v, g = inputs(P)
    for kind, layout, causal in VARIANTS:
        if kind == "ulysses" and H % P:
            continue
        per_rank = dist.run(engine_rank, P, args=(q, k, v, g, kind, layout, causal))
        error = largest_error(per_rank, layout, reference(q, k, v, g, causal))
        assert error <= TOL, (kind, layout, causal, error)


def test_a_ring_of_six_with_the_causal_mask():
    q, k, v, g = inputs(6)
    per_rank = dist.run(engine_rank, 6, args=(q, k, v, g, "ring", "plain", True))
    assert largest_error(per_rank, "plain", reference(q, k, v, g, True)) <= TOL


@pytest.mark.skipif(not dist.is_available("gloo"), reason="no gloo")
def test_torch_and_engine_on_three_gloo_processes():
    """One world of three processes (odd: ranks 2 and 0 both send first), six heads: every
    variant with torch's autograd through the torch rows, and the ring with the engine through
    the engine rows."""
    q, k, v, g = inputs(7, heads=6)
    per_variant = dist.run(_every_variant, 3, args=(q, k, v, g), backend="gloo")
    for i, (_, layout, causal) in enumerate(VARIANTS):
        expected = reference(q, k, v, g, causal)
        for framework in (0, 1):
            per_rank = [rank[i][framework] for rank in per_variant]
            if per_rank[0] is not None:
                assert largest_error(per_rank, layout, expected) <= TOL


def _every_variant(q, k, v, g):
    return [
        (
            torch_rank(q, k, v, g, kind, layout, causal),
            engine_rank(q, k, v, g, kind, layout, causal) if kind == "ring" else None,
        )
        for kind, layout, causal in VARIANTS
    ]


# -- what travels --------------------------------------------------------------------------------


def _traced(q, k, v, g):
    r, P = dist.rank(), dist.world_size()
    leaves = [Tensor(cp.shard_sequence(x, r, P, "plain"), requires_grad=True) for x in (q, k, v)]
    out = cp.ring_attention(*leaves)
    dist.barrier()
    out.backward(cp.shard_sequence(g, r, P, "plain"))


def test_keys_and_values_go_round_forward_and_their_gradients_come_back():
    trace = dist.Trace()
    dist.run(_traced, 4, args=tuple(inputs()), trace=trace)
    moves = [(e.op, e.kwargs.get("src"), e.kwargs.get("dst"), e.nbytes) for e in trace]
    split = moves.index(("barrier", None, None, 0))
    block = 2 * H * (N // 4) * D * 8  # K and V of one rank, float64
    forward = sorted(moves[:split])
    assert forward == sorted([("send", r, (r + 1) % 4, block) for r in range(4)] * 3)
    assert sorted(moves[split + 1 :]) == sorted(
        [("send", (r + 1) % 4, r, block) for r in range(4)] * 3
    )
    assert cp.ring_bytes((H, N // 4, D), 4) == 3 * block


def _everyone_sends_first(x):
    r, P = dist.rank(), dist.world_size()
    from chainrule.parallel.duality import recv_from_rank, send_to_rank

    phony = send_to_rank(Tensor(x, requires_grad=True), (r + 1) % P).sum()
    return phony + recv_from_rank((r - 1) % P)


def test_a_ring_where_every_rank_sends_first_is_a_named_deadlock():
    with pytest.raises(dist.CollectiveError, match="deadlock"):
        dist.run(_everyone_sends_first, 3, args=(np.ones(2),))


def test_ulysses_moves_less_than_the_ring_and_needs_the_heads_to_split():
    shape = (H, N // 4, D)
    assert cp.ulysses_bytes(shape, 4) == 4 * 3 * H * (N // 4) * D * 8 // 4
    assert cp.ulysses_bytes(shape, 4) < cp.ring_bytes(shape, 4)
    q = np.zeros((3, 4, 2))
    with pytest.raises(dist.RankError, match="3 heads do not split over 2 ranks"):
        dist.run(lambda: cp.ulysses_attention(q, q, q), 2)


def _two_layers(q, k, v, g, w):
    """Two ring attentions stacked, the second's queries, keys and values computed from the
    first's output and from k, and a loss that reads k once more: the backward meets the ring's
    messages in a graph the ring did not build alone."""
    r, P = dist.rank(), dist.world_size()
    leaves = [Tensor(cp.shard_sequence(x, r, P, "zigzag"), requires_grad=True) for x in (q, k, v)]
    first = cp.ring_attention(*leaves, causal=True, layout="zigzag")
    second = cp.ring_attention(first @ w, leaves[1] + first, first, causal=True, layout="zigzag")
    loss = (second * cp.shard_sequence(g, r, P, "zigzag")).sum() + (leaves[1] * leaves[1]).sum()
    loss.backward()
    return [second.data] + [x.grad for x in leaves]


def test_two_stacked_rings_on_five_ranks_equal_one_process():
    rng = np.random.default_rng(5)
    q, k, v, g = (rng.standard_normal((2, 20, D)) for _ in range(4))
    w = rng.standard_normal((D, D))
    leaves = [Tensor(x, requires_grad=True) for x in (q, k, v)]
    first = cp.attention(*leaves, causal=True)
    second = cp.attention(first @ w, leaves[1] + first, first, causal=True)
    ((second * g).sum() + (leaves[1] * leaves[1]).sum()).backward()
    expected = [second.data] + [x.grad for x in leaves]
    per_rank = dist.run(_two_layers, 5, args=(q, k, v, g, w))
    assert largest_error(per_rank, "zigzag", expected) <= TOL
