"""One rank on torch.distributed (gloo on CPU, NCCL on GPUs): each collective is one call.

:class:`TorchWorld` answers the collectives of a process that is a rank of a
``torch.distributed`` process group: a worker of :func:`chainrule.dist.run`'s pool
(:mod:`chainrule.dist.pool`), or a process under torchrun (:mod:`chainrule.dist.torchrun`).
:mod:`chainrule.dist.api` hands it contiguous torch tensors on the rank's device
(``cuda:<local rank>`` for NCCL).

Before each collective every rank gathers every rank's :class:`~chainrule.dist.calls.Call`, pickled
(one small all-gather; a second for a long call), and checks them with
:func:`chainrule.dist.calls.agree`: a mismatch, or a rank that returned or raised while the others
wait, ends in an error on every rank at once, in the words of the simulated world, instead of a
hang, a crashed process or silently reinterpreted bytes. Then comes the collective itself, one
``torch.distributed`` call (the functions at the end of this module). A functional result costs one
copy: ``all_reduce`` reduces a clone, or with ``out=`` reduces in ``out``'s own memory. gloo has no
average: ``ReduceOp.AVG`` sums, then divides by P.
"""

from __future__ import annotations

import copy
import pickle
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from chainrule.dist.calls import Call, agree, event
from chainrule.dist.torch_pairs import Pairs
from chainrule.dist.trace import CollectiveEvent
from chainrule.dist.world import CollectiveAborted, CollectiveError, ReduceOp
from chainrule.engine import interop

if TYPE_CHECKING:
    from chainrule.dist.groups import Group
    from chainrule.dist.whereabouts import Status

HEAD = 256
"""Bytes each rank sends in the first gather of an agreement: its pickled call's length and
first bytes; a longer call (a large shape, every rank's counts) takes a second gather."""


