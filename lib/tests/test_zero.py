"""ZeRO stages 0-3 on the engine: each equals one process, holds the bytes the model says, and
moves the collectives and bytes the placements say."""

import numpy as np
import pytest
from chainrule import dist
from chainrule.costs import comm_cost as cc
from chainrule.engine.tensor import Tensor
from chainrule.parallel import zero

WIDTHS = [4, 5, 3]  # Ψ = 25 + 18 = 43, prime: no P > 1 divides it, nor either layer's 25, 18 by 4
LAYERS = zero.mlp(WIDTHS)
ROWS = 12  # divisible by every P below


def _problem(seed=0, steps=3, dtype=np.float64):
    rng = np.random.default_rng(seed)
    params = zero.init_params(LAYERS, rng, dtype)
    batches = [
        (rng.standard_normal((ROWS, WIDTHS[0])).astype(dtype),
         rng.standard_normal((ROWS, WIDTHS[-1])).astype(dtype))
        for _ in range(steps)
    ]  # fmt: skip
    return params, batches


def _max_error(a, b):
    return max(float(np.abs(x - y).max()) for la, lb in zip(a, b, strict=True)
               for x, y in zip(la, lb, strict=True))  # fmt: skip


def test_psi_is_divisible_by_no_world_size():
    assert zero.num_parameters(LAYERS) == 43
    layout = zero.FlatLayout(tuple(s for layer in LAYERS for s in layer.shapes), 4)
    assert (layout.numel, layout.chunk, layout.padded) == (43, 11, 44)
    flat = layout.flatten([np.full(s, 1.0) for s in layout.shapes])
    assert flat[43:].tolist() == [0.0] and [v.shape for v in layout.views(flat)] == [
        (5, 4), (5,), (3, 5), (3,)
    ]  # fmt: skip
    assert np.shares_memory(layout.views(flat)[0], flat)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("stage", zero.STAGES)
def test_every_stage_equals_one_process(stage, world_size):
    params, batches = _problem()
    ref_losses, ref_params = zero.train_one_process(LAYERS, params, batches, lr=0.2, momentum=0.8)
    result = zero.train(LAYERS, params, batches, stage, world_size, lr=0.2, momentum=0.8)
    assert _max_error(result.params, ref_params) < 1e-12
    assert np.allclose(result.losses, ref_losses, rtol=0, atol=1e-12)
    assert _max_error(params, ref_params) > 1e-3  # it trained


def test_stage_three_without_resharding_equals_one_process():
    params, batches = _problem(1)
    _, ref_params = zero.train_one_process(LAYERS, params, batches)
    result = zero.train(LAYERS, params, batches, 3, 3, reshard=False)
    assert _max_error(result.params, ref_params) < 1e-12


@pytest.mark.parametrize("stage", zero.STAGES)
def test_every_rank_holds_the_same_parameters_after_the_all_gather(stage):
    params, batches = _problem(2)

    def flats():
        zero_rank = zero.Zero.create(LAYERS, params, stage, 0.1)
        for x, y in batches:
            zero_rank.step(x[dist.rank() :: 3], y[dist.rank() :: 3])
        return zero_rank.flat

    per_rank = dist.run(flats, 3)
    if stage < 3:
        for other in per_rank[1:]:
            assert all(np.array_equal(a, b) for a, b in zip(other, per_rank[0], strict=True))
    else:  # the chunks tile the buffer: different on every rank
        assert not np.array_equal(per_rank[0][0], per_rank[1][0])


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available("gloo"), reason="gloo is not available")
@pytest.mark.parametrize("stage", zero.STAGES)
def test_gloo_equals_sim(stage):
    params, batches = _problem(3)
    sim = zero.train(LAYERS, params, batches, stage, 3)
    gloo = zero.train(LAYERS, params, batches, stage, 3, backend="gloo")
    assert _max_error(gloo.params, sim.params) < 1e-12


WIDE = zero.mlp([8, 64, 64, 64, 4])  # Ψ = 576 + 4160 + 4160 + 260 = 9156: 73 kB per state
OVERHEAD = 8_000  # bytes of Python objects (lists, the Zero, the graph) tracemalloc counts too


def _wide_problem():
    rng = np.random.default_rng(4)
    params = zero.init_params(WIDE, rng)
    return params, (rng.standard_normal((ROWS, 8)), rng.standard_normal((ROWS, 4)))


def _model_bytes(stage, P):
    padded = sum(lay.padded for lay in zero.layouts(WIDE, stage, P))
    return sum(zero.memory_model(padded, P, stage, (8, 8, 8)))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("stage", zero.STAGES)
