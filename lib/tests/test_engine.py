"""The engine as a whole: the two rules of split graphs, deep chains, dtypes, errors, .grad."""

import sys

import chainrule as cr
import numpy as np
import pytest
import torch
from chainrule.engine import ops
from chainrule.engine.tensor import Tensor, no_grad

# -- rule 1: fan-out becomes a sum --------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 5])
def test_value_used_k_times_receives_the_sum_of_k_gradients(k, rng):
    """v feeds u_i = c_i·tanh(v) for i = 1..k: v̄ = Σ_i (∂u_i/∂v)ᵀ ū_i."""
    v0 = rng.standard_normal(4)
    cs = rng.standard_normal(k)
    v = Tensor(v0, requires_grad=True)
    shared = ops.tanh(v)
    loss = ops.sum(ops.stack([shared * c for c in cs]) ** 2)
    loss.backward()
    # each branch alone, added up by hand
    branches = []
    for c in cs:
        w = Tensor(v0, requires_grad=True)
        ((ops.tanh(w) * c) ** 2).sum().backward()
        branches.append(w.grad)
    np.testing.assert_allclose(v.grad, np.sum(branches, axis=0), rtol=1e-13)


def test_fan_out_in_one_op_and_across_ops_matches_torch(rng):
    x0 = rng.standard_normal((3, 3))
    x = Tensor(x0, requires_grad=True)
    y = x * x + x @ x + ops.exp(x).sum(axis=0) - x.T  # x read six times
    (y * y).sum().backward()
    t = torch.tensor(x0, requires_grad=True)
    ty = t * t + t @ t + torch.exp(t).sum(0) - t.T
    (ty * ty).sum().backward()
    np.testing.assert_allclose(x.grad, t.grad.numpy(), rtol=1e-12)


def test_diamond_graph_visits_the_shared_node_once_with_the_summed_gradient(rng):
    calls = []
    x = Tensor(rng.standard_normal(3), requires_grad=True)

    def counting_vjp(g):
        calls.append(g.copy())
        return (2 * g,)

    h = Tensor.from_op(2 * x.data, (x,), counting_vjp, "double")
    (ops.tanh(h) + h * 3).sum().backward()  # h is read by tanh and by mul
    assert len(calls) == 1  # the VJP of h runs once, on the sum of both branches
    expected_h_grad = (1 - np.tanh(h.data) ** 2) + 3
    np.testing.assert_allclose(calls[0], expected_h_grad, rtol=1e-13)
    np.testing.assert_allclose(x.grad, 2 * expected_h_grad, rtol=1e-13)


# -- rule 2: concatenation becomes a split ----------------------------------------------------


def test_concat_gradient_is_the_slices_of_the_output_gradient(rng):
    v1 = Tensor(rng.standard_normal((2, 3)), requires_grad=True)
    v2 = Tensor(rng.standard_normal((4, 3)), requires_grad=True)
    u = ops.concat([v1, v2], axis=0)
    u_bar = rng.standard_normal(u.shape)
    u.backward(u_bar)
    np.testing.assert_array_equal(v1.grad, u_bar[:2])  # exactly: no arithmetic, only routing
    np.testing.assert_array_equal(v2.grad, u_bar[2:])


def test_split_gradient_is_the_concat_with_zeros_for_unused_pieces(rng):
    x = Tensor(rng.standard_normal((2, 6)), requires_grad=True)
    a, b, c = ops.split(x, [1, 2, 3], axis=1)
    a_bar = rng.standard_normal(a.shape)
    c_bar = rng.standard_normal(c.shape)
    ((a * a_bar).sum() + (c * c_bar).sum()).backward()  # b is never used
    np.testing.assert_array_equal(x.grad, np.concatenate([a_bar, np.zeros((2, 2)), c_bar], 1))


def test_split_then_concat_is_the_identity_for_gradients(rng):
    x = Tensor(rng.standard_normal((5, 2)), requires_grad=True)
    y = ops.concat(ops.split(x, [2, 3]), axis=0)
    g = rng.standard_normal(y.shape)
    y.backward(g)
    np.testing.assert_array_equal(y.data, x.data)
    np.testing.assert_array_equal(x.grad, g)


# -- depth, dtypes, accumulation ------------------------------------------------------------


