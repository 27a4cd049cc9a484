"""torch.distributed backends: gloo on P = 2 and 4 ranks against numpy and against the
simulated world, functions from a notebook, errors, timeouts, and no process left behind.

The worker pools are module-level in chainrule.dist.pool, so every test here reuses the same
P=2 (and P=4) pool; the failure tests that must stop a pool come last.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from chainrule import Tensor, dist
from chainrule.dist import pool as pools

torch = pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")

# Seconds within which a failure must end (processes stopped, stacks read) when the code it
# stops would run for 60 s: generous on a busy machine, and far from what it tells apart.
PROMPTLY = 15.0

pytestmark = pytest.mark.skipif(
    not dist.is_available("gloo"), reason="torch.distributed with gloo is not available"
)


@pytest.fixture(autouse=True)
def _other_fixtures_processes_left_out():
    """This test process may hold other tests' long-lived fixtures (a browser, a server)."""
    from process_tree import note_other_children

    note_other_children()


def children() -> list:
    """This process's descendants (other fixtures' left out)."""
    from process_tree import descendants

    return descendants()


# -- every collective, against numpy and the simulated world ----------------------------------


def rank_inputs(rank: int, P: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1000 + rank)
    return {
        "f64": rng.standard_normal((2 * P, 3)),
        "f32": rng.standard_normal((3, 2 * P)).astype(np.float32),
        "i64": rng.integers(-100, 100, size=(P, 2)),
    }


def every_collective() -> dict[str, np.ndarray]:
    """An SPMD function that calls every collective (module level: sent by reference)."""
    r, P = dist.rank(), dist.world_size()
    x = rank_inputs(r, P)
    return {
        "all_reduce_sum": dist.all_reduce(x["f64"]),
        "all_reduce_avg": dist.all_reduce(x["f32"], op=dist.ReduceOp.AVG),
        "all_reduce_max": dist.all_reduce(x["i64"], op="max"),
        "all_gather": dist.all_gather(x["f32"], axis=1),
        "all_gather_scalar": dist.all_gather(float(r)),
        "reduce_scatter": dist.reduce_scatter(x["f64"]),
        "reduce_scatter_avg_axis1": dist.reduce_scatter(x["f32"], op="avg", axis=1),
        "all_to_all": dist.all_to_all(x["i64"], split_axis=0, concat_axis=1),
        "all_to_all_02": dist.all_to_all(x["f32"], split_axis=1, concat_axis=0),
        "broadcast": dist.broadcast(x["f64"] if r == P - 1 else None, src=P - 1),
        "scatter": dist.scatter(x["i64"] if r == 0 else None, src=0, axis=0),
        "rank": np.array([r, P]),
    }


def expected_results(P: int) -> list[dict[str, np.ndarray]]:
    xs = [rank_inputs(r, P) for r in range(P)]

    def stack(key):
        return [x[key] for x in xs]

    total64 = sum(stack("f64")[1:], stack("f64")[0])
    avg32 = sum(stack("f32")[1:], stack("f32")[0]) / np.float32(P)
    out = []
    for r in range(P):
        out.append(
            {
                "all_reduce_sum": total64,
                "all_reduce_avg": avg32,
                "all_reduce_max": np.maximum.reduce(stack("i64")),
                "all_gather": np.concatenate(stack("f32"), axis=1),
                "all_gather_scalar": np.arange(P, dtype=np.float64),
                "reduce_scatter": np.split(total64, P, axis=0)[r],
                "reduce_scatter_avg_axis1": np.split(avg32, P, axis=1)[r],
                "all_to_all": np.concatenate([np.split(a, P, 0)[r] for a in stack("i64")], 1),
                "all_to_all_02": np.concatenate([np.split(a, P, 1)[r] for a in stack("f32")], 0),
                "broadcast": xs[P - 1]["f64"],
                "scatter": np.split(xs[0]["i64"], P, axis=0)[r],
                "rank": np.array([r, P]),
            }
        )
    return out


def check_against(results: list[dict], expected: list[dict], exact: bool) -> None:
    for got, want in zip(results, expected, strict=True):
        assert got.keys() == want.keys()
        for key in want:
            assert isinstance(got[key], np.ndarray), key
            assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape, key
            if exact or want[key].dtype.kind == "i":
                np.testing.assert_array_equal(got[key], want[key], err_msg=key)
            else:
                tol = 1e-6 if want[key].dtype == np.float32 else 1e-12
                np.testing.assert_allclose(got[key], want[key], rtol=tol, atol=tol, err_msg=key)