class TorchWorld:
    """This process's rank of the default ``torch.distributed`` process group, or of a group
    of its ranks.

    ``backend``: "gloo" or "nccl"; ``device``: where the rank's tensors live. ``events``: when
    a list, every collective this rank leads (it is its group's rank 0) appends its
    :class:`~chainrule.dist.trace.CollectiveEvent`, and ``event_times`` when it happened
    (``time.monotonic()``, one clock for every process of the machine). A group's world
    (:meth:`subgroup`) has its own collective numbers and shares the rest with this one.
    """

    native = "torch"

    def __init__(self, backend: str, device: Any, status: Status | None = None) -> None:
        import torch
        import torch.distributed as td

        self.backend = backend
        self.device = torch.device(device)
        self.rank: int = td.get_rank()
        self.world_size: int = td.get_world_size()
        self.ranks: tuple[int, ...] = tuple(range(self.world_size))  # as world ranks
        self.process_group: Any = None  # None: the default group
        self.root = self  # the world of the whole default group
        self.groups: dict[tuple[int, ...], TorchWorld] = {}  # the groups made so far
        self.seq = 0  # the number of the next collective
        self.failure: str | None = None  # why the ranks could not agree, once they could not
        self.events: list[CollectiveEvent] | None = None
        self.event_times: list[float] = []
        self.status = status  # where a pool's owner reads the collective this rank waits in
        self.pairs = Pairs(self)  # its sends and recvs

    def start(self, tracing: bool) -> None:
        """Begin a run of an SPMD function: collectives count from 0 again."""
        self.seq, self.failure = 0, None
        self.events = [] if tracing else None
        self.event_times = []
        for group in self.groups.values():
            group.seq = 0
        self.pairs.start()

    def register_group(self, group: Group) -> None:
        """Create ``group``'s process group, once per process (a collective step of every rank
        of the default group: every rank calls it, in the same order)."""
        if group.ranks in self.root.groups:
            return
        import torch.distributed as td

        process_group = td.new_group(list(group.ranks), sort_ranks=False)
        member = copy.copy(self.root)
        member.process_group, member.ranks, member.seq = process_group, group.ranks, 0
        if self.rank in group.ranks:
            member.rank, member.world_size = group.index(self.root.rank), len(group)
        self.root.groups[group.ranks] = member

    def subgroup(self, group: Group) -> TorchWorld:
        member = self.root.groups.get(group.ranks)
        if member is None:
            raise CollectiveError(
                f"the group of ranks {group.ranks} was not made with dist.new_group on every "
                "rank of this run"
            )
        group.index(self.root.rank)  # ValueError for a rank outside the group
        return member

    def collective(self, call: Call, data: Any, into: Any = None) -> tuple[Any, Call]:
        calls, lead = self.agree(call)
        root = self.root
        if root.events is not None and self.rank == 0:
            root.events.append(event(calls, lead, self.seq - 1, self.backend, self.ranks))
            root.event_times.append(time.monotonic())
        return COLLECTIVES[lead.op](self, lead, data, into), lead

    def point_to_point(self, call: Call, data: Any) -> tuple[Any, Call]:
        """A send or a recv, in this world's process group (a group's, or the default)."""
        return self.root.pairs.meet(call, data, self.process_group)

    def agree(self, call: Call) -> tuple[list[Call], Call]:
        """Every rank's call of the next collective, and the call they agree on (or raise)."""

        root = self.root
        if root.failure is not None:
            raise CollectiveAborted(root.failure)
        seq, self.seq = self.seq, self.seq + 1
        if root.status is not None:
            group = "" if self is root else f" (in the group of ranks {self.ranks})"
            root.status.waiting_in(f"{call.op} #{seq}{group}")
        calls = self._gather(pickle.dumps(call))
        if root.status is not None:
            root.status.waiting_in(None)
        try:
            return calls, agree(calls, seq)
        except CollectiveError as exc:
            if self is root:
                root.failure = str(exc)
                raise
            root.failure = f"{exc} (ranks of the group {self.ranks})"
            raise type(exc)(root.failure) from None

    def _gather(self, mine: bytes) -> list[Call]:
        """Every rank's call, from its pickle: first :data:`HEAD` bytes of each (its length
        first), then, when one is longer, all of each."""
        import torch

        framed = bytearray(len(mine).to_bytes(4, "little") + mine)
        width, rows = HEAD, None
        while rows is None or width > rows.shape[1]:  # a second gather when a call is longer
            buffer = torch.zeros(width, dtype=torch.uint8)
            buffer[: min(width, len(framed))] = torch.frombuffer(framed, dtype=torch.uint8)[:width]
            rows = _all_gather_stacked(buffer.to(self.device), self).cpu().numpy()
            sizes = [4 + int.from_bytes(row[:4].tobytes(), "little") for row in rows]
            width = max(width, *sizes)
        return [pickle.loads(row[4:size].tobytes()) for row, size in zip(rows, sizes, strict=True)]

    def finish(self, raised: bool) -> None:
        """End a run: tell the other ranks this one returned (or raised), so that a rank still
        waiting in a collective, a send or a recv learns it at once."""
        self.pairs.finish(raised)
        if self.failure is None:
            try:
                self.agree(Call("raised" if raised else "returned"))
            except CollectiveError:
                pass  # a rank that waits in a collective reports it


# -- one torch.distributed call per collective ------------------------------------------------


def _dist() -> Any:
    import torch.distributed as td

    return td


def _sum_or_max(op: ReduceOp) -> Any:
    """The torch.distributed reduction: AVG sums (gloo has no average), then divides."""
    td = _dist()
    return td.ReduceOp.MAX if op is ReduceOp.MAX else td.ReduceOp.SUM


