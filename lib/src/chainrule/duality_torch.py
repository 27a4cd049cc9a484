"""The duality table as ``torch.autograd.Function``s on ``torch.distributed``.

The same rows as :mod:`chainrule.duality` (read its docstrings for the math: the forward map,
its Jacobian and the VJP), for torch tensors in real processes with a process group
initialised — for example inside ``chainrule.dist.run(fn, P, backend="gloo")``. Each class's
``backward`` calls the backward collective of its row; the lower-case functions are the
wrappers to call. ``group`` is the process group (``None``: the default, whole world).

Collectives go through ``torch.distributed`` directly, with list-based ``all_gather``,
``reduce_scatter`` and ``all_to_all`` (the ``*_tensor`` variants are deprecated in torch
2.13).

Memory: an all-reduce writes its result into memory no one else uses: large results reuse
memory that nothing refers to any more (:class:`chainrule.dist.torch_backend.TensorPool`),
since freshly allocated 64 MB costs about 3× a copy into mapped memory. ``CopyToRanks.backward``
reduces the incoming gradient in place only when autograd hands over a tensor that nothing
else holds (not the caller's ``gradient`` passed to ``backward``, not a view, not kept by a
hook, no graph being built for a second derivative), the same test torch uses to steal a
gradient; otherwise it reduces a copy. A caller's tensor is never written into.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.distributed as td
from torch.autograd.function import FunctionCtx

from chainrule.dist.torch_backend import (
    all_reduce_copy,
    pair_peer,
    pair_sum,
    storage_unshared,
    tensor_pool,
)

Group = Any  # a torch.distributed ProcessGroup, or None for the default group


def _all_reduce_sum(x: torch.Tensor, group: Group) -> torch.Tensor:
    """Σ_r x_r in memory no one else uses (``x`` is left as it was)."""
    out = tensor_pool.empty(x.shape, x.dtype, x.device)
    all_reduce_copy(td, out, x.detach(), td.ReduceOp.SUM, group)
    return out


def _references(grad: torch.Tensor) -> int:
    """References to ``grad``'s Python object, called straight from a ``backward``."""
    return sys.getrefcount(grad)


class _Probe(torch.autograd.Function):
    """Measures, once, the references a gradient that only autograd holds has in backward."""

    references = -1

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        _Probe.references = _references(grad)
        return grad


def _fresh_gradient_references() -> int:
    if _Probe.references < 0:
        with torch.enable_grad():
            x = torch.zeros(1, requires_grad=True)
            (_Probe.apply(x) * 2).backward(torch.ones(1))  # MulBackward hands over a new tensor
    return _Probe.references


def _autograd_owns(grad: torch.Tensor, references: int) -> bool:
    """Whether the incoming gradient may be overwritten: nothing but autograd's call holds it.

    Not a view, nothing else on its memory, one C++ owner (a gradient passed to
    ``backward(gradient)`` is also held by the graph's root, one an ``add`` sends to two
    branches by both), no extra Python reference (a hook that kept it), and no graph being
    recorded (``create_graph=True``). ``references``: :func:`_references` of ``grad``.
    """
    use_count = getattr(grad, "_use_count", None)
    return (
        use_count is not None
        and not torch.is_grad_enabled()
        and not grad.requires_grad
        and grad._base is None
        and grad.is_contiguous()
        and use_count() == 1
        and references == _fresh_gradient_references()
        and storage_unshared(grad)
    )


def _all_gather_cat(x: torch.Tensor, axis: int, group: Group) -> torch.Tensor:
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(td.get_world_size(group))]
    td.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=axis)


def _chunks(x: torch.Tensor, parts: int, axis: int) -> list[torch.Tensor]:
    length = x.shape[axis]
    if length % parts:
        raise ValueError(
            f"axis {axis} of shape {tuple(x.shape)} has length {length}, "
            f"which does not split into {parts} equal chunks (one per rank)"
        )
    return [c.contiguous() for c in torch.chunk(x, parts, dim=axis)]


