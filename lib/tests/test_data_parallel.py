"""Data parallelism on engine tensors in the simulated world: each reduction against one process."""

import numpy as np
import pytest
from chainrule import Tensor, dist
from chainrule.engine import ops, optim
from chainrule.parallel.data_parallel import (
    DataParallel,
    accumulate_gradients,
    average_gradients,
    clip_grad_norm_global,
    flatten_gradients,
    gradients_of,
    joined_epoch,
    local_batch_norm,
    padded_epoch,
    sync_batch_norm,
    token_weighted_gradients,
    unflatten_gradients,
    zeros_like_gradients,
)
from chainrule.parallel.tensor_parallel import init_mlp_weights, single_device_mlp

TOL = 1e-12
D_IN, HIDDEN, CLASSES = 4, 6, 3


def sgd_step(params, lr):
    """Plain SGD, then the gradients forgotten for the next step."""
    optim.sgd_step(params, lr)
    optim.zero_grad(params)


# -- the model and data used by the training tests -------------------------------------------


def make_batches(steps, rows, seed, masked=False):
    """``steps`` global batches (x, targets, mask) of ``rows`` rows each."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(steps):
        x = rng.standard_normal((rows, D_IN))
        targets = rng.integers(0, CLASSES, rows)
        mask = (rng.random(rows) < 0.6).astype(float) if masked else np.ones(rows)
        batches.append((x, targets, mask))
    return batches


def uneven_masks(batches, world_size):
    """Make rank 0's rows mostly real and the other ranks' rows mostly padding."""
    out = []
    for x, targets, mask in batches:
        mask = mask.copy()
        shard = len(mask) // world_size
        mask[:shard] = 1.0
        for r in range(1, world_size):
            mask[r * shard + 1 : (r + 1) * shard] *= np.arange(shard - 1) % 3 == 0
            mask[r * shard] = 1.0  # at least one real token on every rank
        out.append((x, targets, mask))
    return out


def loss_of(model, x, targets, mask):
    """Mean cross-entropy over the real tokens of the batch."""
    return ops.cross_entropy(model(Tensor(x)), targets, mask=mask)


def shard(array, rank, world_size):
    return np.split(array, world_size)[rank]


def train_single_process(weights, batches, lr, max_norm=None):
    model = single_device_mlp(weights)
    params = model.parameters()
    for x, targets, mask in batches:
        loss_of(model, x, targets, mask).backward()
        if max_norm is not None:
            grads = [p.grad for p in params]
            norm = np.sqrt(sum((g * g).sum() for g in grads))
            for p in params:
                p.grad = p.grad * min(1.0, max_norm / (norm + 1e-6))
        sgd_step(params, lr)
    return model.weights()


def train_data_parallel(weights, batches, lr, variant, max_norm=None, k=3):
    """One rank of data-parallel SGD; ``variant`` picks the reduction under test."""
    rank, world_size = dist.rank(), dist.world_size()
    model = single_device_mlp(weights)  # every rank holds the same replicated parameters
    params = model.parameters()
    norms = []
    for x, targets, mask in batches:
        x, targets, mask = (shard(a, rank, world_size) for a in (x, targets, mask))
        if variant == "accumulate":
            micro = list(zip(np.split(x, k), np.split(targets, k), np.split(mask, k), strict=True))
            accumulate_gradients(params, micro, lambda b: loss_of(model, *b))
            sgd_step(params, lr)
            continue
        loss_of(model, x, targets, mask).backward()
        grads = gradients_of(params)
        if variant == "tokens":
            grads = token_weighted_gradients(grads, mask.sum())
        elif variant == "mean":
            grads = average_gradients(grads)
        elif variant == "clip":
            grads, norm = sharded_clip(grads, params, max_norm)
            norms.append(norm)
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        sgd_step(params, lr)
    return model.weights(), norms


def sharded_clip(grads, params, max_norm):
    """Reduce-scatter the mean gradient, clip each rank's slice by the global norm, gather."""
    world_size = dist.world_size()
    flat = flatten_gradients(grads)
    padding = -len(flat) % world_size
    flat = np.concatenate([flat, np.zeros(padding)])
    mine = dist.reduce_scatter(flat, op=dist.ReduceOp.AVG)
    (clipped,), norm = clip_grad_norm_global([mine], max_norm, sharded=True)
    whole = dist.all_gather(clipped)[: len(flat) - padding]
    return unflatten_gradients(whole, params), norm


