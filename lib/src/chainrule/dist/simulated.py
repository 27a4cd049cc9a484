"""A simulated world of P ranks: one thread per rank, collectives as rendezvous in memory.

The SPMD function really runs P times, once in each rank's thread, and every collective is a
meeting point: the k-th collective of every rank (its sequence number k) waits until all P
ranks have called their k-th collective. The last rank to arrive checks that the calls agree
(same collective, arguments, shapes, dtypes), computes every rank's result and wakes the
others, each of which leaves with its own array.

Determinism. By default a reduction is computed once, in rank order
``((x_0 ⊕ x_1) ⊕ x_2) ⊕ ...``, and every rank receives a bitwise-identical copy, so replicas
that start equal stay equal. With ``deterministic=False`` rank r reduces in its own ring
order ``x_r ⊕ x_{r+1} ⊕ ... ⊕ x_{r−1}``. Floating-point addition is not associative, so for
P ≥ 3 the ranks' sums differ in the last bits, and replicas drift apart over many steps.

Failures end the run quickly and name the ranks: collectives that differ between ranks,
mismatched shapes or dtypes, a rank that returned while others wait for it, a rank whose
collective partners never arrive within ``timeout`` seconds, and exceptions (re-raised as
:class:`~chainrule.dist.errors.RankError`). After any failure the waiting ranks are released
with a :class:`~chainrule.dist.errors.CollectiveError` inside their collective, and
:meth:`SimulatedWorld.run` joins every thread before it raises.
"""

from __future__ import annotations

import ctypes
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from chainrule.dist import api
from chainrule.dist.api import ReduceOp, Restore
from chainrule.dist.buffers import ArrayPool
from chainrule.dist.errors import CollectiveError, RankError
from chainrule.dist.trace import CollectiveEvent, Trace

DEFAULT_TIMEOUT = 5.0
"""Seconds a rank waits in a collective for the others before the run fails."""

JOIN_GRACE = 0.5
"""Seconds a failed run waits for ranks still in their own code, before interrupting them
(and then again for the interrupted ones)."""

PARALLEL_MIN_BYTES = 1 << 21
"""From this size on, an all-reduce is computed by all ranks' threads together, each a slice
(numpy releases the GIL while it adds), instead of by the last rank to arrive alone."""

BLOCK_ELEMENTS = 32768
"""Elements per block of a reduction: the partial result of a block stays in the L2 cache
while every rank's block is added to it and it is copied out to every rank."""

_UFUNCS = {"sum": np.add, "avg": np.add, "max": np.maximum}  # by ReduceOp.value


class _Aborted(CollectiveError):
    """Raised inside a rank's collective once the run has failed (not the failure itself)."""


class _Interrupted(CollectiveError):
    """Injected into a rank thread still running its own code after the run failed."""


def _ranks(ranks: Sequence[int]) -> str:
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


class _Call:
    """One rank's side of a collective: its name, arguments and data."""

    __slots__ = ("op", "params", "array", "restore")

    def __init__(self, op: str, params: tuple, array: np.ndarray | None, restore: Restore) -> None:
        self.op = op
        self.params = params
        self.array = array
        self.restore = restore


class _Round:
    """The k-th collective of the run, while the ranks meet in it."""

    __slots__ = ("seq", "calls", "arrived", "started", "done", "results", "work", "working")

    def __init__(self, seq: int, world_size: int) -> None:
        self.seq = seq
        self.calls: list[_Call | None] = [None] * world_size
        self.arrived = 0
        self.started = time.monotonic()
        self.done = False
        self.results: list[Any] = [None] * world_size
        self.work: Callable[[int], None] | None = None  # each rank's share of the work
        self.working = 0  # ranks still doing their share

    def name(self) -> str:
        call = next(c for c in self.calls if c is not None)
        return f"{call.op} #{self.seq}"

    def waiting(self) -> list[int]:
        return [r for r, c in enumerate(self.calls) if c is not None]


