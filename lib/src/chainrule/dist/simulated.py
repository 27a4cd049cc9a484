"""A simulated world of P ranks: one greenlet per rank, collectives as meetings in memory.

The SPMD function really runs P times, once in each rank's greenlet, all in the calling
thread. A scheduler resumes the ranks one at a time, in rank order; a rank runs its own code
until it calls a collective, records its :class:`~chainrule.dist.calls.Call` and its array,
and hands back to the scheduler. The last rank to arrive at the k-th collective checks that
the P calls agree (:func:`chainrule.dist.calls.agree`), computes every rank's result with one
numpy computation (the functions at the end of this module) and goes on; the others are
resumed, in rank order, each with its own result. Switching between greenlets costs no
operating-system wake-up, so a small collective takes microseconds.

Each rank runs in a ``contextvars`` context of its own (so ``chainrule.no_grad()`` on one rank
never leaks into another) and, when torch is loaded, with its own torch grad mode, restored
around every switch. A collective may not be called from inside torch's autograd engine (a
hook or an ``autograd.Function.backward`` during ``loss.backward()``): the engine keeps
per-thread state that the ranks would share; use ``backend="gloo"`` for that.

Determinism. By default a reduction is computed once, in rank order
``((x_0 ⊕ x_1) ⊕ x_2) ⊕ ...``, and every rank receives a bitwise-identical copy, so replicas
that start equal stay equal. With ``deterministic=False`` rank r reduces in its own ring
order ``x_r ⊕ x_{r+1} ⊕ ... ⊕ x_{r−1}``. Floating-point addition is not associative, so for
P ≥ 3 the ranks' sums differ in the last bits, and replicas drift apart over many steps.

Failures end the run quickly and name the ranks: calls that disagree, a rank that returned
while others wait for it (seen as soon as no rank can go on), an exception (re-raised as
:class:`~chainrule.dist.world.RankError`), and a rank that runs its own code for more than
``timeout`` seconds without reaching a collective. That last one is the watchdog's: an alarm
clock (``signal.setitimer``) set each time a rank is resumed, whose signal interrupts the rank
whatever it is doing — computing, sleeping, or waiting for a lock that another rank holds.
Python runs signal handlers in the main thread only, so off the main thread there is no
watchdog. After a failure the waiting ranks are released with a
:class:`~chainrule.dist.world.CollectiveAborted` inside their collective, and
:meth:`SimulatedWorld.run` raises once every rank's greenlet has ended. A
``KeyboardInterrupt`` (a notebook's interrupt) ends every rank's greenlet and propagates.
"""

from __future__ import annotations

import contextvars
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any, cast

import numpy as np
from greenlet import GreenletExit, greenlet

from chainrule.dist.calls import (
    Call,
    agree,
    agree_pair,
    deadlock_message,
    event,
    pair_event,
    pair_group,
    pair_name,
    pair_returned_message,
    ranks_text,
    returned_message,
)
from chainrule.dist.groups import Group
from chainrule.dist.trace import Trace
from chainrule.dist.whereabouts import Line, line_of_frame, positions
from chainrule.dist.world import (
    CollectiveAborted,
    CollectiveError,
    RankError,
    ReduceOp,
    refuse_nested_run,
    set_rank_world,
)

DEFAULT_TIMEOUT = 5.0
"""Seconds a rank may run its own code without reaching a collective before the run fails."""

JOIN_GRACE = 0.5
"""Seconds a rank may still run its own code once the run has failed, before it is stopped."""


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

    def __repr__(self) -> str:
        return (
            f"SimulatedWorld(world_size={self.world_size}, timeout={self.timeout}, "
            f"deterministic={self.deterministic})"
        )

    def run(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        trace: Trace | None = None,
    ) -> list[Any]:
        """``fn(*args, **kwargs)`` once per rank, in P greenlets; the results in rank order."""
        refuse_nested_run()
        if not self._running.acquire(blocking=False):
            raise RuntimeError("this SimulatedWorld is already running an SPMD function")
        try:
            run = _Run(self, trace if trace is not None else self.trace)
            return run.execute(fn, args, kwargs or {})
        finally:
            self._running.release()