def test_memory_held_after_a_step_is_the_model_of_the_padded_buffers(stage, world_size):
    params, batch = _wide_problem()
    measured = zero.measure_memory(WIDE, params, batch, stage, world_size)
    model = _model_bytes(stage, world_size)
    assert 0 <= measured.held - model < OVERHEAD, (measured, model)
    assert measured.peak > measured.held


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_stage_two_peaks_lower_than_stage_one(world_size):
    """Stage 1 holds the full gradient; stage 2 one layer's bucket at a time, then its chunk."""
    P = world_size
    params, batch = _wide_problem()
    peaks = {s: zero.measure_memory(WIDE, params, batch, s, P) for s in zero.STAGES}
    assert peaks[0].peak > peaks[1].peak > peaks[2].peak, peaks
    largest = max(lay.padded for lay in zero.layouts(WIDE, 2, P))
    # stage 2's peak: its states, one layer's full bucket and the chunk reduce-scattered from it
    extra = peaks[2].peak - peaks[2].held
    assert 8 * largest <= extra < 8 * largest * (1 + 1 / P) + OVERHEAD + 8 * ROWS * 64 * 2
    # stage 3 holds a gathered layer for a while: above its states by at least that layer
    assert peaks[3].peak - peaks[3].held >= 8 * max(lay.padded for lay in zero.layouts(WIDE, 3, P))


def test_keeping_every_gathered_layer_costs_more_than_resharding():
    params, batch = _wide_problem()
    resharded = zero.measure_memory(WIDE, params, batch, 3, 4)
    kept = zero.measure_memory(WIDE, params, batch, 3, 4, reshard=False)
    layers = zero.layouts(WIDE, 3, 4)
    # kept: every layer's gathered θ at once, at the start of the backward
    assert kept.peak - resharded.peak > 8 * (sum(lay.padded for lay in layers) - 2 * max(
        lay.padded for lay in layers))  # fmt: skip
    assert abs(kept.held - resharded.held) < OVERHEAD


def test_the_replay_refuses_a_different_collective():
    params, batch = _wide_problem()
    received = dist.run(zero._recorded_step, 2, args=(WIDE, params, batch, 1, True))[0][1]
    replay = zero._Tape(2, received=received)
    call, result = received[0]
    assert replay.collective(call, None)[0] is not result  # a new buffer
    with pytest.raises(RuntimeError, match="the replay calls"):
        replay.collective(call._replace(op="all_reduce"), None)


@pytest.mark.parametrize("activation", [None, "tanh", "relu", "sigmoid"])
def test_closed_form_backward_is_the_engines(activation):
    layer = zero.Linear(4, 3, activation)
    rng = np.random.default_rng(5)
    params = [rng.standard_normal(s) for s in layer.shapes]
    x = rng.standard_normal((6, 4))
    g = rng.standard_normal((6, 3))
    leaves = [Tensor(p, requires_grad=True) for p in params]
    x_leaf = Tensor(x, requires_grad=True)
    y = layer(leaves, x_leaf)
    y.backward(g)
    out = np.full(layer.d_out * (layer.d_in + 1) + 2, np.nan)  # room for padding
    flat, gx = layer.backward(params, x, y.data, g, out=out)
    assert flat is out and flat[-2:].tolist() == [0.0, 0.0]
    assert np.allclose(flat[:12], leaves[0].grad.ravel()) and np.allclose(
        flat[12:15], leaves[1].grad
    )
    assert np.allclose(gx, x_leaf.grad)
    with pytest.raises(ValueError, match="activation"):
        zero.Linear(2, 2, "gelu")


def test_resharded_backward_gathers_the_parameters_and_computes_no_forward(monkeypatch):
    calls = []
    forward = zero.Linear.__call__
    monkeypatch.setattr(
        zero.Linear, "__call__", lambda self, p, x: calls.append(1) or forward(self, p, x)
    )
    params, batches = _problem(steps=1)
    trace = dist.Trace()

    def step():
        z = zero.Zero.create(LAYERS, params, 3, 0.1)
        out, _ = z.forward(Tensor(batches[0][0][dist.rank() :: 2]))
        dist.barrier()  # both ranks' forwards are done
        forwards = len(calls)
        out.sum().backward()
        dist.barrier()
        return forwards, len(calls)

    (before, after), _ = dist.run(step, 2, trace=trace)
    assert before == after == 2 * len(LAYERS)  # both ranks' forwards; the backward ran none
    backward = ["all_gather", "reduce_scatter"] * 2  # per layer: θ gathered again, g scattered
    assert trace.ops() == ["all_gather"] * 2 + ["barrier", *backward, "barrier"]