class SimulatedWorld:
    """P ranks in one process (one thread each) whose collectives meet in memory.

    ``timeout``: seconds a collective waits for the missing ranks (default
    :data:`DEFAULT_TIMEOUT`). ``deterministic``: see the module docstring. ``trace``: a
    :class:`~chainrule.dist.trace.Trace` that receives one event per collective, the default
    of every :meth:`run`. A world can run several SPMD functions, one after the other.
    """

    def __init__(
        self,
        world_size: int,
        *,
        timeout: float | None = None,
        deterministic: bool = True,
        trace: Trace | None = None,
    ) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        self.world_size = int(world_size)
        self.timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)
        self.deterministic = bool(deterministic)
        self.trace = trace
        self._running = threading.Lock()
        self._lock = threading.Lock()  # guards the state of the run below
        self._buffers = ArrayPool()  # large results, reused within a run
        self._generation = 0  # which run the state below belongs to
        self._reset(trace)

    def _reset(self, trace: Trace | None) -> None:
        P = self.world_size
        self._generation += 1  # a thread left over from an earlier run must not touch this one
        self._active_trace = trace
        self._next_seq = [0] * P
        self._rounds: dict[int, _Round] = {}
        self._returned: dict[int, int] = {}  # rank -> number of collectives it made
        self._failure: str | None = None  # the first thing that went wrong, as a message
        self._failed_rank: int | None = None  # the rank whose exception failed the run
        self._errors: dict[int, tuple[BaseException, str]] = {}
        self._results: list[Any] = [None] * P
        self._finished = 0  # ranks whose function has returned or raised
        self._over = threading.Event()  # all ranks finished, or the run failed
        # Each rank sleeps in a collective on its own lock, held while it should sleep and
        # released once (by the last rank to arrive, or by a failure) to wake it.
        self._wake = [threading.Lock() for _ in range(P)]
        for wake in self._wake:
            wake.acquire()
        self._sleeping = [False] * P

    def __repr__(self) -> str:
        return (
            f"SimulatedWorld(world_size={self.world_size}, timeout={self.timeout}, "
            f"deterministic={self.deterministic})"
        )

    # -- running an SPMD function -----------------------------------------------------------

    def run(
        self,
        fn: Callable[..., Any],
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        *,
        trace: Trace | None = None,
    ) -> list:
        """``fn(*args, **kwargs)`` once per rank, in P threads; the results in rank order."""
        if not self._running.acquire(blocking=False):
            raise RuntimeError("this SimulatedWorld is already running an SPMD function")
        try:
            self._reset(trace if trace is not None else self.trace)
            kwargs = kwargs or {}
            threads = [
                threading.Thread(
                    target=self._rank_main,
                    args=(_SimRank(self, r, self._generation), fn, args, kwargs),
                    name=f"chainrule-sim-rank-{r}",
                    daemon=True,
                )
                for r in range(self.world_size)
            ]
            try:
                for thread in threads:
                    thread.start()
                self._over.wait()
            except BaseException:  # KeyboardInterrupt while starting or waiting: stop every rank
                self._fail("the run was interrupted")
                self._stop(threads)
                raise
            self._stop(threads)
            if self._failure is not None:
                error = self._error()
                stuck = [r for r, t in enumerate(threads) if t.is_alive()]
                if stuck:
                    error.add_note(
                        f"{_ranks(stuck)} could not be interrupted (blocked outside Python, "
                        "e.g. in time.sleep); the thread ends when that call returns"
                    )
                raise error from None
            return self._results
        finally:
            self._buffers.clear()
            self._running.release()

    def _rank_main(
        self, me: _SimRank, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]
    ) -> None:
        api.set_thread_backend(me)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - every exception goes back to the caller
            self._rank_raised(me, exc)
        else:
            self._rank_returned(me, result)
        finally:
            api.set_thread_backend(None)

    def _rank_raised(self, me: _SimRank, exc: BaseException) -> None:
        rank = me.rank()
        with self._lock:
            if me.generation != self._generation:
                return  # a rank of an earlier run that could not be interrupted in time
            self._finished += 1
            if self._finished == self.world_size:
                self._over.set()
            if isinstance(exc, _Aborted | _Interrupted):
                return  # released because the run had already failed
            tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
            text = "".join(traceback.format_exception(type(exc), exc, tb))
            self._errors[rank] = (exc, text)
            if self._failure is None:
                self._failed_rank = rank
                self._fail_locked(f"rank {rank} raised {type(exc).__name__}: {exc}")

    def _rank_returned(self, me: _SimRank, result: Any) -> None:
        rank = me.rank()
        with self._lock:
            if me.generation != self._generation:
                return  # a rank of an earlier run that could not be interrupted in time
            self._results[rank] = result
            self._finished += 1
            if self._finished == self.world_size:
                self._over.set()
            made = self._next_seq[rank]
            self._returned[rank] = made
            for rnd in self._rounds.values():
                if not rnd.done and rnd.calls[rank] is None:
                    self._fail_locked(self._left_early(rnd, rank))
                    return

    def _left_early(self, rnd: _Round, rank: int) -> str:
        waiting = rnd.waiting()
        verb = "is" if len(waiting) == 1 else "are"
        return (
            f"{_ranks(waiting)} {verb} waiting in {rnd.name()} but rank {rank} has already "
            f"returned (after {self._returned[rank]} collectives): every rank must call the "
            "same collectives in the same order"
        )

    def _fail(self, message: str) -> None:
        with self._lock:
            self._fail_locked(message)

    def _fail_locked(self, message: str) -> None:
        if self._failure is None:
            self._failure = message
        self._over.set()
        for r in range(self.world_size):
            self._wake_locked(r)

    def _wake_locked(self, rank: int) -> None:
        if self._sleeping[rank]:
            self._sleeping[rank] = False
            self._wake[rank].release()

    def _error(self) -> Exception:
        if self._failed_rank is not None and self._errors:
            first = min(self._errors)  # the lowest rank that raised on its own
            exc, text = self._errors[first]
            error: Exception = RankError(first, type(exc).__name__, str(exc), text)
            error.original = exc  # type: ignore[attr-defined]
            others = sorted(set(self._errors) - {first})
            if others:
                error.add_note(f"{_ranks(others)} also raised")
            return error
        return CollectiveError(self._failure)

    def _stop(self, threads: list[threading.Thread]) -> None:
        """Join every rank thread; interrupt those still running their own code."""
        threads = [t for t in threads if t.ident is not None]  # started
        if self._failure is None:
            for thread in threads:
                thread.join()
            return
        deadline = time.monotonic() + JOIN_GRACE
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t for t in threads if t.is_alive()]
        for thread in alive:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(thread.ident), ctypes.py_object(_Interrupted)
            )
        deadline = time.monotonic() + JOIN_GRACE
        for thread in alive:
            thread.join(max(0.0, deadline - time.monotonic()))

    # -- the rendezvous ---------------------------------------------------------------------

    def collective(
        self,
        me: _SimRank,
        op: str,
        params: tuple,
        array: np.ndarray | None,
        restore: Restore,
    ) -> tuple[Any, Restore]:
        """Meet the other ranks in ``op``; this rank's result and the restorer that built it.

        The result comes from :data:`_COMPUTE` [op], run once by the last rank to arrive.
        """
        rank = me.rank()
        with self._lock:
            if me.generation != self._generation:
                raise _Aborted("this rank belongs to a run that has already ended")
            if self._failure is not None:
                raise _Aborted(self._failure)
            seq = self._next_seq[rank]
            self._next_seq[rank] = seq + 1
            rnd = self._rounds.get(seq)
            if rnd is None:
                rnd = self._rounds[seq] = _Round(seq, self.world_size)
            rnd.calls[rank] = _Call(op, params, array, restore)
            rnd.arrived += 1
            if self._returned:
                gone = [r for r, made in self._returned.items() if made <= seq]
                if gone:
                    self._fail_locked(self._left_early(rnd, gone[0]))
                    raise _Aborted(self._failure)
            last = rnd.arrived == self.world_size
            if last:
                del self._rounds[seq]  # complete: nobody looks it up again
            else:
                self._sleeping[rank] = True
        if not last:
            return self._wait(rnd, rank)
        # The last to arrive checks the calls and computes every rank's result, unlocked.
        calls: list[_Call] = rnd.calls  # type: ignore[assignment]
        try:
            tracing = self._active_trace is not None
            results, event, work = _compute(
                calls, seq, self.deterministic, tracing, self._buffers.empty
            )
        except CollectiveError as exc:
            self._fail(str(exc))
            raise _Aborted(str(exc)) from None
        except Exception as exc:
            self._fail(f"{rnd.name()} failed: {type(exc).__name__}: {exc}")
            raise
        with self._lock:
            if self._failure is not None:  # the others were released with the failure
                raise _Aborted(self._failure)
            if event is not None:
                self._active_trace.record(event)
            rnd.results = results
            if work is None:
                rnd.done = True
            else:  # large data: every rank computes its share, in parallel
                rnd.work = work
                rnd.working = self.world_size
            for r in range(self.world_size):
                self._wake_locked(r)
        if work is not None:
            self._share_work(rnd, rank)
        return results[rank]

    def _share_work(self, rnd: _Round, rank: int) -> None:
        """Do this rank's share of ``rnd.work``, then wait until every rank has done its own."""
        try:
            rnd.work(rank)
        except BaseException as exc:
            self._fail(f"{rnd.name()} failed: {type(exc).__name__}: {exc}")
            raise
        with self._lock:
            rnd.working -= 1
            if rnd.working == 0:
                rnd.done = True
                for r in range(self.world_size):
                    self._wake_locked(r)
                return
            if self._failure is not None:
                raise _Aborted(self._failure)
            self._sleeping[rank] = True
        self._wake[rank].acquire()
        if not rnd.done:
            raise _Aborted(self._failure)

    def _wait(self, rnd: _Round, rank: int) -> tuple[Any, Restore]:
        """Sleep until the last rank completes ``rnd``, the run fails, or the time is up."""
        wake = self._wake[rank]
        deadline: float | None = rnd.started + self.timeout
        while True:
            if deadline is None:
                wake.acquire()
                break
            remaining = deadline - time.monotonic()
            if remaining > 0 and wake.acquire(timeout=remaining):
                break
            with self._lock:
                if not self._sleeping[rank]:  # woken right after the timeout
                    wake.acquire()  # returns at once, taking that wake-up
                    break
                if rnd.arrived == self.world_size:  # all here: the last one is computing
                    deadline = None
                    continue
                self._sleeping[rank] = False
                self._fail_locked(self._timed_out(rnd))
                raise _Aborted(self._failure)
        if rnd.done:
            return rnd.results[rank]
        if rnd.work is not None and self._failure is None:
            self._share_work(rnd, rank)
            return rnd.results[rank]
        raise _Aborted(self._failure)

    def _timed_out(self, rnd: _Round) -> str:
        arrived = rnd.waiting()
        missing = [r for r in range(self.world_size) if rnd.calls[r] is None]
        still = "was still running its" if len(missing) == 1 else "were still running their"
        return (
            f"{rnd.name()} timed out after {self.timeout:g} s: {_ranks(arrived)} arrived but "
            f"{_ranks(missing)} {still} own code; pass timeout= to "
            "dist.run to wait longer"
        )


