"""Column-parallel → row-parallel MLP with f and f̄: one device's function and gradients."""

import numpy as np
import pytest
from chainrule import Tensor, dist
from chainrule.parallel.data_parallel import clip_grad_norm_global
from chainrule.parallel.tensor_parallel import (
    SHARDED,
    MLPWeights,
    gather_mlp_gradients,
    init_mlp_weights,
    shard_mlp_weights,
    single_device_mlp,
    tensor_parallel_mlp,
)

D_IN, HIDDEN, D_OUT, BATCH = 5, 12, 3, 6
TOL = 1e-12
NAMES = ("w1", "b1", "w2", "b2")


def problem(seed=0):
    rng = np.random.default_rng(seed + 100)
    weights = init_mlp_weights(D_IN, HIDDEN, D_OUT, seed=seed)
    x = rng.standard_normal((BATCH, D_IN))
    readout = rng.standard_normal((BATCH, D_OUT))  # the loss Σ tanh(y) ⊙ readout, counted once
    return weights, x, readout


def reference_step(weights, x, readout, activation="tanh", framework="engine"):
    """Output, input gradient and parameter gradients of the single-device MLP."""
    mlp = single_device_mlp(weights, activation=activation, framework=framework)
    xt = leaf(x, framework)
    y = mlp(xt)
    (y.tanh() * constant(readout, framework)).sum().backward()
    return to_numpy(y), to_numpy(xt.grad), mlp.gradients()


def tensor_parallel_step(weights, x, readout, activation="tanh", framework="engine", **fns):
    mlp = tensor_parallel_mlp(weights, activation=activation, framework=framework, **fns)
    xt = leaf(x, framework)
    y = mlp(xt)
    (y.tanh() * constant(readout, framework)).sum().backward()
    return to_numpy(y), to_numpy(xt.grad), gather_mlp_gradients(mlp)


def leaf(array, framework):
    if framework == "engine":
        return Tensor(array, requires_grad=True)
    import torch

    return torch.tensor(array, dtype=torch.float64, requires_grad=True)


def constant(array, framework):
    if framework == "engine":
        return array
    import torch

    return torch.tensor(array, dtype=torch.float64)


def to_numpy(value):
    if isinstance(value, Tensor):
        return value.data
    if isinstance(value, np.ndarray):
        return value
    return value.detach().numpy()


def assert_same_step(got, expected, tol=TOL):
    y, x_grad, grads = got
    y_ref, x_grad_ref, grads_ref = expected
    np.testing.assert_allclose(y, y_ref, rtol=0, atol=tol)
    np.testing.assert_allclose(x_grad, x_grad_ref, rtol=0, atol=tol)
    for name, g, g_ref in zip(NAMES, grads.as_tuple(), grads_ref.as_tuple(), strict=True):
        np.testing.assert_allclose(g, g_ref, rtol=0, atol=tol, err_msg=name)


