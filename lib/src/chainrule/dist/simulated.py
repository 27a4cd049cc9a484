"""A simulated world of P ranks: one greenlet per rank, collectives as rendezvous in memory.

The SPMD function really runs P times, once in each rank's greenlet, all inside the calling
thread, and every collective is a meeting point: the k-th collective of every rank (its
sequence number k) waits until all P ranks have called their k-th collective. A rank that
arrives records its call and hands over to the next rank (directly, or through the scheduler
when that rank has to be started or told of a failure); the last rank to arrive checks that
the calls agree (same collective, arguments, shapes, dtypes), computes every rank's result
once and carries on, and each of the others is resumed, in rank order, with its own array.
Switching between greenlets costs no operating-system wake-up, so a small collective takes
microseconds.

Each rank runs in a ``contextvars`` context of its own (so ``chainrule.no_grad()`` on one rank
never leaks into another) and, when torch is loaded, with its own torch grad mode, saved and
restored around every switch. A collective may not be called from inside torch's autograd
engine (a hook or an ``autograd.Function.backward`` during ``loss.backward()``): the engine
keeps per-thread state that the ranks would share; use ``backend="gloo"`` for that.

Determinism. By default a reduction is computed once, in rank order
``((x_0 ⊕ x_1) ⊕ x_2) ⊕ ...``, and every rank receives a bitwise-identical copy, so replicas
that start equal stay equal. With ``deterministic=False`` rank r reduces in its own ring
order ``x_r ⊕ x_{r+1} ⊕ ... ⊕ x_{r−1}``. Floating-point addition is not associative, so for
P ≥ 3 the ranks' sums differ in the last bits, and replicas drift apart over many steps.

Large collectives (from :data:`PARALLEL_MIN_BYTES` moved) are cut into blocks that the calling
thread and a helper thread take in turn (numpy releases the GIL while it adds and copies, and
one core alone cannot use all of the memory bandwidth). A block is computed the same way
whichever thread takes it, so the results are the same bits as in one thread.

Failures end the run quickly and name the ranks: collectives that differ between ranks,
mismatched shapes or dtypes, a rank that returned while others wait for it (detected as soon
as no rank can go on), a rank that runs its own code for more than ``timeout`` seconds
without reaching a collective (a watchdog thread interrupts it), and exceptions (re-raised as
:class:`~chainrule.dist.errors.RankError`). After any failure the waiting ranks are released
with a :class:`~chainrule.dist.errors.CollectiveError` inside their collective, and
:meth:`SimulatedWorld.run` raises once every rank's greenlet has ended. A
``KeyboardInterrupt`` (a notebook's interrupt) kills every rank's greenlet and propagates.
"""

from __future__ import annotations

import contextvars
import ctypes
import functools
import os
import queue
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from time import monotonic as _monotonic
from typing import Any

import numpy as np
from greenlet import GreenletExit, greenlet

from chainrule.dist import api
from chainrule.dist.api import ReduceOp, Restore
from chainrule.dist.buffers import MIN_POOLED_BYTES, ArrayPool
from chainrule.dist.errors import CollectiveError, RankError
from chainrule.dist.trace import CollectiveEvent, Trace

DEFAULT_TIMEOUT = 5.0
"""Seconds a rank may run its own code without reaching a collective before the run fails."""

JOIN_GRACE = 0.5
"""Seconds a rank may still run its own code once the run has failed, before it is interrupted;
also how late an interruption may take effect before the error says so."""

BLOCK_BYTES = 1 << 19
"""Bytes per block of a reduction: the partial result of a block stays in the L2 cache while
every rank's block is added to it and it is copied out to every rank. Smaller blocks cost
more Python per byte, and when two threads share the blocks a numpy call may have to wait for
the other thread to hand back the GIL (measured with two threads on 64 MB: 64 KB blocks took
about 1.8 times as long as 256 KB ones, 512 KB and 1 MB blocks as long)."""

THREADS = 2
"""Threads, the calling one included, that share the work of a large collective (at most one
per core): one core alone cannot use all of the memory bandwidth."""

PARALLEL_MIN_BYTES = 1 << 23
"""Bytes a collective must read and write before helper threads share its work (starting a
helper costs about 0.1 ms once per run, handing it work about 20 µs per collective)."""


_AVG, _MAX = ReduceOp.AVG, ReduceOp.MAX  # (an enum member's lookup costs a function call)


def _ufunc(op: ReduceOp) -> np.ufunc:
    """The binary ufunc of a reduction (AVG adds, then divides)."""
    return np.maximum if op is _MAX else np.add


class _Aborted(CollectiveError):
    """Raised inside a rank's collective once the run has failed (not the failure itself)."""


class _Interrupted(CollectiveError):
    """Injected into a rank that ran its own code for too long (by the watchdog)."""


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


_Key = tuple[str, tuple, tuple[int, ...] | None, np.dtype | None]
"""What must agree between the ranks' calls of a collective: (op, params, shape, dtype)."""

_Call = tuple[_Key, np.ndarray | None, Restore]
"""One rank's side of a collective: its key, its array and the restorer of its input's type
(a plain tuple: the rendezvous records one per rank and call)."""


