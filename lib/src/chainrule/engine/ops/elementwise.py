"""Elementwise functions: ``out = f(a)``, so the VJP is ``ā = ḡ · f'(a)`` (a diagonal Jacobian)."""

from __future__ import annotations

import numpy as np

from chainrule.engine.ops._operands import operand
from chainrule.engine.tensor import ArrayLike, Tensor


def exp(a: ArrayLike) -> Tensor:
    """``eᵃ``.  VJP: ``ā = ḡ · out``."""
    a = operand(a)
    out = np.exp(a.data)

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        return (g * out,)

    return Tensor.from_op(out, (a,), vjp, "exp")


def log(a: ArrayLike) -> Tensor:
    """``ln a``.  VJP: ``ā = ḡ / a``."""
    a = operand(a)
    ad = a.data

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        return (g / ad,)

    return Tensor.from_op(np.log(ad), (a,), vjp, "log")


def tanh(a: ArrayLike) -> Tensor:
    """``tanh a``.  VJP: ``ā = ḡ · (1 - out²)``."""
    a = operand(a)
    out = np.tanh(a.data)

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        d = 1 - out * out
        d *= g  # in place: one large temporary fewer
        return (d,)

    return Tensor.from_op(out, (a,), vjp, "tanh")


def relu(a: ArrayLike) -> Tensor:
    """``max(a, 0)``.  VJP: ``ā = ḡ · [a > 0]`` (0 at a = 0, as in PyTorch)."""
    a = operand(a)
    ad = a.data

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        return (g * (ad > 0),)

    return Tensor.from_op(np.maximum(ad, 0), (a,), vjp, "relu")


def sigmoid(a: ArrayLike) -> Tensor:
    """``σ(a) = 1 / (1 + e⁻ᵃ)``, computed without overflow.  VJP: ``ā = ḡ · out · (1 - out)``."""
    a = operand(a)
    ad = a.data
    e = np.exp(-np.abs(ad))  # never overflows
    out = np.where(ad >= 0, 1, e) / (1 + e)

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        return (g * out * (1 - out),)

    return Tensor.from_op(out, (a,), vjp, "sigmoid")
