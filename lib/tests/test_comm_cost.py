"""The ring model of a collective's bytes and time, read off traces, and fitted."""

import numpy as np
import pytest
from chainrule import comm_cost as cc
from chainrule import dist


def test_ring_bytes_per_rank():
    N = 1200
    assert cc.ring_bytes("all_reduce", N, 4) == 2 * 3 / 4 * N
    assert cc.ring_bytes("all_gather", N, 3) == cc.ring_bytes("reduce_scatter", N, 3) == 800
    assert cc.ring_bytes("all_to_all", N, 2) == 600
    assert cc.ring_bytes("all_reduce", N, 1) == 0.0
    assert cc.steps("all_reduce", 4) == 6 and cc.steps("all_gather", 4) == 3
    with pytest.raises(ValueError, match="no ring model"):
        cc.ring_bytes("scatter", N, 2)
    # less than 2N per rank however many ranks
    assert all(cc.ring_bytes("all_reduce", N, P) < 2 * N for P in range(1, 100))


def test_trace_events_give_the_bytes_of_the_whole_tensor():
    def step():
        x = np.zeros(6)  # 48 bytes per rank
        dist.all_reduce(x)
        dist.all_gather(x)  # gathers 3 × 48 bytes
        dist.reduce_scatter(x)
        dist.all_to_all(x)
        dist.barrier()

    trace = dist.Trace()
    dist.run(step, 3, trace=trace)
    assert cc.trace_bytes(trace) == {
        "all_reduce": 2 * 2 / 3 * 48,
        "all_gather": 2 / 3 * 144,
        "reduce_scatter": 2 / 3 * 48,
        "all_to_all": 2 / 3 * 48,
    }
    assert cc.trace_bytes(trace.to_rows()) == cc.trace_bytes(trace)


def test_fit_recovers_alpha_and_bandwidth():
    alpha, bandwidth = 2e-4, 1.5e9
    measurements = [
        cc.Measurement(op, P, n, cc.alpha_beta_time(op, n, P, alpha, bandwidth))
        for op in ("all_reduce", "all_gather")
        for P in (2, 3, 4)
        for n in (1 << 10, 1 << 20, 1 << 26)
    ]
    for op in ("all_reduce", "all_gather"):
        fit = cc.fit(measurements, op)
        assert fit.alpha == pytest.approx(alpha, rel=1e-9)
        assert fit.bandwidth == pytest.approx(bandwidth, rel=1e-9)
        assert fit.max_relative_error < 1e-9
        assert fit.predict(1 << 20, 2) == pytest.approx(
            cc.alpha_beta_time(op, 1 << 20, 2, alpha, bandwidth)
        )
    with pytest.raises(ValueError, match="at least two"):
        cc.fit(measurements[:1], "all_reduce")


@pytest.mark.skipif(not dist.is_available("gloo"), reason="needs gloo")
def test_measure_times_raw_collectives_on_gloo():
    found = cc.measure_collectives([2], [1 << 10, 1 << 14], repeat=2)
    assert [(m.op, m.world_size, m.nbytes) for m in found] == [
        (op, 2, n)
        for n in (1 << 10, 1 << 14)
        for op in ("all_reduce", "all_gather", "reduce_scatter")
    ]
    assert all(m.seconds > 0 for m in found)
