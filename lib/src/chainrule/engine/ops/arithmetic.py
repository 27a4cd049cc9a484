"""Arithmetic with broadcasting: each forward beside its VJP.

For ``out = a ∘ b`` with broadcasting, the VJP first computes the elementwise gradient
(shape of ``out``) and then sums it back to each operand's shape with :func:`unbroadcast`:
broadcasting copies a value, and copies' gradients add (rule 1).
"""

from __future__ import annotations

from numbers import Number
from typing import cast

import numpy as np

from chainrule.engine.ops._operands import operand, operands, shape_error
from chainrule.engine.tensor import ArrayLike, Tensor, unbroadcast


def add(a: ArrayLike, b: ArrayLike) -> Tensor:
    """``a + b``.  VJP: ``ā = unbroadcast(ḡ)``, ``b̄ = unbroadcast(ḡ)``."""
    a, b = operands(a, b)
    try:
        out = a.data + b.data
    except ValueError:
        raise shape_error("add", a, b) from None
    sa, sb = a.data.shape, b.data.shape

    def vjp(g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ga, gb = unbroadcast(g, sa), unbroadcast(g, sb)
        # Two leaves must not share one .grad array (an in-place update of one would change both).
        return ga, (gb.copy() if gb is ga else gb)

    return Tensor.from_op(out, (a, b), vjp, "add")


def sub(a: ArrayLike, b: ArrayLike) -> Tensor:
    """``a - b``.  VJP: ``ā = unbroadcast(ḡ)``, ``b̄ = -unbroadcast(ḡ)``."""
    a, b = operands(a, b)
    try:
        out = a.data - b.data
    except ValueError:
        raise shape_error("sub", a, b) from None
    sa, sb = a.data.shape, b.data.shape
    need_b = b.requires_grad

    def vjp(g: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        return unbroadcast(g, sa), (-unbroadcast(g, sb) if need_b else None)

    return Tensor.from_op(out, (a, b), vjp, "sub")


def mul(a: ArrayLike, b: ArrayLike) -> Tensor:
    """``a * b`` (elementwise).  VJP: ``ā = unbroadcast(ḡ·b)``, ``b̄ = unbroadcast(ḡ·a)``."""
    a, b = operands(a, b)
    ad, bd = a.data, b.data
    try:
        out = ad * bd
    except ValueError:
        raise shape_error("mul", a, b) from None
    need_a, need_b = a.requires_grad, b.requires_grad

    def vjp(g: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        ga = unbroadcast(g * bd, ad.shape) if need_a else None
        gb = unbroadcast(g * ad, bd.shape) if need_b else None
        return ga, gb

    return Tensor.from_op(out, (a, b), vjp, "mul")


def div(a: ArrayLike, b: ArrayLike) -> Tensor:
    """``a / b``.  VJP: ``ā = unbroadcast(ḡ/b)``, ``b̄ = unbroadcast(-ḡ·a/b²)`` (``= -ḡ·out/b``)."""
    a, b = operands(a, b)
    ad, bd = a.data, b.data
    try:
        out = ad / bd
    except ValueError:
        raise shape_error("div", a, b) from None
    need_a, need_b = a.requires_grad, b.requires_grad

    def vjp(g: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        ga = unbroadcast(g / bd, ad.shape) if need_a else None
        gb = unbroadcast(-g * out / bd, bd.shape) if need_b else None
        return ga, gb

    return Tensor.from_op(out, (a, b), vjp, "div")


def neg(a: ArrayLike) -> Tensor:
    """``-a``.  VJP: ``ā = -ḡ``."""
    a = operand(a)

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        return (-g,)

    return Tensor.from_op(-a.data, (a,), vjp, "neg")


def pow(a: ArrayLike, exponent: ArrayLike) -> Tensor:
    """``a ** exponent`` for a number exponent p, or a tensor exponent b (broadcasting).

    VJP with a number p: ``ā = ḡ·p·a^(p-1)``.
    VJP with a tensor b: ``ā = unbroadcast(ḡ·b·a^(b-1))``, ``b̄ = unbroadcast(ḡ·out·log a)``,
    where ``out·log a`` is taken as 0 at ``a = 0`` (its limit for b > 0).
    """
    if isinstance(exponent, Number) and not isinstance(exponent, bool):
        a = operand(a)
        ad, p = a.data, cast(float, exponent)
        out = ad**p

        def vjp_number(g: np.ndarray) -> tuple[np.ndarray]:
            if p == 2:
                return (g * (2 * ad),)
            return (g * (p * ad ** (p - 1)),)

        return Tensor.from_op(out, (a,), vjp_number, "pow")

    a, b = operands(a, exponent)
    ad, bd = a.data, b.data
    try:
        out = ad**bd
    except ValueError:
        raise shape_error("pow", a, b) from None
    need_a, need_b = a.requires_grad, b.requires_grad

    def vjp(g: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        ga = unbroadcast(g * bd * ad ** (bd - 1), ad.shape) if need_a else None
        gb = None
        if need_b:
            with np.errstate(divide="ignore", invalid="ignore"):
                d_out = np.where(ad == 0, 0.0, out * np.log(ad))
            gb = unbroadcast(g * d_out, bd.shape)
        return ga, gb

    return Tensor.from_op(out, (a, b), vjp, "pow")


def matmul(a: ArrayLike, b: ArrayLike) -> Tensor:
    """``a @ b`` with numpy's rules: 1-D operands are promoted, leading axes are batch axes.

    For 2-D operands ``ā = ḡ bᵀ`` and ``b̄ = aᵀ ḡ``. A 1-D ``a`` acts as a row ``(1, k)`` and a
    1-D ``b`` as a column ``(k, 1)``; batch axes are broadcast, so their gradients are summed
    back with :func:`unbroadcast`.
    """
    a, b = operands(a, b)
    ad, bd = a.data, b.data
    try:
        out = ad @ bd
    except ValueError:
        raise _matmul_error(ad.shape, bd.shape) from None
    need_a, need_b = a.requires_grad, b.requires_grad

    if ad.ndim == 2 and bd.ndim == 2:
        # b = Wᵀ (a transposed view): compute b̄ = (ḡᵀ a)ᵀ so that W̄ = ḡᵀ a is contiguous.
        b_is_transposed = bd.flags.f_contiguous and not bd.flags.c_contiguous

        def vjp_2d(g: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
            ga = g @ bd.T if need_a else None
            if not need_b:
                return ga, None
            return ga, ((g.T @ ad).T if b_is_transposed else ad.T @ g)

        return Tensor.from_op(out, (a, b), vjp_2d, "matmul")

    a2 = ad[None, :] if ad.ndim == 1 else ad  # (k,) -> (1, k)
    b2 = bd[:, None] if bd.ndim == 1 else bd  # (k,) -> (k, 1)
    out2_shape = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]) + (a2.shape[-2], b2.shape[-1])

    def vjp(g: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        g = g.reshape(out2_shape)  # put back the axes the 1-D promotion removed
        ga = gb = None
        if need_a:
            ga = unbroadcast(g @ np.swapaxes(b2, -1, -2), a2.shape).reshape(ad.shape)
        if need_b:
            gb = unbroadcast(np.swapaxes(a2, -1, -2) @ g, b2.shape).reshape(bd.shape)
        return ga, gb

    return Tensor.from_op(out, (a, b), vjp, "matmul")


def _matmul_error(sa: tuple[int, ...], sb: tuple[int, ...]) -> ValueError:
    if not sa or not sb:
        return ValueError(f"matmul: shapes {sa} and {sb}: scalar operands are not allowed")
    k_a = sa[-1]
    k_b = sb[0] if len(sb) == 1 else sb[-2]
    if k_a != k_b:
        return ValueError(f"matmul: shapes {sa} and {sb} do not align ({k_a} != {k_b})")
    return ValueError(f"matmul: shapes {sa} and {sb}: batch axes do not broadcast")
