"""Chunk p of P along an axis: the one way the library cuts a value into the ranks' equal shares
(the collectives' chunks, shards of weights and batches, experts per rank), with one error."""

from __future__ import annotations

from typing import Any, TypeVar, cast

T = TypeVar("T")


def chunk_slice(length: int, index: int, parts: int, what: str = "the axis") -> slice:
    """Elements ``[index·n, (index+1)·n)``: chunk ``index`` of ``parts`` (n = length / parts)."""
    if length % parts:
        raise ValueError(
            f"{what} has length {length}, which does not split into {parts} equal chunks "
            "(one per rank)"
        )
    size = length // parts
    return slice(index * size, (index + 1) * size)


def chunk(x: T, index: int, parts: int, axis: int = 0) -> T:
    """Chunk ``index`` of ``parts`` equal chunks of ``x`` along ``axis``: a view of a numpy array
    or a torch tensor, a differentiable slice of an engine tensor."""
    array: Any = x
    shape = tuple(array.shape)
    axis %= len(shape)
    where = chunk_slice(shape[axis], index, parts, f"axis {axis} of shape {shape}")
    return cast(T, array[(slice(None),) * axis + (where,)])
