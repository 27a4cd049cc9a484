"""A record of the collectives a run performed: one event per collective, not per rank.

Pass ``trace=Trace()`` to :func:`chainrule.dist.run` (or give a :class:`SimulatedWorld` a
default trace) and every collective appends one :class:`CollectiveEvent`: which operation,
each rank's shape, the dtype, the bytes each rank contributed and the arguments (``op``,
``axis``, ``src``...). The trace is list-like and prints as a table, so a lesson can show
"what went over the wire" next to the math: data parallelism is one all-reduce of the
gradients per step, a sharded layer is an all-gather forward and a reduce-scatter backward.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CollectiveEvent:
    """One collective, as all ranks performed it together.

    ``seq`` is its number in the run (from 0, the ``#k`` of error messages), ``shapes[i]`` the
    shape of the input on ``ranks[i]`` (``None`` where a rank passed no data, e.g. a non-source
    rank of a broadcast), ``nbytes`` the bytes of the payload one rank contributes (the largest
    over the ranks; for ``broadcast``/``scatter`` the source's array), ``kwargs`` the arguments.
    """

    seq: int
    op: str
    shapes: tuple[tuple[int, ...] | None, ...]
    dtype: str | None
    nbytes: int
    ranks: tuple[int, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    backend: str = "sim"

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def to_row(self) -> dict[str, Any]:
        """The event as a flat dict (one row of :meth:`Trace.to_rows`)."""
        distinct = set(self.shapes)
        if distinct == {None}:
            shape: Any = "-"
        elif len(distinct) == 1:
            shape = next(iter(distinct))
        else:
            shape = list(self.shapes)
        return {
            "seq": self.seq,
            "op": self.op,
            "shape": shape,
            "dtype": self.dtype,
            "nbytes": self.nbytes,
            "ranks": len(self.ranks),
            "args": ", ".join(f"{k}={_show(v)}" for k, v in self.kwargs.items()),
        }


def _show(value: Any) -> str:
    name = getattr(value, "name", None)
    return name if isinstance(name, str) and hasattr(value, "value") else repr(value)


class Trace:
    """A list-like, thread-safe record of collectives (:class:`CollectiveEvent` items).

    >>> trace = Trace()
    >>> # dist.run(step, 4, trace=trace)
    >>> # trace.count("all_reduce"), trace[0].shapes, print(trace)
    """

    def __init__(self) -> None:
        self._events: list[CollectiveEvent] = []
        self._lock = threading.Lock()

    def record(self, event: CollectiveEvent) -> None:
        """Append one event (called by the backends, once per collective)."""
        with self._lock:
            self._events.append(event)

    def extend(self, events: list[CollectiveEvent]) -> None:
        with self._lock:
            self._events.extend(events)

    def clear(self) -> None:
        with self._lock:
            self._events.clear()

    def count(self, op: str | None = None) -> int:
        """How many collectives named ``op`` were recorded (all of them with ``op=None``)."""
        with self._lock:
            if op is None:
                return len(self._events)
            return sum(1 for e in self._events if e.op == op)

    def ops(self) -> list[str]:
        """The operation names in order, e.g. ``["all_reduce", "all_reduce"]``."""
        with self._lock:
            return [e.op for e in self._events]

    def total_bytes(self, op: str | None = None) -> int:
        """The sum of ``nbytes`` over the events named ``op`` (all events with ``op=None``)."""
        with self._lock:
            return sum(e.nbytes for e in self._events if op is None or e.op == op)

    def to_rows(self) -> list[dict[str, Any]]:
        """One dict per event (seq, op, shape, dtype, nbytes, ranks, args): a table's rows."""
        with self._lock:
            return [e.to_row() for e in self._events]

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[CollectiveEvent]:
        with self._lock:
            return iter(list(self._events))

    def __getitem__(self, index: int | slice) -> Any:
        with self._lock:
            return self._events[index]

    def __bool__(self) -> bool:
        return True  # an empty trace is still a trace (``trace or default`` must keep it)

    def __repr__(self) -> str:
        return f"Trace({len(self)} collectives: {_summary(self.ops())})"

    def __str__(self) -> str:
        rows = self.to_rows()
        if not rows:
            return "Trace (no collectives)"
        columns = ["seq", "op", "shape", "dtype", "nbytes", "ranks", "args"]
        cells = [[str(row[c]) for c in columns] for row in rows]
        widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
        lines.append("  ".join("-" * w for w in widths))
        lines += [
            "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells
        ]
        return "\n".join(lines)


def _summary(ops: list[str]) -> str:
    counts: dict[str, int] = {}
    for op in ops:
        counts[op] = counts.get(op, 0) + 1
    return ", ".join(f"{n}× {op}" for op, n in counts.items()) or "none"
