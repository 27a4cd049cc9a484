"""Ops that move values without arithmetic: reshape, transpose, indexing, concat, split, stack.

Their VJPs only route gradients: undo the move, put zeros where nothing was read, and add
where a value was read more than once (rule 1). Concatenation and splitting are each other's
VJPs (rule 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from chainrule.engine.ops._operands import operand
from chainrule.engine.tensor import VJP, ArrayLike, Tensor


def reshape(a: ArrayLike, shape: int | Sequence[int]) -> Tensor:
    """``a`` with a new shape (same elements, same order).  VJP: ``ā = ḡ`` reshaped back."""
    a = operand(a)
    in_shape = a.data.shape
    try:
        out = a.data.reshape(shape)
    except ValueError:
        raise ValueError(f"reshape: cannot reshape {in_shape} into {shape}") from None

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        return (g.reshape(in_shape),)

    return Tensor.from_op(out, (a,), vjp, "reshape")


def transpose(a: ArrayLike, axes: Sequence[int] | None = None) -> Tensor:
    """``a`` with its axes permuted (reversed when ``axes`` is None).

    VJP: ``ā = ḡ`` permuted by the inverse permutation.
    """
    a = operand(a)
    if axes is not None and len(axes) == 1 and isinstance(axes[0], tuple | list):
        axes = axes[0]
    try:
        out = a.data.transpose(axes)
    except ValueError:
        raise ValueError(f"transpose: axes {axes} do not fit shape {a.data.shape}") from None
    inverse = None if axes is None else tuple(np.argsort(axes))

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        return (g.transpose(inverse),)

    return Tensor.from_op(out, (a,), vjp, "transpose")


def _is_advanced(index: Any) -> bool:
    """Whether ``index`` reads with integer arrays, which may repeat an element."""
    parts = index if isinstance(index, tuple) else (index,)
    for part in parts:
        if isinstance(part, list):
            return True
        if isinstance(part, np.ndarray) and part.dtype != np.bool_:
            return True
    return False


def getitem(a: ArrayLike, index: Any) -> Tensor:
    """``a[index]``: ints, slices, ``None``, ``...``, integer arrays and boolean masks.

    VJP: a zero array of ``a``'s shape with ``ḡ`` added at the places that were read. An
    integer array may read an element several times, so those gradients are summed with
    ``np.add.at`` (rule 1); basic indexing and masks read each element at most once.
    """
    a = operand(a)
    if isinstance(index, Tensor):
        index = index.data
    elif isinstance(index, tuple):
        index = tuple(i.data if isinstance(i, Tensor) else i for i in index)
    try:
        out = a.data[index]
    except IndexError as error:
        raise IndexError(f"getitem: index {index!r} on shape {a.data.shape}: {error}") from None
    shape, dtype = a.data.shape, a.data.dtype
    scatter_add = _is_advanced(index)

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        full = np.zeros(shape, dtype=dtype)
        if scatter_add:
            np.add.at(full, index, g)
        else:
            full[index] = g
        return (full,)

    return Tensor.from_op(np.asarray(out), (a,), vjp, "getitem")


def _along(axis: int, ndim: int, start: int, stop: int) -> tuple[slice, ...]:
    """The index that selects ``start:stop`` along ``axis``."""
    return (slice(None),) * axis + (slice(start, stop),) + (slice(None),) * (ndim - axis - 1)


def concat(tensors: Sequence[ArrayLike], axis: int = 0) -> Tensor:
    """``[v_1; v_2; …]`` along ``axis``.

    VJP (rule 2: concatenation becomes a split): ``v̄_i = ū[o_i : o_i + n_i]`` along ``axis``,
    the slice of the gradient at the place ``v_i`` was put. No arithmetic, only routing.
    """
    parts = [operand(t) for t in tensors]
    if not parts:
        raise ValueError("concat: needs at least one tensor")
    try:
        out = np.concatenate([p.data for p in parts], axis=axis)
    except ValueError:
        shapes = ", ".join(str(p.data.shape) for p in parts)
        raise ValueError(
            f"concat: shapes {shapes} must match on every axis except axis {axis}"
        ) from None
    ax = axis % out.ndim
    offsets = np.cumsum([p.data.shape[ax] for p in parts])[:-1]

    def vjp(g: np.ndarray) -> list[np.ndarray]:
        return np.split(g, offsets, axis=ax)  # the split

    return Tensor.from_op(out, parts, vjp, "concat")


def split(
    a: ArrayLike, sections_or_sizes: int | Sequence[int], axis: int = 0
) -> tuple[Tensor, ...]:
    """``a`` cut along ``axis`` into ``n`` equal pieces (an int) or pieces of the given sizes.

    VJP (rule 2 backwards: splitting becomes a concatenation): the gradient of ``a`` is
    ``concat(ū_1, …, ū_k)``. Each piece contributes its own slot of that concat, with zeros in
    the slots of the other pieces (and a piece that got no gradient contributes nothing), and
    the engine sums the contributions because ``a`` fans out to k pieces (rule 1).
    """
    a = operand(a)
    shape = a.data.shape
    if not shape:
        raise ValueError("split: cannot split a scalar (shape ())")
    ax = axis % a.data.ndim
    length = shape[ax]
    if isinstance(sections_or_sizes, int):
        if sections_or_sizes <= 0 or length % sections_or_sizes:
            raise ValueError(
                f"split: axis {axis} of shape {shape} has length {length}, "
                f"which is not divisible into {sections_or_sizes} equal sections"
            )
        sizes = [length // sections_or_sizes] * sections_or_sizes
    else:
        sizes = [int(s) for s in sections_or_sizes]
        if any(s < 0 for s in sizes) or np.sum(sizes) != length:
            raise ValueError(
                f"split: sizes {sizes} do not add up to length {length} of axis {axis} "
                f"of shape {shape}"
            )
    pieces = []
    start = 0
    for size in sizes:
        stop = start + size
        pieces.append(
            Tensor.from_op(
                a.data[_along(ax, a.data.ndim, start, stop)],
                (a,),
                _split_vjp(shape, ax, start, stop, a.data.dtype),
                "split",
            )
        )
        start = stop
    return tuple(pieces)


def _split_vjp(shape: tuple[int, ...], ax: int, start: int, stop: int, dtype: np.dtype) -> VJP:
    """The VJP of one piece of a split: its gradient in its slot of the concat, zeros elsewhere."""

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        before = list(shape)
        before[ax] = start
        after = list(shape)
        after[ax] = shape[ax] - stop
        return (np.concatenate([np.zeros(before, dtype), g, np.zeros(after, dtype)], axis=ax),)

    return vjp


def stack(tensors: Sequence[ArrayLike], axis: int = 0) -> Tensor:
    """The tensors placed side by side along a new ``axis``.

    VJP: ``v̄_i = ū`` at position i of the new axis (a split of ``ū`` along it, rule 2).
    """
    parts = [operand(t) for t in tensors]
    if not parts:
        raise ValueError("stack: needs at least one tensor")
    try:
        out = np.stack([p.data for p in parts], axis=axis)
    except ValueError:
        shapes = ", ".join(str(p.data.shape) for p in parts)
        raise ValueError(f"stack: shapes {shapes} must all be equal") from None
    ax = axis % out.ndim
    n = len(parts)

    def vjp(g: np.ndarray) -> list[np.ndarray]:
        return [np.take(g, i, axis=ax) for i in range(n)]

    return Tensor.from_op(out, parts, vjp, "stack")