class _Rank:
    """One rank of a run: the world that answers the collectives called in its greenlet."""

    backend = "sim"
    native = "numpy"
    device = None
    __slots__ = ("run", "rank", "world_size")

    def __init__(self, run: _Run, rank: int) -> None:
        self.run, self.rank, self.world_size = run, rank, run.world_size

    def collective(self, call: Call, data: Any, into: Any = None) -> tuple[Any, Call]:
        return self.run.meet(self.rank, call, data, self.run.everyone)

    def point_to_point(self, call: Call, data: Any) -> tuple[Any, Call]:
        return self.run.pair(self.rank, call, data)

    def register_group(self, group: Group) -> None:
        pass  # a group of the simulated world is just its ranks

    def subgroup(self, group: Group) -> _GroupRank:
        return _GroupRank(self.run, self.rank, group)


class _GroupRank:
    """One rank of a run as a member of a group: its collectives meet the group's ranks."""

    backend = "sim"
    native = "numpy"
    device = None
    __slots__ = ("run", "global_rank", "ranks", "rank", "world_size")

    def __init__(self, run: _Run, global_rank: int, group: Group) -> None:
        self.run, self.global_rank, self.ranks = run, global_rank, group.ranks
        self.rank, self.world_size = group.index(global_rank), len(group)

    def collective(self, call: Call, data: Any, into: Any = None) -> tuple[Any, Call]:
        return self.run.meet(self.global_rank, call, data, self.ranks)

    def point_to_point(self, call: Call, data: Any) -> tuple[Any, Call]:
        return self.run.pair(self.global_rank, call, data)

    def register_group(self, group: Group) -> None:
        raise TypeError("make groups from the whole world (dist.new_group), not from a group")

    def subgroup(self, group: Group) -> _GroupRank:
        raise TypeError("a collective's group is a group of the world, not of another group")


class _Interrupted(CollectiveError):
    """Raised in a rank that ran its own code for too long (by the watchdog)."""


_START = object()  # what the scheduler sends a rank that has not started yet