# -- the ranks' view --------------------------------------------------------------------------


class _SimRank:
    """One rank of a :class:`SimulatedWorld`: the backend of the collectives in its thread."""

    __slots__ = ("world", "_rank", "generation")

    def __init__(self, world: SimulatedWorld, rank: int, generation: int) -> None:
        self.world = world
        self._rank = rank
        self.generation = generation

    def rank(self) -> int:
        return self._rank

    def world_size(self) -> int:
        return self.world.world_size

    def all_reduce(self, x: Any, op: ReduceOp) -> Any:
        array, restore = api.to_numpy(x)
        api.check_reducible(array, op)
        result, _ = self.world.collective(self, "all_reduce", (("op", op),), array, restore)
        return restore(result)

    def all_gather(self, x: Any, axis: int) -> Any:
        array, restore = api.to_numpy(x)
        if array.ndim == 0:
            array = array.reshape(1)
        axis = api.normalize_axis(axis, array.ndim, "axis")
        result, _ = self.world.collective(self, "all_gather", (("axis", axis),), array, restore)
        return restore(result)

    def reduce_scatter(self, x: Any, op: ReduceOp, axis: int) -> Any:
        array, restore = api.to_numpy(x)
        api.check_reducible(array, op)
        axis = api.check_divisible(array, axis, self.world.world_size, "reduce_scatter")
        result, _ = self.world.collective(
            self, "reduce_scatter", (("op", op), ("axis", axis)), array, restore
        )
        return restore(result)

    def all_to_all(self, x: Any, split_axis: int, concat_axis: int) -> Any:
        array, restore = api.to_numpy(x)
        split_axis = api.check_divisible(
            array, split_axis, self.world.world_size, "all_to_all", "split_axis"
        )
        concat_axis = api.normalize_axis(concat_axis, array.ndim, "concat_axis")
        params = (("split_axis", split_axis), ("concat_axis", concat_axis))
        result, _ = self.world.collective(self, "all_to_all", params, array, restore)
        return restore(result)

    def broadcast(self, x: Any, src: int) -> Any:
        src = api.check_src(src, self.world.world_size)
        array, restore = api.to_numpy(x)
        if array is None and self._rank == src:
            raise ValueError(f"broadcast: the source rank {src} must pass an array, not None")
        result, src_restore = self.world.collective(
            self, "broadcast", (("src", src),), array, restore
        )
        return (restore if x is not None else src_restore)(result)

    def scatter(self, x: Any, src: int, axis: int) -> Any:
        src = api.check_src(src, self.world.world_size)
        array, restore = api.to_numpy(x)
        params: tuple = (("src", src),)
        if self._rank == src:
            if array is None:
                raise ValueError(f"scatter: the source rank {src} must pass an array, not None")
            axis = api.check_divisible(array, axis, self.world.world_size, "scatter")
            params = (("src", src), ("axis", axis))
        result, src_restore = self.world.collective(self, "scatter", params, array, restore)
        return (restore if x is not None else src_restore)(result)

    def barrier(self) -> None:
        self.world.collective(self, "barrier", (), None, api.to_numpy(None)[1])


