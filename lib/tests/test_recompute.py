"""Activation recomputation: a checkpointed part of the graph is run again in the backward.

The gradients are those of the plain graph (bit for bit in float64), the graph holds fewer
bytes, and the extra forward work is counted exactly."""

from __future__ import annotations

import numpy as np
import pytest
from chainrule import dist
from chainrule.engine import ops
from chainrule.engine.gradcheck import gradcheck
from chainrule.engine.layers import MLP
from chainrule.engine.memory import count_ops, evaluations, measure_step, saved_bytes
from chainrule.engine.recompute import CHECKPOINT_OP, checkpoint, checkpoint_sequential
from chainrule.engine.tensor import Tensor, no_grad
from chainrule.parallel import transformer as tf

ROWS, WIDTH, DEPTH = 32, 16, 8
ACTIVATION = ROWS * WIDTH * 8  # bytes of one (rows, width) float64 array


def layer_functions(mlp: MLP) -> list:
    return [lambda t, layer=layer: ops.tanh(layer(t)) for layer in mlp.layers]


def plain(functions, x):
    for f in functions:
        x = f(x)
    return x


def mlp_step(segments: int | None, seed: int = 0):
    """One forward and backward of a tanh MLP of DEPTH layers, plain (None) or with
    ``segments`` checkpointed segments; the measurement and the parameters' gradients."""
    rng = np.random.default_rng(seed)
    mlp = MLP([WIDTH] * (DEPTH + 1), rng)
    x = Tensor(rng.standard_normal((ROWS, WIDTH)))
    fs = layer_functions(mlp)

    def loss() -> Tensor:
        y = plain(fs, x) if segments is None else checkpoint_sequential(fs, segments, x)
        return (y * y).sum()

    measured = measure_step(loss)
    return measured, [p.grad for p in mlp.parameters()]


@pytest.fixture(scope="module")
def plain_mlp():
    return mlp_step(None)


def test_checkpoint_passes_gradcheck_in_its_inputs_and_the_parameters_of_its_closure():
    def f(inputs):
        x, y, w, gain = inputs

        def part(a: Tensor, b: Tensor) -> Tensor:  # reads w and gain from its closure
            return ops.layer_norm(ops.tanh(a @ w) * b, gain)

        return (checkpoint(part, x, y) ** 2).sum()

    rng = np.random.default_rng(1)
    shapes = [(5, 3), (5, 4), (3, 4), (4,)]
    assert gradcheck(f, [rng.standard_normal(s) for s in shapes])


@pytest.mark.parametrize("segments", [1, 2, 4, 8])
def test_full_recomputation_gives_the_plain_gradients_bit_for_bit(plain_mlp, segments):
    _, expected = plain_mlp
    _, grads = mlp_step(segments)
    assert all(np.array_equal(a, b) for a, b in zip(grads, expected, strict=True))


@pytest.mark.parametrize("segments", [1, 2, 4, 8])
def test_stored_bytes_peak_and_recomputed_work_are_counted_exactly(plain_mlp, segments):
    baseline, _ = plain_mlp
    # A layer keeps three (rows, width) arrays: x Wᵀ, + b and tanh (Wᵀ is a view of W, a leaf);
    # y·y keeps one more; the loss is one float64.
    assert baseline.saved_bytes == (3 * DEPTH + 1) * ACTIVATION + 8
    assert baseline.peak_bytes == baseline.saved_bytes and baseline.recomputed_ops == 0
    per_layer = 4  # transpose, matmul, add, tanh
    assert baseline.forward_ops == per_layer * DEPTH + 2  # and mul, sum

    measured, _ = mlp_step(segments)
    span = DEPTH // segments
    # stored: the outputs of the k − 1 checkpointed segments and the last segment's layers
    stored = (segments - 1 + 3 * span + 1) * ACTIVATION + 8
    assert measured.saved_bytes == stored
    rebuilt = 3 * span * ACTIVATION if segments > 1 else 0  # one segment's layers at a time
    assert measured.peak_bytes == stored + rebuilt
    assert measured.forward_ops == baseline.forward_ops
    assert measured.recomputed_ops == per_layer * span * (segments - 1)
    assert measured.forward_counts[CHECKPOINT_OP] == segments - 1
    matmul = 2 * ROWS * WIDTH * WIDTH
    assert measured.forward_flops == DEPTH * matmul
    assert measured.recomputed_flops == span * (segments - 1) * matmul
    if segments > 1:
        assert measured.saved_bytes < baseline.saved_bytes
    # The peak holds the last segment (stored) and a rebuilt one at once: two halves of the
    # layers and a boundary are more than the plain graph; from four segments on it is less.
    assert (measured.peak_bytes < baseline.peak_bytes) == (segments >= 4)


