"""Lesson 5's computations: accumulation equals the big batch, float16 overflow, no-sync traffic."""

import numpy as np
import pytest
import torch
from chainrule.course.widgets import accumulation as acc


@pytest.fixture(scope="module")
def pool():
    model, x, y = acc.make_regression(n=128)
    return acc.micro_batch_gradients(model, x, y, 32)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_micro_batches_give_the_full_batch_gradient(k):
    model, x, y = acc.make_regression(n=32)
    check = acc.accumulation_check(model, x, y, k)
    assert check.k == k
    assert check.max_error < 1e-12
    assert any(np.abs(g).max() > 1e-3 for g in check.full_batch)


def test_accumulating_unscaled_losses_gives_k_times_the_gradient():
    model, x, y = acc.make_regression(n=32)
    full = acc.gradient(model, acc.mean_loss(model, x, y))
    for p in model.parameters():
        p.grad = None
    for xj, yj in zip(np.split(x, 4), np.split(y, 4), strict=True):
        acc.mean_loss(model, xj, yj).backward()
    for p, f in zip(model.parameters(), full, strict=True):
        np.testing.assert_allclose(p.grad, 4 * f, atol=1e-12)


def test_uneven_micro_batches_are_refused():
    model, x, y = acc.make_regression(n=30)
    with pytest.raises(ValueError):
        acc.accumulation_check(model, x, y, 4)


def test_micro_batch_gradients_have_one_row_per_micro_batch(pool):
    model, x, y = acc.make_regression(n=128)
    assert pool.shape == (32, sum(p.size for p in model.parameters()))
    np.testing.assert_allclose(
        pool.mean(axis=0),
        np.concatenate([g.ravel() for g in acc.gradient(model, acc.mean_loss(model, x, y))]),
        atol=1e-12,
    )


def test_largest_safe_scale_is_the_largest_power_of_two_that_fits(pool):
    scale = acc.largest_safe_scale(pool)
    assert np.log2(scale) == int(np.log2(scale))
    peak = np.abs(pool).max()
    assert scale * peak <= acc.FP16_MAX < 2 * scale * peak


def test_fp16_accumulation_matches_torch_float16(pool):
    k, scale = 8, acc.largest_safe_scale(pool)
    result = acc.fp16_accumulation(pool[:k], scale)
    after = torch.zeros(pool.shape[1], dtype=torch.float16)
    first = torch.zeros(pool.shape[1], dtype=torch.float16)
    for j in range(k):
        after += torch.tensor(scale * pool[j]).half()
        first += torch.tensor(scale / k * pool[j]).half()
        assert result.peak_after[j] == after.abs().max().item()
        assert result.peak_first[j] == first.abs().max().item()
    np.testing.assert_array_equal(result.result_first, (first.float() / scale).numpy())


def test_scaling_after_overflows_and_scaling_the_loss_first_does_not(pool):
    scale = acc.largest_safe_scale(pool)
    result = acc.fp16_accumulation(pool[:8], scale)
    assert np.all(np.isfinite((scale * pool[:8]).astype(np.float16)))  # each backward fits
    assert result.overflow_after is not None and result.overflow_after <= 8
    assert not np.all(np.isfinite(result.result_after))
    assert result.overflow_first is None
    np.testing.assert_allclose(result.result_first, pool[:8].mean(axis=0), atol=1e-3)
    assert result.error_first < 1e-3


def test_one_micro_batch_is_the_same_either_way(pool):
    result = acc.fp16_accumulation(pool[:1], 1024.0)
    np.testing.assert_array_equal(result.result_after, result.result_first)
    assert result.overflow_after is None


def test_no_sync_makes_one_all_reduce_instead_of_k():
    k, world = 4, 2
    synced = acc.accumulation_traffic(world, k, no_sync=False)
    lazy = acc.accumulation_traffic(world, k, no_sync=True)
    assert synced.all_reduces == k and lazy.all_reduces == 1
    assert synced.payload_bytes == k * lazy.payload_bytes > 0
    # A ring all-reduce sends 2(P − 1)/P of its payload: for two ranks, the payload itself.
    assert synced.ring_bytes_sent == 2 * (world - 1) / world * synced.payload_bytes
    assert acc.accumulation_traffic(4, k, no_sync=True).ring_bytes_sent == pytest.approx(
        1.5 * lazy.payload_bytes
    )
    assert synced.trace.ops() == ["all_reduce"] * k and lazy.trace.ops() == ["all_reduce"]
    full = acc.full_batch_gradient(world, k)
    for rank in range(world):
        for a, b, f in zip(synced.grads[rank], lazy.grads[rank], full, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-14)
            np.testing.assert_allclose(b, f, atol=1e-14)


def test_fp16_widget_recomputes_when_sliders_move(pool):
    widget = acc.build_fp16_widget(pool, k=8)
    assert widget.last_result.k == 8
    assert widget.last_result.loss_scale == acc.largest_safe_scale(pool)
    assert widget.last_result.overflow_after is not None
    assert "after micro-batch" in widget.table.value
    before = bytes(widget.plot.value)
    widget.controls["log2_scale"].value = 8
    assert widget.last_result.loss_scale == 256.0
    assert widget.last_result.overflow_after is None
    assert "after micro-batch" not in widget.table.value
    widget.controls["k"].value = 3
    assert widget.last_result.k == 3 and len(widget.last_result.peak_after) == 3
    assert bytes(widget.plot.value) != before


def test_fp16_widget_builds_its_own_pool():
    widget = acc.build_fp16_widget()
    assert widget.controls["k"].max == 32
    assert widget.last_result.overflow_first is None


def test_a_dynamic_scaler_gives_both_strategies_the_same_float16_buffer():
    model, x, y = acc.make_regression(n=64)
    pool = acc.micro_batch_gradients(model, x, y, 8)
    scale_after, buffer_after = acc.dynamic_loss_scale(pool, scale_loss_first=False)
    scale_first, buffer_first = acc.dynamic_loss_scale(pool, scale_loss_first=True)
    assert scale_first == 8 * scale_after  # the scaler settles on a k times smaller S
    assert buffer_after.dtype == np.float16 and np.array_equal(buffer_after, buffer_first)


def test_fp16_widget_at_the_ends_of_its_controls(sweep):
    widget = acc.build_fp16_widget(k=8)
    for _, _ in sweep(widget):
        assert "e+" not in widget.table.value  # numbers in plain digits or powers of two
    widget.controls["log2_scale"].value = 21
    assert "2^21" in widget.table.value


def test_dividing_the_loss_first_is_the_scale_s_over_k_at_the_bottom_of_the_range():
    # An entry of 2^-20 at S = 2^7: scaled afterwards it is 2^-13, a normal float16; with the
    # loss divided by k = 8 first it is 2^-16, below the normal range (2^-14), a subnormal.
    grads = np.tile([2.0**-20, 1.0, 0.0], (8, 1))
    result = acc.fp16_accumulation(grads, 2.0**7)
    assert acc.FP16_SMALLEST_NORMAL == 2.0**-14
    assert result.below_normal_after == 0 and result.below_normal_first == 8  # the zero is not
    assert acc.fp16_accumulation(grads, 2.0**10).below_normal_first == 0
    assert "8 of 24" in acc.build_fp16_widget(grads, k=8, log2_scale=7).table.value
