"""The ring model of a collective's bytes and time, read off traces, and fitted."""

import numpy as np
import pytest
from chainrule import dist
from chainrule.costs import comm_cost as cc
from chainrule.course import timing


def test_ring_bytes_per_rank():
    N = 1200
    assert cc.ring_bytes("all_reduce", N, 4) == 2 * 3 / 4 * N
    assert cc.ring_bytes("all_gather", N, 3) == cc.ring_bytes("reduce_scatter", N, 3) == 800
    assert cc.ring_bytes("all_to_all", N, 2) == 600
    assert cc.ring_bytes("all_reduce", N, 1) == 0.0
    assert cc.steps("all_reduce", 4) == 6 and cc.steps("all_gather", 4) == 3
    assert cc.ring_bytes("scatter", N, 4) == 900 and cc.ring_bytes("broadcast", N, 4) == N
    assert cc.steps("broadcast", 4) == cc.steps("scatter", 4) == 3
    with pytest.raises(ValueError, match="no collective named 'gather'"):
        cc.ring_bytes("gather", N, 1)
    # less than 2N per rank however many ranks
    assert all(cc.ring_bytes("all_reduce", N, P) < 2 * N for P in range(1, 100))


def test_every_collective_of_a_trace_has_its_bytes():
    def step():
        x = np.zeros(8)  # 64 bytes
        dist.broadcast(x if dist.rank() == 0 else None)
        dist.scatter(x if dist.rank() == 1 else None, src=1)
        dist.all_to_all(np.zeros(3 + dist.rank()), send_counts=[1] * 3 + [dist.rank()])

    trace = dist.Trace()
    dist.run(step, 4, trace=trace)
    totals = cc.trace_bytes(trace)
    assert totals["broadcast"] == 64 and totals["scatter"] == 3 / 4 * 64
    assert totals["all_to_all"] == 3 / 4 * 6 * 8  # the largest rank's buffer, 6 numbers


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
    found = timing.measure_collectives([2], [1 << 10, 1 << 14], repeat=2)
    assert [(m.op, m.world_size, m.nbytes) for m in found] == [
        (op, 2, n)
        for n in (1 << 10, 1 << 14)
        for op in ("all_reduce", "all_gather", "reduce_scatter")
    ]
    assert all(m.seconds > 0 for m in found)


def test_all_to_all_on_a_switch_ring_and_torus():
    N = 4096.0
    for P in (2, 4, 16):  # the switch: each rank's own link carries what it sends
        assert cc.all_to_all_link_bytes(N, P, "switch") == cc.ring_bytes("all_to_all", N, P)
    # a ring: the busiest link carries P/8 · N (P even), more than a switch's link from P = 8 on
    for P in (4, 6, 8, 16, 32):
        assert cc.all_to_all_link_bytes(N, P, "ring") == pytest.approx(P / 8 * N)
    assert cc.all_to_all_link_bytes(N, 4, "ring") < cc.all_to_all_link_bytes(N, 4, "switch")
    assert cc.all_to_all_link_bytes(N, 16, "ring") > cc.all_to_all_link_bytes(N, 16, "switch")
    # a √P × √P torus: √P/8 · N
    for P in (16, 36, 64):
        assert cc.all_to_all_link_bytes(N, P, "torus") == pytest.approx(P**0.5 / 8 * N)
    # an odd ring: every chunk has one shorter way; the load is still even over the links
    assert cc.all_to_all_link_bytes(N, 5, "ring") == pytest.approx(6 / 5 * N / 2)
    assert cc.all_to_all_link_bytes(N, 1, "ring") == 0.0
    with pytest.raises(ValueError, match="square"):
        cc.all_to_all_link_bytes(N, 8, "torus")
    with pytest.raises(ValueError, match="unknown topology"):
        cc.all_to_all_link_bytes(N, 8, "mesh")


@pytest.mark.skipif(not dist.is_available("gloo"), reason="needs gloo")
def test_gloo_runs_reduce_scatter_as_all_reduces():
    works = timing.gloo_works(world_size=3, elements=3 * 256)
    assert works["all_reduce"] == [("all_reduce", [768])]
    assert works["all_gather"] == [("all_gather", [256])]
    assert works["reduce_scatter"] == [("all_reduce", [256])] * 3  # one per slice
    assert works["reduce_scatter_single"] == [("all_reduce", [768])]  # the whole tensor