class SimulatedWorld:
    """P ranks in one thread (one greenlet each) whose collectives meet in memory.

    ``timeout``: seconds a rank may run its own code without reaching a collective (default
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
        self._buffers = ArrayPool()  # large results, reused within a run

    def __repr__(self) -> str:
        return (
            f"SimulatedWorld(world_size={self.world_size}, timeout={self.timeout}, "
            f"deterministic={self.deterministic})"
        )

    def run(
        self,
        fn: Callable[..., Any],
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        *,
        trace: Trace | None = None,
    ) -> list:
        """``fn(*args, **kwargs)`` once per rank, in P greenlets; the results in rank order."""
        if not self._running.acquire(blocking=False):
            raise RuntimeError("this SimulatedWorld is already running an SPMD function")
        try:
            active = trace if trace is not None else self.trace
            return _Run(self, active, self._buffers).execute(fn, args, kwargs or {})
        finally:
            self._buffers.clear()
            self._running.release()


_NEW, _RUNNABLE, _WAITING, _DONE = range(4)  # the states of a rank in a run


class _Run:
    """One run of an SPMD function: the scheduler of the ranks' greenlets and the rendezvous.

    The scheduler resumes runnable ranks one at a time, in rank order; a rank runs until it
    waits in a collective or ends. When no rank can run and some have not ended, the run is
    stuck: a rank returned while others wait, or a rank was interrupted by the watchdog.
    """

    def __init__(self, world: SimulatedWorld, trace: Trace | None, buffers: ArrayPool) -> None:
        P = world.world_size
        self.world_size = P
        self.timeout = world.timeout
        self.deterministic = world.deterministic
        self.trace = trace
        self.work = _Work(buffers.empty, min(THREADS, _cores()))
        self.seq = 0  # the collective the ranks meet in now
        self.calls: list[_Call | None] = [None] * P
        self.source_restore: Restore = _RESTORE_ARRAY  # of the last broadcast or scatter
        self.arrived = 0
        self.state = [_NEW] * P
        self.resume: list[Any] = [None] * P  # what a runnable rank receives (or an exception)
        self.runnable: deque[int] = deque(range(P))
        self.results: list[Any] = [None] * P
        self.failure: str | None = None  # the first thing that went wrong, as a message
        self.failed_rank: int | None = None  # the rank whose exception failed the run
        self.errors: dict[int, tuple[BaseException, str]] = {}
        self.interrupt: BaseException | None = None  # a KeyboardInterrupt raised on a rank
        self.timed_out: dict[int, float] = {}  # rank -> when the watchdog interrupted it
        self.late: dict[int, float] = {}  # rank -> seconds its interruption took to act
        self.grad_modes = [True] * P  # each rank's torch grad mode (torch's default)
        self.scheduler = greenlet.getcurrent()
        self.current = -1  # the rank running now (-1: the scheduler)
        self.greenlets: list[greenlet] = []
        self.watchdog: _Watchdog | None = None

    # -- scheduling -------------------------------------------------------------------------

    def execute(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> list:
        """Run every rank to its end; the results in rank order, or the run's error."""
        for _ in range(self.world_size):
            g = greenlet(self._rank_main, self.scheduler)
            g.gr_context = contextvars.Context()  # as a new thread: no context var is set
            self.greenlets.append(g)
        self.fn, self.args, self.kwargs = fn, args, kwargs
        torch = sys.modules.get("torch")
        caller_grad = torch.is_grad_enabled() if torch is not None else True
        if self.world_size > 1:
            self.watchdog = _Watchdog(self, self.timeout)
        try:
            self._schedule()
        except BaseException:  # KeyboardInterrupt: end every rank, then propagate
            self._kill()
            raise
        finally:
            self.work.close()
            if self.watchdog is not None:
                self.watchdog.stop()
            torch = sys.modules.get("torch")
            if torch is not None:
                torch._C._set_grad_enabled(caller_grad)
        if self.failure is not None:
            raise self._error() from None
        return self.results

    def _schedule(self) -> None:
        runnable = self.runnable
        while True:
            while runnable:
                self._step(runnable.popleft())
                if self.interrupt is not None:
                    raise self.interrupt
            waiting = [r for r in range(self.world_size) if self.state[r] == _WAITING]
            if not waiting:
                if self.timed_out and self.failure is None:  # no partner reached a collective
                    missing = sorted(self.timed_out)
                    own = "its" if len(missing) == 1 else "their"
                    self._fail(
                        f"{_ranks(missing)} ran {own} own code for more than {self.timeout:g} s "
                        f"without reaching collective #{self.seq}; pass timeout= to dist.run "
                        "to wait longer"
                    )
                return
            if self.failure is None:
                self._fail(self._stuck(waiting))
            for r in waiting:  # release the waiting ranks with the failure
                self.calls[r] = None
                self.state[r] = _RUNNABLE
                self.resume[r] = _Aborted(self.failure)
                runnable.append(r)

    def _step(self, rank: int) -> None:
        """Resume ``rank`` (start it, let it take its result or throw into it) until a rank
        switches back: this one, or another that it handed over to (:meth:`_wait`). A result
        stays in ``self.resume`` for the rank to take: passed through the switch, the
        scheduler's suspended frame would hold it and keep it from the array pool."""
        g = self.greenlets[rank]
        state = self.state[rank]
        error = self.resume[rank]
        if not isinstance(error, BaseException):
            error = None  # a result: the rank takes it itself
        self.state[rank] = _RUNNABLE
        torch = sys.modules.get("torch")
        if torch is not None:
            torch._C._set_grad_enabled(self.grad_modes[rank])
        watchdog = self.watchdog
        if watchdog is not None:  # watchdog.start(rank), inlined
            watchdog.started = _monotonic()
            watchdog.rank = rank
        self.current = rank
        try:
            try:
                if state == _NEW:
                    g.switch(rank)
                elif error is not None:
                    self.resume[rank] = None
                    g.throw(error)
                else:
                    g.switch()
            finally:
                if watchdog is not None:  # watchdog.end(), inlined
                    watchdog.rank = -1
                    if watchdog.arming or watchdog.injected:
                        watchdog.settle()
        except _Interrupted:  # the watchdog's exception took effect after the switch back
            watchdog.settle()  # type: ignore[union-attr]
        rank = self.current  # the rank that switched back
        self.current = -1
        g = self.greenlets[rank]
        if torch is not None or "torch" in sys.modules:
            self.grad_modes[rank] = sys.modules["torch"].is_grad_enabled()
        if g.dead:
            self.state[rank] = _DONE

    def _kill(self) -> None:
        """End every rank's greenlet (their ``finally`` blocks run)."""
        self.failure = self.failure or "the run was interrupted"
        for g in self.greenlets:
            if g and not g.dead:  # started and not ended
                try:
                    g.throw(GreenletExit)
                except BaseException:  # noqa: BLE001, S110 - the run is being interrupted anyway
                    pass

    # -- a rank's life ----------------------------------------------------------------------

    def _rank_main(self, rank: int) -> None:
        api.set_rank_backend(_SimRank(self, rank))
        try:
            result = self.fn(*self.args, **self.kwargs)
        except GreenletExit:
            return  # killed by the scheduler
        except KeyboardInterrupt as exc:
            self.interrupt = exc
        except BaseException as exc:  # noqa: BLE001 - every exception goes back to the caller
            self._rank_raised(rank, exc)
        else:
            self.results[rank] = result
        if rank in self.timed_out:
            self.late[rank] = time.monotonic() - self.timed_out[rank]

    def _rank_raised(self, rank: int, exc: BaseException) -> None:
        if isinstance(exc, _Aborted | _Interrupted) or rank in self.timed_out:
            return  # released because the run had already failed, or interrupted
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        text = "".join(traceback.format_exception(type(exc), exc, tb))
        self.errors[rank] = (exc, text)
        if self.failure is None:
            self.failed_rank = rank
            self._fail(f"rank {rank} raised {type(exc).__name__}: {exc}")

    def _fail(self, message: str) -> None:
        if self.failure is None:
            self.failure = message
            if self.watchdog is not None:  # ranks still running their own code get a grace
                self.watchdog.limit = min(self.timeout, JOIN_GRACE)

    def _stuck(self, waiting: list[int]) -> str:
        """Why no rank can go on while ``waiting`` ranks wait in the current collective."""
        name = f"{self.calls[waiting[0]][0][0]} #{self.seq}"  # type: ignore[index]
        if self.timed_out:
            missing = sorted(self.timed_out)
            still = "was still running its" if len(missing) == 1 else "were still running their"
            return (
                f"{name} timed out after {self.timeout:g} s: {_ranks(waiting)} arrived but "
                f"{_ranks(missing)} {still} own code; pass timeout= to dist.run to wait longer"
            )
        returned = min(r for r in range(self.world_size) if self.calls[r] is None)
        verb = "is" if len(waiting) == 1 else "are"
        return (
            f"{_ranks(waiting)} {verb} waiting in {name} but rank {returned} has already "
            f"returned (after {self.seq} collectives): every rank must call the "
            "same collectives in the same order"
        )

    def _error(self) -> Exception:
        if self.failed_rank is not None and self.errors:
            first = min(self.errors)  # the lowest rank that raised on its own
            exc, text = self.errors[first]
            error: Exception = RankError(first, type(exc).__name__, str(exc), text)
            error.original = exc  # type: ignore[attr-defined]
            others = sorted(set(self.errors) - {first})
            if others:
                error.add_note(f"{_ranks(others)} also raised")
            return error
        error = CollectiveError(self.failure)
        late = sorted(r for r, seconds in self.late.items() if seconds > JOIN_GRACE)
        if late:
            error.add_note(
                f"{_ranks(late)} could not be interrupted at once (blocked outside Python, "
                "e.g. in time.sleep): the run ended when that call returned"
            )
        return error

    # -- the rendezvous ---------------------------------------------------------------------

    def collective(
        self, rank: int, op: str, params: tuple, array: np.ndarray | None, restore: Restore
    ) -> Any:
        """Meet the other ranks in ``op``; this rank's result (as a numpy array).

        The last rank to arrive computes every rank's result (:func:`_compute`) and goes on;
        the others hand over to another rank (:meth:`_wait`) until resumed with their results. The
        restorer of the source's input type (broadcast and scatter) is left in
        ``self.source_restore`` for the ranks that passed None.
        """
        if self.failure is not None:
            raise _Aborted(self.failure)
        if self.timed_out and rank in self.timed_out:
            raise _Interrupted(f"rank {rank} was interrupted after {self.timeout:g} s")
        P = self.world_size
        torch = sys.modules.get("torch")
        if torch is not None and P > 1 and torch._C._current_graph_task_id() != -1:
            raise RuntimeError(
                "a collective of the simulated world cannot run inside torch's autograd engine "
                "(a hook or an autograd.Function's backward during .backward()): the ranks share "
                "one thread; call it outside backward, or use dist.run(..., backend='gloo')"
            )
        if array is None:
            self.calls[rank] = ((op, params, None, None), None, restore)
        else:
            self.calls[rank] = ((op, params, array.shape, array.dtype), array, restore)
        arrived = self.arrived + 1
        if arrived < P:
            self.arrived = arrived
            self.state[rank] = _WAITING
            self._wait(rank)
            result = self.resume[rank]  # (the scheduler throws into this rank instead on failure)
            self.resume[rank] = None
            return result
        calls: list[_Call] = self.calls  # type: ignore[assignment]
        seq = self.seq
        self.seq = seq + 1
        self.calls = [None] * P
        self.arrived = 0
        try:
            results, self.source_restore, event = _compute(
                calls, seq, self.deterministic, self.trace is not None, self.work
            )
        except CollectiveError as exc:
            self._fail(str(exc))
            self._release(rank)
            raise _Aborted(str(exc)) from None
        except Exception as exc:
            self._fail(f"{_Name(op, seq)} failed: {type(exc).__name__}: {exc}")
            self._release(rank)
            raise
        if event is not None:
            self.trace.record(event)  # type: ignore[union-attr]
        state, resume, runnable = self.state, self.resume, self.runnable
        for r in range(P):
            if r != rank:
                state[r] = _RUNNABLE
                resume[r] = results[r]
                runnable.append(r)
        return results[rank]

    def _wait(self, rank: int) -> None:
        """Let the other ranks run until one resumes ``rank``.

        When the next runnable rank only has to take its result, this rank hands over to it
        directly, doing the scheduler's work for both (the watchdog, the torch grad modes):
        one greenlet switch instead of two. Anything else (a rank to start or to throw into,
        an interruption to settle, no rank to run) goes through the scheduler.
        """
        runnable = self.runnable
        if runnable:
            nxt = runnable[0]
            if self.state[nxt] == _RUNNABLE and not isinstance(self.resume[nxt], BaseException):
                watchdog = self.watchdog
                if watchdog is not None:  # as the scheduler does when a rank switches back
                    watchdog.rank = -1
                    if watchdog.arming or watchdog.injected:
                        self.scheduler.switch()  # it settles the watchdog
                        return
                runnable.popleft()
                torch = sys.modules.get("torch")
                if torch is not None:
                    self.grad_modes[rank] = torch.is_grad_enabled()
                    torch._C._set_grad_enabled(self.grad_modes[nxt])
                if watchdog is not None:  # as the scheduler does before resuming a rank
                    watchdog.started = _monotonic()
                    watchdog.rank = nxt
                self.current = nxt
                self.greenlets[nxt].switch()
                return
        self.scheduler.switch()

    def _release(self, rank: int) -> None:
        """Make every rank but ``rank`` (all waiting in the collective) raise the failure."""
        for r in range(self.world_size):
            if r != rank:
                self.state[r] = _RUNNABLE
                self.resume[r] = _Aborted(self.failure)
                self.runnable.append(r)


