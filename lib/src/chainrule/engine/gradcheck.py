"""Checking gradients: central differences, ``gradcheck``, and the adjoint (dot-product) test.

Conventions: ``f`` takes ONE argument, the list of inputs, and the inputs may be numpy arrays or
Tensors. ``numerical_gradient`` and ``gradcheck`` need a scalar output; the adjoint test works
for any number of inputs and outputs (a Tensor or a tuple/list of Tensors).

The adjoint test is the definition of the VJP: for every input perturbation u and output
cotangent v,

    ⟨v, J u⟩ = ⟨Jᵀ v, u⟩,

where ``J u`` (a JVP) comes from a central difference of f along u, or exactly from ``f(u)``
when f is linear, and ``Jᵀ v`` comes from ``backward(grad=v)``. A VJP that is not the transpose
of the forward's derivative fails it, whatever the shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from chainrule.engine.tensor import ArrayLike, Tensor, no_grad

Inputs = Sequence[ArrayLike]


def _as_list(inputs: Inputs | ArrayLike) -> list[Any]:
    if isinstance(inputs, Tensor | np.ndarray):
        return [inputs]
    return list(inputs)


def _float64(x: ArrayLike) -> np.ndarray:
    """A float64 copy of an input's values."""
    return np.array(x.data if isinstance(x, Tensor) else x, dtype=np.float64)


def _value(out: Any) -> float:
    if isinstance(out, Tensor):
        if out.data.size != 1:
            raise ValueError(f"f must return a scalar, got a tensor of shape {out.data.shape}")
        return float(out.data.reshape(()))
    return float(out)


def _like(original: Any, data: np.ndarray) -> Any:
    """``data`` in the form ``original`` was given in (Tensor or array)."""
    return Tensor(data) if isinstance(original, Tensor) else data


def numerical_gradient(
    f: Callable[[list[Any]], Any], inputs: Inputs, eps: float = 1e-6
) -> list[np.ndarray]:
    """``∂f/∂x_i`` for every input by central differences, element by element.

    ``∂f/∂x[j] ≈ (f(x + ε e_j) - f(x - ε e_j)) / 2ε``: error O(ε²) plus rounding O(δ/ε).
    Inputs are handed to ``f`` in the form they were given (arrays or Tensors), in float64.
    """
    originals = _as_list(inputs)
    arrays = [_float64(x) for x in originals]

    def evaluate() -> float:
        with no_grad():
            return _value(f([_like(x, a.copy()) for x, a in zip(originals, arrays, strict=True)]))

    grads = []
    for a in arrays:
        grad = np.zeros_like(a)
        flat, gflat = a.reshape(-1), grad.reshape(-1)
        for j in range(flat.size):
            keep = flat[j]
            flat[j] = keep + eps
            up = evaluate()
            flat[j] = keep - eps
            down = evaluate()
            flat[j] = keep
            gflat[j] = (up - down) / (2 * eps)
        grads.append(grad)
    return grads


def analytic_gradient(f: Callable[[list[Any]], Any], inputs: Inputs) -> list[np.ndarray]:
    """``∂f/∂x_i`` for every input by one backward pass (fresh float64 leaves)."""
    leaves = [Tensor(_float64(x), True) for x in _as_list(inputs)]
    out = f(leaves)
    if not isinstance(out, Tensor) or out.data.size != 1:
        raise ValueError("gradcheck: f must return a scalar Tensor")
    out.backward()
    return [np.zeros_like(x.data) if x.grad is None else x.grad for x in leaves]


