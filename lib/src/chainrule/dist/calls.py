"""What one rank asks of a collective, and the check that every rank asked the same.

Each collective call becomes a :class:`Call`: the collective's name, its arguments, and the
shape, dtype and kind of the value the rank passed. Before any data moves, the ranks compare
their calls (:func:`agree`): the simulated world in memory, the torch backend by gathering
every rank's call as a row of integers (:func:`encode`, :func:`decode`). Mismatched
collectives, arguments, shapes or dtypes, and a rank that returned while others wait, become a
:class:`~chainrule.dist.errors.CollectiveError` that names the collective, the ranks and the
mismatch, with the same words on every backend. Nothing is ever reinterpreted.

Adding a collective: its name and argument names in :data:`PARAMETERS`, its function in
:mod:`chainrule.dist.api`, and one computation in each backend.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from chainrule.dist.errors import CollectiveAborted, CollectiveError
from chainrule.dist.trace import CollectiveEvent
from chainrule.engine.interop import itemsize

PARAMETERS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("op",),
    "all_gather": ("axis",),
    "reduce_scatter": ("op", "axis"),
    "all_to_all": ("split_axis", "concat_axis"),
    "broadcast": ("src",),
    "scatter": ("src", "axis"),
    "barrier": (),
    "returned": (),  # a rank's function returned (the end of a run on torch.distributed)
    "raised": (),  # a rank's function raised
}
"""Every collective and the names of its arguments, in order."""


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
    """The call every rank agreed on (for broadcast and scatter, the source's), or raise.

    ``calls[r]`` is rank r's call of collective number ``seq``. Raises
    :class:`~chainrule.dist.errors.CollectiveError` naming the ranks that differ and how, or
    :class:`~chainrule.dist.errors.CollectiveAborted` when a rank raised instead of calling.
    """
    first = calls[0]
    if calls.count(first) == len(calls):  # the common case: one comparison per rank
        return first
    ops = [call.op for call in calls]
    if "raised" in ops:
        raised = ops.index("raised")
        waiting = [r for r, op in enumerate(ops) if op not in ("raised", "returned")]
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
    op, name = first.op, f"{first.op} #{seq}"
    if op == "scatter":  # only the source knows the axis
        _same_params([call.params[:1] for call in calls], name)
        return calls[first.param("src")]
    _same_params([call.params for call in calls], name)
    if op == "broadcast":
        src = first.param("src")
        source = calls[src]
        for r, call in enumerate(calls):
            if call.shape is not None and (call.shape, call.dtype) != (source.shape, source.dtype):
                raise CollectiveError(
                    f"{name}: rank {r} passed shape {call.shape} {call.dtype} but the source rank "
                    f"{src} sends {source.shape} {source.dtype}; pass None or an array like the "
                    "source's"
                )
        return source
    _same(calls, name, "dtype", [call.dtype for call in calls])
    _same(calls, name, "shape", [call.shape for call in calls])
    return first


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
    if lead.op in ("broadcast", "scatter"):
        nbytes = lead.nbytes
    else:
        nbytes = max(call.nbytes for call in calls)
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


# -- a call as a row of integers (what the torch backend's ranks gather) ----------------------

MAX_NDIM = 16
"""The most dimensions a value of a collective may have on the torch backend."""

_OPS = tuple(PARAMETERS)
_KINDS = (None, "numpy", "engine", "torch")
_DTYPES = (
    None,
    *(
        "float64 float32 float16 bfloat16 complex128 complex64 "
        "int64 int32 int16 int8 uint64 uint32 uint16 uint8 bool"
    ).split(),
)
ROW = 4 + MAX_NDIM + 1 + 3
"""Integers per encoded call: op, kind, dtype, ndim, the shape, the count of arguments, the
arguments."""


def encode(call: Call, reduce_ops: Sequence[Any]) -> list[int]:
    """``call`` as :data:`ROW` integers. ``reduce_ops``: the ReduceOp members, in order."""
    shape = call.shape if call.shape is not None else ()
    if len(shape) > MAX_NDIM:
        raise ValueError(f"{call.op}: at most {MAX_NDIM} dimensions, got {len(shape)}")
    if call.dtype not in _DTYPES:
        raise TypeError(f"{call.op}: the torch backend does not move {call.dtype} values")
    values = [reduce_ops.index(v) if name == "op" else int(v) for name, v in call.params]
    row = [
        _OPS.index(call.op),
        _KINDS.index(call.kind),
        _DTYPES.index(call.dtype),
        -1 if call.shape is None else len(shape),
        *shape,
        *[0] * (MAX_NDIM - len(shape)),
        len(values),
        *values,
        *[0] * (3 - len(values)),
    ]
    return row


def decode(row: Sequence[int], reduce_ops: Sequence[Any]) -> Call:
    """The :class:`Call` that :func:`encode` turned into ``row``."""
    op, kind, dtype, ndim = _OPS[row[0]], _KINDS[row[1]], _DTYPES[row[2]], row[3]
    shape = None if ndim < 0 else tuple(row[4 : 4 + ndim])
    count = row[4 + MAX_NDIM]
    values = row[5 + MAX_NDIM : 5 + MAX_NDIM + count]
    names = PARAMETERS[op][:count]
    params = tuple(
        (name, reduce_ops[v] if name == "op" else v) for name, v in zip(names, values, strict=True)
    )
    return Call(op, params, shape, dtype, kind)
