"""Reverse vs forward accumulation: the multiply-add counts, checked by counting every product."""

import numpy as np
import pytest
from chainrule.costs.chain_cost import (
    ChainTiming,
    crossover,
    forward_accumulate,
    forward_flops,
    random_jacobians,
    reverse_accumulate,
    reverse_flops,
    time_chain,
)
from hypothesis import given
from hypothesis import strategies as st


class CountingMatmul:
    """Brute-force matrix product with a triple loop that counts its multiply-adds."""

    def __init__(self):
        self.count = 0

    def __call__(self, a, b):
        m, k = a.shape
        k2, n = b.shape
        assert k == k2
        out = np.zeros((m, n))
        for i in range(m):
            for j in range(n):
                for p in range(k):
                    out[i, j] += a[i, p] * b[p, j]
                    self.count += 1
        return out


widths_strategy = st.lists(st.integers(1, 5), min_size=2, max_size=5)


@given(widths=widths_strategy, seed=st.integers(0, 2**32 - 1))
def test_counted_products_match_the_formulas_and_the_full_jacobian(widths, seed):
    jacobians = random_jacobians(widths, np.random.default_rng(seed))
    assert [j.shape for j in jacobians] == [
        (widths[k], widths[k - 1]) for k in range(1, len(widths))
    ]
    full = jacobians[0]
    for jac in jacobians[1:]:
        full = jac @ full

    reverse, forward = CountingMatmul(), CountingMatmul()
    np.testing.assert_allclose(reverse_accumulate(jacobians, reverse), full, atol=1e-12)
    np.testing.assert_allclose(forward_accumulate(jacobians, forward), full, atol=1e-12)
    assert reverse.count == reverse_flops(widths)
    assert forward.count == forward_flops(widths)


def test_scalar_loss_reverse_cost_is_a_sum_of_matrix_vector_products():
    widths = [7, 5, 3, 1]
    counter = CountingMatmul()
    reverse_accumulate(random_jacobians(widths, np.random.default_rng(0)), counter)
    assert counter.count == 5 * 7 + 3 * 5 + 1 * 3  # Σ d_k·d_{k-1}
    assert reverse_flops(widths) == counter.count


def test_forward_cost_builds_jacobian_products_matrix_by_matrix():
    widths = [4, 6, 2, 1]
    counter = CountingMatmul()
    forward_accumulate(random_jacobians(widths, np.random.default_rng(0)), counter)
    assert counter.count == 4 * 4 * 6 + 4 * 6 * 2 + 4 * 2 * 1  # Σ d_0·d_{k-1}·d_k
    assert forward_flops(widths) == counter.count


@given(widths=widths_strategy)
def test_the_two_orders_are_mirror_images(widths):
    assert forward_flops(widths) == reverse_flops(widths[::-1])


@given(widths=widths_strategy, seed=st.integers(0, 2**32 - 1))
def test_reverse_mode_costs_output_size_times_one_vjp_sweep(widths, seed):
    """One VJP sweep carries a single cotangent vector: J_kᵀ v at every step."""
    jacobians = random_jacobians(widths, np.random.default_rng(seed))
    sweep = CountingMatmul()
    v = np.ones((widths[-1], 1))
    for jac in reversed(jacobians):
        v = sweep(jac.T, v)
    assert sweep.count == sum(a * b for a, b in zip(widths, widths[1:], strict=False))
    assert reverse_flops(widths) == widths[-1] * sweep.count


@given(before=st.lists(st.integers(1, 40), min_size=1, max_size=4))
def test_crossover_is_where_the_costs_meet_and_the_winner_changes(before):
    m_star = crossover(before)
    assert m_star == pytest.approx(before[0], rel=1e-9)  # the factorisation (m - d_0)(…)
    m = round(m_star)
    assert reverse_flops([*before, m]) == forward_flops([*before, m])
    if m > 1:
        assert reverse_flops([*before, m - 1]) < forward_flops([*before, m - 1])
    assert reverse_flops([*before, m + 1]) > forward_flops([*before, m + 1])


def test_time_chain_times_both_orders_and_reverse_wins_for_a_scalar_loss():
    timing = time_chain([256, 256, 256, 1], repeats=3, rng=np.random.default_rng(0))
    assert isinstance(timing, ChainTiming)
    assert timing.reverse_flops == reverse_flops([256, 256, 256, 1])
    assert timing.forward_flops == forward_flops([256, 256, 256, 1])
    assert timing.flop_ratio == pytest.approx(timing.forward_flops / timing.reverse_flops)
    assert timing.reverse_seconds > 0 and timing.forward_seconds > 0
    assert timing.time_ratio > 2  # 256× fewer multiply-adds: robust even on a loaded machine


@pytest.mark.parametrize("bad", [[3], [], [0, 2], [2, -1]])
def test_widths_are_validated(bad):
    with pytest.raises(ValueError, match="widths"):
        reverse_flops(bad)
