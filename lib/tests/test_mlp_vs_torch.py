"""A small MLP (two linear layers, tanh, cross-entropy) agrees with PyTorch to 1e-10."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from chainrule.engine import layers, ops, optim
from chainrule.engine.tensor import Tensor


def torch_copy(mlp, dtype=torch.float64):
    """The same network in PyTorch, with the same parameter values."""
    layers = []
    for layer in mlp.layers:
        out_features, in_features = layer.weight.shape
        linear = torch.nn.Linear(in_features, out_features, dtype=dtype)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(layer.weight.data.copy()))
            linear.bias.copy_(torch.from_numpy(layer.bias.data.copy()))
        layers += [linear, torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


@pytest.fixture
def problem(rng):
    x = rng.standard_normal((16, 5))
    targets = rng.integers(0, 3, 16)
    mlp = layers.MLP([5, 7, 3], rng)
    return x, targets, mlp


def test_linear_follows_torch_conventions(rng):
    layer = layers.Linear(4, 3, rng)
    assert layer.weight.shape == (3, 4) and layer.bias.shape == (3,)
    assert np.abs(layer.weight.data).max() <= 0.5  # uniform in ±1/√in_features
    x = rng.standard_normal((2, 4))
    np.testing.assert_allclose(layer(Tensor(x)).data, x @ layer.weight.data.T + layer.bias.data)
    assert layer.parameters() == [layer.weight, layer.bias]


def test_loss_and_every_parameter_gradient_equal_torch(problem):
    x, targets, mlp = problem
    reference = torch_copy(mlp)
    loss = ops.cross_entropy(mlp(Tensor(x)), targets)
    loss.backward()
    expected = F.cross_entropy(reference(torch.from_numpy(x)), torch.from_numpy(targets))
    expected.backward()
    assert abs(loss.item() - expected.item()) <= 1e-10
    params = mlp.parameters()
    assert len(params) == 4 == len(list(reference.parameters()))
    for ours, theirs in zip(params, reference.parameters(), strict=True):
        assert ours.grad.shape == tuple(theirs.shape)
        np.testing.assert_allclose(ours.grad, theirs.grad.numpy(), rtol=0, atol=1e-10)


def test_sgd_steps_keep_matching_torch(problem):
    x, targets, mlp = problem
    reference = torch_copy(mlp)
    params = mlp.parameters()
    for _ in range(5):
        optim.zero_grad(params)
        ops.cross_entropy(mlp(Tensor(x)), targets).backward()
        optim.sgd_step(params, lr=0.5)
        reference.zero_grad()
        F.cross_entropy(reference(torch.from_numpy(x)), torch.from_numpy(targets)).backward()
        with torch.no_grad():  # plain SGD (torch.optim's first use costs seconds of imports)
            for p in reference.parameters():
                p -= 0.5 * p.grad
    for ours, theirs in zip(params, reference.parameters(), strict=True):
        np.testing.assert_allclose(ours.data, theirs.detach().numpy(), rtol=0, atol=1e-10)


def test_float32_mlp_stays_float32_and_matches_torch_float32(rng):
    x = rng.standard_normal((8, 5)).astype(np.float32)
    targets = rng.integers(0, 3, 8)
    mlp = layers.MLP([5, 6, 3], rng, dtype=np.float32)
    loss = ops.cross_entropy(mlp(Tensor(x)), targets)
    loss.backward()
    assert loss.dtype == np.float32
    assert all(p.data.dtype == np.float32 and p.grad.dtype == np.float32 for p in mlp.parameters())
    reference = torch_copy(mlp, dtype=torch.float32)
    F.cross_entropy(reference(torch.from_numpy(x)), torch.from_numpy(targets)).backward()
    for ours, theirs in zip(mlp.parameters(), reference.parameters(), strict=True):
        np.testing.assert_allclose(ours.grad, theirs.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_parameter_helpers(problem):
    _, _, mlp = problem
    params = mlp.parameters()
    assert layers.num_parameters(params) == 5 * 7 + 7 + 7 * 3 + 3
    for p in params:
        p.grad = np.ones_like(p.data)
    before = [p.data.copy() for p in params]
    optim.sgd_step(params, lr=0.1)
    for p, b in zip(params, before, strict=True):
        np.testing.assert_allclose(p.data, b - 0.1)
    optim.zero_grad(params)
    assert all(p.grad is None for p in params)


def test_sgd_with_momentum_matches_torch_and_never_writes_into_a_shared_array():
    shared = np.array([1.0, -2.0, 3.0])
    ours = Tensor(shared, requires_grad=True)
    theirs = torch.tensor(shared, requires_grad=True)
    mine, reference = optim.SGD([ours], lr=0.1, momentum=0.9), torch.optim.SGD([theirs], 0.1, 0.9)
    for _ in range(3):
        (ours * ours).sum().backward()
        (theirs * theirs).sum().backward()
        mine.step()
        reference.step()
        mine.zero_grad()
        reference.zero_grad()
    np.testing.assert_allclose(ours.data, theirs.detach().numpy(), rtol=0, atol=1e-15)
    np.testing.assert_array_equal(shared, [1.0, -2.0, 3.0])
    buffer = np.array([1.0, 2.0])
    assert optim.update(buffer, np.ones(2), 0.5, out=buffer) is buffer
    np.testing.assert_array_equal(buffer, [0.5, 1.5])