# -- checking the calls and computing the results ---------------------------------------------


def _compute(
    calls: list[_Call], seq: int, deterministic: bool, tracing: bool, empty: Empty
) -> tuple[list[tuple[Any, Restore]], CollectiveEvent | None, Work | None]:
    """Check that the P calls of collective ``seq`` agree; each rank's (result, restorer),
    the trace event, and the work left to share between the ranks (None: results complete).

    The checks compare with plain loops first (the common case: everything agrees) and only
    group the ranks by value to write the error message when something differs.
    """
    first = calls[0]
    op = first.op
    if any(c.op != op for c in calls):
        _check_same_op(calls, seq)
    name = _Name(op, seq)
    if op == "scatter":  # only the source knows the axis of a scatter
        params = first.params[:1]
        if any(c.params[:1] != params for c in calls):
            _check_same_params([c.params[:1] for c in calls], name)
    else:
        params = first.params
        if any(c.params != params for c in calls):
            _check_same_params([c.params for c in calls], name)
    arrays = [c.array for c in calls]
    kwargs = dict(params)
    if op == "broadcast" or op == "scatter":
        src = kwargs["src"]
        kwargs = dict(calls[src].params)
        if op == "broadcast":
            _check_like_source(arrays, src, name)
        results, work = _COMPUTE[op](arrays, kwargs, deterministic, empty)
        restore = calls[src].restore
        nbytes = arrays[src].nbytes
    else:
        if op != "barrier":
            a0 = arrays[0]
            if any(a.dtype != a0.dtype or a.shape != a0.shape for a in arrays):
                _check_same(arrays, name, "dtype", lambda a: a.dtype)
                _check_same(arrays, name, "shape", lambda a: a.shape)
        results, work = _COMPUTE[op](arrays, kwargs, deterministic, empty)
        restore = _RESTORE_ARRAY
        nbytes = max((a.nbytes for a in arrays if a is not None), default=0)
    event = None
    if tracing:
        present = [a for a in arrays if a is not None]
        event = CollectiveEvent(
            seq=seq,
            op=op,
            shapes=tuple(None if a is None else a.shape for a in arrays),
            dtype=str(present[0].dtype) if present else None,
            nbytes=int(nbytes),
            ranks=tuple(range(len(calls))),
            kwargs=kwargs,
        )
    return [(result, restore) for result in results], event, work