@pytest.fixture(scope="module")
def transformer_steps():
    config = tf.Config(vocab=11, context=12, width=16, heads=2, layers=3, hidden=24)
    weights = tf.init_weights(config)
    windows = np.random.default_rng(3).integers(0, config.vocab, size=(3, config.context + 1))
    steps = {}
    for mode in tf.RECOMPUTE:
        params = {name: Tensor(w, requires_grad=True) for name, w in weights.items()}
        measured = measure_step(lambda p=params, m=mode: tf.loss(p, windows, config, recompute=m))
        steps[mode] = (measured, {name: p.grad for name, p in params.items()})
    return config, steps


def test_full_and_selective_recomputation_of_the_transformer_give_the_same_gradients(
    transformer_steps,
):
    _, steps = transformer_steps
    _, expected = steps["none"]
    for mode in ("full", "selective"):
        _, grads = steps[mode]
        assert grads.keys() == expected.keys()
        assert all(np.array_equal(grads[k], expected[k]) for k in expected), mode


def test_selective_recomputation_stores_less_and_recomputes_only_the_attention_core(
    transformer_steps,
):
    config, steps = transformer_steps
    none, full, selective = (steps[m][0] for m in ("none", "full", "selective"))
    assert full.saved_bytes < selective.saved_bytes < none.saved_bytes
    assert none.recomputed_ops == 0 < selective.recomputed_ops < full.recomputed_ops
    # selective: per block the two products of attention (q kᵀ and the weights times v) and
    # its softmax, nothing with a parameter
    assert selective.recomputed_counts["matmul"] == 2 * config.layers
    assert selective.recomputed_counts["softmax"] == config.layers
    assert selective.recomputed_counts["rms_norm"] == 0
    # full: every block's forward once more, its eight products (q, k, v, q kᵀ, times v, the
    # output projection, the two of the MLP) and two norms
    assert full.recomputed_counts["matmul"] == 8 * config.layers
    assert full.recomputed_counts["rms_norm"] == 2 * config.layers
    # the scores and the softmax of a block: batch × heads × tokens × tokens float64 each
    batch, tokens = 3, config.context
    scores = batch * config.heads * tokens * tokens * 8
    assert none.saved_bytes - selective.saved_bytes >= 3 * scores * config.layers


def test_a_part_without_an_input_that_needs_a_gradient_still_passes_one_to_its_parameters():
    # torch's old reentrant checkpoint lost these gradients: the input is data, not a parameter
    rng = np.random.default_rng(4)
    w = Tensor(rng.standard_normal((3, 3)), requires_grad=True)
    x = Tensor(rng.standard_normal((2, 3)))
    checkpoint(lambda t: ops.tanh(t @ w), x).sum().backward()
    expected = w.grad
    w.grad = None
    ops.tanh(x @ w).sum().backward()
    assert np.array_equal(w.grad, expected)


def test_an_intermediate_value_read_from_the_closure_gets_its_gradient_once():
    rng = np.random.default_rng(5)
    a = Tensor(rng.standard_normal(4), requires_grad=True)
    outside = ops.exp(a)  # not a leaf, read by the part without being passed in
    part = checkpoint(lambda t: t * outside, ops.tanh(a))
    (part + outside).sum().backward()
    expected = a.grad
    a.grad = None
    outside = ops.exp(a)
    (ops.tanh(a) * outside + outside).sum().backward()
    np.testing.assert_allclose(expected, a.grad, rtol=1e-15, atol=0)


def test_nested_checkpoints_recompute_the_inner_part_twice_and_agree():
    rng = np.random.default_rng(6)
    w = Tensor(rng.standard_normal((4, 4)), requires_grad=True)
    x = Tensor(rng.standard_normal((2, 4)), requires_grad=True)

    def inner(t: Tensor) -> Tensor:
        return ops.tanh(t @ w)

    def outer(t: Tensor) -> Tensor:
        return checkpoint(inner, t) * 2.0

    nested = measure_step(lambda: checkpoint(outer, x).sum())
    expected = (w.grad, x.grad)
    w.grad = x.grad = None
    ops.sum(inner(x) * 2.0).backward()
    assert np.array_equal(w.grad, expected[0]) and np.array_equal(x.grad, expected[1])
    # forward: inner's 2 ops and mul, sum; backward: outer again (inner's 2 ops, mul), then
    # inner again inside outer's backward (2 ops)
    assert nested.forward_ops == 4
    assert nested.recomputed_ops == 5
    assert nested.recomputed_counts[CHECKPOINT_OP] == 1


