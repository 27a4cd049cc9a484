"""The simulated world: every collective against a numpy reference, determinism, the trace,
per-rank state across greenlet switches, and every failure ending quickly in a clear error
with no rank's greenlet and no thread left behind."""

from __future__ import annotations

import functools
import gc
import re
import threading
import time

import chainrule as cr
import numpy as np
import pytest
from chainrule import Tensor, dist
from chainrule.dist import simulated
from greenlet import greenlet

WORLD_SIZES = range(1, 9)
DTYPES = [np.float32, np.float64, np.int64]
LARGE_BYTES = 1 << 21  # 2 MB a rank
# Seconds within which a failure must end when the code it stops would run for 60 s or a
# timeout of 20 s or more would otherwise end it: generous on a busy machine, and still far
# from what it tells apart.
PROMPTLY = 10.0
REDUCTIONS = [  # AVG of integers is rejected (test_avg_of_integers_is_rejected)
    (op, dtype)
    for op in ("sum", "avg", "max")
    for dtype in DTYPES
    if not (op == "avg" and dtype is np.int64)
]


def rank_threads() -> list[threading.Thread]:
    """Threads of the simulated world still running (it starts none)."""
    return [t for t in threading.enumerate() if t.name.startswith("chainrule-sim")]


def live_greenlets() -> list[greenlet]:
    """Greenlets started and not ended (a rank's greenlet left suspended), but this one."""
    here = greenlet.getcurrent()
    return [g for g in gc.get_objects() if type(g) is greenlet and g and g is not here]


@pytest.fixture(autouse=True)
def no_rank_thread_left():
    yield
    assert rank_threads() == [], "a thread of the simulated world is still running"


def inputs(P: int, shape: tuple[int, ...], dtype: type, seed: int) -> list[np.ndarray]:
    """Rank r's input: random values of ``dtype`` (integers small enough never to overflow)."""
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        return [rng.integers(-1000, 1000, size=shape).astype(dtype) for _ in range(P)]
    return [
        (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, size=shape)).astype(dtype)
        for _ in range(P)
    ]


def random_shape(rng: np.random.Generator, P: int, divisible_axis: int | None = None) -> tuple:
    shape = [int(n) for n in rng.integers(1, 5, size=rng.integers(1, 4))]
    if divisible_axis is not None:
        divisible_axis %= len(shape)
        shape[divisible_axis] = P * int(rng.integers(1, 4))
    return tuple(shape)


def run_per_rank(P: int, fn, xs: list, **kwargs) -> list:
    """Run ``fn(x_r)`` on every rank r of a simulated world."""
    return dist.run(lambda: fn(xs[dist.rank()]), P, **kwargs)


def rank_order_reduce(xs: list[np.ndarray], op: str) -> np.ndarray:
    if op == "max":
        return functools.reduce(np.maximum, xs)
    total = functools.reduce(np.add, xs)
    return total / len(xs) if op == "avg" else total


def assert_same(actual: np.ndarray, expected: np.ndarray) -> None:
    """Equal values (bit for bit) and the same dtype and shape."""
    assert isinstance(actual, np.ndarray)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    np.testing.assert_array_equal(actual, expected, strict=True)


# -- every collective against numpy -----------------------------------------------------------


@pytest.mark.parametrize("P", WORLD_SIZES)
@pytest.mark.parametrize(("op", "dtype"), REDUCTIONS)
def test_all_reduce_matches_numpy(P, dtype, op):
    rng = np.random.default_rng(P * 100 + len(op))
    xs = inputs(P, random_shape(rng, P), dtype, seed=P)
    results = run_per_rank(P, lambda x: dist.all_reduce(x, op=op), xs)
    expected = rank_order_reduce(xs, op)
    for result in results:
        assert_same(result, expected)