class _Run:
    """One run of an SPMD function: the ranks' greenlets, their scheduler and their meetings."""

    def __init__(self, world: SimulatedWorld, trace: Trace | None) -> None:
        P = world.world_size
        self.world_size = P
        self.timeout = world.timeout
        self.deterministic = world.deterministic
        self.trace = trace
        self.everyone = tuple(range(P))
        self.meetings: dict[tuple[int, ...], _Meeting] = {self.everyone: _Meeting()}
        self.waiting_in: list[tuple[int, ...] | None] = [None] * P  # each rank's meeting
        self.channels: dict[tuple[Any, ...], _Channel] = {}  # (source, destination, group)
        self.pair_waits: dict[int, tuple[str, int]] = {}  # rank -> its send/recv, its peer
        self.ready: deque[tuple[int, Any]] = deque((r, _START) for r in range(P))
        self.done = [False] * P
        self.results: list[Any] = [None] * P
        self.failure: str | None = None  # the first thing that went wrong, as a message
        self.failed_rank: int | None = None  # the rank whose exception failed the run
        self.errors: dict[int, tuple[BaseException, str]] = {}
        self.interrupt: BaseException | None = None  # a KeyboardInterrupt raised on a rank
        self.timed_out: dict[int, float] = {}  # rank -> seconds it had run when stopped
        self.stopped_at: dict[int, Line | None] = {}  # rank -> the line it was stopped at
        self.running: int | None = None  # the rank running its own code now
        self.started = 0.0  # when it was resumed
        self.grad_modes = [True] * P  # each rank's torch grad mode (torch's default)
        self.scheduler = greenlet.getcurrent()
        self.greenlets: list[greenlet] = []
        self.watchdog = _Watchdog(self)

    # -- scheduling -------------------------------------------------------------------------

    def execute(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[Any]:
        """Run every rank to its end; the results in rank order, or the run's error."""
        self.fn, self.args, self.kwargs = fn, args, kwargs
        for _ in range(self.world_size):
            g = greenlet(self._rank_main, self.scheduler)
            g.gr_context = contextvars.Context()  # as a new thread: no context var is set
            self.greenlets.append(g)
        torch = sys.modules.get("torch")
        caller_grad = torch.is_grad_enabled() if torch is not None else True
        try:
            with self.watchdog:
                self._schedule()
        except BaseException:  # KeyboardInterrupt: end every rank, then propagate
            self._kill()
            raise
        finally:
            torch = sys.modules.get("torch")
            if torch is not None:
                torch.set_grad_enabled(caller_grad)
        if self.failure is not None:
            raise self._error() from None
        return self.results

    def _schedule(self) -> None:
        while True:
            while self.ready:
                self._resume(*self.ready.popleft())
                if self.interrupt is not None:
                    raise self.interrupt
            waiting = [r for r, members in enumerate(self.waiting_in) if members is not None]
            if not waiting:
                if self.timed_out and self.failure is None:  # no rank reached a collective
                    missing = sorted(self.timed_out)
                    own = "its" if len(missing) == 1 else "their"
                    seq = self.meetings[self.everyone].seq
                    at = positions({r: self.stopped_at.get(r) for r in missing})
                    self._fail(
                        f"{ranks_text(missing)} ran {own} own code for more than "
                        f"{self.timeout:g} s without reaching collective #{seq}"
                        + (f" ({at})" if at else "")
                        + "; pass timeout= to dist.run to wait longer"
                    )
                return
            if self.failure is None:
                self._fail(self._stuck(waiting))
            for r in waiting:  # release the waiting ranks with the failure
                self.waiting_in[r] = None
                self.ready.append((r, CollectiveAborted(self.failure)))
            for meeting in self.meetings.values():
                meeting.arrived.clear()
            for channel in self.channels.values():
                channel.waiting = None
            self.pair_waits.clear()

    def _resume(self, rank: int, value: Any) -> None:
        """Run ``rank`` until it waits in a collective or ends: start it, hand it its result,
        or throw an exception into it."""
        g = self.greenlets[rank]
        if value is _START and self.failure is not None:
            self.done[rank] = True  # after a failure, ranks that have not started never start
            return
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_grad_enabled(self.grad_modes[rank])
        self.started = time.monotonic()
        self.running = rank
        try:
            if value is _START:
                g.switch(rank)
            elif isinstance(value, BaseException):
                g.throw(value)
            else:
                g.switch(value)
        except _Interrupted:  # the alarm rang as the rank ended: it ended all the same
            pass
        self.running = None
        if torch is not None or "torch" in sys.modules:
            self.grad_modes[rank] = sys.modules["torch"].is_grad_enabled()
        if g.dead:
            self.done[rank] = True

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
        set_rank_world(_Rank(self, rank))
        try:
            self.results[rank] = self.fn(*self.args, **self.kwargs)
        except GreenletExit:
            pass  # ended by the scheduler
        except KeyboardInterrupt as exc:
            self.interrupt = exc
        except BaseException as exc:  # noqa: BLE001 - every exception goes back to the caller
            self._rank_raised(rank, exc)
        finally:
            self.running = None

    def _rank_raised(self, rank: int, exc: BaseException) -> None:
        if isinstance(exc, CollectiveAborted) or rank in self.timed_out:
            return  # released because the run had already failed, or stopped by the watchdog
        if isinstance(exc, CollectiveError):  # a misuse caught on this rank (a nested run)
            self._fail(str(exc))
            return
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        self.errors[rank] = (exc, "".join(traceback.format_exception(type(exc), exc, tb)))
        if self.failure is None:
            self.failed_rank = rank
            self._fail(f"rank {rank} raised {type(exc).__name__}: {exc}")

    def _fail(self, message: str) -> None:
        if self.failure is None:
            self.failure = message
            if self.watchdog.active:  # ranks still running their own code get a grace
                self.watchdog.ring_in(self.limit())

    def limit(self) -> float:
        """Seconds a rank may run its own code now (shorter once the run has failed)."""
        return self.timeout if self.failure is None else min(self.timeout, JOIN_GRACE)

    def alone(self, rank: int) -> bool:
        """Whether every other rank has returned: then no one waits for ``rank``."""
        return all(done for r, done in enumerate(self.done) if r != rank)

    def _waits_in(self, rank: int) -> str:
        """What a waiting rank waits in: ``all_reduce #3``, ``recv #0 from rank 1``..."""
        if rank in self.pair_waits:
            return self.pair_waits[rank][0]
        members: tuple[int, ...] = self.waiting_in[rank]  # type: ignore[assignment]
        meeting = self.meetings[members]
        where = "" if members == self.everyone else f" (in the group of ranks {members})"
        return f"{meeting.arrived[rank][0].op} #{meeting.seq}{where}"

    def _stuck(self, waiting: list[int]) -> str:
        """Why no rank can go on while ``waiting`` ranks wait in collectives, sends or recvs."""
        if self.timed_out:
            here = [waiting[0]]
            if waiting[0] not in self.pair_waits:
                here = sorted(self.meetings[self.waiting_in[waiting[0]]].arrived)  # type: ignore[index]
            missing = sorted(self.timed_out)
            still = "was still running its" if len(missing) == 1 else "were still running their"
            seconds = max(self.timed_out[r] for r in missing)
            at = positions({r: self.stopped_at.get(r) for r in missing})
            return (
                f"{self._waits_in(waiting[0])} timed out after {self.timeout:g} s: "
                f"{ranks_text(here)} arrived but {ranks_text(missing)} {still} own code (stopped "
                f"after {seconds:.2f} s" + (f", {at}" if at else "") + "); pass timeout= to "
                "dist.run to wait longer"
            )
        pairs = [r for r in waiting if r in self.pair_waits]
        if pairs:
            what, peer = self.pair_waits[pairs[0]]
            if self.done[peer]:
                return pair_returned_message(pairs[0], what, peer)
            return deadlock_message({r: self._waits_in(r) for r in waiting})
        members: tuple[int, ...] = self.waiting_in[waiting[0]]  # type: ignore[assignment]
        meeting = self.meetings[members]
        here = sorted(meeting.arrived)
        op, seq = meeting.arrived[here[0]][0].op, meeting.seq
        where = "" if members == self.everyone else f" (in the group of ranks {members})"
        absent = [r for r in members if r not in meeting.arrived]
        returned = [r for r in absent if self.done[r]]
        if returned:
            return returned_message(here, returned[0], op, seq) + where
        other: tuple[int, ...] = self.waiting_in[absent[0]]  # type: ignore[assignment]
        elsewhere = [r for r in absent if self.waiting_in[r] == other]
        other_op = self.meetings[other].arrived[elsewhere[0]][0].op
        return (
            f"{ranks_text(here)} wait in {op} #{seq} of the group of ranks {members} while "
            f"{ranks_text(elsewhere)} wait in {other_op} of the group of ranks {other}: the "
            "ranks of a group must call its collectives in the same order"
        )

    def _error(self) -> Exception:
        if self.failed_rank is not None and self.errors:
            first = min(self.errors)  # the lowest rank that raised on its own
            exc, text = self.errors[first]
            error: Exception = RankError(first, type(exc).__name__, str(exc), text)
            error.original = exc  # type: ignore[attr-defined]
            others = sorted(set(self.errors) - {first})
            if others:
                error.add_note(f"{ranks_text(others)} also raised")
            return error
        return CollectiveError(self.failure)

    # -- the meeting ------------------------------------------------------------------------

    def meet(self, rank: int, call: Call, data: Any, members: tuple[int, ...]) -> tuple[Any, Call]:
        """Meet the other ranks of ``members`` in ``call``; this rank's result and the agreed
        call.

        The last rank to arrive checks the calls, computes every rank's result and goes on;
        the others hand back to the scheduler until it resumes them with their results.
        """
        self.running = None  # this rank's own code is done until it has its result
        if self.failure is not None:
            raise CollectiveAborted(self.failure)
        if rank in self.timed_out:  # it swallowed the watchdog's exception: once more
            raise _Interrupted(f"rank {rank} was stopped after {self.timed_out[rank]:.2f} s")
        P = len(members)
        torch = sys.modules.get("torch")
        if torch is not None and P > 1 and torch._C._current_graph_task_id() != -1:
            raise RuntimeError(
                "a collective of the simulated world cannot run inside torch's autograd engine "
                "(a hook or an autograd.Function's backward during .backward()): the ranks share "
                "one thread; call it outside backward, or use dist.run(..., backend='gloo')"
            )
        meeting = self.meetings.setdefault(members, _Meeting())
        meeting.arrived[rank] = (call, data)
        self.waiting_in[rank] = members
        if len(meeting.arrived) < P:
            return cast(tuple[Any, Call], self.scheduler.switch())
        arrived = [meeting.arrived[r] for r in members]
        seq = meeting.seq
        meeting.arrived, meeting.seq = {}, seq + 1
        for r in members:
            self.waiting_in[r] = None
        calls = [c for c, _ in arrived]
        where = "" if members == self.everyone else f" (ranks of the group {members})"
        try:
            lead = agree(calls, seq)
            results = COMPUTE[lead.op]([d for _, d in arrived], lead, self.deterministic)
        except CollectiveError as exc:
            self._fail(str(exc) + where)
            self._release(rank, members)
            raise CollectiveAborted(str(exc) + where) from None
        except Exception as exc:
            self._fail(f"{call.op} #{seq}{where} failed: {type(exc).__name__}: {exc}")
            self._release(rank, members)
            raise
        if self.trace is not None:
            self.trace.record(event(calls, lead, seq, "sim", members))
        for i, r in enumerate(members):
            if r != rank:
                self.ready.append((r, (results[i], lead)))
        self.running, self.started = rank, time.monotonic()  # the last to arrive goes on
        return results[members.index(rank)], lead

    def _release(self, rank: int, members: tuple[int, ...]) -> None:
        """Make every rank of ``members`` but ``rank`` (all waiting in the collective) raise
        the failure."""
        for r in members:
            if r != rank:
                self.ready.append((r, CollectiveAborted(self.failure)))

    # -- a send and its recv ----------------------------------------------------------------

    def pair(self, rank: int, call: Call, data: Any) -> tuple[Any, Call]:
        """Meet the peer of this rank's send or recv ``call`` (``data``: what a send sends);
        the received array (None for a send) and the sender's call.

        Messages from one rank to another travel in channels, one per group (the world's
        too), each counted apart. The first of the two to arrive waits; the second checks the pair
        (:func:`~chainrule.dist.calls.agree_pair`), hands the receiver a copy and goes on.
        """
        self.running = None
        if self.failure is not None:
            raise CollectiveAborted(self.failure)
        if rank in self.timed_out:
            raise _Interrupted(f"rank {rank} was stopped after {self.timed_out[rank]:.2f} s")
        torch = sys.modules.get("torch")
        if torch is not None and torch._C._current_graph_task_id() != -1:
            raise RuntimeError(
                f"a {call.op} of the simulated world cannot run inside torch's autograd engine "
                "(a hook or an autograd.Function's backward during .backward()): the ranks share "
                "one thread; call it outside backward, or use dist.run(..., backend='gloo')"
            )
        sending = call.op == "send"
        src, dst = call.param("src"), call.param("dst")
        peer = dst if sending else src
        channel = self.channels.setdefault((src, dst, pair_group(call)), _Channel())
        seq = channel.sent if sending else channel.received
        if sending:
            channel.sent += 1
        else:
            channel.received += 1
        if channel.waiting is None:  # the first to arrive waits for its peer
            channel.waiting = (call, data)
            self.waiting_in[rank] = ()
            self.pair_waits[rank] = (pair_name(call, seq), peer)
            return cast(tuple[Any, Call], self.scheduler.switch())
        other, other_data = channel.waiting
        channel.waiting = None
        self.waiting_in[peer] = None
        del self.pair_waits[peer]
        sent, payload, expected = (call, data, other) if sending else (other, other_data, call)
        try:
            lead = agree_pair(sent, expected, seq)
        except CollectiveError as exc:
            self._fail(str(exc))
            self.ready.append((peer, CollectiveAborted(self.failure)))
            raise CollectiveAborted(str(exc)) from None
        received = np.array(payload, order="C")  # the receiver's own copy
        if self.trace is not None:
            self.trace.record(pair_event(lead, seq, "sim"))
        self.ready.append((peer, (received, lead) if sending else (None, lead)))
        self.running, self.started = rank, time.monotonic()  # the second to arrive goes on
        return (None, lead) if sending else (received, lead)


class _Channel:
    """The messages from one rank to another: how many were sent and received, and the send
    or recv (its call and data) that waits for its peer, if one does."""

    __slots__ = ("received", "sent", "waiting")

    def __init__(self) -> None:
        self.sent = 0
        self.received = 0
        self.waiting: tuple[Call, Any] | None = None


class _Meeting:
    """The ranks of one group that wait in its current collective, and its number."""

    __slots__ = ("arrived", "seq")

    def __init__(self) -> None:
        self.arrived: dict[int, tuple[Call, Any]] = {}  # world rank -> (call, data)
        self.seq = 0  # the number of the group's collective the ranks meet in now


class _Watchdog:
    """The alarm clock that stops a rank running its own code for too long.

    A real-time timer (``signal.setitimer``) rings when the rank running now will have run
    for the limit, counted from when the scheduler resumed it (:attr:`_Run.started`). If that
    rank still runs its own code then, the handler raises :class:`_Interrupted` in it: Python
    runs the handler between two bytecodes, and a ``time.sleep`` or a lock's ``acquire`` returns
    early to let it run. Otherwise the handler sets the timer for the rank running by then, so
    the timer is set once per ring, not once per switch. A rank that swallows the exception is
    stopped again after another limit. The caller's own alarm, if any, is put back afterwards.
    Only the main thread runs signal handlers: elsewhere (and in a world of one rank) the
    watchdog stays off.
    """

    def __init__(self, run: _Run) -> None:
        self.run = run
        self.active = False

    def __enter__(self) -> _Watchdog:
        if self.run.world_size > 1 and threading.current_thread() is threading.main_thread():
            self._handler = signal.signal(signal.SIGALRM, self._ring)
            self._timer = signal.setitimer(signal.ITIMER_REAL, 0)  # the caller's, paused
            self._entered = time.monotonic()
            self.active = True
            self.ring_in(self.run.limit())
        return self

    def ring_in(self, seconds: float) -> None:
        signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))

    def __exit__(self, *exc: object) -> None:
        if not self.active:
            return
        self.active = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._handler if self._handler is not None else 0)
        delay, interval = self._timer
        if delay > 0:
            left = delay - (time.monotonic() - self._entered)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), interval)

    def _ring(self, signum: int, frame: Any) -> None:
        run = self.run
        limit, rank = run.limit(), run.running
        if rank is None or run.alone(rank):  # no rank's own code, or no one waits for it
            self.ring_in(limit)
            return
        seconds = time.monotonic() - run.started
        if seconds < limit:
            self.ring_in(limit - seconds)
            return
        run.timed_out.setdefault(rank, seconds)
        run.stopped_at.setdefault(rank, line_of_frame(frame))
        run.started = time.monotonic()
        self.ring_in(limit)
        raise _Interrupted(f"rank {rank} was stopped after {seconds:.2f} s of its own code")


