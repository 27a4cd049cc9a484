"""Reductions: ``sum`` and ``mean`` over an axis, several axes, or everything.

A sum reads every input element once with weight 1, so its VJP copies ``ḡ`` back over the
reduced axes (a broadcast); a mean does the same and divides by the number of elements.
"""

from __future__ import annotations

import numpy as np

from chainrule.engine.ops._operands import operand
from chainrule.engine.tensor import ArrayLike, Tensor

Axis = int | tuple[int, ...] | None


def normalize_axes(axis: Axis, ndim: int) -> tuple[int, ...]:
    """``axis`` as a sorted tuple of non-negative axes (``None`` means all of them)."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for ax in axes:
        if not -ndim <= ax < max(ndim, 1):
            raise ValueError(f"axis {ax} is out of range for an array of {ndim} dimensions")
        out.append(ax % ndim if ndim else 0)
    return tuple(sorted(out))


def _spread(
    g: np.ndarray, shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool
) -> np.ndarray:
    """``ḡ`` copied back over the reduced ``axes`` into a fresh array of ``shape``."""
    if not keepdims and axes:
        g = np.expand_dims(g, axes)
    out = np.empty(shape, dtype=g.dtype)
    out[...] = g
    return out


def sum(a: ArrayLike, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """``Σ a`` over ``axis``.  VJP: ``ā = ḡ`` broadcast back over the summed axes."""
    a = operand(a)
    shape = a.data.shape
    axes = normalize_axes(axis, a.data.ndim)
    out = np.sum(a.data, axis=axes, keepdims=keepdims)
    out = np.asarray(out)

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        return (_spread(g, shape, axes, keepdims),)

    return Tensor.from_op(out, (a,), vjp, "sum")


def mean(a: ArrayLike, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """``(1/n) Σ a`` over ``axis`` (n elements per mean).  VJP: ``ā = ḡ / n`` broadcast back."""
    a = operand(a)
    shape = a.data.shape
    axes = normalize_axes(axis, a.data.ndim)
    n = int(np.prod([shape[ax] for ax in axes])) if axes else 1
    out = np.asarray(np.mean(a.data, axis=axes, keepdims=keepdims))

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        return (_spread(g / n, shape, axes, keepdims),)

    return Tensor.from_op(out, (a,), vjp, "mean")