def assert_same_weights(got, expected, atol=1e-10):
    for g, e in zip(got.as_tuple(), expected.as_tuple(), strict=True):
        np.testing.assert_allclose(g, e, rtol=0, atol=atol)


# -- the syllabus's worked examples -------------------------------------------------------------


def squared_error_gradient(points, w=1.0):
    """∂/∂w of the mean of ½(wx − y)² over the points, by the engine."""
    wt = Tensor(np.array(w), requires_grad=True)
    x, y = np.array(points, dtype=float).T
    ((wt * x - y) ** 2 * 0.5).mean().backward()
    return float(wt.grad)


def test_worked_example_mean_of_local_gradients_is_the_full_batch_gradient():
    shards = [[(1, 0), (2, 1)], [(3, 1), (4, 2)]]

    def step():
        local = np.array(squared_error_gradient(shards[dist.rank()]))
        (mean,) = average_gradients([local])
        return float(mean)

    full = squared_error_gradient(shards[0] + shards[1])
    assert dist.run(step, 2) == [pytest.approx(full, abs=TOL)] * 2
    assert full == pytest.approx(4.25)  # the syllabus's number, ¼[1 + 2 + 6 + 8]


def per_token_problem(tokens, seed=0):
    """Per-token gradients of a 5-parameter model on each rank (rows are tokens)."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((t, 5)) for t in tokens]


def test_token_weighting_900_and_300_gives_the_mean_over_all_1200_tokens():
    per_token = per_token_problem([900, 300])
    true = np.concatenate(per_token).mean(axis=0)  # (G_0 + G_1) / 1200

    def step(weighted):
        local_mean = per_token[dist.rank()].mean(axis=0)
        if weighted:
            return token_weighted_gradients([local_mean], len(per_token[dist.rank()]))[0]
        return average_gradients([local_mean])[0]

    for g in dist.run(step, 2, args=(True,)):
        np.testing.assert_allclose(g, true, atol=TOL)
    plain = dist.run(step, 2, args=(False,))[0]
    g0, g1 = (t.sum(axis=0) for t in per_token)
    np.testing.assert_allclose(plain, g0 / 1800 + g1 / 600, atol=TOL)  # the wrong weights
    assert np.abs(plain - true).max() > 1e-3


def test_token_weighting_with_no_tokens_anywhere_is_zero():
    def step():
        return token_weighted_gradients([np.ones(3)], 0)[0]

    for g in dist.run(step, 3):
        np.testing.assert_array_equal(g, np.zeros(3))


# -- global clipping ----------------------------------------------------------------------------


@pytest.mark.parametrize("max_norm", [0.5, 100.0], ids=["clipping", "below-max"])
def test_clipping_sharded_gradients_uses_the_norm_of_the_whole_gradient(max_norm):
    rng = np.random.default_rng(3)
    full = [rng.standard_normal((4, 6)), rng.standard_normal(6)]
    full_norm = np.sqrt(sum((g * g).sum() for g in full))
    coefficient = min(1.0, max_norm / (full_norm + 1e-6))

    def step():
        mine = [np.split(g, 3, axis=-1)[dist.rank()] for g in full]
        return clip_grad_norm_global(mine, max_norm)

    for rank, (clipped, norm) in enumerate(dist.run(step, 3)):
        assert norm == pytest.approx(full_norm, rel=1e-12)
        for c, g in zip(clipped, full, strict=True):
            np.testing.assert_allclose(c, coefficient * np.split(g, 3, axis=-1)[rank], atol=TOL)


def test_clipping_replicated_gradients_does_not_count_them_p_times():
    g = np.array([3.0, 4.0])

    def step(sharded):
        return clip_grad_norm_global([g], 1.0, sharded=sharded)[1]

    assert dist.run(step, 4, args=(False,)) == [pytest.approx(5.0)] * 4
    assert dist.run(step, 4, args=(True,)) == [pytest.approx(10.0)] * 4  # √4 · 5: wrong here
    with pytest.raises(dist.RankError, match="2 flags for 1 gradients"):
        dist.run(lambda: clip_grad_norm_global([g], 1.0, sharded=[True, False]), 2)


# -- gradient accumulation and no_sync --------------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 4])
def test_accumulating_k_micro_batches_equals_the_big_batch(world_size):
    weights = init_mlp_weights(D_IN, HIDDEN, CLASSES, seed=1)
    ((x, targets, mask),) = make_batches(1, 24, seed=2)
    model = single_device_mlp(weights)
    loss_of(model, x, targets, mask).backward()
    expected = model.gradients()

    def step(no_sync, k):
        model = single_device_mlp(weights)
        mine = [shard(a, dist.rank(), dist.world_size()) for a in (x, targets, mask)]
        micro = list(zip(*(np.split(a, k) for a in mine), strict=True))
        accumulate_gradients(model.parameters(), micro, lambda b: loss_of(model, *b), no_sync)
        return model.gradients()

    for no_sync in (True, False):
        trace = dist.Trace()
        results = dist.run(step, world_size, args=(no_sync, 3), trace=trace)
        for grads in results:
            assert_same_weights(grads, expected, atol=TOL)
        assert trace.count("all_reduce") == (1 if no_sync else 3)


def test_no_sync_costs_one_all_reduce_per_bucket_per_step():
    weights = init_mlp_weights(D_IN, HIDDEN, CLASSES, seed=1)
    ((x, targets, mask),) = make_batches(1, 8, seed=2)

    def step(no_sync, k, bucket_cap):
        model = single_device_mlp(weights)
        micro = list(zip(*(np.split(a, k) for a in (x, targets, mask)), strict=True))
        params = model.parameters()
        accumulate_gradients(params, micro, lambda b: loss_of(model, *b), no_sync, bucket_cap)
        return len(DataParallel(params, bucket_cap).buckets)

    for no_sync, k, cap in [(True, 4, 30), (False, 4, 30), (True, 2, None), (False, 2, None)]:
        trace = dist.Trace()
        (buckets, _) = dist.run(step, 2, args=(no_sync, k, cap), trace=trace)
        assert buckets == (1 if cap is None else 2)  # 24 + 6 elements, then 18 + 3
        assert trace.count("all_reduce") == buckets * (1 if no_sync else k)


def test_data_parallel_sync_averages_and_no_sync_only_accumulates():
    def step():
        p = Tensor(np.zeros(3), requires_grad=True)
        dp = DataParallel([p])
        with dp.no_sync():
            assert not dp.will_sync
            dp.backward((p * (dist.rank() + 1.0)).sum())
        local = p.grad.copy()
        dp.sync_gradients()
        return local, p.grad

    for rank, (local, averaged) in enumerate(dist.run(step, 4)):
        np.testing.assert_array_equal(local, np.full(3, rank + 1.0))
        np.testing.assert_allclose(averaged, np.full(3, 2.5))


def test_parameters_without_a_gradient_still_take_part_with_zeros():
    def step():
        used, unused = (
            Tensor(np.ones(2), requires_grad=True),
            Tensor(np.ones(3), requires_grad=True),
        )
        dp = DataParallel([used, unused])
        if dist.rank() == 0:
            dp.backward((used * 2.0).sum())
        else:
            dp.backward((used * unused[:2]).sum())
        return unused.grad

    grads = dist.run(step, 2)
    np.testing.assert_allclose(grads[0], [0.5, 0.5, 0.0])


# -- ten steps of data-parallel SGD against one process -----------------------------------------


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("variant", ["mean", "tokens", "clip", "accumulate"])
def test_ten_steps_of_data_parallel_sgd_match_full_batch_training(variant, world_size):
    weights = init_mlp_weights(D_IN, HIDDEN, CLASSES, seed=5)
    batches = make_batches(10, 24, seed=6, masked=variant == "tokens")
    if variant == "tokens":
        batches = uneven_masks(batches, world_size)
    max_norm = 0.3 if variant == "clip" else None
    expected = train_single_process(weights, batches, lr=0.5, max_norm=max_norm)
    results = dist.run(
        train_data_parallel, world_size, args=(weights, batches, 0.5, variant, max_norm)
    )
    for got, _ in results:
        assert_same_weights(got, expected)
    if variant == "clip":
        assert max(results[0][1]) > max_norm  # the clip was active
    assert np.abs(expected.w1 - weights.w1).max() > 1e-2  # training moved the weights


def test_plain_averaging_of_uneven_token_counts_drifts_from_full_batch_training():
    weights = init_mlp_weights(D_IN, HIDDEN, CLASSES, seed=5)
    batches = uneven_masks(make_batches(10, 24, seed=6, masked=True), 2)
    expected = train_single_process(weights, batches, lr=0.5)
    (got, _), _ = dist.run(train_data_parallel, 2, args=(weights, batches, 0.5, "mean"))
    assert np.abs(got.w1 - expected.w1).max() > 1e-3


# -- uneven numbers of batches: padding and join ------------------------------------------------


def rank_batches(counts, rows=4, seed=7):
    """``counts[r]`` batches for rank r."""
    rng = np.random.default_rng(seed)
    return [
        [(rng.standard_normal((rows, D_IN)), rng.integers(0, CLASSES, rows)) for _ in range(n)]
        for n in counts
    ]


def train_uneven(weights, per_rank, lr, epoch):
    model = single_device_mlp(weights)
    params = model.parameters()
    mine = per_rank[dist.rank()]
    source = padded_epoch(mine) if epoch == "padded" else joined_epoch(iter(mine))
    steps = 0
    for batch in source:
        if batch is None:  # shadow the step: zero gradients, zero weight
            grads, tokens = zeros_like_gradients(params), 0
        else:
            x, targets = batch
            ops.cross_entropy(model(Tensor(x)), targets).backward()
            grads, tokens = gradients_of(params), len(targets)
        for p, g in zip(params, token_weighted_gradients(grads, tokens), strict=True):
            p.grad = g
        sgd_step(params, lr)
        steps += 1
    return model.weights(), steps


def train_uneven_single_process(weights, per_rank, lr):
    model = single_device_mlp(weights)
    for step in range(max(len(b) for b in per_rank)):
        present = [b[step] for b in per_rank if step < len(b)]
        x = np.concatenate([x for x, _ in present])
        targets = np.concatenate([t for _, t in present])
        ops.cross_entropy(model(Tensor(x)), targets).backward()
        sgd_step(model.parameters(), lr)
    return model.weights()


@pytest.mark.parametrize("epoch", ["padded", "joined"])
@pytest.mark.parametrize("counts", [[3, 1, 2], [2, 0], [1, 1, 4, 2]], ids=str)
def test_uneven_batch_counts_finish_together_with_the_right_gradient(counts, epoch):
    weights = init_mlp_weights(D_IN, HIDDEN, CLASSES, seed=8)
    per_rank = rank_batches(counts)
    expected = train_uneven_single_process(weights, per_rank, lr=0.3)
    trace = dist.Trace()
    results = dist.run(
        train_uneven, len(counts), args=(weights, per_rank, 0.3, epoch), timeout=10, trace=trace
    )
    steps = max(counts)
    for got, taken in results:
        assert taken == steps
        assert_same_weights(got, expected)
    per_step = 1 + len(weights.as_tuple())  # the token count, then one per gradient
    control = 1 if epoch == "padded" else steps + 1  # one MAX, or one flag per step + the last
    assert trace.count("all_reduce") == steps * per_step + control


def test_without_padding_or_join_the_early_rank_breaks_the_collective():
    weights = init_mlp_weights(D_IN, HIDDEN, CLASSES, seed=8)
    per_rank = rank_batches([2, 1])

    def naive():
        model = single_device_mlp(weights)
        for x, targets in per_rank[dist.rank()]:
            ops.cross_entropy(model(Tensor(x)), targets).backward()
            average_gradients(gradients_of(model.parameters()))

    with pytest.raises(dist.CollectiveError):
        dist.run(naive, 2, timeout=5)


# -- batch normalisation: local statistics change the function, synchronised ones do not ---------


def batch_norm_problem(seed=9):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((12, 4)) * 2.0 + 1.0
    weight, bias = rng.standard_normal(4), rng.standard_normal(4)
    readout = rng.standard_normal((12, 4))
    return x, weight, bias, readout


def torch_full_batch_norm(x, weight, bias, readout):
    import torch

    xt, wt, bt = (torch.tensor(a, requires_grad=True) for a in (x, weight, bias))
    y = torch.nn.functional.batch_norm(xt, None, None, wt, bt, training=True, eps=1e-5)
    (y * torch.tensor(readout)).sum().backward()
    return [t.detach().numpy() for t in (y, xt.grad, wt.grad, bt.grad)]


def batch_norm_on_ranks(norm, x, weight, bias, readout):
    rank, world_size = dist.rank(), dist.world_size()
    xt = Tensor(shard(x, rank, world_size), requires_grad=True)
    wt, bt = Tensor(weight, requires_grad=True), Tensor(bias, requires_grad=True)
    y = norm(xt, wt, bt, 1e-5)
    (y * shard(readout, rank, world_size)).sum().backward()
    return y.data, xt.grad, wt.grad, bt.grad


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_sync_batch_norm_is_full_batch_batch_norm(world_size):
    x, weight, bias, readout = batch_norm_problem()
    y, x_grad, w_grad, b_grad = torch_full_batch_norm(x, weight, bias, readout)
    results = dist.run(
        batch_norm_on_ranks, world_size, args=(sync_batch_norm, x, weight, bias, readout)
    )
    np.testing.assert_allclose(np.concatenate([r[0] for r in results]), y, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([r[1] for r in results]), x_grad, atol=1e-12)
    np.testing.assert_allclose(sum(r[2] for r in results), w_grad, atol=1e-12)
    np.testing.assert_allclose(sum(r[3] for r in results), b_grad, atol=1e-12)


def test_local_batch_norm_is_a_different_function_of_the_global_batch():
    x, weight, bias, readout = batch_norm_problem()
    y, x_grad, _, _ = torch_full_batch_norm(x, weight, bias, readout)
    results = dist.run(batch_norm_on_ranks, 3, args=(local_batch_norm, x, weight, bias, readout))
    assert np.abs(np.concatenate([r[0] for r in results]) - y).max() > 1e-2
    assert np.abs(np.concatenate([r[1] for r in results]) - x_grad).max() > 1e-2
    one_rank = dist.run(batch_norm_on_ranks, 1, args=(local_batch_norm, x, weight, bias, readout))
    np.testing.assert_allclose(one_rank[0][0], y, atol=1e-12)  # the same function on one rank


def test_sync_batch_norm_statistics_need_one_all_reduce_each_way():
    x, weight, bias, readout = batch_norm_problem()
    trace = dist.Trace()
    dist.run(batch_norm_on_ranks, 2, args=(sync_batch_norm, x, weight, bias, readout), trace=trace)
    assert trace.ops() == ["all_reduce", "all_reduce"]
    assert trace[0].shapes[0] == (2 * 4 + 1,)  # sums, sums of squares, count


# -- small pieces -----------------------------------------------------------------------------


def test_flatten_and_unflatten_are_inverse():
    grads = [np.arange(6.0).reshape(2, 3), np.array([7.0]), np.zeros((0, 2))]
    flat = flatten_gradients(grads)
    assert flat.shape == (7,)
    for back, g in zip(unflatten_gradients(flat, grads), grads, strict=True):
        np.testing.assert_array_equal(back, g)