class _Watchdog:
    """A thread that interrupts a rank running its own code for more than ``limit`` seconds.

    Before resuming a rank the scheduler sets ``started`` and ``rank``; once the rank has
    switched back it sets ``rank`` to -1, lock-free: the watchdog sets ``arming`` before it
    reads ``rank``, and the scheduler reads ``arming`` (and ``injected``) after clearing
    ``rank``, so either the watchdog sees -1 or the scheduler sees it at work and waits for it
    in :meth:`settle`. The watchdog injects :class:`_Interrupted` into the calling thread
    (``PyThreadState_SetAsyncExc``) only while that rank is still the one running, and
    :meth:`settle` clears an injected exception that has not taken effect yet.
    """

    def __init__(self, run: _Run, limit: float) -> None:
        self.run = run
        self.limit = limit
        self.thread_id = threading.get_ident()
        self.rank = -1  # the rank running now; -1: none
        self.started = 0.0
        self.injected = False
        self.arming = False
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._poll = min(max(limit / 8, 0.005), 0.1)
        self._thread = threading.Thread(target=self._watch, name="chainrule-sim-watchdog")
        self._thread.daemon = True
        self._thread.start()

    def settle(self) -> None:
        """Stop watching; clear an injected exception that has not taken effect yet."""
        while True:  # the injected exception may take effect anywhere in here: start again
            try:
                with self._lock:
                    self.rank = -1
                    injected = self.injected
                    self.injected = False
                if injected:
                    thread = ctypes.c_ulong(self.thread_id)
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(thread, None)
                return
            except _Interrupted:
                continue

    def stop(self) -> None:
        self.settle()
        self._stopped.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stopped.wait(self._poll):
            rank, started = self.rank, self.started
            if rank < 0 or time.monotonic() - started < self.limit:
                continue
            states = self.run.state
            if all(s == _DONE for r, s in enumerate(states) if r != rank):
                continue  # no rank can be waiting for this one: it may take its time
            with self._lock:
                self.arming = True
                if self.rank == rank and self.started == started and not self._stopped.is_set():
                    now = time.monotonic()
                    self.run.timed_out.setdefault(rank, now)
                    self.started = now  # once more after another limit, if it swallows this
                    self.injected = True
                    thread, error = ctypes.c_ulong(self.thread_id), ctypes.py_object(_Interrupted)
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(thread, error)
                self.arming = False


