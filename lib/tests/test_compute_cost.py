"""Arithmetic intensity, the roofline, and a block's arithmetic against its collectives."""

import pytest
from chainrule.costs import comm_cost as cc
from chainrule.costs import compute_cost as kc

# round numbers, so that every threshold below is exact
MACHINE = kc.Machine("test", flops=1e12, memory_bandwidth=1e10, link_bandwidth=1e9, latency=0.0)


def test_roofline_of_a_product_and_of_a_sum():
    assert kc.matmul_flops(2, 3, 4) == 48 and kc.matmul_bytes(2, 3, 4, itemsize=4) == 4 * 26
    # square products: I = 2n/(3b), growing with n; the ridge F/B = 100 crossed at n = 300 (bf16)
    for n in (64, 300, 4096):
        i = kc.intensity(kc.matmul_flops(n, n, n), kc.matmul_bytes(n, n, n))
        assert i == pytest.approx(n / 3)
    assert MACHINE.ridge == 100 and MACHINE.network_ridge == 1000
    assert kc.attainable(50, MACHINE.flops, MACHINE.memory_bandwidth) == 5e11  # memory-bound
    assert kc.attainable(100, MACHINE.flops, MACHINE.memory_bandwidth) == 1e12  # the ridge
    assert kc.attainable(1e4, MACHINE.flops, MACHINE.memory_bandwidth) == 1e12  # compute-bound
    assert kc.roofline_time(2e12, 1e9, 1e12, 1e10) == 2.0
    assert kc.roofline_time(1e9, 1e11, 1e12, 1e10) == 10.0


def test_block_collectives_are_the_placements_and_every_parallelism_shares_the_flops():
    T, d, f, b = 1024, 256, 1024, 2
    assert kc.block_flops(T, d, f) == 3 * (kc.matmul_flops(T, d, f) + kc.matmul_flops(T, f, d))
    for name in kc.PARALLELISMS:
        collectives = kc.block_collectives(name, T, d, f, b)
        per_rank = sum(cc.ring_bytes(op, n, 4) for _, op, n in collectives)
        expected = {"data parallel": 2 * 3 / 4 * 2 * d * f * b}.get(name, 4 * 3 / 4 * T * d * b)
        assert per_rank == expected, name
    with pytest.raises(ValueError, match="unknown parallelism 'pipeline'"):
        kc.block_collectives("pipeline", T, d, f)


def test_data_parallel_hides_from_the_tokens_per_rank_threshold():
    P, d = 8, 512
    threshold = kc.data_parallel_tokens_to_hide(P, MACHINE)  # (P−1)/P · F/B for bf16
    assert threshold == pytest.approx(7 / 8 * 1000)
    tokens = round(threshold * P)  # exactly the threshold: 875 tokens per rank
    at = kc.step_time("data parallel", tokens, d, 4 * d, P, MACHINE)
    assert at.comm == pytest.approx(at.backward) and at.overlaps
    below = kc.step_time("data parallel", tokens // 2, d, 4 * d, P, MACHINE)
    above = kc.step_time("data parallel", 2 * tokens, d, 4 * d, P, MACHINE)
    assert not below.hidden and above.hidden
    assert above.overlapped == pytest.approx(above.math) and above.efficiency == pytest.approx(1)
    assert below.overlapped == pytest.approx(below.forward + below.comm)
    assert below.overlapped < below.serial
    # the width does not matter: the bytes and the FLOPs both grow as d·f
    for width in (128, 4096):
        step = kc.step_time("data parallel", tokens, width, 4 * width, P, MACHINE)
        assert step.comm == pytest.approx(step.backward)


def test_tensor_and_sequence_parallel_pay_in_full_and_match_at_the_width_threshold():
    P, T = 4, 2048
    f = kc.tensor_parallel_width_to_match(P, MACHINE)  # (P−1) · b/3 · F/B = 2000
    assert f == pytest.approx(2000)
    tensor = kc.step_time("tensor parallel", T, 500, 2000, P, MACHINE)
    sequence = kc.step_time("sequence parallel", T, 500, 2000, P, MACHINE)
    assert tensor.comm == pytest.approx(tensor.math) and not tensor.overlaps
    assert tensor.overlapped == tensor.serial == pytest.approx(2 * tensor.math)
    assert tensor.efficiency == pytest.approx(0.5) and not tensor.hidden
    assert sequence.comm == pytest.approx(tensor.comm)  # the same bytes, the same steps
    # latency: 2·2(P−1) steps for tensor parallelism, 4·(P−1) for sequence parallelism
    slow = kc.Machine("α only", 1e12, 1e10, 1e30, latency=1e-3)
    for name in ("tensor parallel", "sequence parallel"):
        assert kc.step_time(name, T, 500, 2000, P, slow).comm == pytest.approx(4 * 3 * 1e-3)
    assert kc.step_time("data parallel", T, 500, 2000, P, slow).comm == pytest.approx(12e-3)


def test_block_collectives_agree_with_the_placements_of_lesson_12():
    from chainrule.course.widgets.comm_cost import step_communication

    T, d, P = 512, 64, 4
    for name in kc.PARALLELISMS:
        planned = sorted((p, op, b) for p, op, _, b in step_communication(name, T, d, 4 * d, P))
        modelled = sorted(
            (p, op, cc.ring_bytes(op, n, P)) for p, op, n in kc.block_collectives(name, T, d, 4 * d)
        )
        assert planned == modelled, name