def test_a_function_that_computes_something_else_the_second_time_is_named():
    rng = np.random.default_rng(7)
    x = Tensor(rng.standard_normal(3), requires_grad=True)
    noise = np.random.default_rng(8)
    y = checkpoint(lambda t: t * noise.standard_normal(3), x)
    with pytest.raises(RuntimeError, match="another output than in the forward"):
        y.sum().backward()


def test_nothing_needs_a_gradient_nothing_is_recorded():
    x = Tensor(np.ones(3))
    y = checkpoint(lambda t: ops.exp(t), x)
    assert not y.requires_grad and y.is_leaf
    with pytest.raises(TypeError, match="one Tensor"):
        checkpoint(lambda t: (t, t), Tensor(np.ones(2), requires_grad=True))
    with pytest.raises(ValueError, match="segments must lie in"):
        checkpoint_sequential([ops.exp, ops.exp], 3, x)


def test_saved_bytes_counts_each_buffer_once_and_what_vjps_capture():
    x = Tensor(np.ones((10, 10)), requires_grad=True)  # a leaf: not an activation
    y = ops.tanh(x * 2.0)  # the outputs of mul (the 2 is a constant leaf) and of tanh
    assert saved_bytes(y) == 2 * 800
    z = y.reshape(100)  # a view of tanh's output: no new buffer
    assert saved_bytes(z) == 2 * 800
    plain = ops.layer_norm(z.reshape(10, 10))  # its output is x̂, which its VJP keeps, and 1/σ
    assert saved_bytes(plain) == 2 * 800 + 800 + 10 * 8
    gain = Tensor(np.ones(10), requires_grad=True)
    scaled = ops.layer_norm(z.reshape(10, 10), gain)  # now the output x̂·w is another array
    assert saved_bytes(scaled) == 2 * 800 + 800 + 800 + 10 * 8


def test_count_ops_counts_with_the_graph_off_too():
    with count_ops() as counts, no_grad():
        ops.exp(Tensor(np.ones(2))) + 1.0
    assert counts == {"exp": 1, "add": 1} and evaluations(counts) == 2


def test_recomputed_blocks_run_their_collectives_again_on_a_tensor_parallel_row():
    config = tf.Config(vocab=11, context=8, width=16, heads=2, layers=2, hidden=24)
    weights = tf.init_weights(config, seed=1)
    windows = np.random.default_rng(9).integers(0, config.vocab, size=(2, config.context + 1))

    def rank_step(mode: str) -> dict[str, np.ndarray]:
        g = dist.grid(1, 2)
        local = tf.shard_weights(weights, g.tp_rank, 2)
        params = {n: Tensor(w, requires_grad=True) for n, w in local.items()}
        tf.loss(params, windows, config, g.tp_group, recompute=mode).backward()
        return {n: p.grad for n, p in params.items()}

    grads, collectives = {}, {}
    for mode in tf.RECOMPUTE:
        trace = dist.Trace()
        grads[mode] = dist.run(rank_step, 2, args=(mode,), trace=trace)
        collectives[mode] = trace.ops()
    for mode in ("full", "selective"):
        for rank in range(2):
            plain, recomputed = grads["none"][rank], grads[mode][rank]
            assert all(np.array_equal(plain[n], recomputed[n]) for n in plain), (mode, rank)
    # per block two f̄ forward and two f backward; a recomputed block runs its two f̄ again
    assert collectives["none"] == collectives["selective"]
    assert collectives["none"].count("all_reduce") == 4 * config.layers
    assert collectives["full"].count("all_reduce") == 6 * config.layers


def test_a_checkpoint_is_drawn_as_a_node_of_its_own_kind():
    from chainrule.course.graph import Graph, draw

    w = Tensor(np.array([0.5, -1.0]), requires_grad=True)
    loss = checkpoint(lambda t: ops.tanh(t * w), Tensor(np.array([1.0, 2.0]))).sum()
    graph = Graph.from_tensor(loss)
    (node,) = [n for n in graph.nodes if n.op == CHECKPOINT_OP]
    assert node.kind == "checkpoint" and "recomputed in the backward" in node.lines
    assert node.grad is not None  # the drawing's gradients run the checkpoint's VJP too
    assert draw(loss).smallest_text_px() >= 9


def test_arguments_that_are_not_tensors_reach_the_function_as_they_are():
    x = Tensor(np.array([0.5, 2.0]), requires_grad=True)
    seen = []

    def power(t: Tensor, n: int, scale: np.ndarray) -> Tensor:
        seen.append((type(n), type(scale)))
        return (t**n) * scale

    checkpoint(power, x, 3, np.array([1.0, -1.0])).sum().backward()
    assert seen == [(int, np.ndarray)] * 2  # the forward and the run in the backward
    np.testing.assert_array_equal(x.grad, 3 * x.data**2 * np.array([1.0, -1.0]))