# -- the ranks' view --------------------------------------------------------------------------


class _SimRank:
    """One rank of a :class:`SimulatedWorld` run: the backend of the collectives in its greenlet."""

    __slots__ = ("world", "_rank")

    def __init__(self, world: _Run, rank: int) -> None:
        self.world = world
        self._rank = rank

    def rank(self) -> int:
        return self._rank

    def world_size(self) -> int:
        return self.world.world_size

    def all_reduce(self, x: Any, op: ReduceOp, out: Any = None) -> Any:
        """⊕_r x_r as a new value of x's type, or written into ``out`` (which may be x)."""
        if out is not None:
            return self._all_reduce_into(x, op, out)
        if type(x) is np.ndarray and x.dtype.kind == "f":  # the common case: nothing to convert
            return self.world.collective(self._rank, "all_reduce", (("op", op),), x, _RESTORE_ARRAY)
        array, restore = api.to_numpy(x)
        api.check_reducible(array, op)
        return restore(
            self.world.collective(self._rank, "all_reduce", (("op", op),), array, restore)
        )

    def _all_reduce_into(self, x: Any, op: ReduceOp, out: Any) -> Any:
        """Write ⊕_r x_r into ``out`` (x's shape and dtype) and return ``out``. Every rank's
        input is read before any rank writes, so ``out`` may be x itself."""
        array, _ = api.to_numpy(x)
        write = _writer(out, x, array)
        api.check_reducible(array, op)
        write(self.world.collective(self._rank, "all_reduce", (("op", op),), array, _RESTORE_ARRAY))
        return out

    def all_gather(self, x: Any, axis: int) -> Any:
        array, restore = api.to_numpy(x)
        if array.ndim == 0:
            array = array.reshape(1)
        axis = api.normalize_axis(axis, array.ndim, "axis")
        result = self.world.collective(self._rank, "all_gather", (("axis", axis),), array, restore)
        return restore(result)

    def reduce_scatter(self, x: Any, op: ReduceOp, axis: int) -> Any:
        array, restore = api.to_numpy(x)
        api.check_reducible(array, op)
        axis = api.check_divisible(array, axis, self.world.world_size, "reduce_scatter")
        result = self.world.collective(
            self._rank, "reduce_scatter", (("op", op), ("axis", axis)), array, restore
        )
        return restore(result)

    def all_to_all(self, x: Any, split_axis: int, concat_axis: int) -> Any:
        array, restore = api.to_numpy(x)
        split_axis = api.check_divisible(
            array, split_axis, self.world.world_size, "all_to_all", "split_axis"
        )
        concat_axis = api.normalize_axis(concat_axis, array.ndim, "concat_axis")
        params = (("split_axis", split_axis), ("concat_axis", concat_axis))
        result = self.world.collective(self._rank, "all_to_all", params, array, restore)
        return restore(result)

    def broadcast(self, x: Any, src: int) -> Any:
        src = api.check_src(src, self.world.world_size)
        array, restore = api.to_numpy(x)
        if array is None and self._rank == src:
            raise ValueError(f"broadcast: the source rank {src} must pass an array, not None")
        result = self.world.collective(self._rank, "broadcast", (("src", src),), array, restore)
        return (restore if x is not None else self.world.source_restore)(result)

    def scatter(self, x: Any, src: int, axis: int) -> Any:
        src = api.check_src(src, self.world.world_size)
        array, restore = api.to_numpy(x)
        params: tuple = (("src", src),)
        if self._rank == src:
            if array is None:
                raise ValueError(f"scatter: the source rank {src} must pass an array, not None")
            axis = api.check_divisible(array, axis, self.world.world_size, "scatter")
            params = (("src", src), ("axis", axis))
        result = self.world.collective(self._rank, "scatter", params, array, restore)
        return (restore if x is not None else self.world.source_restore)(result)

    def barrier(self) -> None:
        self.world.collective(self._rank, "barrier", (), None, _RESTORE_ARRAY)


