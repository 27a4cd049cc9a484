"""What one rank asks of a collective, and the check that every rank asked the same.

Each collective call becomes a :class:`Call`: the collective's name, its arguments, and the shape,
dtype and kind of the value the rank passed. Before any data moves, the ranks compare their calls
(:func:`agree`, by the collective's specification in :mod:`chainrule.dist.collectives`): the
simulated world in memory, the torch backend by gathering every rank's call, pickled (a value of any
size: every rank's counts...). Mismatched collectives, arguments, shapes or dtypes, and a rank that
returned while others wait, become a :class:`~chainrule.dist.world.CollectiveError` that names the
collective, the ranks and the mismatch, with the same words on every backend. Nothing is ever
reinterpreted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from chainrule.dist.collectives import COLLECTIVES, Collective
from chainrule.dist.trace import CollectiveEvent
from chainrule.dist.world import CollectiveAborted, CollectiveError
from chainrule.engine.interop import itemsize

SIGNALS = ("returned", "raised")
"""Not collectives: what a rank's function did instead of calling one (returned, raised)."""


class Call(NamedTuple):
    """One rank's side of a collective.

    ``params``: the arguments as ``(name, value)`` pairs (a scatter's ``axis`` only on the
    source, which alone has the array). ``shape``, ``dtype`` (a name such as ``"float32"``) and
    ``kind`` (``"numpy"``, ``"engine"`` or ``"torch"``) describe the value passed; all three
    are None when there is none (a barrier, or None passed to a broadcast or scatter).
    """

    op: str
    params: tuple[tuple[str, Any], ...] = ()
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    kind: str | None = None

    def param(self, name: str) -> Any:
        """The value of the argument ``name``."""
        for key, value in self.params:
            if key == name:
                return value
        raise KeyError(name)

    @property
    def nbytes(self) -> int:
        """The bytes of the value passed (0 for none)."""
        if self.shape is None or self.dtype is None:
            return 0
        return itemsize(self.dtype) * math.prod(self.shape)


def agree(calls: Sequence[Call], seq: int) -> Call:
    """The call every rank agreed on (a rooted collective's: the source's; with arguments of
    each rank's own, it holds every rank's value), ``calls[r]`` being rank r's call of collective
    ``seq``; or raise CollectiveError naming the ranks that differ and how (CollectiveAborted
    when a rank raised instead of calling)."""
    first = calls[0]
    spec = COLLECTIVES.get(first.op)
    own = spec is not None and any(key in spec.own for key, _ in first.params)
    if calls.count(first) == len(calls) and not own:  # the common case: one comparison a rank
        return first
    ops = [call.op for call in calls]
    if "raised" in ops:
        raised = ops.index("raised")
        waiting = [r for r, op in enumerate(ops) if op not in SIGNALS]
        if not waiting:
            return Call("raised")
        raise CollectiveAborted(
            f"{ranks_text(waiting)} waited in {ops[waiting[0]]} #{seq} for rank {raised}, "
            "which raised"
        )
    if len(set(ops)) > 1:
        if "returned" in ops:
            returned = [r for r, op in enumerate(ops) if op == "returned"]
            waiting = [r for r, op in enumerate(ops) if op != "returned"]
            raise CollectiveError(returned_message(waiting, returned[0], ops[waiting[0]], seq))
        (majority, ranks), *others = _group(ops)
        odd = ", ".join(f"{ranks_text(rs)} called {op}" for op, rs in others)
        raise CollectiveError(
            f"{odd} while {ranks_text(ranks)} called {majority} (collective #{seq}): every rank "
            "must call the same collectives in the same order"
        )
    assert spec is not None
    name = f"{first.op} #{seq}"
    if spec.rooted:  # only the source's value and arguments count
        _same_params([call.params[:1] for call in calls], name)
        src = first.param("src")
        source: Call = calls[src]
        for r, call in enumerate(calls):
            if call.shape is not None and (call.shape, call.dtype) != (source.shape, source.dtype):
                raise CollectiveError(
                    f"{name}: rank {r} passed shape {call.shape} {call.dtype} but the source rank "
                    f"{src} sends {source.shape} {source.dtype}; pass None or an array like the "
                    "source's"
                )
        return source
    agreed = [tuple(p for p in call.params if p[0] not in spec.own) for call in calls]
    _same_params(agreed, name)
    _same(calls, name, "dtype", [call.dtype for call in calls])
    owners = any(len(call.params) > len(mine) for call, mine in zip(calls, agreed, strict=True))
    rows = _own_rows(calls, spec, name) if owners else None
    shapes: list[Any] = [call.shape for call in calls]
    if rows is not None and spec.free_axis is not None:  # the ranks' lengths there may differ
        axis = first.param(spec.free_axis)
        shapes = ["(" + ", ".join("·" if i == axis else str(n) for i, n in enumerate(s)) + ")"
                  for s in shapes]  # fmt: skip
    _same(calls, name, "shape", shapes)
    if rows is None:
        return first
    return first._replace(params=(*agreed[0], (spec.own[0], rows)))


