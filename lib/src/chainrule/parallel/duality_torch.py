"""The duality table as ``torch.autograd.Function``s on ``torch.distributed``.

The same rows as :mod:`chainrule.parallel.duality` (read its docstrings for the math: the forward
map, its Jacobian and the VJP), for torch tensors in real processes with a process group
initialised — for example inside ``chainrule.dist.run(fn, P, backend="gloo")``. Each row is
one small Function: its ``forward`` calls the row's forward collective, its ``backward`` the
backward collective. The lower-case functions are the ones to call; ``group`` is the process
group (``None``: the default, whole world).

Every collective writes into memory of its own, so neither an input nor an incoming gradient
is ever written into: an all-reduce reduces a copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as td

Group = Any  # a torch.distributed ProcessGroup, or None for the default group


def _all_reduce(x: torch.Tensor, group: Group) -> torch.Tensor:
    """Σ_r x_r in new memory."""
    out = x.clone(memory_format=torch.contiguous_format)
    td.all_reduce(out, group=group)
    return out


def _all_gather(x: torch.Tensor, axis: int, group: Group) -> torch.Tensor:
    """[x_0; …; x_{P−1}] along ``axis``."""
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(_size(group))]
    td.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=axis)


def _reduce_scatter(x: torch.Tensor, axis: int, group: Group) -> torch.Tensor:
    """Chunk r (along ``axis``) of Σ_j x_j, on rank r."""
    chunks = [c.contiguous() for c in _chunks(x, axis, group)]
    out = torch.empty_like(chunks[0])
    td.reduce_scatter(out, chunks, group=group)
    return out


def _all_to_all(x: torch.Tensor, split_axis: int, concat_axis: int, group: Group) -> torch.Tensor:
    """Chunk j of x to rank j; what every rank sent here, concatenated along ``concat_axis``."""
    sends = [c.contiguous() for c in _chunks(x, split_axis, group)]
    receives = [torch.empty_like(chunk) for chunk in sends]
    td.all_to_all(receives, sends, group=group)
    return torch.cat(receives, dim=concat_axis)


def _own_chunk(x: torch.Tensor, axis: int, group: Group) -> torch.Tensor:
    """This rank's chunk of x along ``axis`` (a copy)."""
    return _chunks(x, axis, group)[td.get_rank(group)].clone(memory_format=torch.contiguous_format)


def _chunks(x: torch.Tensor, axis: int, group: Group) -> tuple[torch.Tensor, ...]:
    """x cut into one chunk per rank along ``axis`` (views)."""
    parts = _size(group)
    if x.shape[axis] % parts:
        raise ValueError(
            f"axis {axis} of shape {tuple(x.shape)} has length {x.shape[axis]}, "
            f"which does not split into {parts} equal chunks (one per rank)"
        )
    return torch.chunk(x, parts, dim=axis)


def _size(group: Group) -> int:
    return int(td.get_world_size(group))


# -- the rows -----------------------------------------------------------------------------------


class CopyToRanks(torch.autograd.Function):
    """``f``: identity forward on a replicated value, all-reduce (sum) backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group = None) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_reduce(grad, ctx.group), None


class ReduceFromRanks(torch.autograd.Function):
    """``f̄``: all-reduce (sum) forward of per-rank partial results, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group = None) -> torch.Tensor:
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class GatherFromRanks(torch.autograd.Function):
    """All-gather forward with per-rank downstream, reduce-scatter backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, axis: int = 0, group: Group = None) -> torch.Tensor:
        ctx.axis, ctx.group = axis, group
        return _all_gather(x, axis, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _reduce_scatter(grad, ctx.axis, ctx.group), None, None


class GatherReplicated(torch.autograd.Function):
    """All-gather forward with replicated downstream (counted once), split backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, axis: int = 0, group: Group = None) -> torch.Tensor:
        ctx.axis, ctx.group = axis, group
        return _all_gather(x, axis, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _own_chunk(grad, ctx.axis, ctx.group), None, None


class ReduceScatterToRanks(torch.autograd.Function):
    """Reduce-scatter (sum) forward, all-gather backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, axis: int = 0, group: Group = None) -> torch.Tensor:
        ctx.axis, ctx.group = axis, group
        return _reduce_scatter(x, axis, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _all_gather(grad, ctx.axis, ctx.group), None, None


class AllToAllRanks(torch.autograd.Function):
    """All-to-all forward, all-to-all with ``split_axis`` and ``concat_axis`` swapped backward."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        split_axis: int = 0,
        concat_axis: int = 0,
        group: Group = None,
    ) -> torch.Tensor:
        ctx.axes, ctx.group = (split_axis, concat_axis), group
        return _all_to_all(x, split_axis, concat_axis, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        split_axis, concat_axis = ctx.axes
        return _all_to_all(grad, concat_axis, split_axis, ctx.group), None, None, None


class SplitToRanks(torch.autograd.Function):
    """Split forward (each rank keeps its chunk of a replicated value), all-gather backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, axis: int = 0, group: Group = None) -> torch.Tensor:
        ctx.axis, ctx.group = axis, group
        return _own_chunk(x, axis, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _all_gather(grad, ctx.axis, ctx.group), None, None


# -- the functions to call ------------------------------------------------------------------


def copy_to_ranks(x: torch.Tensor, group: Group = None) -> torch.Tensor:
    """``f``: identity forward, all-reduce (sum) backward (see :class:`CopyToRanks`)."""
    return CopyToRanks.apply(x, group)


def reduce_from_ranks(x: torch.Tensor, group: Group = None) -> torch.Tensor:
    """``f̄``: all-reduce (sum) forward, identity backward (see :class:`ReduceFromRanks`)."""
    return ReduceFromRanks.apply(x, group)


def gather_from_ranks(x: torch.Tensor, axis: int = 0, group: Group = None) -> torch.Tensor:
    """All-gather forward, reduce-scatter backward (see :class:`GatherFromRanks`)."""
    return GatherFromRanks.apply(x, axis, group)


def gather_replicated(x: torch.Tensor, axis: int = 0, group: Group = None) -> torch.Tensor:
    """All-gather forward, split backward (see :class:`GatherReplicated`)."""
    return GatherReplicated.apply(x, axis, group)


def reduce_scatter_to_ranks(x: torch.Tensor, axis: int = 0, group: Group = None) -> torch.Tensor:
    """Reduce-scatter forward, all-gather backward (see :class:`ReduceScatterToRanks`)."""
    return ReduceScatterToRanks.apply(x, axis, group)


def all_to_all_ranks(
    x: torch.Tensor, split_axis: int = 0, concat_axis: int = 0, group: Group = None
) -> torch.Tensor:
    """All-to-all forward, transposed all-to-all backward (see :class:`AllToAllRanks`)."""
    return AllToAllRanks.apply(x, split_axis, concat_axis, group)


def split_to_ranks(x: torch.Tensor, axis: int = 0, group: Group = None) -> torch.Tensor:
    """Keep this rank's chunk forward, all-gather backward (see :class:`SplitToRanks`)."""
    return SplitToRanks.apply(x, axis, group)


f = copy_to_ranks
f_bar = reduce_from_ranks

ROWS: dict[str, Callable[..., torch.Tensor]] = {
    "identity": copy_to_ranks,
    "all_reduce": reduce_from_ranks,
    "all_gather": gather_from_ranks,
    "reduce_scatter": reduce_scatter_to_ranks,
    "all_to_all": all_to_all_ranks,
    "split": split_to_ranks,
    "all_gather_replicated": gather_replicated,
}
"""Each row of :data:`chainrule.parallel.duality.DUALITY_TABLE`, by its key, on torch tensors."""