def _dtype_name(value: Any) -> str:
    """'float32' for a numpy array, a chainrule Tensor or a torch tensor."""
    dtype = value.dtype
    return dtype.name if isinstance(dtype, np.dtype) else str(dtype).removeprefix("torch.")


def _writer(out: Any, x: Any, array: np.ndarray) -> Callable[[np.ndarray], None]:
    """The step that writes an all_reduce result into ``out``, once ``out`` is checked: a
    writable numpy array, chainrule Tensor or torch tensor of the same shape and dtype as
    ``x`` (whose values are ``array``)."""
    if isinstance(out, np.ndarray) or api.is_chainrule_tensor(out):
        target = out.data if api.is_chainrule_tensor(out) else out
        if not target.flags.writeable:
            raise ValueError("all_reduce: out is a read-only array")
        write: Callable[[np.ndarray], Any] = functools.partial(np.copyto, target)
    elif api.is_torch_tensor(out):
        target = out.detach()
        from_numpy = sys.modules["torch"].from_numpy

        def write(result: np.ndarray) -> None:
            target.copy_(from_numpy(result))  # (to out's device and dtype)

    else:
        raise TypeError(
            "all_reduce: out must be a numpy array, a chainrule Tensor or a torch tensor, "
            f"not {type(out).__name__}"
        )
    source = x.data if api.is_chainrule_tensor(x) else x if hasattr(x, "dtype") else array
    shape, like = tuple(target.shape), tuple(array.shape)
    if shape != like or _dtype_name(target) != _dtype_name(source):
        raise ValueError(
            f"all_reduce: out has shape {shape} {_dtype_name(target)} but x has {like} "
            f"{_dtype_name(source)}; out must be like x"
        )
    return write