def _own_rows(calls: Sequence[Call], spec: Collective, name: str) -> tuple[Any, ...]:
    """Every rank's own ``spec.own[0]`` (the counts it sends each rank), after checking that
    every rank passed one and that each ``spec.own[1]`` given is the column the others send."""
    send, receive = spec.own
    given = [r for r, call in enumerate(calls) if any(k == send for k, _ in call.params)]
    if len(given) < len(calls):
        missing = [r for r in range(len(calls)) if r not in given]
        raise CollectiveError(
            f"{name}: {ranks_text(given)} passed {send} but {ranks_text(missing)} did not: "
            f"every rank passes its own {send}, or none does"
        )
    rows = tuple(call.param(send) for call in calls)
    for r, call in enumerate(calls):
        expected = tuple(row[r] for row in rows)
        if any(k == receive for k, _ in call.params) and call.param(receive) != expected:
            raise CollectiveError(
                f"{name}: rank {r} expects {receive}={call.param(receive)} but the ranks' "
                f"{send} send it {expected}"
            )
    return rows


def returned_message(waiting: Sequence[int], returned: int, op: str, seq: int) -> str:
    """Why ranks ``waiting`` in collective ``seq`` cannot go on: rank ``returned`` is done."""
    verb = "is" if len(waiting) == 1 else "are"
    return (
        f"{ranks_text(waiting)} {verb} waiting in {op} #{seq} but rank {returned} has already "
        f"returned (after {seq} collectives): every rank must call the same collectives in "
        "the same order"
    )


def event(
    calls: Sequence[Call],
    lead: Call,
    seq: int,
    backend: str,
    ranks: Sequence[int] | None = None,
) -> CollectiveEvent:
    """The trace event of collective ``seq``: every rank's shape, the agreed arguments.
    ``ranks``: the world ranks of ``calls`` (default: the whole world, 0 to P−1)."""
    rooted = COLLECTIVES[lead.op].rooted  # then the source's bytes
    nbytes = lead.nbytes if rooted else max(call.nbytes for call in calls)
    return CollectiveEvent(
        seq=seq,
        op=lead.op,
        shapes=tuple(call.shape for call in calls),
        dtype=lead.dtype,
        nbytes=nbytes,
        ranks=tuple(range(len(calls))) if ranks is None else tuple(ranks),
        kwargs=dict(lead.params),
        backend=backend,
    )