# -- one numpy computation per collective: every rank's result --------------------------------


def _ring_order(arrays: list[Any], rank: int) -> list[Any]:
    return arrays[rank:] + arrays[:rank]


def _reduce(arrays: list[np.ndarray], op: ReduceOp) -> np.ndarray:
    """``((x_0 ⊕ x_1) ⊕ x_2) ⊕ ...`` in a new C-ordered array (AVG: the sum over P)."""
    ufunc = np.maximum if op is ReduceOp.MAX else np.add
    total = np.empty(arrays[0].shape, arrays[0].dtype)
    if len(arrays) == 1:
        np.copyto(total, arrays[0])
    else:
        ufunc(arrays[0], arrays[1], out=total)
    for a in arrays[2:]:
        ufunc(total, a, out=total)
    if op is ReduceOp.AVG:
        np.divide(total, len(arrays), out=total)
    return total


def _same_order(op: ReduceOp, deterministic: bool, world_size: int) -> bool:
    """Whether every rank reduces in rank order (the order shows only in sums of P ≥ 3)."""
    return deterministic or op is ReduceOp.MAX or world_size <= 2


def _all_reduce(arrays: list[np.ndarray], call: Call, deterministic: bool) -> list[np.ndarray]:
    op, P = call.param("op"), len(arrays)
    if _same_order(op, deterministic, P):
        total = _reduce(arrays, op)
        return [total] + [total.copy() for _ in range(P - 1)]
    return [_reduce(_ring_order(arrays, r), op) for r in range(P)]