def test_shards_reassemble_into_the_full_weights():
    weights, _, _ = problem()
    shards = [shard_mlp_weights(weights, r, 4) for r in range(4)]
    assert shards[1].w1.shape == (D_IN, HIDDEN // 4)
    assert shards[1].w2.shape == (HIDDEN // 4, D_OUT)
    np.testing.assert_array_equal(np.concatenate([s.w1 for s in shards], axis=1), weights.w1)
    np.testing.assert_array_equal(np.concatenate([s.b1 for s in shards]), weights.b1)
    np.testing.assert_array_equal(np.concatenate([s.w2 for s in shards], axis=0), weights.w2)
    for s in shards:
        np.testing.assert_array_equal(s.b2, weights.b2)
    with pytest.raises(ValueError, match="hidden width has length 12"):
        shard_mlp_weights(weights, 0, 5)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_engine_tensor_parallel_mlp_matches_one_device(world_size, activation):
    weights, x, readout = problem(seed=world_size)
    expected = reference_step(weights, x, readout, activation)
    results = dist.run(tensor_parallel_step, world_size, args=(weights, x, readout, activation))
    for got in results:
        assert_same_step(got, expected)


def test_each_rank_holds_its_own_slice_of_the_hidden_layer():
    weights, x, readout = problem()

    def step():
        mlp = tensor_parallel_mlp(weights)
        return mlp.w1.data.copy(), mlp.b2.data.copy()

    for rank, (w1, b2) in enumerate(dist.run(step, 3)):
        np.testing.assert_array_equal(w1, weights.w1[:, 4 * rank : 4 * rank + 4])
        np.testing.assert_array_equal(b2, weights.b2)


def test_one_all_reduce_forward_and_one_backward():
    weights, x, readout = problem()

    def step():
        mlp = tensor_parallel_mlp(weights)
        y = mlp(Tensor(x, requires_grad=True))
        (y * readout).sum().backward()

    trace = dist.Trace()
    dist.run(step, 4, trace=trace)
    assert trace.ops() == ["all_reduce", "all_reduce"]
    assert [event.shapes[0] for event in trace] == [(BATCH, D_OUT), (BATCH, D_IN)]


def identity(x):
    return x


def test_the_mlp_uses_the_f_and_f_bar_it_is_given():
    """Plugging in the identity for f loses the input gradient; for f̄, the output."""
    weights, x, readout = problem()
    y_ref, x_grad_ref, _ = reference_step(weights, x, readout)
    without_f = dist.run(
        tensor_parallel_step, 2, args=(weights, x, readout), kwargs={"f": identity}
    )
    without_f_bar = dist.run(
        tensor_parallel_step, 2, args=(weights, x, readout), kwargs={"f_bar": identity}
    )
    for y, x_grad, _ in without_f:
        np.testing.assert_allclose(y, y_ref, atol=TOL)  # the forward is still right
        assert np.abs(x_grad - x_grad_ref).max() > 1e-3  # only this rank's share of x̄
    for y, _, _ in without_f_bar:
        assert np.abs(y - y_ref).max() > 1e-3  # a partial sum instead of the output


def test_global_clipping_of_sharded_and_replicated_gradients():
    """The norm counts each shard once and the replicated b₂ once: the full gradient's norm."""
    weights, x, readout = problem()
    _, _, full = reference_step(weights, x, readout)
    full_norm = np.sqrt(sum((g * g).sum() for g in full.as_tuple()))
    max_norm = 0.5 * full_norm

    def step():
        mlp = tensor_parallel_mlp(weights)
        (mlp(Tensor(x)).tanh() * readout).sum().backward()
        clipped, norm = clip_grad_norm_global(mlp.gradients().as_tuple(), max_norm, SHARDED)
        mlp_clipped = MLPWeights(*clipped)
        gathered = [dist.all_gather(mlp_clipped.w1, axis=1), mlp_clipped.b2]
        return norm, gathered

    coefficient = max_norm / (full_norm + 1e-6)
    for norm, (w1, b2) in dist.run(step, 3):
        assert norm == pytest.approx(full_norm, rel=1e-12)
        np.testing.assert_allclose(w1, coefficient * full.w1, atol=TOL)
        np.testing.assert_allclose(b2, coefficient * full.b2, atol=TOL)


# -- torch on real processes ----------------------------------------------------------------


def hand_written_pair():
    """f and f̄ as an exercise would write them: two autograd Functions on torch.distributed."""
    import torch
    import torch.distributed as td

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            td.all_reduce(grad)
            return grad

    class FBar(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x = x.clone()
            td.all_reduce(x)
            return x

        @staticmethod
        def backward(ctx, grad):
            return grad

    return F.apply, FBar.apply


def torch_steps(weights, x, readout):
    f, f_bar = hand_written_pair()
    return {
        "torch": tensor_parallel_step(weights, x, readout, framework="torch"),
        "torch-relu": tensor_parallel_step(weights, x, readout, "relu", framework="torch"),
        "hand-written": tensor_parallel_step(
            weights, x, readout, framework="torch", f=f, f_bar=f_bar
        ),
        "torch-without-f": tensor_parallel_step(weights, x, readout, framework="torch", f=identity),
        "engine": tensor_parallel_step(weights, x, readout),
    }


def test_tensor_parallel_mlp_on_two_gloo_processes():
    weights, x, readout = problem(seed=7)
    expected = {
        "tanh": reference_step(weights, x, readout, framework="torch"),
        "relu": reference_step(weights, x, readout, "relu", framework="torch"),
    }
    assert_same_step(reference_step(weights, x, readout), expected["tanh"])  # engine = torch
    for steps in dist.run(torch_steps, 2, backend="gloo", args=(weights, x, readout)):
        assert_same_step(steps["torch"], expected["tanh"])
        assert_same_step(steps["torch-relu"], expected["relu"])
        assert_same_step(steps["hand-written"], expected["tanh"])
        assert_same_step(steps["engine"], expected["tanh"])
        _, x_grad, _ = steps["torch-without-f"]
        assert np.abs(x_grad - expected["tanh"][1]).max() > 1e-3
