"""Data parallelism on two gloo processes against one process: torch autograd SGD, and the
engine's uneven epochs and synchronised batch norm on real processes.

Each test is one or two ``dist.run`` calls (the process pool is shared by the test suite).
"""

import numpy as np
import torch
import torch.nn.functional as F
from chainrule import Tensor, dist
from chainrule.engine import ops, optim
from chainrule.parallel.data_parallel import (
    accumulate_gradients,
    average_gradients,
    clip_grad_norm_global,
    flatten_gradients,
    gradients_of,
    joined_epoch,
    padded_epoch,
    sync_batch_norm,
    token_weighted_gradients,
    unflatten_gradients,
    zeros_like_gradients,
)
from chainrule.parallel.tensor_parallel import init_mlp_weights, single_device_mlp

D_IN, HIDDEN, CLASSES, ROWS, STEPS, LR = 4, 6, 3, 24, 10, 0.5
MAX_NORM = 0.3
VARIANTS = ("mean", "tokens", "clip", "accumulate")


def sgd_step(params, lr):
    """Plain SGD, then the gradients forgotten for the next step."""
    optim.sgd_step(params, lr)
    optim.zero_grad(params)


def make_batches(seed, masked):
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(STEPS):
        x = rng.standard_normal((ROWS, D_IN))
        targets = rng.integers(0, CLASSES, ROWS)
        # rank 0's half is all real tokens, rank 1's half mostly padding: uneven token counts
        mask = np.ones(ROWS)
        if masked:
            mask[ROWS // 2 + 1 :] = np.arange(ROWS // 2 - 1) % 4 == 0
        batches.append((x, targets, mask))
    return batches


def masked_cross_entropy(model, x, targets, mask):
    """Mean cross-entropy over the real tokens (mask 1), torch autograd."""
    logits = model(torch.tensor(x))
    per_token = F.cross_entropy(logits, torch.tensor(targets), reduction="none")
    mask = torch.tensor(mask)
    return (per_token * mask).sum() / mask.sum()


def train_single_process(weights, batches, max_norm=None):
    model = single_device_mlp(weights, framework="torch")
    params = model.parameters()
    for batch in batches:
        masked_cross_entropy(model, *batch).backward()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, max_norm)
        sgd_step(params, LR)
    return model.weights()


def sharded_clip(grads, params, max_norm):
    """Reduce-scatter the mean gradient, clip each slice with the global norm, gather."""
    world_size = dist.world_size()
    flat = flatten_gradients(grads)
    padding = -flat.numel() % world_size
    flat = torch.cat([flat, torch.zeros(padding, dtype=flat.dtype)])
    mine = dist.reduce_scatter(flat, op=dist.ReduceOp.AVG)
    (clipped,), _ = clip_grad_norm_global([mine], max_norm, sharded=True)
    whole = dist.all_gather(clipped)[: flat.numel() - padding]
    return unflatten_gradients(whole, params)


def train_data_parallel(weights, batches, variant, k=3):
    rank, world_size = dist.rank(), dist.world_size()
    model = single_device_mlp(weights, framework="torch")
    params = model.parameters()
    for batch in batches:
        x, targets, mask = (np.split(a, world_size)[rank] for a in batch)
        if variant == "accumulate":
            micro = list(zip(np.split(x, k), np.split(targets, k), np.split(mask, k), strict=True))
            accumulate_gradients(params, micro, lambda b: masked_cross_entropy(model, *b))
        else:
            masked_cross_entropy(model, x, targets, mask).backward()
            grads = gradients_of(params)
            if variant == "tokens":
                grads = token_weighted_gradients(grads, float(mask.sum()))
            elif variant == "mean":
                grads = average_gradients(grads)
            else:
                grads = sharded_clip(grads, params, MAX_NORM)
            for p, g in zip(params, grads, strict=True):
                p.grad = g
        sgd_step(params, LR)
    return model.weights()


def all_variants(weights, plain, masked):
    return {
        variant: train_data_parallel(weights, masked if variant == "tokens" else plain, variant)
        for variant in VARIANTS
    }


