"""Gradient checking: central differences, gradcheck's verdicts, and the adjoint test."""

import numpy as np
import pytest
from chainrule.engine import ops
from chainrule.engine.gradcheck import adjoint_test, assert_adjoint, gradcheck, numerical_gradient
from chainrule.engine.tensor import Tensor


def wrong_vjp_double(x):
    """Forward 2x, but a VJP that multiplies by 3: a deliberately wrong op."""
    return Tensor.from_op(2 * x.data, (x,), lambda g: (3 * g,), "wrong")


def transposed_vjp_matvec(a, x):
    """Forward A x, but a VJP for x that uses A instead of Aᵀ (right shape for square A)."""
    return Tensor.from_op(a.data @ x.data, (a, x), lambda g: (None, a.data @ g), "bad_matvec")


def test_numerical_gradient_of_a_polynomial_matches_its_derivative(rng):
    x, y = rng.standard_normal(3), rng.standard_normal((2, 2))

    def f(xs):
        a, b = xs
        return float(np.sum(a**3) + np.sum(a) * np.sum(b**2))

    gx, gy = numerical_gradient(f, [x, y])
    np.testing.assert_allclose(gx, 3 * x**2 + np.sum(y**2), rtol=1e-7)
    np.testing.assert_allclose(gy, 2 * y * np.sum(x), rtol=1e-7)


def test_numerical_gradient_passes_tensors_as_tensors_and_leaves_inputs_unchanged(rng):
    x = Tensor(rng.standard_normal(4))
    before = x.data.copy()
    seen = []

    def f(xs):
        seen.append(type(xs[0]))
        return (xs[0] * xs[0]).sum()

    (g,) = numerical_gradient(f, [x])
    assert set(seen) == {Tensor}
    np.testing.assert_allclose(g, 2 * before, rtol=1e-7)
    np.testing.assert_array_equal(x.data, before)


def test_gradcheck_accepts_correct_ops(rng):
    x, w = rng.standard_normal((3, 4)), rng.standard_normal(4)
    assert gradcheck(lambda xs: (ops.tanh(ops.layer_norm(xs[0], xs[1])) ** 2).sum(), [x, w])


def test_gradcheck_reports_input_index_and_error_of_a_wrong_vjp(rng):
    x, y = rng.standard_normal(3), rng.standard_normal((2, 2))
    with pytest.raises(AssertionError, match=r"input 1 \(shape \(2, 2\)\): max error") as info:
        gradcheck(lambda xs: xs[0].sum() + wrong_vjp_double(xs[1]).sum(), [x, y])
    assert "backward gave 3" in str(info.value) and "central differences gave 2" in str(info.value)


def test_gradcheck_names_the_element_where_it_fails(rng):
    x = rng.standard_normal(5)

    def f(xs):
        a = xs[0]
        left, bad, right = ops.split(a, [3, 1, 1])
        return (left * left).sum() + wrong_vjp_double(bad).sum() + right.sum()

    with pytest.raises(AssertionError, match=r"at index \(3,\)"):
        gradcheck(f, [x])


@pytest.mark.parametrize("linear", [False, True])
def test_adjoint_test_agrees_for_a_linear_map_with_several_inputs_and_outputs(linear, rng):
    a, b, c = rng.standard_normal((2, 3)), rng.standard_normal((4, 3)), rng.standard_normal(3)
    w = rng.standard_normal((3, 5))  # a constant: f stays linear in (x, y, z)

    def f(xs):
        x, y, z = xs
        joined = ops.concat([x, y], axis=0)  # (6, 3)
        first, second = ops.split(joined * 2.0 - z, [1, 5])
        return first.sum(axis=0), ops.stack([second, second], axis=1), x @ w + z.sum()

    lhs, rhs = adjoint_test(f, [a, b, c], rng, linear=linear)
    tolerance = 1e-12 if linear else 1e-8  # exact up to rounding, or rounding/ε
    assert abs(lhs - rhs) <= tolerance * max(1.0, abs(lhs))


def test_adjoint_test_of_a_nonlinear_function_agrees_to_finite_difference_accuracy(rng):
    x = rng.standard_normal((3, 4))
    lhs, rhs = assert_adjoint(lambda xs: (ops.softmax(xs[0]), ops.exp(xs[0])), [x], rng)
    assert lhs != 0.0


def test_assert_adjoint_catches_a_transposed_vjp(rng):
    a, x = rng.standard_normal((4, 4)), rng.standard_normal(4)
    with pytest.raises(AssertionError, match="adjoint test failed"):
        assert_adjoint(lambda xs: transposed_vjp_matvec(*xs), [a, x], rng, linear=False)


def test_assert_adjoint_catches_a_wrong_scale(rng):
    with pytest.raises(AssertionError, match=r"<v, J u> = .* but <J\^T v, u> = "):
        assert_adjoint(lambda xs: wrong_vjp_double(xs[0]), [rng.standard_normal(5)], rng)


def test_adjoint_test_with_an_output_that_ignores_the_inputs(rng):
    x = rng.standard_normal(3)
    lhs, rhs = assert_adjoint(lambda xs: (xs[0] * 3.0, Tensor(np.ones(2))), [x], rng)
    assert np.isfinite(lhs) and np.isfinite(rhs)