def _all_gather_stacked(t: Any, world: TorchWorld) -> Any:
    """Every rank's ``t``, stacked: shape (P, *t.shape)."""
    import torch

    td, P = _dist(), world.world_size
    out = torch.empty((P * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
    td.all_gather_single(out, t, group=world.process_group)
    return out.view(P, *t.shape)


def _all_reduce(world: TorchWorld, call: Call, t: Any, into: Any) -> Any:
    op: ReduceOp = call.param("op")
    if into is None:
        result = t.clone()  # the one copy of a functional result
    else:
        result = into
        if not interop.shares_memory(into, t):
            result.copy_(t)
    _dist().all_reduce(result, op=_sum_or_max(op), group=world.process_group)
    return result.div_(world.world_size) if op is ReduceOp.AVG else result


def _all_gather(world: TorchWorld, call: Call, t: Any, into: Any) -> Any:
    axis, P = call.param("axis"), world.world_size
    stacked = _all_gather_stacked(t, world)
    shape = list(t.shape)
    shape[axis] *= P
    return stacked.movedim(0, axis).reshape(shape)  # rank j's block j along axis


def _reduce_scatter(world: TorchWorld, call: Call, t: Any, into: Any) -> Any:
    import torch

    td = _dist()
    op, axis, P = call.param("op"), call.param("axis"), world.world_size
    rows = t.movedim(axis, 0).contiguous()  # chunk r: rows r·n/P to (r+1)·n/P − 1
    out = torch.empty((rows.shape[0] // P, *rows.shape[1:]), dtype=t.dtype, device=t.device)
    td.reduce_scatter_single(out, rows, op=_sum_or_max(op), group=world.process_group)
    if op is ReduceOp.AVG:
        out.div_(P)
    return out.movedim(0, axis).contiguous()


def _all_to_all(world: TorchWorld, call: Call, t: Any, into: Any) -> Any:
    import torch

    P, split_axis = world.world_size, call.param("split_axis")
    rows = t.movedim(split_axis, 0).contiguous()  # chunk j: the rows that go to rank j
    counts = dict(call.params).get("send_counts")  # every rank's, when uneven
    if counts is not None:  # concatenated along the split axis, in rank order
        received = [row[world.rank] for row in counts]
        out = rows.new_empty((sum(received), *rows.shape[1:]))
        _dist().all_to_all_single(
            out, rows, received, list(counts[world.rank]), group=world.process_group
        )
        return out.movedim(0, split_axis).contiguous()
    out = torch.empty_like(rows)
    _dist().all_to_all_single(out, rows, group=world.process_group)
    # out holds rank j's chunk for this rank in its rows j·c to (j+1)·c − 1
    chunks = out.reshape(P, -1, *rows.shape[1:]).movedim(1, split_axis + 1)
    shape = list(chunks.shape[1:])
    shape[call.param("concat_axis")] *= P
    return chunks.movedim(0, call.param("concat_axis")).reshape(shape).contiguous()


def _broadcast(world: TorchWorld, call: Call, t: Any, into: Any) -> Any:
    import torch

    src = call.param("src")
    if world.rank == src:
        result = t.clone()
    else:
        dtype = interop.torch_dtype(call.dtype)  # type: ignore[arg-type]
        result = torch.empty(call.shape or (), dtype=dtype, device=world.device)
    _dist().broadcast(result, group=world.process_group, group_src=src)
    return result


def _scatter(world: TorchWorld, call: Call, t: Any, into: Any) -> Any:
    import torch

    src, axis, P = call.param("src"), call.param("axis"), world.world_size
    shape = list(call.shape)  # type: ignore[arg-type]
    shape[axis] //= P
    dtype = interop.torch_dtype(call.dtype)  # type: ignore[arg-type]
    result = torch.empty(shape, dtype=dtype, device=world.device)
    chunks = [c.contiguous() for c in t.chunk(P, dim=axis)] if world.rank == src else None
    _dist().scatter(result, chunks, group=world.process_group, group_src=src)
    return result


def _barrier(world: TorchWorld, call: Call, t: Any, into: Any) -> None:
    if world.backend == "nccl":
        _dist().barrier(group=world.process_group, device_ids=[world.device.index])
    else:
        _dist().barrier(group=world.process_group)


COLLECTIVES: dict[str, Callable[[TorchWorld, Call, Any, Any], Any]] = {
    "all_reduce": _all_reduce,
    "all_gather": _all_gather,
    "reduce_scatter": _reduce_scatter,
    "all_to_all": _all_to_all,
    "broadcast": _broadcast,
    "scatter": _scatter,
    "barrier": _barrier,
}
"""Each collective on torch.distributed: the world, the agreed call, this rank's tensor (None
where it passed none), the tensor ``out=`` lends (all_reduce); this rank's result."""