# -- checking the calls and computing the results ---------------------------------------------


def _compute(
    calls: list[_Call], seq: int, deterministic: bool, tracing: bool, work: _Work
) -> tuple[Out, Restore, CollectiveEvent | None]:
    """Check that the P calls of collective ``seq`` agree; every rank's result, the restorer
    of the source's type (broadcast, scatter) and the trace event.

    The common case, every rank made the same call with the same shape and dtype, costs one
    comparison of keys per rank; only when keys differ are the calls checked field by field
    (:func:`_agreed`), which either finds them compatible (the ranks that pass None to a
    broadcast or scatter) or raises a message that names the ranks.
    """
    key = calls[0][0]
    arrays = []
    differ = False
    for call in calls:
        if call[0] != key:
            differ = True
        arrays.append(call[1])
    op, params = _agreed(calls, seq) if differ else (key[0], key[1])
    kwargs = dict(params)
    if op == "broadcast" or op == "scatter":
        src = kwargs["src"]
        kwargs = dict(calls[src][0][1])
        restore = calls[src][2]
    else:
        restore = _RESTORE_ARRAY
    results = _COMPUTE[op](arrays, kwargs, deterministic, work)
    event = _event(op, seq, arrays, kwargs) if tracing else None
    return results, restore, event


def _agreed(calls: list[_Call], seq: int) -> tuple[str, tuple]:
    """The (op, params) of calls whose keys differ, if they are compatible; else raise
    :class:`CollectiveError` naming the ranks that differ and how."""
    op, params = calls[0][0][0], calls[0][0][1]
    name = _Name(op, seq)  # formatted only in a message
    if any(c[0][0] != op for c in calls):
        _check_same_op(calls, seq)
    if op == "scatter":  # only the source knows the axis of a scatter
        params = params[:1]
        if any(c[0][1][:1] != params for c in calls):
            _check_same_params([c[0][1][:1] for c in calls], name)
    elif any(c[0][1] != params for c in calls):
        _check_same_params([c[0][1] for c in calls], name)
    arrays = [c[1] for c in calls]
    if op == "broadcast":
        _check_like_source(arrays, dict(params)["src"], name)
    elif op != "scatter" and op != "barrier":
        _check_same(arrays, name, "dtype", lambda a: a.dtype)
        _check_same(arrays, name, "shape", lambda a: a.shape)
    return op, params


def _event(op: str, seq: int, arrays: list[Any], kwargs: dict[str, Any]) -> CollectiveEvent:
    """The trace event of a collective (``kwargs`` as the source passed them)."""
    if op == "broadcast" or op == "scatter":
        nbytes = arrays[kwargs["src"]].nbytes
    else:
        nbytes = max((a.nbytes for a in arrays if a is not None), default=0)
    present = [a for a in arrays if a is not None]
    return CollectiveEvent(
        seq=seq,
        op=op,
        shapes=tuple(None if a is None else a.shape for a in arrays),
        dtype=str(present[0].dtype) if present else None,
        nbytes=int(nbytes),
        ranks=tuple(range(len(arrays))),
        kwargs=dict(kwargs),
    )


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
    groups = _group([c[0][0] for c in calls])
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


def _cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _ring_order(rank: int, world_size: int) -> list[int]:
    return [(rank + i) % world_size for i in range(world_size)]


Task = Callable[[], None]
"""A piece of a collective's work that writes to memory no other piece touches."""