_RESTORE_ARRAY = api.to_numpy(None)[1]


class _Name:
    """The name of a collective in messages, 'all_reduce #3', formatted only when needed."""

    __slots__ = ("op", "seq")

    def __init__(self, op: str, seq: int) -> None:
        self.op = op
        self.seq = seq

    def __str__(self) -> str:
        return f"{self.op} #{self.seq}"


def _check_same_op(calls: list[_Call], seq: int) -> str:
    groups = _group([c.op for c in calls])
    if len(groups) > 1:
        (majority, ranks), *others = groups
        odd = ", ".join(f"{_ranks(rs)} called {op}" for op, rs in others)
        raise CollectiveError(
            f"{odd} while {_ranks(ranks)} called {majority} (collective #{seq}): every rank "
            "must call the same collectives in the same order"
        )
    return groups[0][0]


def _check_same_params(params: list[tuple], name: _Name) -> None:
    groups = _group(params)
    shown = "; ".join(
        f"{_ranks(rs)}: " + ", ".join(f"{k}={_show(v)}" for k, v in p) for p, rs in groups
    )
    raise CollectiveError(f"the ranks disagree on the arguments of {name}: {shown}")


def _show(value: Any) -> str:
    return f"ReduceOp.{value.name}" if isinstance(value, ReduceOp) else repr(value)