def _reduce_scatter_sum(x: torch.Tensor, axis: int, group: Group) -> torch.Tensor:
    chunks = _chunks(x, td.get_world_size(group), axis)
    out = tensor_pool.empty(chunks[0].shape, chunks[0].dtype, chunks[0].device)
    peer = pair_peer(td, x, td.ReduceOp.SUM, group)
    if peer is not None:  # two ranks: one exchange of halves and one addition
        rank = td.get_rank(group)
        pair_sum(td, out, chunks[1 - rank], chunks[rank], peer, group)
    else:
        td.reduce_scatter(out.detach(), chunks, op=td.ReduceOp.SUM, group=group)
    return out


def _all_to_all(x: torch.Tensor, split_axis: int, concat_axis: int, group: Group) -> torch.Tensor:
    sends = _chunks(x, td.get_world_size(group), split_axis)
    receives = [torch.empty_like(c) for c in sends]
    td.all_to_all(receives, sends, group=group)
    return torch.cat(receives, dim=concat_axis)


def _own_chunk(x: torch.Tensor, axis: int, group: Group) -> torch.Tensor:
    return _chunks(x, td.get_world_size(group), axis)[td.get_rank(group)]


class CopyToRanks(torch.autograd.Function):
    """``f``: identity forward on a replicated value, all-reduce (sum) backward."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, group: Group = None) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        references = _references(grad)  # as in _Probe.backward
        if _autograd_owns(grad, references):
            td.all_reduce(grad.detach(), op=td.ReduceOp.SUM, group=ctx.group)  # in place
            return grad, None
        return _all_reduce_sum(grad, ctx.group), None


class ReduceFromRanks(torch.autograd.Function):
    """``f̄``: all-reduce (sum) forward of per-rank partial results, identity backward."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, group: Group = None) -> torch.Tensor:
        return _all_reduce_sum(x, group)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class GatherFromRanks(torch.autograd.Function):
    """All-gather forward with per-rank downstream, reduce-scatter backward."""

    @staticmethod
    def forward(
        ctx: FunctionCtx, x: torch.Tensor, axis: int = 0, group: Group = None
    ) -> torch.Tensor:
        ctx.axis, ctx.group = axis, group
        return _all_gather_cat(x, axis, group)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _reduce_scatter_sum(grad, ctx.axis, ctx.group), None, None


class GatherReplicated(torch.autograd.Function):
    """All-gather forward with replicated downstream (counted once), split backward."""

    @staticmethod
    def forward(
        ctx: FunctionCtx, x: torch.Tensor, axis: int = 0, group: Group = None
    ) -> torch.Tensor:
        ctx.axis, ctx.group = axis, group
        return _all_gather_cat(x, axis, group)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _own_chunk(grad, ctx.axis, ctx.group), None, None


class ReduceScatterToRanks(torch.autograd.Function):
    """Reduce-scatter (sum) forward, all-gather backward."""

    @staticmethod
    def forward(
        ctx: FunctionCtx, x: torch.Tensor, axis: int = 0, group: Group = None
    ) -> torch.Tensor:
        ctx.axis, ctx.group = axis, group
        return _reduce_scatter_sum(x, axis, group)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _all_gather_cat(grad, ctx.axis, ctx.group), None, None


class AllToAllRanks(torch.autograd.Function):
    """All-to-all forward, all-to-all with ``split_axis`` and ``concat_axis`` swapped backward."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        x: torch.Tensor,
        split_axis: int = 0,
        concat_axis: int = 0,
        group: Group = None,
    ) -> torch.Tensor:
        ctx.split_axis, ctx.concat_axis, ctx.group = split_axis, concat_axis, group
        return _all_to_all(x, split_axis, concat_axis, group)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        back = _all_to_all(grad, ctx.concat_axis, ctx.split_axis, ctx.group)
        return back, None, None, None


class SplitToRanks(torch.autograd.Function):
    """Split forward (each rank keeps its chunk of a replicated value), all-gather backward."""

    @staticmethod
    def forward(
        ctx: FunctionCtx, x: torch.Tensor, axis: int = 0, group: Group = None
    ) -> torch.Tensor:
        ctx.axis, ctx.group = axis, group
        return _own_chunk(x, axis, group).clone()

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _all_gather_cat(grad, ctx.axis, ctx.group), None, None


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