class _Work:
    """What computing a collective may use: the array pool and the helper threads.

    ``empty`` allocates a result array (:meth:`chainrule.dist.buffers.ArrayPool.empty`).
    :meth:`run` calls a list of tasks, sharing them between the calling thread and
    ``threads − 1`` helper threads when they move at least :data:`PARALLEL_MIN_BYTES`: numpy
    releases the GIL inside its loops and copies, and one core alone cannot use all of the
    memory bandwidth. Each thread takes the next task as soon as it is done with its last,
    so a thread that shares its core with other work takes fewer. A task computes the same
    bits whichever thread runs it, so results do not depend on the threads. The helpers
    start when a run first needs them and end with the run (:meth:`close`).
    """

    def __init__(self, empty: Empty, threads: int) -> None:
        self.empty = empty
        self.threads = threads
        self._helpers: list[threading.Thread] = []
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()

    def shares(self, nbytes: int) -> bool:
        """Whether helper threads share work that reads and writes ``nbytes`` bytes."""
        return self.threads > 1 and nbytes >= PARALLEL_MIN_BYTES

    def run(self, tasks: list[Task], nbytes: int) -> None:
        """Call every task once; ``nbytes``: about how many bytes they read and write."""
        if len(tasks) < 2 or not self.shares(nbytes):
            for task in tasks:
                task()
            return
        if not self._helpers:
            self._start()
        pending = iter(tasks)
        lock = threading.Lock()
        stopped: list[bool] = []  # set when the calling thread fails: the helpers stop too

        def work() -> None:
            while not stopped:
                with lock:
                    task = next(pending, None)
                if task is None:
                    return
                task()

        for _ in self._helpers:  # each in a copy of this rank's context (numpy's errstate)
            self._inbox.put((contextvars.copy_context(), work))
        try:
            work()
        finally:
            stopped.append(True)
            failures = [self._done.get() for _ in self._helpers]
        for failure in failures:
            if failure is not None:
                raise failure

    def _start(self) -> None:
        for i in range(self.threads - 1):
            thread = threading.Thread(target=self._serve, name=f"chainrule-sim-helper-{i}")
            thread.daemon = True
            thread.start()
            self._helpers.append(thread)

    def _serve(self) -> None:
        while (item := self._inbox.get()) is not None:
            context, work = item
            try:
                context.run(work)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread
                self._done.put(exc)
            else:
                self._done.put(None)

    def close(self) -> None:
        """End the helper threads."""
        for _ in self._helpers:
            self._inbox.put(None)
        for thread in self._helpers:
            thread.join()
        self._helpers.clear()


