"""The duality table as one ``torch.autograd.Function`` on ``torch.distributed``.

The rows of :mod:`chainrule.parallel.duality` (its docstrings give the math) for torch tensors
in real processes, e.g. inside ``dist.run(fn, P, backend="gloo")``: each function below is one
row, its forward and backward collectives side by side, run by :class:`Row`. ``group``: the
process group (None: the whole world). No input or incoming gradient is ever written into.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
import torch.distributed as td

from chainrule.dist.chunks import chunk

Group = Any  # a torch.distributed ProcessGroup, or None for the default group
Collective = Callable[[torch.Tensor], torch.Tensor]


def _all_reduce(x: torch.Tensor, group: Group) -> torch.Tensor:
    """Σ_r x_r in new memory."""
    out = x.clone(memory_format=torch.contiguous_format)
    td.all_reduce(out, group=group)
    return out


def _all_gather(x: torch.Tensor, axis: int, group: Group) -> torch.Tensor:
    """[x_0; …; x_{P−1}] along ``axis``."""
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(td.get_world_size(group))]
    td.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=axis)


def _reduce_scatter(x: torch.Tensor, axis: int, group: Group) -> torch.Tensor:
    """Chunk r (along ``axis``) of Σ_j x_j, on rank r."""
    P = td.get_world_size(group)
    chunks = [chunk(x, r, P, axis).contiguous() for r in range(P)]
    out = torch.empty_like(chunks[0])
    td.reduce_scatter(out, chunks, group=group)
    return out


def _all_to_all(
    x: torch.Tensor,
    split_axis: int,
    concat_axis: int,
    group: Group,
    send: Sequence[int] | None = None,
    receive: Sequence[int] | None = None,
) -> torch.Tensor:
    """Chunk j of x to rank j; what every rank sent here, concatenated along ``concat_axis``.
    Uneven: ``send[j]`` slices to rank j, ``receive[j]`` from it, along ``split_axis``."""
    if send is not None and receive is not None:
        rows = x.movedim(split_axis, 0).contiguous()
        out = rows.new_empty((sum(receive), *rows.shape[1:]))
        td.all_to_all_single(out, rows, list(receive), list(send), group=group)
        return out.movedim(0, split_axis)
    P = td.get_world_size(group)
    sends = [chunk(x, r, P, split_axis).contiguous() for r in range(P)]
    receives = [torch.empty_like(part) for part in sends]
    td.all_to_all(receives, sends, group=group)
    return torch.cat(receives, dim=concat_axis)


def _own_chunk(x: torch.Tensor, axis: int, group: Group) -> torch.Tensor:
    """This rank's chunk of x along ``axis`` (a copy)."""
    own = chunk(x, td.get_rank(group), td.get_world_size(group), axis)
    return own.clone(memory_format=torch.contiguous_format)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x.view_as(x)


