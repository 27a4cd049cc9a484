"""Misuse of the collectives, on the simulated world and on gloo: every case ends within
seconds in an error that names the collective, the ranks and the mismatch (the same words on
both backends), nothing is ever reinterpreted, and no thread or process is left behind.

On gloo the ranks agree before any data moves, so a mismatch ends every rank at once and the
warm pool stays as it was; a run that outlasts its timeout stops the pool.
"""

from __future__ import annotations

import gc
import re
import threading
import time

import numpy as np
import pytest
from chainrule import dist
from greenlet import greenlet

BOUND = 10.0  # seconds: generous on a loaded machine, and far below gloo's own 30-min hangs

BACKENDS = [
    "sim",
    pytest.param("gloo", marks=pytest.mark.skipif(not dist.is_available("gloo"), reason="no gloo")),
]

LOCK = threading.Lock()  # module level: each gloo rank, a process, has its own


@pytest.fixture(autouse=True)
def _other_fixtures_processes_left_out():
    """This test process may hold other tests' long-lived fixtures (a browser, a server)."""
    pytest.importorskip("psutil")
    from process_tree import note_other_children

    note_other_children()


def processes() -> set[int]:
    """The pids of this process's descendants (other fixtures' left out)."""
    pytest.importorskip("psutil")
    from process_tree import descendants

    return {p.pid for p in descendants()}


def pool_processes() -> set[int]:
    """The processes of the live worker pools: their launchers and ranks."""
    from chainrule.dist import pool

    return {pid for p in pool._pools.values() for pid in (p.launcher.pid, *p.pids)}


def assert_nothing_left_behind(backend: str, world_size: int) -> None:
    assert [t.name for t in threading.enumerate() if t.name.startswith("chainrule")] == []
    if backend == "sim":
        here = greenlet.getcurrent()
        assert [g for g in gc.get_objects() if type(g) is greenlet and g and g is not here] == []
    else:
        extra = {p for p in processes() - pool_processes() if _alive(p)}
        assert extra == set(), "processes outside the warm pools are still running"
        assert dist.run(dist.rank, world_size, backend=backend) == list(range(world_size))


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def fails(fn, world_size: int, backend: str, error=dist.CollectiveError, **kwargs) -> str:
    """The message of the error ``dist.run(fn, ...)`` ends in, within :data:`BOUND` seconds."""
    start = time.monotonic()
    with pytest.raises(error) as info:
        dist.run(fn, world_size, backend=backend, **kwargs)
    assert time.monotonic() - start < BOUND
    assert_nothing_left_behind(backend, world_size)
    return str(info.value)


# -- mismatches: caught before any data moves -------------------------------------------------


def int_and_float():
    dtype = np.int64 if dist.rank() == 0 else np.float64  # the same bytes, other numbers
    return dist.all_reduce(np.ones(3, dtype))


def float32_and_int32():
    dtype = np.float32 if dist.rank() == 0 else np.int32
    return dist.all_reduce(np.ones(4, dtype))


def gather_of_shapes():
    return dist.all_gather(np.ones(2 + dist.rank()))


def reduce_with_ops():
    return dist.all_reduce(np.ones(2), op="max" if dist.rank() == 1 else "sum")


def different_collectives():
    dist.barrier()
    if dist.rank() == 1:
        return dist.all_gather(np.ones(2))
    return dist.all_reduce(np.ones(2))


def skips_the_last():
    dist.all_reduce(np.ones(2))
    if dist.rank() == 0:
        dist.all_reduce(np.ones(2))  # rank 1 has returned


def skips_one_in_the_middle():
    if dist.rank() == 0:
        dist.all_reduce(np.ones(2))  # rank 1 goes on to the barrier
    dist.barrier()