def gradcheck(
    f: Callable[[list[Any]], Any],
    inputs: Inputs,
    atol: float = 1e-6,
    rtol: float = 1e-4,
    eps: float = 1e-6,
) -> bool:
    """Whether backward's gradient of the scalar ``f`` matches central differences.

    ``f`` receives Tensors in both passes. Passes when
    ``|analytic - numerical| ≤ atol + rtol·|numerical|`` everywhere; otherwise raises an
    AssertionError naming the input, the element, both values and the max error.
    """
    analytic = analytic_gradient(f, inputs)
    numeric = numerical_gradient(f, [Tensor(_float64(x)) for x in _as_list(inputs)], eps=eps)
    for i, (a, n) in enumerate(zip(analytic, numeric, strict=True)):
        error = np.abs(a - n)
        bad = error > atol + rtol * np.abs(n)
        if bad.any():
            where = np.unravel_index(np.argmax(np.where(bad, error, -1)), a.shape)
            raise AssertionError(
                f"gradcheck: input {i} (shape {a.shape}): max error {error.max():.3e}; "
                f"at index {tuple(int(k) for k in where)} backward gave {a[where]:.8g}, "
                f"central differences gave {n[where]:.8g} (atol={atol}, rtol={rtol})"
            )
    return True


def _outputs(out: Any) -> list[Tensor]:
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, list | tuple) and all(isinstance(o, Tensor) for o in out):
        return list(out)
    raise TypeError(f"f must return a Tensor or a tuple of Tensors, got {type(out).__name__}")


def adjoint_test(
    f: Callable[[list[Any]], Any],
    inputs: Inputs,
    rng: np.random.Generator | None = None,
    eps: float = 1e-6,
    linear: bool = False,
) -> tuple[float, float]:
    """``(⟨v, J u⟩, ⟨Jᵀ v, u⟩)`` for random u (one per input) and v (one per output).

    ``f`` maps the list of input Tensors to a Tensor or a tuple of Tensors. ``J u`` is the
    central difference ``(f(x + εu) - f(x - εu)) / 2ε``, or ``f(u)`` exactly when
    ``linear=True``; ``Jᵀ v`` is what ``backward(grad=v_j)`` on each output accumulates in the
    inputs' ``.grad``. The two numbers agree to rounding (linear) or O(ε²) when the VJPs are right.
    """
    rng = np.random.default_rng() if rng is None else rng
    xs = [_float64(x) for x in _as_list(inputs)]
    us = [rng.standard_normal(x.shape) for x in xs]

    leaves = [Tensor(x, requires_grad=True) for x in xs]
    outs = _outputs(f(leaves))
    vs = [rng.standard_normal(o.data.shape) for o in outs]
    for o, v in zip(outs, vs, strict=True):
        if o.requires_grad:
            o.backward(v)
    rhs = sum(
        float(np.vdot(x.grad, u)) for x, u in zip(leaves, us, strict=True) if x.grad is not None
    )

    with no_grad():
        if linear:
            jus = [o.data for o in _outputs(f([Tensor(u) for u in us]))]
        else:
            up = _outputs(f([Tensor(x + eps * u) for x, u in zip(xs, us, strict=True)]))
            down = _outputs(f([Tensor(x - eps * u) for x, u in zip(xs, us, strict=True)]))
            jus = [(a.data - b.data) / (2 * eps) for a, b in zip(up, down, strict=True)]
    lhs = sum(float(np.vdot(v, ju)) for v, ju in zip(vs, jus, strict=True))
    return lhs, rhs


def assert_adjoint(
    f: Callable[[list[Any]], Any],
    inputs: Inputs,
    rng: np.random.Generator | None = None,
    rtol: float = 1e-6,
    atol: float = 1e-9,
    eps: float = 1e-6,
    linear: bool = False,
) -> tuple[float, float]:
    """:func:`adjoint_test`, raising an AssertionError when ``⟨v, J u⟩ ≠ ⟨Jᵀ v, u⟩``."""
    lhs, rhs = adjoint_test(f, inputs, rng=rng, eps=eps, linear=linear)
    if not abs(lhs - rhs) <= atol + rtol * max(abs(lhs), abs(rhs)):
        raise AssertionError(
            f"adjoint test failed: <v, J u> = {lhs:.12g} but <J^T v, u> = {rhs:.12g} "
            f"(difference {abs(lhs - rhs):.3e}, rtol={rtol}, atol={atol})"
        )
    return lhs, rhs