def _check_same(
    arrays: list[np.ndarray], name: _Name, what: str, key: Callable[[np.ndarray], Any]
) -> None:
    groups = _group([key(a) for a in arrays])
    if len(groups) > 1:
        shown = "; ".join(f"{_ranks(rs)} {_shown(v)}" for v, rs in groups)
        raise CollectiveError(f"{name}: the ranks' {what}s differ: {shown}")


def _shown(value: Any) -> str:
    return str(value)


def _check_like_source(arrays: list[np.ndarray | None], src: int, name: _Name) -> None:
    source = arrays[src]
    for r, a in enumerate(arrays):
        if a is None or r == src:
            continue
        if a.dtype != source.dtype or a.shape != source.shape:
            raise CollectiveError(
                f"{name}: rank {r} passed shape {a.shape} {a.dtype} but the source rank {src} "
                f"sends {source.shape} {source.dtype}; pass None or an array like the source's"
            )


def _ring_order(rank: int, world_size: int) -> list[int]:
    return [(rank + i) % world_size for i in range(world_size)]


def _reduce(sources: Sequence[np.ndarray], op: ReduceOp, outs: Sequence[np.ndarray]) -> None:
    """``outs[0] = sources[0] ⊕ sources[1] ⊕ ...`` (left to right), copied into ``outs[1:]``.

    Works block by block on contiguous data, so each block of the partial result stays in
    cache while the next rank's block is added and while it is copied out: one pass over the
    inputs and one over the outputs, no temporary array.
    """
    ufunc = _UFUNCS[op.value]
    first = outs[0]
    scale = len(sources) if op is ReduceOp.AVG else None
    if all(a.flags.c_contiguous for a in sources) and first.size > BLOCK_ELEMENTS:
        flat_sources = [a.reshape(-1) for a in sources]
        flat_outs = [o.reshape(-1) for o in outs]
        for start in range(0, first.size, BLOCK_ELEMENTS):
            block = slice(start, start + BLOCK_ELEMENTS)
            _reduce_block(
                [s[block] for s in flat_sources], ufunc, scale, [o[block] for o in flat_outs]
            )
    else:
        _reduce_block(sources, ufunc, scale, outs)


def _reduce_block(
    sources: Sequence[np.ndarray], ufunc: np.ufunc, scale: int | None, outs: Sequence[np.ndarray]
) -> None:
    out = outs[0]
    if len(sources) == 1:
        np.copyto(out, sources[0])
    else:
        ufunc(sources[0], sources[1], out=out)
        for source in sources[2:]:
            ufunc(out, source, out=out)
    if scale is not None:
        np.divide(out, scale, out=out)
    for other in outs[1:]:
        np.copyto(other, out)


Empty = Callable[[tuple[int, ...], np.dtype], np.ndarray]
"""Allocates a result array (:meth:`chainrule.dist.buffers.ArrayPool.empty`)."""

Work = Callable[[int], None]
"""``work(r)``: rank r's share of filling the results, run in rank r's thread."""

Out = tuple[list[Any], Work | None]
"""What a collective computes: every rank's result, and the work still to do on them."""


def _copies(source: np.ndarray, count: int, empty: Empty) -> list[np.ndarray]:
    outs = []
    for _ in range(count):
        out = empty(source.shape, source.dtype)
        np.copyto(out, source)
        outs.append(out)
    return outs