class Row(torch.autograd.Function):
    """A row of the duality table: ``forward(x)`` in the forward pass, ``backward(grad)`` in the
    backward pass (the row's two collectives; nothing else of the call gets a gradient)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, forward: Collective, backward: Collective
    ) -> torch.Tensor:
        ctx.backward = backward
        return forward(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return ctx.backward(grad), None, None


# -- the rows -----------------------------------------------------------------------------------


def copy_to_ranks(x: torch.Tensor, group: Group = None) -> torch.Tensor:
    """``f``: identity forward on a replicated value, all-reduce (sum) backward."""
    return Row.apply(x, _identity, partial(_all_reduce, group=group))


def reduce_from_ranks(x: torch.Tensor, group: Group = None) -> torch.Tensor:
    """``f̄``: all-reduce (sum) forward of per-rank partial results, identity backward."""
    return Row.apply(x, partial(_all_reduce, group=group), _identity)


def gather_from_ranks(x: torch.Tensor, axis: int = 0, group: Group = None) -> torch.Tensor:
    """All-gather forward with per-rank downstream, reduce-scatter backward."""
    return Row.apply(
        x,
        partial(_all_gather, axis=axis, group=group),
        partial(_reduce_scatter, axis=axis, group=group),
    )


def gather_replicated(x: torch.Tensor, axis: int = 0, group: Group = None) -> torch.Tensor:
    """All-gather forward with replicated downstream (counted once), split backward."""
    return Row.apply(
        x, partial(_all_gather, axis=axis, group=group), partial(_own_chunk, axis=axis, group=group)
    )


def reduce_scatter_to_ranks(x: torch.Tensor, axis: int = 0, group: Group = None) -> torch.Tensor:
    """Reduce-scatter (sum) forward, all-gather backward."""
    return Row.apply(
        x,
        partial(_reduce_scatter, axis=axis, group=group),
        partial(_all_gather, axis=axis, group=group),
    )


def all_to_all_ranks(
    x: torch.Tensor,
    split_axis: int = 0,
    concat_axis: int = 0,
    send_counts: Sequence[int] | None = None,
    recv_counts: Sequence[int] | None = None,
    group: Group = None,
) -> torch.Tensor:
    """All-to-all forward, all-to-all with ``split_axis`` and ``concat_axis`` swapped (and the
    counts transposed: what arrived goes back) backward. Uneven with ``send_counts``, along
    ``split_axis``; without ``recv_counts`` the ranks first exchange the counts."""
    if send_counts is not None and recv_counts is None:
        counts = torch.tensor(list(send_counts), dtype=torch.int64)
        recv_counts = _all_to_all(counts, 0, 0, group).tolist()
    forward = partial(_all_to_all, split_axis=split_axis, concat_axis=concat_axis, group=group)
    backward = partial(_all_to_all, split_axis=concat_axis, concat_axis=split_axis, group=group)
    return Row.apply(
        x, partial(forward, send=send_counts, receive=recv_counts),
        partial(backward, send=recv_counts, receive=send_counts),
    )  # fmt: skip


def split_to_ranks(x: torch.Tensor, axis: int = 0, group: Group = None) -> torch.Tensor:
    """Keep this rank's chunk forward (of a replicated value), all-gather backward."""
    return Row.apply(
        x, partial(_own_chunk, axis=axis, group=group), partial(_all_gather, axis=axis, group=group)
    )


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


# -- point to point ------------------------------------------------------------------------------


class SendToRank(torch.autograd.Function):
    """Send forward, recv of the gradient from the destination backward; the output is a
    zero-size phony that holds the backward in the graph."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dst: int) -> torch.Tensor:
        td.send(x.contiguous(), dst)
        ctx.dst, ctx.like = dst, torch.empty_like(x, memory_format=torch.contiguous_format)
        return x.new_empty(0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        received = torch.empty_like(ctx.like)
        td.recv(received, ctx.dst)
        return received, None


class RecvFromRank(torch.autograd.Function):
    """Recv forward (into a tensor of the given shape and dtype, as torch.distributed's recv
    needs), send of the gradient back to the source backward. ``anchor``: a zero-size tensor
    that requires a gradient, so that autograd reaches this backward."""

    @staticmethod
    def forward(
        ctx: Any, anchor: torch.Tensor, src: int, shape: Sequence[int], dtype: torch.dtype
    ) -> torch.Tensor:
        received = torch.empty(tuple(shape), dtype=dtype)
        td.recv(received, src)
        ctx.src = src
        return received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None, None]:
        td.send(grad.contiguous(), ctx.src)
        return None, None, None, None


def send_to_rank(x: torch.Tensor, dst: int) -> torch.Tensor:
    """Send x to rank ``dst``; backward: receive x's gradient from it. Returns the phony."""
    return SendToRank.apply(x, dst)


def recv_from_rank(
    src: int, shape: Sequence[int], dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """What rank ``src`` sends (its shape and dtype given, as torch.distributed's recv needs
    them); backward: send its gradient back to ``src``."""
    anchor = torch.zeros(0, dtype=dtype, requires_grad=True)
    return RecvFromRank.apply(anchor, src, shape, dtype)


def pass_to_next(x: torch.Tensor) -> torch.Tensor:
    """``y_r = x_{r−1}``, ``y_0 = 0``: each rank receives first, then sends (see the engine's
    :func:`chainrule.parallel.duality.pass_to_next`)."""
    r, P = td.get_rank(), td.get_world_size()
    y = recv_from_rank(r - 1, x.shape, x.dtype) if r > 0 else x * 0.0
    if r < P - 1:
        y = y + send_to_rank(x, r + 1).sum()
    return y


POINT_TO_POINT_ROWS: dict[str, Callable[..., torch.Tensor]] = {
    "send": pass_to_next,
    "recv": pass_to_next,
}
"""The rows of :data:`chainrule.parallel.duality.POINT_TO_POINT_TABLE` on torch tensors (both
run in :func:`pass_to_next`)."""