def test_ten_steps_of_torch_data_parallel_sgd_on_gloo_match_one_process():
    weights = init_mlp_weights(D_IN, HIDDEN, CLASSES, seed=5)
    plain, masked = make_batches(6, masked=False), make_batches(6, masked=True)
    expected = {
        "mean": train_single_process(weights, plain),
        "tokens": train_single_process(weights, masked),
        "clip": train_single_process(weights, plain, MAX_NORM),
        "accumulate": train_single_process(weights, plain),
    }
    assert np.abs(expected["clip"].w1 - expected["mean"].w1).max() > 1e-3  # clipping acted
    for result in dist.run(all_variants, 2, backend="gloo", args=(weights, plain, masked)):
        for variant in VARIANTS:
            for got, want in zip(
                result[variant].as_tuple(), expected[variant].as_tuple(), strict=True
            ):
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-10, err_msg=variant)


def count_all_reduces(weights, plain, no_sync):
    model = single_device_mlp(weights, framework="torch")
    x, targets, mask = (np.split(a, 2)[dist.rank()] for a in plain[0])
    micro = list(zip(np.split(x, 3), np.split(targets, 3), np.split(mask, 3), strict=True))
    accumulate_gradients(
        model.parameters(), micro, lambda b: masked_cross_entropy(model, *b), no_sync
    )
    return model.gradients()


def test_no_sync_on_gloo_reduces_once_instead_of_k_times():
    weights = init_mlp_weights(D_IN, HIDDEN, CLASSES, seed=5)
    plain = make_batches(6, masked=False)[:1]
    results = {}
    for no_sync in (True, False):
        trace = dist.Trace()
        results[no_sync] = dist.run(
            count_all_reduces, 2, backend="gloo", args=(weights, plain, no_sync), trace=trace
        )
        assert trace.count("all_reduce") == (1 if no_sync else 3)
    for a, b in zip(results[True][0].as_tuple(), results[False][0].as_tuple(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-12)


# -- engine tensors on real processes: uneven epochs and synchronised batch norm --------------


def engine_blocks_on_ranks(weights, per_rank, x, readout):
    """Padded and joined epochs (uneven batch counts) and sync batch norm, engine tensors."""
    results = {}
    for epoch in ("padded", "joined"):
        model = single_device_mlp(weights)
        params = model.parameters()
        mine = per_rank[dist.rank()]
        source = padded_epoch(mine) if epoch == "padded" else joined_epoch(iter(mine))
        for batch in source:
            if batch is None:
                grads, tokens = zeros_like_gradients(params), 0
            else:
                ops.cross_entropy(model(Tensor(batch[0])), batch[1]).backward()
                grads, tokens = gradients_of(params), len(batch[1])
            for p, g in zip(params, token_weighted_gradients(grads, tokens), strict=True):
                p.grad = g
            sgd_step(params, LR)
        results[epoch] = model.weights()
    xt = Tensor(np.split(x, 2)[dist.rank()], requires_grad=True)
    (sync_batch_norm(xt) * np.split(readout, 2)[dist.rank()]).sum().backward()
    results["batch_norm_grad"] = xt.grad
    return results


def test_engine_epochs_and_sync_batch_norm_on_gloo():
    rng = np.random.default_rng(11)
    weights = init_mlp_weights(D_IN, HIDDEN, CLASSES, seed=12)
    per_rank = [
        [(rng.standard_normal((4, D_IN)), rng.integers(0, CLASSES, 4)) for _ in range(n)]
        for n in (3, 1)
    ]
    model = single_device_mlp(weights)
    for step in range(3):
        present = [b[step] for b in per_rank if step < len(b)]
        x = np.concatenate([b[0] for b in present])
        targets = np.concatenate([b[1] for b in present])
        ops.cross_entropy(model(Tensor(x)), targets).backward()
        sgd_step(model.parameters(), LR)
    expected = model.weights()
    x, readout = rng.standard_normal((8, 3)), rng.standard_normal((8, 3))
    xt = torch.tensor(x, requires_grad=True)
    y = F.batch_norm(xt, None, None, training=True, eps=1e-5)
    (y * torch.tensor(readout)).sum().backward()

    results = dist.run(
        engine_blocks_on_ranks, 2, backend="gloo", args=(weights, per_rank, x, readout), timeout=60
    )
    for epoch in ("padded", "joined"):
        for result in results:
            for got, want in zip(result[epoch].as_tuple(), expected.as_tuple(), strict=True):
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-10, err_msg=epoch)
    x_grad = np.concatenate([r["batch_norm_grad"] for r in results])
    np.testing.assert_allclose(x_grad, xt.grad.numpy(), atol=1e-12)