def test_every_collective_on_gloo_with_two_ranks_matches_numpy_and_the_simulation():
    gloo = dist.run(every_collective, 2, backend="gloo")
    sim = dist.run(every_collective, 2)
    check_against(gloo, expected_results(2), exact=False)
    check_against(gloo, sim, exact=True)  # two summands: no order to disagree about


@pytest.mark.slow
def test_every_collective_on_gloo_with_four_ranks_matches_numpy_and_the_simulation():
    gloo = dist.run(every_collective, 4, backend="gloo")
    check_against(gloo, expected_results(4), exact=False)
    check_against(gloo, dist.run(every_collective, 4), exact=False)


def linear_regression_step(w: np.ndarray, steps: int) -> np.ndarray:
    """Data-parallel gradient descent: each rank's shard, gradients averaged by all_reduce."""
    rng = np.random.default_rng(dist.rank())
    X = rng.standard_normal((16, w.size))
    y = X @ np.arange(1.0, w.size + 1)
    for _ in range(steps):
        grad = 2 * X.T @ (X @ w - y) / len(y)
        w = w - 0.05 * dist.all_reduce(grad, op="avg")
    return w


def test_the_same_training_gives_the_same_numbers_on_sim_and_gloo():
    w0 = np.zeros(3)
    gloo = dist.run(linear_regression_step, 2, backend="gloo", args=(w0, 20))
    sim = dist.run(linear_regression_step, 2, args=(w0, 20))
    for a, b in zip(gloo, sim, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(gloo[0], gloo[1])


def test_tensor_kinds_come_back_as_they_went_in():
    def fn():
        r = dist.rank()
        t = torch.full((2,), float(r + 1), dtype=torch.float32, requires_grad=True)
        return (
            dist.all_reduce(t),
            dist.all_reduce(Tensor(np.ones(2) * r)),
            dist.broadcast(torch.arange(3) if r == 0 else None),
            dist.all_reduce(np.float64(r)),
            t,
        )

    results = dist.run(fn, 2, backend="gloo")
    for r, (summed, tensor, broadcast, scalar, original) in enumerate(results):
        assert isinstance(summed, torch.Tensor) and summed.dtype == torch.float32
        assert torch.equal(summed, torch.full((2,), 3.0)) and not summed.requires_grad
        assert torch.equal(original.detach(), torch.full((2,), float(r + 1)))  # not mutated
        assert isinstance(tensor, Tensor) and np.array_equal(tensor.data, np.ones(2))
        assert isinstance(broadcast, torch.Tensor) and torch.equal(broadcast, torch.arange(3))
        assert isinstance(scalar, np.ndarray) and scalar.shape == () and scalar == 1.0


# -- all_reduce into `out` --------------------------------------------------------------------


def all_reduce_into_out() -> dict:
    """Every form of ``out=`` on small and large tensors."""
    r = dist.rank()
    results = {}
    for n in (6, 3 << 20):  # 24 bytes and 12 MB of float32
        x = torch.arange(n, dtype=torch.float32) + r
        same = x.clone()
        returned = dist.all_reduce(same, out=same)
        other = torch.empty_like(x)
        kept = x.clone()
        into_other = dist.all_reduce(x, op="avg", out=other)
        array = np.arange(n, dtype=np.float64) * (r + 1)
        array_out = dist.all_reduce(array, out=array)
        strided = torch.zeros(2 * n, dtype=torch.float32)[::2]  # not contiguous: staged
        dist.all_reduce(x, op="max", out=strided)
        tensor = Tensor(np.full(3, r + 1.0))
        results[n] = {
            "in place": (returned is same, same[:4].tolist(), same[-1].item()),
            "into other": (into_other is other, other[:4].tolist(), other[-1].item()),
            "input kept": torch.equal(x, kept),
            "numpy in place": (array_out is array, array[:3].tolist()),
            "strided": (strided[:4].tolist(), strided[-1].item()),
            "chainrule Tensor": (dist.all_reduce(tensor, out=tensor) is tensor, tensor.data),
            "functional": dist.all_reduce(x)[-2:].tolist(),
        }
    return results


@pytest.mark.parametrize("backend", ["gloo", "sim"])
def test_all_reduce_writes_into_out_which_may_be_the_input(backend):
    for results in dist.run(all_reduce_into_out, 2, backend=backend):
        for n, got in results.items():
            last = 2.0 * (n - 1) + 1  # (n − 1 + 0) + (n − 1 + 1)
            assert got["in place"] == (True, [1.0, 3.0, 5.0, 7.0], last)
            assert got["into other"] == (True, [0.5, 1.5, 2.5, 3.5], last / 2)
            assert got["input kept"], "out= must leave a different x as it was"
            assert got["numpy in place"] == (True, [0.0, 3.0, 6.0])
            assert got["strided"] == ([1.0, 2.0, 3.0, 4.0], float(n))
            assert got["chainrule Tensor"][0]
            np.testing.assert_array_equal(got["chainrule Tensor"][1], np.full(3, 3.0))
            assert got["functional"] == [last - 2, last]


@pytest.mark.parametrize("numpy_input", [False, True])
@pytest.mark.parametrize("backend", ["gloo", "sim"])
def test_all_reduce_into_out_checks_out(backend, numpy_input):
    def fn():
        x = np.ones(4, dtype=np.float32) if numpy_input else torch.ones(4)
        errors = []
        for out in (torch.ones(5), torch.ones(4, dtype=torch.float64), "no"):
            try:
                dist.all_reduce(x, out=out)
            except (ValueError, TypeError) as exc:
                errors.append(str(exc))
        read_only = np.ones(4)
        read_only.flags.writeable = False
        try:
            dist.all_reduce(read_only, out=read_only)
        except ValueError as exc:
            errors.append(str(exc))
        dist.barrier()
        return errors

    errors = dist.run(fn, 2, backend=backend)[0]
    assert len(errors) == 4
    assert "out has shape (5,) float32 but x has (4,) float32" in errors[0]
    assert "float64" in errors[1]
    assert "not str" in errors[2]
    assert "read-only" in errors[3]


def test_all_reduce_into_out_is_traced_like_the_functional_call():
    def fn():
        x = np.ones((2, 3))
        dist.all_reduce(x)
        dist.all_reduce(x, out=x)

    trace = dist.Trace()
    dist.run(fn, 2, backend="gloo", trace=trace)
    assert len(trace) == 2
    assert (trace[0].op, trace[0].shapes, trace[0].kwargs) == (
        trace[1].op,
        trace[1].shapes,
        trace[1].kwargs,
    )


def test_what_ranks_print_is_shown_in_rank_order(capsys):
    def fn():
        print(f"hello from rank {dist.rank()}")
        return dist.rank()

    capsys.readouterr()
    assert dist.run(fn, 2, backend="gloo") == [0, 1]
    assert capsys.readouterr().out == "hello from rank 0\nhello from rank 1\n"


def test_trace_on_gloo_matches_the_simulation():
    gloo, sim = dist.Trace(), dist.Trace()
    dist.run(every_collective, 2, backend="gloo", trace=gloo)
    dist.run(every_collective, 2, trace=sim)
    assert len(gloo) == len(sim) == 11
    for g, s in zip(gloo, sim, strict=True):
        assert (g.seq, g.op, g.shapes, g.dtype, g.nbytes, g.ranks, g.kwargs) == (
            s.seq,
            s.op,
            s.shapes,
            s.dtype,
            s.nbytes,
            s.ranks,
            s.kwargs,
        )
        assert g.backend == "gloo" and s.backend == "sim"


def test_a_function_defined_in_a_notebook_runs_on_gloo():
    namespace = {"__name__": "__main__"}
    exec(
        "from chainrule import dist\n"
        "import numpy as np\n"
        "SCALE = 3.0\n"
        "def notebook_step(offset):\n"
        "    return dist.all_reduce(np.ones(2) * (dist.rank() + offset) * SCALE)\n",
        namespace,
    )
    fn = namespace["notebook_step"]
    assert fn.__module__ == "__main__"
    results = dist.run(fn, 2, backend="gloo", args=(1.0,))
    np.testing.assert_array_equal(results[1], np.full(2, 9.0))


def test_repeated_calls_reuse_the_pool_and_are_fast():
    dist.run(dist.rank, 2, backend="gloo")
    pids = list(pools._pools[("gloo", 2)].pids)
    times = []
    for _ in range(10):
        start = time.perf_counter()
        assert dist.run(dist.rank, 2, backend="gloo") == [0, 1]
        times.append(time.perf_counter() - start)
    assert list(pools._pools[("gloo", 2)].pids) == pids
    assert np.median(times) < 0.05, f"median {np.median(times) * 1e3:.1f} ms per call"


def test_every_rank_is_forked_from_one_launcher_in_a_session_of_its_own():
    dist.run(dist.rank, 2, backend="gloo")
    pool = pools._pools[("gloo", 2)]
    launcher = psutil.Process(pool.launcher.pid)
    assert launcher.ppid() == os.getpid() and os.getsid(launcher.pid) == launcher.pid
    assert [psutil.Process(pid).ppid() for pid in pool.pids] == [launcher.pid] * 2
    assert all(os.getsid(pid) == launcher.pid != os.getsid(0) for pid in pool.pids)
    assert dist.run(os.getpid, 2, backend="gloo") == pool.pids


@pytest.mark.slow
def test_a_caller_without_torch_never_imports_it(tmp_path):
    script = (
        "import json, os, sys\n"
        "from chainrule import dist\n"
        "from chainrule.dist import pool\n"
        "assert dist.run(os.getpid, 2, backend='gloo') == pool._pools[('gloo', 2)].pids\n"
        "print(json.dumps({'torch_here': 'torch' in sys.modules}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert not json.loads(done.stdout.splitlines()[-1])["torch_here"]


def test_an_exception_on_every_rank_keeps_the_pool():
    pids = list(pools._pools[("gloo", 2)].pids)

    def fn():
        raise ZeroDivisionError(f"rank {dist.rank()} divided by zero")

    with pytest.raises(dist.RankError) as info:
        dist.run(fn, 2, backend="gloo")
    assert info.value.rank == 0 and info.value.exc_type == "ZeroDivisionError"
    assert "rank 0 divided by zero" in str(info.value)
    assert "raise ZeroDivisionError" in info.value.traceback_text
    assert list(pools._pools[("gloo", 2)].pids) == pids


def test_a_result_that_cannot_be_pickled_is_a_rank_error():
    import threading

    with pytest.raises(dist.RankError, match="rank 0 raised"):
        dist.run(threading.Lock, 2, backend="gloo")


def test_init_from_env_outside_torchrun_explains_itself(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="torchrun"):
        dist.init_from_env()


def test_backends_report_what_is_available():
    assert dist.available_backends()[:2] == ["sim", "gloo"]
    assert dist.is_available("auto")
    expected = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
    assert dist.api.auto_backend(2) == expected


# -- failures that stop a pool, and shutdown (last: the next call starts a fresh pool) --------


def test_an_exception_while_others_wait_is_a_rank_error_and_keeps_the_pool():
    dist.run(dist.rank, 2, backend="gloo")
    pids = list(pools._pools[("gloo", 2)].pids)

    def fn():
        if dist.rank() == 1:
            raise ValueError("only on rank 1")
        return dist.all_reduce(np.ones(2))  # released as soon as rank 1 has raised

    start = time.monotonic()
    with pytest.raises(dist.RankError) as info:
        dist.run(fn, 2, backend="gloo")
    assert time.monotonic() - start < PROMPTLY
    assert info.value.rank == 1 and "only on rank 1" in str(info.value)
    assert any("rank 0 did not finish" in note for note in info.value.__notes__)
    assert list(pools._pools[("gloo", 2)].pids) == pids  # the ranks ended together
    assert dist.run(dist.rank, 2, backend="gloo") == [0, 1]


@pytest.mark.slow
@pytest.mark.parametrize("dying", [0, 1])
def test_a_rank_whose_process_dies_is_reported_and_the_next_call_restarts(dying):
    def fn():
        if dist.rank() == dying:
            os._exit(3)
        return dist.rank()

    assert dist.run(dist.rank, 2, backend="gloo") == [0, 1]
    old = list(pools._pools[("gloo", 2)].pids)
    with pytest.raises(dist.CollectiveError) as info:
        dist.run(fn, 2, backend="gloo", timeout=20)
    died = f"rank {dying} (exit code 3)"  # as the launcher saw it
    assert f"the gloo worker process of {died}" in str(info.value)
    assert ("gloo", 2) not in pools._pools
    assert not {p.pid for p in children() if p.status() != psutil.STATUS_ZOMBIE} & set(old)
    assert dist.run(dist.rank, 2, backend="gloo") == [0, 1]


@pytest.mark.slow
def test_a_hang_times_out_naming_the_ranks_and_leaves_no_process():
    def fn():
        if dist.rank() == 0:
            time.sleep(60)  # busy in its own code, while rank 1 has returned

    assert dist.run(dist.rank, 2, backend="gloo") == [0, 1]  # a fresh pool after a stop
    old = list(pools._pools[("gloo", 2)].pids)
    start = time.monotonic()
    with pytest.raises(dist.CollectiveError) as info:
        dist.run(fn, 2, backend="gloo", timeout=1.0)
    assert time.monotonic() - start < PROMPTLY
    message = str(info.value)
    line = fn.__code__.co_firstlineno + 2  # a function sent by value: its line is still found
    assert message.startswith(
        "the gloo run timed out after 1 s: rank 0 ran its own code for more than 1 s (at line "
        f"{line} of fn: time.sleep(60)  # busy in its own code"
    )
    assert "the gloo worker processes were stopped and restart on the next call" in message
    assert not {p.pid for p in children()} & set(old)
    assert ("gloo", 2) not in pools._pools


@pytest.mark.slow  # starts a fresh pool: the failure tests above stopped the shared one
def test_shutdown_stops_every_worker():
    assert dist.run(dist.rank, 2, backend="gloo") == [0, 1]
    assert children()
    dist.shutdown()
    assert pools._pools == {}
    assert [p for p in children() if p.status() != psutil.STATUS_ZOMBIE] == []


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["exit", "SIGKILL"])
def test_workers_and_their_folder_end_with_the_process_that_started_them(tmp_path, ending):
    """Whether the pool's owner exits (without calling ``dist.shutdown()``) or is killed (a
    kernel stopped with SIGKILL runs no exit handler), its workers end and the pool's folder
    (its socket and the ranks' status files) is removed."""
    script = (
        "import os, signal, psutil\n"
        "from chainrule import dist\n"
        "from chainrule.dist import pool\n"
        "assert dist.run(dist.rank, 2, backend='gloo') == [0, 1]\n"
        "print(' '.join(str(p.pid) for p in psutil.Process().children(recursive=True)))\n"
        "print(pool._pools['gloo', 2].folder, flush=True)\n"
        + ("os.kill(os.getpid(), signal.SIGKILL)\n" if ending == "SIGKILL" else "")
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == (-signal.SIGKILL if ending == "SIGKILL" else 0), done.stderr
    pids_line, folder = done.stdout.splitlines()
    pids = [int(pid) for pid in pids_line.split()]
    assert len(pids) == 3  # the launcher and the two ranks
    deadline = time.monotonic() + PROMPTLY
    while time.monotonic() < deadline and (
        any(psutil.pid_exists(pid) for pid in pids) or os.path.exists(folder)
    ):
        time.sleep(0.05)
    assert not any(psutil.pid_exists(pid) for pid in pids)
    assert not os.path.exists(folder)


# -- NCCL: one GPU per rank -------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(
    not dist.is_available("nccl") or torch.cuda.device_count() < 2,
    reason="NCCL tests need at least 2 CUDA GPUs",
)
def test_every_collective_on_nccl_matches_numpy():
    P = 2
    results = dist.run(every_collective, P, backend="nccl")
    check_against(results, expected_results(P), exact=False)

    def on_gpu():
        t = torch.ones(3, device=f"cuda:{dist.rank()}") * (dist.rank() + 1)
        return dist.all_reduce(t, op="avg").device.type, dist.all_reduce(t).cpu()

    for device, summed in dist.run(on_gpu, P, backend="nccl"):
        assert device == "cuda" and torch.equal(summed, torch.full((3,), 3.0))
    dist.shutdown()


@pytest.mark.slow  # starts a fresh pool
def test_a_pool_starts_under_a_temporary_folder_too_long_for_a_socket(tmp_path, monkeypatch):
    """A grading workspace's temporary folder can be longer than a Unix socket's address may
    be: the pool's folder is then made in /tmp."""
    import tempfile

    deep = tmp_path / ("a-long-folder-name-" * 6)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    dist.shutdown()
    try:
        assert dist.run(dist.rank, 2, backend="gloo") == [0, 1]
        folder = pools._pools[("gloo", 2)].folder
        assert len(os.path.join(folder, "socket")) <= pools.SOCKET_PATH_LIMIT
    finally:
        dist.shutdown()