def _reduce_scatter(arrays: list[np.ndarray], call: Call, deterministic: bool) -> list[Any]:
    op, axis, P = call.param("op"), call.param("axis"), len(arrays)
    chunks = [np.split(a, P, axis=axis) for a in arrays]
    same = _same_order(op, deterministic, P)
    return [
        _reduce([c[r] for c in (chunks if same else _ring_order(chunks, r))], op) for r in range(P)
    ]


def _all_gather(arrays: list[np.ndarray], call: Call, deterministic: bool) -> list[Any]:
    gathered = np.concatenate(arrays, axis=call.param("axis"))
    return [gathered] + [gathered.copy() for _ in arrays[1:]]


def _all_to_all(arrays: list[np.ndarray], call: Call, deterministic: bool) -> list[Any]:
    P, counts = len(arrays), dict(call.params).get("send_counts")  # every rank's, when uneven
    cuts: list[Any] = [P] * P if counts is None else [np.cumsum(row)[:-1] for row in counts]
    chunks = [
        np.split(a, cut, axis=call.param("split_axis")) for a, cut in zip(arrays, cuts, strict=True)
    ]
    return [
        np.concatenate([c[r] for c in chunks], axis=call.param("concat_axis")) for r in range(P)
    ]


def _broadcast(arrays: list[np.ndarray], call: Call, deterministic: bool) -> list[Any]:
    source = arrays[call.param("src")]
    return [np.array(source, order="C") for _ in arrays]


def _scatter(arrays: list[np.ndarray], call: Call, deterministic: bool) -> list[Any]:
    chunks = np.split(arrays[call.param("src")], len(arrays), axis=call.param("axis"))
    return [np.array(chunk, order="C") for chunk in chunks]


def _barrier(arrays: list[None], call: Call, deterministic: bool) -> list[Any]:
    return [None] * len(arrays)


COMPUTE: dict[str, Callable[[list[Any], Call, bool], list[Any]]] = {
    "all_reduce": _all_reduce,
    "reduce_scatter": _reduce_scatter,
    "all_gather": _all_gather,
    "all_to_all": _all_to_all,
    "broadcast": _broadcast,
    "scatter": _scatter,
    "barrier": _barrier,
}
"""Each collective's computation: every rank's input (None where a rank passed none), the
agreed call, whether to reduce in rank order; every rank's result."""