def _reduce_tasks(
    sources: Sequence[np.ndarray], op: ReduceOp, outs: Sequence[np.ndarray]
) -> list[Task]:
    """Tasks that compute ``outs[0] = sources[0] ⊕ sources[1] ⊕ ...`` (left to right) and
    copy it into ``outs[1:]``.

    On contiguous data one task per block of :data:`BLOCK_BYTES` bytes: the block of
    the partial result stays in cache while the next rank's block is added and while it is
    copied out, so the work is one pass over the inputs and one over the outputs with no
    temporary array. Every element is reduced in the same order, whatever the blocks.
    """
    ufunc = _ufunc(op)
    scale = len(sources) if op is _AVG else None
    size = outs[0].size
    block = max(1, BLOCK_BYTES // outs[0].itemsize)
    if size > block and all(a.flags.c_contiguous for a in sources):
        flat_sources = [a.reshape(-1) for a in sources]
        flat_outs = [o.reshape(-1) for o in outs]
        return [
            functools.partial(
                _reduce_range, flat_sources, ufunc, scale, flat_outs, start, start + block
            )
            for start in range(0, size, block)
        ]
    return [functools.partial(_reduce_block, sources, ufunc, scale, outs)]


def _reduce_range(
    sources: Sequence[np.ndarray],
    ufunc: np.ufunc,
    scale: int | None,
    outs: Sequence[np.ndarray],
    start: int,
    stop: int,
) -> None:
    """:func:`_reduce_block` of the elements ``start:stop`` of flat arrays."""
    block = slice(start, stop)
    _reduce_block([s[block] for s in sources], ufunc, scale, [o[block] for o in outs])


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


def _copy_tasks(pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[Task]:
    """Tasks that copy each ``source`` into its ``destination`` (pairs of the same shape)."""
    return [functools.partial(np.copyto, destination, source) for destination, source in pairs]


def _nbytes(arrays: Sequence[np.ndarray]) -> int:
    return sum(a.nbytes for a in arrays)


Empty = Callable[[tuple[int, ...], np.dtype], np.ndarray]
"""Allocates a result array (:meth:`chainrule.dist.buffers.ArrayPool.empty`)."""

Out = list[Any]
"""What a collective computes: every rank's result."""


def _copies(source: np.ndarray, count: int, work: _Work) -> list[np.ndarray]:
    """``count`` copies of ``source``."""
    outs = [work.empty(source.shape, source.dtype) for _ in range(count)]
    work.run(_copy_tasks([(out, source) for out in outs]), 2 * _nbytes(outs))
    return outs


def _all_reduce(arrays: list[np.ndarray], kwargs: dict, deterministic: bool, work: _Work) -> Out:
    op: ReduceOp = kwargs["op"]
    P = len(arrays)
    a0 = arrays[0]
    same_order = deterministic or P <= 2 or op is _MAX  # order matters for P ≥ 3 sums
    if same_order and a0.nbytes <= BLOCK_BYTES:  # small: one result, then plain copies
        ufunc = np.maximum if op is _MAX else np.add
        if P > 1 and a0.ndim:  # a C-ordered result, as every rank's copy
            total, rest = ufunc(a0, arrays[1], order="C"), arrays[2:]
        else:  # (a ufunc of 0-d arrays returns a scalar: start from a copy)
            total, rest = a0.copy(), arrays[1:]
        for a in rest:
            ufunc(total, a, out=total)
        if op is _AVG:
            np.divide(total, P, out=total)
        results = [total]
        for _ in range(1, P):
            results.append(total.copy())
        return results
    empty = work.empty if a0.nbytes >= MIN_POOLED_BYTES else np.empty  # the pool: large only
    outs = [empty(a0.shape, a0.dtype) for _ in range(P)]
    if same_order:
        tasks = _reduce_tasks(arrays, op, outs)
    else:  # rank r sums in its ring order r, r+1, ..., r−1
        tasks = [
            task
            for r in range(P)
            for task in _reduce_tasks([arrays[j] for j in _ring_order(r, P)], op, [outs[r]])
        ]
    work.run(tasks, _nbytes(arrays) + _nbytes(outs))
    return outs


def _chunks(array: np.ndarray, parts: int, axis: int) -> list[np.ndarray]:
    return np.split(array, parts, axis=axis)


def _reduce_scatter(
    arrays: list[np.ndarray], kwargs: dict, deterministic: bool, work: _Work
) -> Out:
    op: ReduceOp = kwargs["op"]
    P = len(arrays)
    chunked = [_chunks(a, P, kwargs["axis"]) for a in arrays]
    outs, tasks = [], []
    for r in range(P):
        order = range(P) if deterministic else _ring_order(r, P)
        sources = [chunked[j][r] for j in order]
        out = work.empty(sources[0].shape, arrays[0].dtype)
        tasks += _reduce_tasks(sources, op, [out])
        outs.append(out)
    work.run(tasks, _nbytes(arrays) + _nbytes(outs))
    return outs


def _all_gather(arrays: list[np.ndarray], kwargs: dict, deterministic: bool, work: _Work) -> Out:
    """One concatenation copied P − 1 times; or, shared between threads, P² independent
    copies of the inputs into the parts of the results."""
    P = len(arrays)
    axis = kwargs["axis"]
    shape = list(arrays[0].shape)
    shape[axis] *= P
    outs = [work.empty(tuple(shape), arrays[0].dtype) for _ in range(P)]
    nbytes = 2 * _nbytes(outs)
    if not work.shares(nbytes):
        gathered = np.concatenate(arrays, axis=axis, out=outs[0])
        for out in outs[1:]:
            np.copyto(out, gathered)
        return outs
    pairs = [
        (part, a) for out in outs for part, a in zip(_chunks(out, P, axis), arrays, strict=True)
    ]
    work.run(_copy_tasks(pairs), nbytes)
    return outs


def _all_to_all(arrays: list[np.ndarray], kwargs: dict, deterministic: bool, work: _Work) -> Out:
    """Rank r's result is chunk r of every input, concatenated (shared between threads: P²
    independent copies of S/P)."""
    P = len(arrays)
    concat_axis = kwargs["concat_axis"]
    chunked = [_chunks(a, P, kwargs["split_axis"]) for a in arrays]
    shape = list(chunked[0][0].shape)
    shape[concat_axis] *= P
    outs = [work.empty(tuple(shape), arrays[0].dtype) for _ in range(P)]
    nbytes = 2 * _nbytes(outs)
    if not work.shares(nbytes):
        for r, out in enumerate(outs):
            np.concatenate([chunked[j][r] for j in range(P)], axis=concat_axis, out=out)
        return outs
    pairs = [
        (part, chunked[j][r])
        for r, out in enumerate(outs)
        for j, part in enumerate(_chunks(out, P, concat_axis))
    ]
    work.run(_copy_tasks(pairs), nbytes)
    return outs


def _barrier(arrays: list[None], kwargs: dict, deterministic: bool, work: _Work) -> Out:
    return [None] * len(arrays)


def _broadcast(arrays: list[np.ndarray], kwargs: dict, deterministic: bool, work: _Work) -> Out:
    return _copies(arrays[kwargs["src"]], len(arrays), work)


def _scatter(arrays: list[np.ndarray], kwargs: dict, deterministic: bool, work: _Work) -> Out:
    chunks = _chunks(arrays[kwargs["src"]], len(arrays), kwargs["axis"])
    outs = [work.empty(chunk.shape, chunk.dtype) for chunk in chunks]
    work.run(_copy_tasks(list(zip(outs, chunks, strict=True))), 2 * _nbytes(outs))
    return outs


_COMPUTE: dict[str, Callable[..., Out]] = {
    "all_reduce": _all_reduce,
    "reduce_scatter": _reduce_scatter,
    "all_gather": _all_gather,
    "all_to_all": _all_to_all,
    "broadcast": _broadcast,
    "scatter": _scatter,
    "barrier": _barrier,
}