def nested_run():
    return dist.run(dist.rank, 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mismatched_dtypes_of_the_same_size_are_an_error_not_reinterpreted(backend):
    message = fails(int_and_float, 2, backend)
    assert message == "all_reduce #0: the ranks' dtypes differ: rank 0 int64; rank 1 float64"
    message = fails(float32_and_int32, 3, backend)
    assert message == "all_reduce #0: the ranks' dtypes differ: ranks 1, 2 int32; rank 0 float32"


@pytest.mark.parametrize("backend", BACKENDS)
def test_mismatched_shapes_in_all_gather(backend):
    message = fails(gather_of_shapes, 3, backend)
    assert (
        message == "all_gather #0: the ranks' shapes differ: rank 0 (2,); rank 1 (3,); rank 2 (4,)"
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_mismatched_reductions(backend):
    message = fails(reduce_with_ops, 2, backend)
    assert message == (
        "the ranks disagree on the arguments of all_reduce #0: rank 0: op=ReduceOp.SUM; "
        "rank 1: op=ReduceOp.MAX"
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_different_collectives_at_the_same_step(backend):
    message = fails(different_collectives, 2, backend)
    assert message.startswith(
        "rank 1 called all_gather while rank 0 called all_reduce (collective #1)"
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_skipped_collective(backend):
    message = fails(skips_the_last, 2, backend)
    assert message.startswith(
        "rank 0 is waiting in all_reduce #1 but rank 1 has already returned (after 1 collectives)"
    )
    message = fails(skips_one_in_the_middle, 2, backend)
    assert message.startswith(
        "rank 1 called barrier while rank 0 called all_reduce (collective #0)"
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_nested_run(backend):
    message = fails(nested_run, 2, backend)
    assert message.startswith(
        f"dist.run was called inside an SPMD function, on rank 0 of a {backend} world of 2"
    )


def counts_that_do_not_match():
    r = dist.rank()  # rank 1 expects two rows from rank 2, which sends it one
    expected = [1, 1, 2] if r == 1 else [1, 1, 1]
    return dist.all_to_all(np.ones((3, 2)), send_counts=[1, 1, 1], recv_counts=expected)


def counts_on_some_ranks():
    return dist.all_to_all(np.ones(3), send_counts=[1, 1, 1] if dist.rank() else None)


def rows_of_other_widths():
    return dist.all_to_all(np.ones((2, 2 + dist.rank())), send_counts=[1, 1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_uneven_all_to_all_is_agreed_on_every_rank_s_counts(backend):
    assert fails(counts_that_do_not_match, 3, backend) == (
        "all_to_all #0: rank 1 expects recv_counts=(1, 1, 2) but the ranks' send_counts send "
        "it (1, 1, 1)"
    )
    assert fails(counts_on_some_ranks, 3, backend) == (
        "all_to_all #0: ranks 1, 2 passed send_counts but rank 0 did not: every rank passes "
        "its own send_counts, or none does"
    )
    assert fails(rows_of_other_widths, 2, backend) == (
        "all_to_all #0: the ranks' shapes differ: rank 0 (·, 2); rank 1 (·, 3)"
    )


# -- a rank that does not come: the simulated world's watchdog, gloo's timeout ------------------


def holds_a_lock_across_a_collective():
    with LOCK:  # on one thread, rank 1 waits for the lock that rank 0 holds in the barrier
        dist.barrier()


def sleeps():
    if dist.rank() == 1:
        time.sleep(60)
    dist.barrier()


def spins():
    if dist.rank() == 1:
        while True:
            pass
    dist.barrier()


def stopped_after(message: str) -> float:
    return float(re.search(r"stopped after ([0-9.]+) s", message).group(1))


def test_a_lock_held_across_a_collective_is_stopped_on_the_simulated_world():
    message = fails(holds_a_lock_across_a_collective, 2, "sim", timeout=1.0)
    assert message.startswith("barrier #0 timed out after 1 s: rank 0 arrived but rank 1")
    assert 1.0 <= stopped_after(message) < BOUND
    assert not LOCK.locked()


@pytest.mark.skipif(not dist.is_available("gloo"), reason="no gloo")
def test_a_lock_held_across_a_collective_is_no_deadlock_on_gloo():
    start = time.monotonic()
    assert dist.run(holds_a_lock_across_a_collective, 2, backend="gloo") == [None, None]
    assert time.monotonic() - start < BOUND
    assert_nothing_left_behind("gloo", 2)


def rank_here():
    return dist.rank()


STUCK_AT = {  # where a late rank can be caught (a busy loop: its test or its body)
    sleeps: ["at line 3 of sleeps: time.sleep(60)"],
    spins: ["at line 3 of spins: while True:", "at line 4 of spins: pass"],
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [sleeps, spins], ids=["sleep", "busy loop"])
def test_a_rank_that_never_comes_is_named_with_the_collective_and_its_line(backend, fn):
    """The words of both backends: the collective the others wait in, the late rank, and the
    line it was running; the simulated world stops it, gloo stops its processes."""
    from chainrule.dist import pool

    dist.run(rank_here, 2, backend=backend)  # on gloo the ranks import this module now
    started = pool._pools.get(("gloo", 2)) if backend == "gloo" else None
    message = fails(fn, 2, backend, timeout=1.0)
    assert message.startswith(
        "barrier #0 timed out after 1 s: rank 0 arrived but rank 1 was still running its own code ("
    )
    assert any(_relative(where, fn) in message for where in STUCK_AT[fn]), message
    if started is None:
        assert 1.0 <= stopped_after(message) < BOUND  # the real time, not the sleep's 60 s
    else:
        assert "; the gloo worker processes were stopped and restart on the next call" in message
        stopped = {started.launcher.pid, *started.pids}
        assert not {p for p in stopped if _alive(p)}, "the stopped pool's processes still run"


def _relative(where: str, fn) -> str:
    """``where`` with the line counted in the file (the table counts from ``def``)."""
    number = int(re.search(r"line (\d+)", where).group(1))
    return where.replace(f"line {number}", f"line {fn.__code__.co_firstlineno + number - 1}")


def waits_for_the_one_who_sleeps():
    if dist.rank() == 1:
        time.sleep(60)
    return dist.all_reduce(np.ones(2))


def waits_for_the_one_who_spins():
    if dist.rank() == 1:
        while True:
            pass
    return dist.all_reduce(np.ones(2))


@pytest.mark.usefixtures("ctrl_c_raises")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "fn", [waits_for_the_one_who_sleeps, waits_for_the_one_who_spins], ids=["sleep", "busy loop"]
)
def test_an_interrupt_ends_a_stuck_run_at_once(backend, fn):
    import os
    import signal

    dist.run(dist.rank, 2, backend=backend)  # a warm pool on gloo: the interrupt, not a start
    sent = []

    def interrupt():
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)  # what JupyterLab's Interrupt sends the kernel

    timer = threading.Timer(0.5, interrupt)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        dist.run(fn, 2, backend=backend, timeout=60)  # a timeout would take a minute
    timer.join()
    assert time.monotonic() - sent[0] < BOUND
    assert_nothing_left_behind(backend, 2)  # and the next run works


def catches_the_mismatch():
    try:
        dist.all_reduce(np.ones(2 + dist.rank()))
    except dist.CollectiveError:
        return "caught"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_caught_mismatch_still_fails_the_run(backend):
    message = fails(catches_the_mismatch, 2, backend)
    assert message == "all_reduce #0: the ranks' shapes differ: rank 0 (2,); rank 1 (3,)"


def test_a_stack_of_code_sent_by_value_is_read_in_the_callers_file():
    """A notebook's function reaches a gloo rank by value, its file renamed: the line is read
    from the caller's own copy; Python's, the packages' and the library's frames are passed."""
    import linecache

    from chainrule.dist import whereabouts, worker

    dump = (
        "Thread 0x01 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n\n'
        "Current thread 0x02 (most recent call first):\n"
        f'  File "{np.__file__}", line 5 in helper\n'
        f'  File "{whereabouts.__file__}", line 9 in waiting_in\n'
        '  File "<dynamic-code>", line 3 in sleeps\n'
        f'  File "{worker.__file__}", line 240 in run_task\n'
    )
    line = whereabouts.own_line(dump, {"sleeps": {__file__}})
    assert line == whereabouts.Line("sleeps", 3, linecache.getline(__file__, 3).strip())
    assert str(line) == f"line 3 of sleeps: {line.text}"
    assert whereabouts.own_line(dump.replace("run_task", "serve"), {}) is None


def late_after_a_collective():
    dist.all_reduce(np.ones(2))
    if dist.rank() == 1:  # the last to arrive: it goes on in its own code without a switch
        time.sleep(60)
    dist.all_reduce(np.ones(2))


def test_the_last_rank_to_arrive_is_watched_as_it_goes_on():
    message = fails(late_after_a_collective, 2, "sim", timeout=1.0)
    assert message.startswith("all_reduce #1 timed out after 1 s: rank 0 arrived but rank 1")
    assert 1.0 <= stopped_after(message) < BOUND