def ranks_text(ranks: Sequence[int]) -> str:
    """Ranks for a message: 'rank 2' or 'ranks 0, 1, 3'."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks))


def _group(values: Sequence[Any]) -> list[tuple[Any, list[int]]]:
    """Ranks grouped by value, the largest group first (ties: lowest rank first)."""
    groups: dict[Any, list[int]] = {}
    for r, value in enumerate(values):
        groups.setdefault(value, []).append(r)
    return sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0]))


def _same_params(params: list[tuple[tuple[str, Any], ...]], name: str) -> None:
    groups = _group(params)
    if len(groups) > 1:
        shown = "; ".join(
            f"{ranks_text(rs)}: " + ", ".join(f"{k}={_show(v)}" for k, v in p) for p, rs in groups
        )
        raise CollectiveError(f"the ranks disagree on the arguments of {name}: {shown}")


def _same(calls: Sequence[Call], name: str, what: str, values: list[Any]) -> None:
    groups = _group(values)
    if len(groups) > 1:
        shown = "; ".join(f"{ranks_text(rs)} {value}" for value, rs in groups)
        raise CollectiveError(f"{name}: the ranks' {what}s differ: {shown}")


def _show(value: Any) -> str:
    name = getattr(value, "name", None)
    return f"ReduceOp.{name}" if hasattr(value, "value") and name else repr(value)


# -- point to point: a send and its recv ------------------------------------------------------


def pair_group(call: Call) -> tuple[int, ...] | None:
    """The world ranks of the group a message travels in (None: the world's)."""
    return dict(call.params).get("group")


def _in_group(call: Call) -> str:
    group = pair_group(call)
    return "" if group is None else f" in the group of ranks {group}"


def pair_name(call: Call, seq: int) -> str:
    """What a rank waits in, for a message: ``send #0 to rank 1``, ``recv #2 from rank 0``
    (``#k``: the k-th message from the source to the destination, counted from 0; ranks are
    the world's), followed by ``in the group of ranks (0, 4)`` for a message sent in a group."""
    if call.op == "send":
        return f"send #{seq} to rank {call.param('dst')}{_in_group(call)}"
    return f"recv #{seq} from rank {call.param('src')}{_in_group(call)}"


def agree_pair(sent: Call, expected: Call, seq: int) -> Call:
    """The call the k-th send from a source to a destination and the destination's k-th recv
    from it agree on: the sender's; or CollectiveError naming the pair and the mismatch, when the
    receiver gave a shape or a dtype (``expected``'s, None where it gave none) that differs."""
    src, dst = sent.param("src"), sent.param("dst")
    name = f"send #{seq} from rank {src} to rank {dst}{_in_group(sent)}"
    for what, mine, theirs in (
        ("shape", sent.shape, expected.shape),
        ("dtype", sent.dtype, expected.dtype),
    ):
        if theirs is not None and theirs != mine:
            raise CollectiveError(
                f"{name}: the {what}s differ: rank {src} sends {mine} but rank {dst} receives "
                f"{theirs}"
            )
    return sent


def pair_event(sent: Call, seq: int, backend: str) -> CollectiveEvent:
    """The trace event of a send and its recv: one event, the source's N bytes (its
    ``kwargs``: ``src`` and ``dst``, world ranks, and ``group`` for a message sent in one)."""
    src, dst = sent.param("src"), sent.param("dst")
    return CollectiveEvent(
        seq=seq,
        op="send",
        shapes=(sent.shape, sent.shape),
        dtype=sent.dtype,
        nbytes=sent.nbytes,
        ranks=(src, dst),
        kwargs=dict(sent.params),
        backend=backend,
    )


def pair_returned_message(rank: int, waits_in: str, peer: int) -> str:
    """Why ``rank``, waiting in a send or a recv, cannot go on: its peer is done."""
    return (
        f"rank {rank} is waiting in {waits_in} but rank {peer} has already returned: every "
        "send needs a recv on its destination, and every recv a send on its source"
    )


def deadlock_message(waits: dict[int, str]) -> str:
    """Ranks that wait for each other forever: ``waits[r]`` is what rank r waits in."""
    shown = ", ".join(f"rank {r} waits in {what}" for r, what in sorted(waits.items()))
    return (
        f"deadlock: {shown}; no rank can go on. A send waits for its recv and a recv for its "
        "send, so when every rank receives first (or every rank sends first) each waits for "
        "another; let one rank of each pair send while the other receives"
    )