def test_ten_thousand_op_chain_backward_without_recursion(rng):
    n = 10_000
    assert n > sys.getrecursionlimit()
    x = Tensor(np.array([0.3, -0.2]), requires_grad=True)
    y = x
    for i in range(n // 2):
        y = ops.tanh(y) * 1.0001 if i % 2 else y * 0.9999 + 0.0001
    y.sum().backward()
    # the same chain with its derivative carried forward by hand
    value, derivative = x.data.copy(), np.ones(2)
    for i in range(n // 2):
        if i % 2:
            t = np.tanh(value)
            derivative = derivative * (1 - t * t) * 1.0001
            value = t * 1.0001
        else:
            derivative = derivative * 0.9999
            value = value * 0.9999 + 0.0001
    np.testing.assert_allclose(y.data, value, rtol=1e-12)
    np.testing.assert_allclose(x.grad, derivative, rtol=1e-10)


def test_float32_on_request_stays_float32(rng):
    x = cr.tensor(rng.standard_normal((4, 3)), requires_grad=True, dtype=np.float32)
    w = cr.tensor(rng.standard_normal((3, 2)), requires_grad=True, dtype=np.float32)
    targets = np.array([0, 1, 1, 0])
    h = ops.layer_norm(ops.tanh(x @ w * 2.0 + 1) / 3 - 0.5, eps=1e-5)
    loss = ops.cross_entropy(ops.concat([h, h**2], axis=1), targets) + ops.mse_loss(h, 0.0)
    assert h.dtype == np.float32
    assert loss.dtype == np.float32
    loss.backward()
    assert x.grad.dtype == np.float32 and w.grad.dtype == np.float32


def test_float64_is_the_default():
    assert cr.tensor([1, 2, 3]).dtype == np.float64
    assert (cr.tensor([1.0]) + 1).dtype == np.float64


def test_backward_twice_accumulates_into_grad(rng):
    x = Tensor(rng.standard_normal(3), requires_grad=True)
    (x * x).sum().backward()
    first = x.grad.copy()
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad, 2 * first)
    np.testing.assert_allclose(first, 2 * x.data)


def test_two_leaves_never_share_a_gradient_array(rng):
    a = Tensor(rng.standard_normal(3), requires_grad=True)
    b = Tensor(rng.standard_normal(3), requires_grad=True)
    (a + b).sum().backward()
    a.grad *= 2  # an in-place update (clipping, all-reduce) of one gradient
    np.testing.assert_array_equal(b.grad, np.ones(3))


def test_numpy_and_number_operands_on_either_side(rng):
    x = Tensor(rng.standard_normal(3), requires_grad=True)
    a = rng.standard_normal(3)
    y = a * x + 2 - x / a + (1 - x) * 3 + a @ x
    assert isinstance(y, Tensor)
    y.sum().backward()
    np.testing.assert_allclose(x.grad, a - 1 / a - 3 + 3 * a)


def test_no_grad_records_nothing(rng):
    x = Tensor(rng.standard_normal(3), requires_grad=True)
    with no_grad():
        y = ops.tanh(x) * 2
    assert not y.requires_grad and y.parents == ()
    assert (x * 2).requires_grad


def test_constants_get_no_gradient(rng):
    x = Tensor(rng.standard_normal(3), requires_grad=True)
    c = Tensor(rng.standard_normal(3))
    (x * c).sum().backward()
    assert c.grad is None
    np.testing.assert_array_equal(x.grad, c.data)


# -- error messages name the op and the shapes ------------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: ops.matmul(np.ones((3, 4)), np.ones((5, 2))),
            r"matmul: shapes \(3, 4\) and \(5, 2\) do not align \(4 != 5\)",
        ),
        (
            lambda: cr.tensor(np.ones((2, 3))) @ np.ones(4),
            r"matmul: shapes \(2, 3\) and \(4,\) do not align \(3 != 4\)",
        ),
        (
            lambda: ops.add(np.ones((3,)), np.ones((4,))),
            r"add: shapes \(3,\) and \(4,\) do not broadcast",
        ),
        (
            lambda: cr.tensor(np.ones((2, 3))) * np.ones((3, 2)),
            r"mul: shapes \(2, 3\) and \(3, 2\)",
        ),
        (lambda: cr.tensor(np.ones(2)) - np.ones(3), r"sub: shapes \(2,\) and \(3,\)"),
        (lambda: cr.tensor(np.ones(2)) / np.ones(3), r"div: shapes \(2,\) and \(3,\)"),
        (
            lambda: ops.cross_entropy(np.ones((4, 3)), np.zeros(5, int)),
            r"cross_entropy: targets of shape \(5,\) do not match logits of shape \(4, 3\)",
        ),
        (
            lambda: ops.cross_entropy(np.ones((4, 3)), np.array([0, 1, 3, 0])),
            r"cross_entropy: targets must lie in \[0, 3\)",
        ),
        (
            lambda: ops.cross_entropy(np.ones((4, 3)), np.zeros(4, int), np.ones(3)),
            r"cross_entropy: mask of shape \(3,\)",
        ),
        (
            lambda: ops.concat([np.ones((2, 3)), np.ones((2, 4))], axis=0),
            r"concat: shapes \(2, 3\), \(2, 4\)",
        ),
        (lambda: ops.split(np.ones((5, 2)), 2), r"split: axis 0 of shape \(5, 2\) has length 5"),
        (
            lambda: ops.split(np.ones((5, 2)), [2, 2]),
            r"split: sizes \[2, 2\] do not add up to length 5",
        ),
        (lambda: ops.reshape(np.ones(6), (4, 2)), r"reshape: cannot reshape \(6,\) into \(4, 2\)"),
        (
            lambda: ops.layer_norm(np.ones((2, 3)), np.ones(2)),
            r"layer_norm: weight of shape \(2,\) does not match input of shape \(2, 3\)",
        ),
        (lambda: ops.mse_loss(np.ones(2), np.ones(3)), r"mse_loss: shapes \(2,\) and \(3,\)"),
    ],
)
def test_errors_name_the_op_and_the_shapes(call, message):
    with pytest.raises((ValueError, IndexError), match=message):
        call()