def test_memory_model_of_mixed_precision_adam():
    psi, P = 7.5e9, 64
    totals = [sum(zero.memory_model(psi, P, s)) for s in zero.STAGES]
    assert totals == pytest.approx([16 * psi, 4 * psi + 12 * psi / P, 2 * psi + 14 * psi / P,
                                    16 * psi / P])  # fmt: skip
    assert sum(zero.memory_model(psi, 1, 3)) == 16 * psi  # one rank: nothing to share
    with pytest.raises(ValueError, match="stages 0, 1, 2 and 3"):
        zero.memory_model(psi, P, 4)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_communication_from_the_placements(world_size):
    P = world_size
    f = (P - 1) / P
    for stage in zero.STAGES:
        factor = zero.communication_factor(stage, P)
        assert factor == pytest.approx((3 if stage == 3 else 2) * f)
    assert [op for _, op, _, _ in zero.communication(0, 1.0, P)] == ["all_reduce"]
    assert [(w, op, t) for w, op, t, _ in zero.communication(1, 1.0, P)] == [
        ("step", "reduce_scatter", "g"), ("step", "all_gather", "θ")
    ]  # fmt: skip
    assert [(w, op, t) for w, op, t, _ in zero.communication(2, 1.0, P)] == [
        ("backward", "reduce_scatter", "g"), ("step", "all_gather", "θ")
    ]  # fmt: skip
    assert [(w, op, t) for w, op, t, _ in zero.communication(3, 1.0, P)] == [
        ("forward", "all_gather", "θ"), ("backward", "all_gather", "θ"),
        ("backward", "reduce_scatter", "g"),
    ]  # fmt: skip
    assert zero.communication_factor(3, P, reshard=False) == pytest.approx(2 * f)
    assert zero.communication_factor(3, 1) == 0.0


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("stage", zero.STAGES)
def test_the_trace_has_the_stated_collectives_and_bytes(stage, world_size):
    P = world_size
    params, batches = _problem(steps=1)
    trace = dist.Trace()
    zero.train(LAYERS, params, batches, stage, P, trace=trace)
    if stage == 0:
        assert trace.ops() == ["all_reduce"]
    elif stage == 1:
        assert trace.ops() == ["reduce_scatter", "all_gather"]
    elif stage == 2:  # each layer's bucket in the backward, last layer first; then the gathers
        assert trace.ops() == ["reduce_scatter"] * 2 + ["all_gather"] * 2
    else:  # per layer: gathered forward, gathered again backward, gradient reduce-scattered
        backward = ["all_gather", "reduce_scatter"] * 2
        assert trace.ops() == ["all_gather", "all_gather", *backward]
    expected: dict[str, float] = {}
    for layout in zero.layouts(LAYERS, stage, P):
        for _, op, _, sent in zero.communication(stage, 8 * layout.padded, P):
            expected[op] = expected.get(op, 0.0) + sent
    assert cc.trace_bytes(trace) == pytest.approx(expected)
    padded = sum(lay.padded for lay in zero.layouts(LAYERS, stage, P))
    total = sum(cc.trace_bytes(trace).values())
    assert total == pytest.approx(zero.communication_factor(stage, P) * 8 * padded)


def test_stage_three_reduce_scatter_comes_from_the_gathers_backward():
    layout = zero.FlatLayout(LAYERS[0].shapes, 2)

    def one_layer(reshard):
        rng = np.random.default_rng(dist.rank())
        shard = Tensor(rng.standard_normal(layout.chunk), requires_grad=True)
        x = Tensor(rng.standard_normal((3, 4)))
        seen: list[int] = []
        if reshard:
            y = zero.resharded_layer(LAYERS[0], layout, shard, x, seen)
        else:
            y = zero.gather_layer(LAYERS[0], layout, shard, x)
        dist.barrier()
        y.sum().backward()
        return shard.grad

    grads = {}
    for reshard, backward in ((False, ["reduce_scatter"]),
                              (True, ["all_gather", "reduce_scatter"])):  # fmt: skip
        trace = dist.Trace()
        grads[reshard] = dist.run(one_layer, 2, args=(reshard,), trace=trace)
        assert trace.ops() == ["all_gather", "barrier", *backward]
    assert all(np.allclose(a, b) for a, b in zip(grads[True], grads[False], strict=True))


def test_refuses_what_it_cannot_do():
    params, batches = _problem(steps=1)
    with pytest.raises(ValueError, match="equal chunks"):
        zero.train(LAYERS, params, batches, 1, 5)
    with pytest.raises(ValueError, match="stages"):
        zero.train(LAYERS, params, batches, 5, 2)