@pytest.mark.parametrize("P", WORLD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather_matches_numpy(P, dtype):
    rng = np.random.default_rng(P)
    shape = random_shape(rng, P)
    axis = int(rng.integers(-len(shape), len(shape)))
    xs = inputs(P, shape, dtype, seed=P + 1)
    results = run_per_rank(P, lambda x: dist.all_gather(x, axis=axis), xs)
    expected = np.concatenate(xs, axis=axis)
    for result in results:
        assert_same(result, expected)


@pytest.mark.parametrize("P", WORLD_SIZES)
@pytest.mark.parametrize(("op", "dtype"), REDUCTIONS)
def test_reduce_scatter_matches_numpy(P, dtype, op):
    rng = np.random.default_rng(P + 7)
    axis = int(rng.integers(0, 3))
    shape = random_shape(rng, P, divisible_axis=axis)
    axis %= len(shape)
    xs = inputs(P, shape, dtype, seed=P + 2)
    results = run_per_rank(P, lambda x: dist.reduce_scatter(x, op=op, axis=axis), xs)
    expected = np.split(rank_order_reduce(xs, op), P, axis=axis)
    for r, result in enumerate(results):
        assert_same(result, expected[r])


@pytest.mark.parametrize("P", WORLD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_to_all_matches_numpy(P, dtype):
    rng = np.random.default_rng(P + 11)
    split_axis = int(rng.integers(0, 3))
    shape = random_shape(rng, P, divisible_axis=split_axis)
    split_axis %= len(shape)
    concat_axis = int(rng.integers(0, len(shape)))
    xs = inputs(P, shape, dtype, seed=P + 3)
    results = run_per_rank(
        P, lambda x: dist.all_to_all(x, split_axis=split_axis, concat_axis=concat_axis), xs
    )
    for r, result in enumerate(results):
        chunks = [np.split(x, P, axis=split_axis)[r] for x in xs]
        assert_same(result, np.concatenate(chunks, axis=concat_axis))


@pytest.mark.parametrize("P", WORLD_SIZES)
def test_all_to_all_twice_with_swapped_axes_is_the_identity(P):
    xs = inputs(P, (2 * P, 3 * P), np.float64, seed=5)

    def there_and_back(x):
        y = dist.all_to_all(x, split_axis=1, concat_axis=0)
        return dist.all_to_all(y, split_axis=0, concat_axis=1)

    for x, result in zip(xs, run_per_rank(P, there_and_back, xs), strict=True):
        assert_same(result, x)


@pytest.mark.parametrize("P", WORLD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_matches_numpy(P, dtype):
    src = P - 1
    xs = inputs(P, (3, 2), dtype, seed=P + 4)
    # Even ranks pass None, odd ranks an array of the source's shape: both are allowed.
    results = run_per_rank(
        P, lambda x: dist.broadcast(x if dist.rank() % 2 or dist.rank() == src else None, src), xs
    )
    for result in results:
        assert_same(result, xs[src])


@pytest.mark.parametrize("P", WORLD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_matches_numpy(P, dtype):
    src = P // 2
    x = inputs(1, (3, 2 * P), dtype, seed=P + 5)[0]
    results = dist.run(lambda: dist.scatter(x if dist.rank() == src else None, src, axis=1), P)
    for r, result in enumerate(results):
        assert_same(result, np.split(x, P, axis=1)[r])


@pytest.mark.parametrize("P", [1, 3, 8])
def test_barrier_waits_for_every_rank(P):
    arrived: list[int] = []

    def fn():
        arrived.append(dist.rank())
        dist.barrier()
        return len(arrived)  # every rank sees all arrivals after the barrier

    assert dist.run(fn, P) == [P] * P


def test_rank_and_world_size_inside_and_results_in_rank_order():
    assert dist.run(lambda: (dist.rank(), dist.world_size()), 5) == [(r, 5) for r in range(5)]


def test_args_and_kwargs_are_passed_to_every_rank():
    results = dist.run(lambda a, b=0: a * 10 + b + dist.rank(), 3, args=(2,), kwargs={"b": 5})
    assert results == [25, 26, 27]


# -- values of every kind ---------------------------------------------------------------------


def test_results_are_fresh_and_inputs_unchanged():
    P = 4
    xs = inputs(P, (8, 4), np.float64, seed=9)
    copies = [x.copy() for x in xs]

    def fn(x):
        outs = [
            dist.all_reduce(x),
            dist.all_gather(x),
            dist.reduce_scatter(x),
            dist.all_to_all(x),
            dist.broadcast(x),
            dist.scatter(x),
        ]
        return outs

    results = run_per_rank(P, fn, xs)
    for x, original in zip(xs, copies, strict=True):
        assert_same(x, original)
    for k in range(6):
        per_rank = [results[r][k] for r in range(P)]
        for a in per_rank:
            for x in xs:
                assert not np.shares_memory(a, x)
        for i in range(P):
            for j in range(i + 1, P):
                assert not np.shares_memory(per_rank[i], per_rank[j])
    # mutating one rank's result leaves another's alone
    before = results[1][0].copy()
    results[0][0][...] = -1
    assert_same(results[1][0], before)


def test_chainrule_tensor_in_new_plain_tensor_out():
    xs = [Tensor(np.arange(4.0) * (r + 1), requires_grad=True) for r in range(3)]
    results = run_per_rank(3, dist.all_reduce, xs)
    for result, x in zip(results, xs, strict=True):
        assert isinstance(result, Tensor)
        assert result is not x and not result.requires_grad and result.is_leaf
        np.testing.assert_array_equal(result.data, np.arange(4.0) * 6)
    np.testing.assert_array_equal(xs[0].data, np.arange(4.0))


def test_tensor_of_float32_keeps_its_dtype():
    xs = [Tensor(np.ones(3), dtype=np.float32) for _ in range(2)]
    results = run_per_rank(2, lambda x: dist.all_gather(x), xs)
    assert all(r.data.dtype == np.float32 and r.shape == (6,) for r in results)


def test_python_numbers_become_arrays():
    results = dist.run(lambda: dist.all_reduce(dist.rank() + 0.5), 4)
    assert all(isinstance(r, np.ndarray) and r.shape == () and r == 8.0 for r in results)
    gathered = dist.run(lambda: dist.all_gather(float(dist.rank())), 3)
    assert_same(gathered[2], np.array([0.0, 1.0, 2.0]))
    lists = dist.run(lambda: dist.all_reduce([1, 2]), 2)
    assert_same(lists[0], np.array([2, 4]))


def test_torch_tensors_in_torch_tensors_out():
    torch = pytest.importorskip("torch")
    xs = [torch.arange(6, dtype=torch.float32).reshape(2, 3) * (r + 1) for r in range(2)]
    xs[0].requires_grad_(True)
    results = run_per_rank(2, lambda x: dist.all_reduce(x, op="max"), xs)
    for result in results:
        assert isinstance(result, torch.Tensor) and result.dtype == torch.float32
        assert torch.equal(result, xs[1])
    halves = run_per_rank(2, dist.reduce_scatter, [x.detach() for x in xs])
    assert torch.equal(torch.cat(halves), xs[0].detach() + xs[1])
    bf16 = run_per_rank(2, dist.all_gather, [torch.ones(2, dtype=torch.bfloat16)] * 2)
    assert bf16[0].dtype == torch.bfloat16 and bf16[0].shape == (4,)


def test_reduce_op_accepts_names_and_rejects_others():
    assert dist.ReduceOp.coerce("SUM") is dist.ReduceOp.SUM
    assert dist.ReduceOp.coerce(dist.ReduceOp.MAX) is dist.ReduceOp.MAX
    with pytest.raises(ValueError, match="unknown reduction"):
        dist.ReduceOp.coerce("min")


def test_avg_of_integers_is_rejected():
    with pytest.raises(dist.RankError, match="AVG of an integer array"):
        dist.run(lambda: dist.all_reduce(np.arange(3), op=dist.ReduceOp.AVG), 2)


def test_non_numbers_are_rejected():
    with pytest.raises(dist.RankError, match="collectives move numbers"):
        dist.run(lambda: dist.all_reduce("text"), 2)


# -- determinism ------------------------------------------------------------------------------


def summands(P: int, n: int = 4000) -> list[np.ndarray]:
    """Floats of very different magnitudes, so the order of the additions shows."""
    rng = np.random.default_rng(0)
    return [rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, size=n) for _ in range(P)]


def test_deterministic_results_are_bitwise_identical_in_rank_order():
    P = 5
    xs = summands(P)
    results = run_per_rank(P, dist.all_reduce, xs)
    expected = (((xs[0] + xs[1]) + xs[2]) + xs[3]) + xs[4]
    for result in results:
        assert result.tobytes() == expected.tobytes()


@pytest.mark.parametrize("P", [3, 4, 8])
def test_non_deterministic_ranks_reduce_in_their_ring_order(P):
    xs = summands(P)
    results = run_per_rank(P, dist.all_reduce, xs, deterministic=False)
    for r, result in enumerate(results):
        ring = [xs[(r + i) % P] for i in range(P)]
        assert result.tobytes() == functools.reduce(np.add, ring).tobytes()
    # Same values up to rounding, but not the same bits on every rank.
    for result in results:
        np.testing.assert_allclose(result, results[0], rtol=1e-12, atol=1e-9)
    assert len({result.tobytes() for result in results}) > 1


def test_non_deterministic_reduce_scatter_and_avg_differ_in_the_last_bits_only():
    P = 4
    xs = [np.tile(x, P) for x in summands(P, 1000)]
    chunks = run_per_rank(P, lambda x: dist.reduce_scatter(x, op="avg"), xs, deterministic=False)
    same = run_per_rank(P, lambda x: dist.reduce_scatter(x, op="avg"), xs)
    assert any(a.tobytes() != b.tobytes() for a, b in zip(chunks, same, strict=True))
    for a, b in zip(chunks, same, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-9)


def test_replicas_drift_apart_only_without_determinism():
    """Plain SGD on replicated weights: identical forever in rank order, drifting otherwise."""
    P = 4

    def train():
        rng = np.random.default_rng(dist.rank())
        w = np.ones(64)
        for _ in range(50):
            g = rng.standard_normal(64) * 10.0 ** rng.integers(-6, 6, size=64)
            w = w - 1e-3 * dist.all_reduce(g, op="avg")
        return w

    same = dist.run(train, P)
    assert len({w.tobytes() for w in same}) == 1
    drifted = dist.run(train, P, deterministic=False)
    assert len({w.tobytes() for w in drifted}) > 1


# -- the trace --------------------------------------------------------------------------------


def test_trace_records_one_event_per_collective():
    trace = dist.Trace()
    P = 4

    def step():
        x = np.ones((8, 2), np.float32) * dist.rank()
        dist.all_reduce(x, op="avg")
        dist.all_gather(x[: dist.world_size()], axis=1)
        dist.reduce_scatter(x)
        dist.broadcast(x if dist.rank() == 2 else None, src=2)
        dist.barrier()
        dist.all_reduce(x)

    dist.run(step, P, trace=trace)
    assert len(trace) == 6
    assert trace.count("all_reduce") == 2 and trace.count() == 6
    assert trace.ops() == [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "barrier",
        "all_reduce",
    ]
    first = trace[0]
    assert first.seq == 0 and first.op == "all_reduce"
    assert first.shapes == ((8, 2),) * P and first.dtype == "float32" and first.nbytes == 64
    assert first.ranks == (0, 1, 2, 3) and first.kwargs == {"op": dist.ReduceOp.AVG}
    assert trace[1].shapes == ((4, 2),) * P and trace[1].kwargs == {"axis": 1}
    assert trace[3].shapes == (None, None, (8, 2), None) and trace[3].kwargs == {"src": 2}
    assert trace[3].nbytes == 64
    assert trace[4].shapes == (None,) * P and trace[4].nbytes == 0
    assert [e.seq for e in trace] == list(range(6))
    assert trace.total_bytes("all_reduce") == 128

    rows = trace.to_rows()
    assert rows[0]["op"] == "all_reduce" and rows[0]["shape"] == (8, 2)
    assert "op=AVG" in rows[0]["args"]
    table = str(trace)
    assert table.splitlines()[0].split()[:3] == ["seq", "op", "shape"]
    assert "reduce_scatter" in table and len(table.splitlines()) == 2 + 6
    assert "6" in repr(trace)

    trace.clear()
    assert len(trace) == 0 and str(trace) == "Trace (no collectives)"


def test_trace_accumulates_over_runs_and_world_default():
    trace = dist.Trace()
    world = dist.SimulatedWorld(2, trace=trace)
    world.run(lambda: dist.all_reduce(1.0))
    world.run(lambda: [dist.barrier(), dist.barrier()])
    assert trace.ops() == ["all_reduce", "barrier", "barrier"]
    assert [e.seq for e in trace] == [0, 0, 1]  # numbered within each run
    untraced = dist.SimulatedWorld(2)
    untraced.run(lambda: dist.all_reduce(1.0), trace=trace)
    assert len(trace) == 4


def test_without_trace_nothing_is_recorded():
    trace = dist.Trace()
    dist.run(lambda: dist.all_reduce(1.0), 2)
    assert len(trace) == 0


# -- failures: clear errors, within seconds, no thread left -----------------------------------


def run_failing(fn, P=4, error=dist.CollectiveError, **kwargs):
    """The failure of ``dist.run(fn, P)``, within :data:`PROMPTLY` seconds. Without a
    ``timeout`` the run may wait 30 s, so a failure that is not detected but waited out fails
    the bound (the default timeout of 5 s would be inside it)."""
    kwargs.setdefault("timeout", 30.0)
    start = time.monotonic()
    with pytest.raises(error) as info:
        dist.run(fn, P, **kwargs)
    elapsed = time.monotonic() - start
    assert elapsed < PROMPTLY, f"took {elapsed:.1f} s to fail"
    assert rank_threads() == []
    assert live_greenlets() == []
    return str(info.value), info.value


def test_different_collectives_at_the_same_step():
    def fn():
        for _ in range(5):
            dist.barrier()
        if dist.rank() == 1:
            return dist.all_gather(np.ones(2))
        return dist.all_reduce(np.ones(2))

    message, _ = run_failing(fn)
    assert message.startswith(
        "rank 1 called all_gather while ranks 0, 2, 3 called all_reduce (collective #5)"
    )


def test_mismatched_shapes_name_the_ranks():
    message, _ = run_failing(lambda: dist.all_reduce(np.ones(2 + (dist.rank() == 3))))
    assert message == "all_reduce #0: the ranks' shapes differ: ranks 0, 1, 2 (2,); rank 3 (3,)"


def test_mismatched_dtypes_name_the_ranks():
    def fn():
        return dist.all_gather(np.ones(2, np.float32 if dist.rank() == 0 else np.float64))

    message, _ = run_failing(fn, P=3)
    assert "all_gather #0" in message and "dtypes differ" in message
    assert "ranks 1, 2 float64" in message and "rank 0 float32" in message


def test_mismatched_arguments_name_the_ranks():
    message, _ = run_failing(
        lambda: dist.all_reduce(1.0, op="max" if dist.rank() == 2 else "sum"), P=3
    )
    assert "disagree on the arguments of all_reduce #0" in message
    assert "ranks 0, 1: op=ReduceOp.SUM" in message and "rank 2: op=ReduceOp.MAX" in message


def test_broadcast_with_a_different_shape_than_the_source():
    message, _ = run_failing(lambda: dist.broadcast(np.ones(2 + dist.rank())), P=2)
    assert "broadcast #0: rank 1 passed shape (3,)" in message and "source rank 0" in message


def test_a_rank_that_returned_while_others_wait():
    def fn():
        for _ in range(3):
            dist.all_reduce(1.0)
        if dist.rank() == 2:
            return  # the others go on to all_reduce #3
        dist.all_reduce(1.0)

    message, _ = run_failing(fn)
    assert message.startswith(
        "ranks 0, 1, 3 are waiting in all_reduce #3 but rank 2 has already returned "
        "(after 3 collectives)"
    )


def test_a_rank_that_returned_before_the_others_arrive():
    def fn():
        if dist.rank() == 0:
            return None
        return dist.all_reduce(1.0)

    message, _ = run_failing(fn, P=3)
    assert "waiting in all_reduce #0 but rank 0 has already returned" in message


def test_an_exception_on_one_rank_is_a_rank_error_and_releases_the_others():
    def buggy_step():
        dist.barrier()
        if dist.rank() == 2:
            raise ValueError("bad learning rate")
        dist.all_reduce(np.ones(2))

    message, error = run_failing(buggy_step, error=dist.RankError)
    assert error.rank == 2 and error.exc_type == "ValueError"
    assert message.startswith("rank 2 raised ValueError: bad learning rate")
    assert "buggy_step" in error.traceback_text and "raise ValueError" in error.traceback_text
    assert isinstance(error.original, ValueError)


def test_several_ranks_raising_report_the_lowest():
    def fn():
        dist.barrier()
        raise KeyError(dist.rank())

    _, error = run_failing(fn, error=dist.RankError)
    assert error.rank == 0
    assert any("also raised" in note for note in getattr(error, "__notes__", []))


def test_a_slow_rank_times_out_naming_the_missing_rank():
    def fn():
        if dist.rank() == 2:
            time.sleep(60)
        dist.all_reduce(1.0)

    start = time.monotonic()
    message, _ = run_failing(fn, timeout=0.2)
    assert message.startswith(
        "all_reduce #0 timed out after 0.2 s: ranks 0, 1, 3 arrived but rank 2 was still "
        "running its own code"
    )
    assert time.monotonic() - start < PROMPTLY  # the sleep was cut short


def test_a_rank_stuck_in_a_loop_is_interrupted():
    def fn():
        if dist.rank() == 1:
            while True:
                pass
        dist.barrier()

    message, _ = run_failing(fn, P=3, timeout=0.2)
    assert "barrier #0 timed out" in message and "rank 1 was still running" in message


def test_a_sleeping_rank_is_stopped_within_its_timeout_and_the_message_says_when():
    world = dist.SimulatedWorld(2, timeout=0.2)

    def first():
        if dist.rank() == 1:
            try:
                time.sleep(60)  # stopped by the watchdog's alarm after 0.2 s
            except BaseException:  # swallows the interruption...
                pass
            dist.barrier()  # ...and then calls a collective: it is stopped again
            return "stale"
        dist.barrier()

    start = time.monotonic()
    with pytest.raises(dist.CollectiveError) as info:
        world.run(first)
    assert time.monotonic() - start < PROMPTLY
    message = str(info.value)
    assert message.startswith("barrier #0 timed out after 0.2 s: rank 0 arrived but rank 1")
    seconds = float(re.search(r"stopped after ([0-9.]+) s", message).group(1))
    assert 0.2 <= seconds < PROMPTLY  # the real time the rank ran, not the sleep's 60 s
    assert live_greenlets() == []

    def second():
        return sum(float(dist.all_reduce(1.0)) for _ in range(10))

    world.timeout = 5.0
    assert world.run(second) == [20.0, 20.0]


def test_timeout_is_configurable():
    def fn():
        time.sleep(0.3 * (dist.rank() == 0))
        return dist.all_reduce(1.0)

    assert dist.run(fn, 2, timeout=2.0) == [2.0, 2.0]


def test_errors_inside_a_collective_reach_every_rank():
    seen: list[str] = []

    def fn():
        try:
            dist.all_reduce(np.ones(1 + dist.rank()))
        except dist.CollectiveError as exc:
            seen.append(str(exc))
            raise

    run_failing(fn, P=3)
    assert len(seen) == 3 and len(set(seen)) == 1


def test_local_argument_errors_are_raised_on_the_rank():
    _, error = run_failing(lambda: dist.reduce_scatter(np.ones(3)), P=2, error=dist.RankError)
    assert "does not split into 2 equal chunks" in str(error)
    _, error = run_failing(lambda: dist.all_gather(np.ones(3), axis=2), P=2, error=dist.RankError)
    assert error.exc_type == "IndexError"
    _, error = run_failing(lambda: dist.broadcast(None, src=0), P=2, error=dist.RankError)
    assert "source rank 0 must pass an array" in str(error)
    _, error = run_failing(lambda: dist.scatter(np.ones(4), src=5), P=2, error=dist.RankError)
    assert "src=5 is not a rank" in str(error)


def test_a_world_can_run_again_after_a_failure():
    world = dist.SimulatedWorld(3, timeout=0.5)
    with pytest.raises(dist.CollectiveError):
        world.run(lambda: dist.all_reduce(np.ones(1 + dist.rank())))
    assert world.run(lambda: dist.all_reduce(1.0)) == [3.0] * 3


def test_outside_any_world_is_an_error():
    for call in (dist.rank, dist.world_size, lambda: dist.all_reduce(1.0), dist.barrier):
        with pytest.raises(dist.NoWorldError, match="only inside a function started by"):
            call()
    assert not dist.in_world()
    assert dist.run(lambda: dist.in_world(), 2) == [True, True]


def test_run_validates_its_arguments():
    with pytest.raises(ValueError, match="at least 1"):
        dist.run(lambda: None, 0)
    with pytest.raises(TypeError):
        dist.run(lambda: None, 2.0)
    with pytest.raises(ValueError, match="unknown backend"):
        dist.run(lambda: None, 2, backend="mpi")
    with pytest.raises(ValueError, match="timeout"):
        dist.run(lambda: None, 2, timeout=0)


def test_a_notebook_style_function_runs():
    namespace = {"__name__": "__main__"}
    exec(
        "from chainrule import dist\nimport numpy as np\n"
        "def step(scale):\n    return dist.all_reduce(np.ones(2) * dist.rank() * scale)\n",
        namespace,
    )
    results = dist.run(namespace["step"], 3, args=(2.0,))
    assert_same(results[0], np.array([6.0, 6.0]))


def test_backends_are_listed():
    assert dist.is_available("sim") and "sim" in dist.available_backends()
    assert not dist.is_available("mpi")


def test_default_timeout_is_a_few_seconds():
    assert 1.0 <= simulated.DEFAULT_TIMEOUT <= 10.0


# -- large arrays -----------------------------------------------------------------------------


@pytest.mark.parametrize("P", [2, 3, 5])
@pytest.mark.parametrize("deterministic", [True, False])
def test_large_all_reduce_is_exact(P, deterministic):
    n = LARGE_BYTES // 8 + 12345  # several blocks and a ragged end
    xs = summands(P, n)
    for op in ("sum", "avg", "max"):
        results = run_per_rank(
            P, lambda x, op=op: dist.all_reduce(x, op=op), xs, deterministic=deterministic
        )
        for r, result in enumerate(results):
            order = range(P) if deterministic or op == "max" else [(r + i) % P for i in range(P)]
            expected = rank_order_reduce([xs[j] for j in order], op)
            assert result.tobytes() == expected.tobytes()


def test_large_non_contiguous_inputs_are_reduced_too():
    xs = [x.reshape(-1, 2)[:, 0] for x in summands(3, LARGE_BYTES // 4)]
    for result in run_per_rank(3, dist.all_reduce, xs):
        assert result.tobytes() == rank_order_reduce(xs, "sum").tobytes()


@pytest.mark.usefixtures("ctrl_c_raises")
def test_ctrl_c_while_waiting_stops_every_rank():
    import os
    import signal

    def fn():
        if dist.rank() == 0:
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C or a notebook's interrupt sends
        if dist.rank() == 1:
            while True:  # busy in its own code: interrupted by an injected exception
                time.sleep(0.01)
        dist.barrier()

    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        dist.run(fn, 3, timeout=20)
    assert time.monotonic() - start < PROMPTLY


# -- greenlets: one thread, per-rank state, immediate deadlock detection ----------------------


def test_ranks_run_in_the_calling_thread():
    assert dist.run(lambda: threading.get_ident(), 3) == [threading.get_ident()] * 3


def test_a_rank_that_returned_is_detected_without_waiting_for_the_timeout():
    def fn():
        if dist.rank() == 1:
            return None
        return dist.all_reduce(1.0)

    start = time.monotonic()
    message, _ = run_failing(fn, P=3, timeout=30.0)
    assert time.monotonic() - start < PROMPTLY  # not the timeout's 30 s
    assert message.startswith("ranks 0, 2 are waiting in all_reduce #0 but rank 1 has already")


def test_no_grad_on_one_rank_does_not_reach_another():
    def fn():
        seen = []
        if dist.rank() == 0:
            with cr.no_grad():
                dist.barrier()  # the other ranks run while rank 0 is inside no_grad
                seen.append(cr.is_grad_enabled())
        else:
            dist.barrier()
            seen.append(cr.is_grad_enabled())
        x = Tensor(np.ones(2), requires_grad=True)
        seen.append((x * 2.0).requires_grad)
        return seen

    with cr.no_grad():  # nor does the caller's: each rank starts as a new thread would
        results = dist.run(fn, 3)
    assert results == [[False, True], [True, True], [True, True]]


def test_torch_grad_mode_is_per_rank_across_collectives():
    torch = pytest.importorskip("torch")

    def step():
        w = torch.ones(3, dtype=torch.float64, requires_grad=True)
        (w * (dist.rank() + 1.0)).sum().backward()
        with torch.no_grad():  # as in an SGD step: the all-reduce switches to the other ranks
            before = torch.is_grad_enabled()
            w -= 0.1 * dist.all_reduce(w.grad, op="avg")
            after = torch.is_grad_enabled()
        return before, after, torch.is_grad_enabled(), w.detach().numpy().copy()

    torch.set_grad_enabled(False)
    try:
        results = dist.run(step, 3)
        assert not torch.is_grad_enabled()  # the caller's mode is restored
    finally:
        torch.set_grad_enabled(True)
    for before, after, outside, w in results:
        assert (before, after, outside) == (False, False, True)
        np.testing.assert_allclose(w, 1.0 - 0.1 * 2.0)


def test_a_collective_inside_torch_backward_is_refused():
    torch = pytest.importorskip("torch")

    class SumGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return dist.all_reduce(grad)

    def fn():
        x = torch.ones(2, requires_grad=True)
        SumGrad.apply(x).sum().backward()
        return x.grad

    _, error = run_failing(fn, P=2, error=dist.RankError)
    assert "inside torch's autograd engine" in str(error)
    assert torch.is_grad_enabled()


@pytest.mark.usefixtures("ctrl_c_raises")
def test_ctrl_c_ends_the_waiting_ranks_and_runs_their_cleanup():
    import os
    import signal

    cleaned: list[int] = []

    def fn():
        dist.barrier()
        try:
            if dist.rank() == 2:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # the interrupt arrives here
            dist.barrier()
        finally:
            cleaned.append(dist.rank())

    with pytest.raises(KeyboardInterrupt):
        dist.run(fn, 4, timeout=20)
    assert sorted(cleaned) == [0, 1, 2, 3]
    assert live_greenlets() == []


def test_the_timeout_bounds_each_ranks_own_code_not_the_whole_round():
    def fn():
        time.sleep(0.2)  # the ranks run one after the other: 1.6 s in all, 0.2 s each
        return dist.all_reduce(1.0)

    assert dist.run(fn, 8, timeout=1.0) == [8.0] * 8


def test_no_timeout_once_every_other_rank_has_returned():
    def fn():
        if dist.rank() == 1:
            time.sleep(0.3)  # rank 0 has returned (ranks start in order): no one waits for it
        return dist.rank()

    assert dist.run(fn, 2, timeout=0.1) == [0, 1]


# -- many collectives in a row ---------------------------------------------------------------


def test_torch_grad_mode_stays_per_rank_over_many_collectives():
    torch = pytest.importorskip("torch")

    def fn():
        dist.barrier()  # the ranks have started: from here on a waiting rank hands over
        torch.set_grad_enabled(dist.rank() % 2 == 0)
        seen = []
        for _ in range(4):
            dist.all_reduce(np.ones(3))
            seen.append(torch.is_grad_enabled())
        return seen

    try:
        results = dist.run(fn, 5)
    finally:
        torch.set_grad_enabled(True)
    assert results == [[r % 2 == 0] * 4 for r in range(5)]


def test_the_timeout_restarts_for_each_rank():
    def fn():
        total = 0.0
        for _ in range(6):
            time.sleep(0.2)  # 1.2 s of each rank's own code in all, 0.2 s between collectives
            total += float(dist.all_reduce(1.0))
        return total

    assert dist.run(fn, 2, timeout=1.0) == [12.0] * 2


def test_a_rank_stuck_after_a_few_collectives_is_interrupted():
    def fn():
        for _ in range(3):
            dist.all_reduce(np.ones(2))
        if dist.rank() == 2:
            while True:
                pass
        dist.barrier()

    message, _ = run_failing(fn, P=4, timeout=0.2)
    assert message.startswith("barrier #3 timed out after 0.2 s: ranks 0, 1, 3 arrived")
    assert "rank 2 was still running its own code" in message


def test_an_exception_after_a_few_collectives_releases_the_waiting_ranks():
    def fn():
        for _ in range(3):
            dist.all_reduce(np.ones(2))
        if dist.rank() == 3:
            raise ValueError("late")
        dist.all_reduce(np.ones(2))

    message, error = run_failing(fn, error=dist.RankError)
    assert error.rank == 3 and message.startswith("rank 3 raised ValueError: late")


def test_many_rounds_in_a_world_of_one_and_of_many():
    for P in (1, 2, 7):
        results = dist.run(
            lambda: [float(dist.all_reduce(np.float64(dist.rank()))) for _ in range(50)], P
        )
        assert results == [[P * (P - 1) / 2] * 50] * P


# -- every dtype and order, and copies of every layout -----------------------------------------


@pytest.mark.parametrize("P", [2, 3, 4])
@pytest.mark.parametrize(("op", "dtype"), [*REDUCTIONS, ("avg", np.float16), ("max", np.int8)])
@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("n", [1001, 64_123])
def test_all_reduce_has_the_bits_of_rank_order(P, op, dtype, deterministic, n):
    if dtype in (np.float32, np.float64):
        xs = [x.astype(dtype) for x in summands(P, n)]
    else:  # small enough not to overflow a float16; int8 sums wrap around, as in numpy
        xs = inputs(P, (n,), dtype, seed=n)
    results = run_per_rank(P, lambda x: dist.all_reduce(x, op=op), xs, deterministic=deterministic)
    for r in range(P):
        order = range(P) if deterministic or op == "max" else [(r + i) % P for i in range(P)]
        expected = rank_order_reduce([xs[j] for j in order], op).astype(dtype)
        assert results[r].tobytes() == expected.tobytes()
        assert results[r].dtype == dtype


@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_reduce_scatter_matches_rank_order(op, deterministic):
    P = 3
    xs = [x.reshape(3 * 700, 10) for x in summands(P, 3 * 7000)]
    for axis in (0, 1):
        xs_axis = [x if axis == 0 else x.reshape(10 * 7, 3 * 100) for x in xs]
        results = run_per_rank(
            P,
            lambda x, axis=axis: dist.reduce_scatter(x, op=op, axis=axis),
            xs_axis,
            deterministic=deterministic,
        )
        for r in range(P):
            order = range(P) if deterministic or op == "max" else [(r + i) % P for i in range(P)]
            chunks = [np.split(xs_axis[j], P, axis=axis)[r] for j in order]
            assert results[r].tobytes() == rank_order_reduce(chunks, op).tobytes()


@pytest.mark.parametrize("P", [2, 4])
def test_copies_match_numpy(P):
    xs = inputs(P, (4 * P, 300), np.float32, seed=P)
    for axis in (0, 1, -1):
        for result in run_per_rank(P, lambda x, axis=axis: dist.all_gather(x, axis=axis), xs):
            assert_same(result, np.concatenate(xs, axis=axis))
    for split_axis, concat_axis in [(0, 0), (0, 1), (1, 0)]:
        xs_ = [x[:, : 100 * P] for x in xs] if split_axis == 1 else xs
        results = run_per_rank(
            P, lambda x, s=split_axis, c=concat_axis: dist.all_to_all(x, s, c), xs_
        )
        for r, result in enumerate(results):
            chunks = [np.split(x, P, axis=split_axis)[r] for x in xs_]
            assert_same(result, np.concatenate(chunks, axis=concat_axis))
    for result in run_per_rank(P, lambda x: dist.broadcast(x, src=P - 1), xs):
        assert_same(result, xs[P - 1])
    results = run_per_rank(P, lambda x: dist.scatter(x, src=0, axis=0), xs)
    for r, result in enumerate(results):
        assert_same(result, np.split(xs[0], P, axis=0)[r])


@pytest.mark.parametrize("layout", ["C", "F", "transposed", "strided"])
def test_every_rank_gets_a_c_ordered_all_reduce_of_any_layout(layout):
    P = 3
    xs = inputs(P, (6, 4), np.float64, seed=3)
    xs = {
        "C": xs,
        "F": [np.asfortranarray(x) for x in xs],
        "transposed": [x.T for x in xs],
        "strided": [x[::2] for x in xs],
    }[layout]
    expected = rank_order_reduce(xs, "sum")
    for result in run_per_rank(P, dist.all_reduce, xs):
        assert result.flags.c_contiguous and result.flags.owndata
        assert_same(result, expected)


# -- all_reduce into out ----------------------------------------------------------------------


@pytest.mark.parametrize("n", [6, 300_000])  # a small all_reduce, and a blocked one
def test_all_reduce_writes_into_out_which_may_be_the_input(n):
    def fn():
        r = dist.rank()
        x = np.arange(n, dtype=np.float64) + r
        same = x.copy()
        returned = dist.all_reduce(same, out=same)
        other = np.empty_like(x)
        kept = x.copy()
        into_other = dist.all_reduce(x, op="avg", out=other)
        strided = np.zeros(2 * n)[::2]
        dist.all_reduce(x, op="max", out=strided)
        tensor = Tensor(np.full(3, r + 1.0))
        into_tensor = dist.all_reduce(tensor, out=tensor)
        return {
            "in place": (returned is same, same[:3].tolist(), same[-1]),
            "into other": (into_other is other, other[:3].tolist(), other[-1]),
            "input kept": np.array_equal(x, kept),
            "strided": (strided[:3].tolist(), strided[-1]),
            "tensor": (into_tensor is tensor, tensor.data.tolist()),
        }

    last = 2.0 * (n - 1) + 1  # (n − 1 + 0) + (n − 1 + 1)
    for got in dist.run(fn, 2):
        assert got["in place"] == (True, [1.0, 3.0, 5.0], last)
        assert got["into other"] == (True, [0.5, 1.5, 2.5], last / 2)
        assert got["input kept"]
        assert got["strided"] == ([1.0, 2.0, 3.0], float(n))
        assert got["tensor"] == (True, [3.0, 3.0, 3.0])


def test_all_reduce_into_out_is_exact_and_traced_like_the_functional_call():
    P = 3
    xs = summands(P, 5000)
    trace = dist.Trace()

    def fn(x):
        functional = dist.all_reduce(x)
        dist.all_reduce(x, out=x)
        return functional, x

    for functional, in_place in run_per_rank(P, fn, [x.copy() for x in xs], trace=trace):
        assert functional.tobytes() == in_place.tobytes() == rank_order_reduce(xs, "sum").tobytes()
    assert [(e.op, e.shapes, e.kwargs) for e in trace] == [
        ("all_reduce", ((5000,),) * P, {"op": dist.ReduceOp.SUM})
    ] * 2


def test_all_reduce_into_a_torch_tensor():
    torch = pytest.importorskip("torch")

    def fn():
        x = torch.arange(4, dtype=torch.float32) + dist.rank()
        out = torch.empty(4, dtype=torch.float32)
        half = torch.zeros(4, dtype=torch.bfloat16)
        returned = dist.all_reduce(x, out=out)
        dist.all_reduce(half + 1, out=half)
        return returned is out, out.tolist(), half.dtype, half.tolist()

    for same, values, dtype, halves in dist.run(fn, 2):
        assert same and values == [1.0, 3.0, 5.0, 7.0]
        assert dtype == torch.bfloat16 and halves == [2.0] * 4