def _all_reduce(arrays: list[np.ndarray], kwargs: dict, deterministic: bool, empty: Empty) -> Out:
    op: ReduceOp = kwargs["op"]
    P = len(arrays)
    outs = [empty(arrays[0].shape, arrays[0].dtype) for _ in range(P)]
    same_order = deterministic or P <= 2 or op is ReduceOp.MAX  # order matters for P ≥ 3 sums
    parallel = P > 1 and arrays[0].nbytes >= PARALLEL_MIN_BYTES
    if same_order and parallel and all(a.flags.c_contiguous for a in arrays):
        flat_in = [a.reshape(-1) for a in arrays]
        flat_out = [o.reshape(-1) for o in outs]
        step = -(-arrays[0].size // (P * BLOCK_ELEMENTS)) * BLOCK_ELEMENTS

        def share(rank: int) -> None:  # rank r reduces the r-th slice for everyone
            part = slice(rank * step, (rank + 1) * step)
            _reduce([a[part] for a in flat_in], op, [o[part] for o in flat_out])

        return outs, share
    if same_order:
        _reduce(arrays, op, outs)
        return outs, None

    def own_order(rank: int) -> None:  # rank r sums in its ring order r, r+1, ..., r−1
        _reduce([arrays[j] for j in _ring_order(rank, P)], op, outs[rank : rank + 1])

    if parallel:
        return outs, own_order
    for r in range(P):
        own_order(r)
    return outs, None


def _chunks(array: np.ndarray, parts: int, axis: int) -> list[np.ndarray]:
    return np.split(array, parts, axis=axis)


def _reduce_scatter(
    arrays: list[np.ndarray], kwargs: dict, deterministic: bool, empty: Empty
) -> Out:
    op: ReduceOp = kwargs["op"]
    P = len(arrays)
    chunked = [_chunks(a, P, kwargs["axis"]) for a in arrays]
    outs = []
    for r in range(P):
        order = range(P) if deterministic else _ring_order(r, P)
        sources = [chunked[j][r] for j in order]
        out = empty(sources[0].shape, arrays[0].dtype)
        _reduce(sources, op, [out])
        outs.append(out)
    return outs, None


def _all_gather(arrays: list[np.ndarray], kwargs: dict, deterministic: bool, empty: Empty) -> Out:
    axis = kwargs["axis"]
    shape = list(arrays[0].shape)
    shape[axis] *= len(arrays)
    gathered = np.concatenate(arrays, axis=axis, out=empty(tuple(shape), arrays[0].dtype))
    return [gathered, *_copies(gathered, len(arrays) - 1, empty)], None


def _all_to_all(arrays: list[np.ndarray], kwargs: dict, deterministic: bool, empty: Empty) -> Out:
    P = len(arrays)
    concat_axis = kwargs["concat_axis"]
    chunked = [_chunks(a, P, kwargs["split_axis"]) for a in arrays]
    shape = list(chunked[0][0].shape)
    shape[concat_axis] *= P
    outs = [
        np.concatenate(
            [chunked[j][r] for j in range(P)],
            axis=concat_axis,
            out=empty(tuple(shape), arrays[0].dtype),
        )
        for r in range(P)
    ]
    return outs, None


def _barrier(arrays: list[None], kwargs: dict, deterministic: bool, empty: Empty) -> Out:
    return [None] * len(arrays), None


def _broadcast(arrays: list[np.ndarray], kwargs: dict, deterministic: bool, empty: Empty) -> Out:
    return _copies(arrays[kwargs["src"]], len(arrays), empty), None


def _scatter(arrays: list[np.ndarray], kwargs: dict, deterministic: bool, empty: Empty) -> Out:
    chunks = _chunks(arrays[kwargs["src"]], len(arrays), kwargs["axis"])
    return [_copies(chunk, 1, empty)[0] for chunk in chunks], None


_COMPUTE: dict[str, Callable[..., Out]] = {
    "all_reduce": _all_reduce,
    "reduce_scatter": _reduce_scatter,
    "all_gather": _all_gather,
    "all_to_all": _all_to_all,
    "broadcast": _broadcast,
    "scatter": _scatter,
    "barrier": _barrier,
}
