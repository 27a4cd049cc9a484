"""Warm worker pools: ``dist.run(fn, P, backend="gloo")`` on P processes that stay alive.

The first call for a (backend, P) starts a :class:`Pool`: one launcher interpreter
(:data:`chainrule.dist.worker.LAUNCH`, in a session of its own) imports torch and forks the P
ranks, which connect back to the pool's socket and join one process group. Later calls send
the function and its arguments to the live ranks and cost a few milliseconds. The function
travels by value (cloudpickle) when it comes from ``__main__``, so a function defined in a
notebook cell runs too.

Each rank sends back a :class:`~chainrule.dist.worker.Reply`. An exception on a rank becomes
a :class:`~chainrule.dist.world.RankError` with the rank's traceback (its source lines put
back for functions from a notebook); ranks that could not agree on a collective, a
:class:`~chainrule.dist.world.CollectiveError`. Both leave the pool warm: the ranks ended
together. A rank that dies, a run longer than ``timeout``, ranks still busy a second after
another raised, and Ctrl-C stop the pool (the launcher's whole process group), and the next
call starts a fresh one. What the ranks print is shown in rank order after the call. The
pools end with the process that started them.
"""

from __future__ import annotations

import atexit
import json
import linecache
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

import cloudpickle

from chainrule.dist import forks, whereabouts
from chainrule.dist.calls import ranks_text
from chainrule.dist.trace import Trace
from chainrule.dist.worker import LAUNCH, Exited, Hello, Ready, RemoteError, Reply, Task
from chainrule.dist.world import CollectiveError, RankError

DEFAULT_TIMEOUT = 30.0
"""Seconds a whole ``run`` on gloo/nccl may take before its processes are stopped."""

START_TIMEOUT = 120.0
"""Seconds to start a pool (interpreter, ``import torch``, ``init_process_group``)."""

SOCKET_PATH_LIMIT = 100
"""Bytes a Unix socket's path may have here (Linux allows 108, macOS 104)."""

ERROR_GRACE = 1.0
"""After one rank raised, seconds to wait for the others before stopping the pool."""

MAX_POOLED_WORKERS = 12
"""Worker processes kept alive over all pools; the least recently used pools close first."""


class Pool:
    """P ranks of one backend, each a process of one live process group.

    ``pids``: each rank's process; ``launcher``: the process that forked them.
    """

    def __init__(self, backend: str, world_size: int) -> None:
        self.backend = backend
        self.world_size = world_size
        self.lock = threading.Lock()
        self.pids = [0] * world_size
        self.ranks: list[Connection] = []
        self.control: Connection | None = None  # the launcher's connection
        self.folder = _private_folder()
        address = os.path.join(self.folder, "socket")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(address)
        listener.listen(world_size + 1)
        config = {
            "address": address,
            "folder": self.folder,
            "world_size": world_size,
            "backend": backend,
            "port": _free_port(),
            "sys_path": [p for p in sys.path if isinstance(p, str)],
        }
        self.launcher = _start_launcher(config)
        try:
            self._await_ranks(listener)
        except BaseException:
            self.close(graceful=False)
            raise
        finally:
            listener.close()

    def _await_ranks(self, listener: socket.socket) -> None:
        """Accept the launcher's and the ranks' connections until every rank is ready."""
        deadline = time.monotonic() + START_TIMEOUT
        unknown: list[Connection] = []  # connected, not yet said who they are
        ranks: dict[int, Connection] = {}
        ready: set[int] = set()
        while len(ready) < self.world_size:
            control = [self.control] if self.control is not None else []
            sources: list[Any] = [listener, *unknown, *ranks.values(), *control]
            readable = wait(sources, max(deadline - time.monotonic(), 0.0))
            if not readable:
                raise CollectiveError(
                    f"starting {self.world_size} {self.backend} workers timed out after "
                    f"{START_TIMEOUT:g} s"
                )
            for source in readable:
                if source is listener:
                    unknown.append(Connection(listener.accept()[0].detach()))
                    continue
                assert isinstance(source, Connection)
                try:
                    message = cloudpickle.loads(source.recv_bytes())
                except (EOFError, OSError):
                    raise CollectiveError(
                        f"a {self.backend} worker exited while starting{self._exit_text()}; "
                        "see its output above"
                    ) from None
                if isinstance(message, Hello):
                    unknown.remove(source)
                    if message.rank is None:
                        self.control = source
                    else:
                        ranks[message.rank] = source
                        self.pids[message.rank] = message.pid
                elif isinstance(message, Ready) and message.error is not None:
                    error = message.error
                    raise RankError(
                        message.rank or 0,
                        error.exc_type,
                        f"while starting {self.backend}: {error.message}",
                        error.traceback,
                    )
                elif isinstance(message, Ready) and message.rank is not None:
                    ready.add(message.rank)
                elif isinstance(message, Exited):
                    raise CollectiveError(
                        f"the {self.backend} worker of rank {message.rank} exited while "
                        f"starting (exit code {message.code}); see its output above"
                    )
        self.ranks = [ranks[r] for r in range(self.world_size)]

    def _exit_text(self) -> str:
        code = self.launcher.poll()
        return "" if code is None else f" (the launcher's exit code: {code})"

    def dispatch(self, task: bytes, timeout: float) -> tuple[dict[int, Reply], dict[int, str]]:
        """Send ``task`` to every rank; the replies by rank, and the ranks whose process died
        (with its exit code). A rank in neither did not finish in time."""
        try:
            for conn in self.ranks:
                conn.send_bytes(task)
        except OSError:
            raise CollectiveError(f"the {self.backend} workers stopped unexpectedly") from None
        replies: dict[int, Reply] = {}
        died: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        while len(replies) + len(died) < self.world_size:
            now = time.monotonic()
            if died or any(reply.error is not None for reply in replies.values()):
                deadline = min(deadline, now + ERROR_GRACE)  # the others may be stuck
            pending = [c for r, c in enumerate(self.ranks) if r not in replies and r not in died]
            readable = wait(pending, max(0.0, deadline - now))
            if not readable:
                break
            for source in readable:
                assert isinstance(source, Connection)
                r = self.ranks.index(source)
                try:
                    replies[r] = cloudpickle.loads(source.recv_bytes())
                except (EOFError, OSError):
                    died[r] = self._exit_code_text(r)
                except Exception as exc:  # a result that cannot be unpickled here
                    replies[r] = Reply(r, error=RemoteError.of(exc))
        return replies, died

    def _exit_code_text(self, rank: int) -> str:
        """`` (exit code N)`` once the launcher reports ``rank``'s exit, else ""."""
        deadline = time.monotonic() + 1.0
        while self.control is not None and wait([self.control], deadline - time.monotonic()):
            try:
                message = cloudpickle.loads(self.control.recv_bytes())
            except (EOFError, OSError):
                break
            if isinstance(message, Exited) and message.rank == rank:
                return f" (exit code {message.code})"
        return ""

    def alive(self) -> bool:
        return self.launcher.poll() is None

    def close(self, graceful: bool = True) -> None:
        """Stop the ranks (asking first when ``graceful``), the launcher and its process group."""
        if graceful:
            for conn in self.ranks:
                try:
                    conn.send_bytes(cloudpickle.dumps(None))
                except OSError:
                    pass
            try:
                self.launcher.wait(2.0)
            except subprocess.TimeoutExpired:
                pass
        if self.launcher.poll() is None:  # the group exists while its leader does
            try:
                os.killpg(self.launcher.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.launcher.wait()
        if self.launcher.stdin is not None:
            self.launcher.stdin.close()
        for conn in self.ranks + ([self.control] if self.control is not None else []):
            conn.close()
        self.ranks, self.control = [], None
        shutil.rmtree(self.folder, ignore_errors=True)


def _start_launcher(config: dict[str, Any]) -> subprocess.Popen[bytes] | forks.ForkedChild:
    """The pool's launcher, given ``config``: a fresh interpreter that imports torch; or, in a
    process forked by a fork server that has imported torch already (a kernel of the grader's
    sandbox), a fork of that server: the same program, without the import.

    Either way it leads a session of its own (a notebook kernel that shuts down signals the
    processes of its group and waits for them; the pool's owner stops the pool itself), and its
    standard input, or the fork server's connection, is its lifeline."""
    fork_server = os.environ.get(forks.ENV)
    if fork_server and config["backend"] == "gloo":
        try:
            where = {"cwd": os.getcwd(), "env": dict(os.environ)}  # ours, not the server's
            return forks.ForkedChild(fork_server, "launcher", {"config": config, **where})
        except OSError:
            pass  # the server is gone (a process forked from a kernel that outlived it)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # P processes share the machine's cores
    # Every functional result and every gradient is a new tensor: with torch's huge-page
    # allocation a large new tensor is mapped in 2 MB pages, not 4 KB ones, much faster to fill
    # where huge pages are madvise-only (BENCHMARKS.md).
    env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCH], stdin=subprocess.PIPE, env=env, start_new_session=True
    )
    assert launcher.stdin is not None
    launcher.stdin.write(json.dumps(config).encode() + b"\n")
    launcher.stdin.flush()
    return launcher


def _private_folder() -> str:
    """A new folder only this user may enter, for the pool's socket and its ranks' status
    files: in the temporary folder, or in ``/tmp`` when the temporary folder's path is too long
    for a Unix socket's address (108 bytes on Linux; a grading workspace's can be longer)."""
    folder = tempfile.mkdtemp(prefix="chainrule-pool-")
    if len(os.path.join(folder, "socket").encode()) <= SOCKET_PATH_LIMIT:
        return folder
    os.rmdir(folder)
    return tempfile.mkdtemp(prefix="chainrule-pool-", dir="/tmp")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_pools: dict[tuple[str, int], Pool] = {}  # in order of use, the most recent last
_pools_lock = threading.Lock()
_start_seconds = 0.0


def _pool(backend: str, world_size: int) -> Pool:
    key = (backend, world_size)
    with _pools_lock:
        pool = _pools.pop(key, None)
        if pool is not None and not pool.alive():
            pool.close(graceful=False)
            pool = None
        while _pools and sum(p.world_size for p in _pools.values()) + world_size > max(
            MAX_POOLED_WORKERS, world_size
        ):
            _pools.pop(next(iter(_pools))).close()
        if pool is None:
            global _start_seconds
            started = time.monotonic()
            pool = Pool(backend, world_size)
            _start_seconds += time.monotonic() - started
        _pools[key] = pool
        return pool


def start_seconds() -> float:
    """Wall seconds this process has spent starting pools (its worlds' processes and process
    groups), in all: the part of a run that a warm pool does not pay again."""
    return _start_seconds


def _discard(pool: Pool) -> None:
    with _pools_lock:
        key = (pool.backend, pool.world_size)
        if _pools.get(key) is pool:
            del _pools[key]
    pool.close(graceful=False)


def shutdown() -> None:
    """Stop every worker pool (and leave a process group this process joined by
    :func:`~chainrule.dist.init_from_env`). Registered to run at exit; safe to call any time."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()
    if "torch.distributed" in sys.modules:
        from chainrule.dist import torchrun

        torchrun.leave()


atexit.register(shutdown)


def run(
    fn: Callable[..., Any],
    world_size: int,
    backend: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    timeout: float | None,
    trace: Trace | None,
) -> list[Any]:
    """``fn(*args, **kwargs)`` on every rank of a pool; see :func:`chainrule.dist.run`."""
    if backend == "nccl":
        import torch

        if torch.cuda.device_count() < world_size:
            raise RuntimeError(
                f"nccl needs one GPU per rank: world_size={world_size} but this machine has "
                f"{torch.cuda.device_count()}"
            )
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    task = cloudpickle.dumps(Task(fn, args, kwargs, list(sys.path), trace is not None))
    pool = _pool(backend, world_size)
    with pool.lock:
        try:
            replies, died = pool.dispatch(task, timeout)
        except BaseException:  # e.g. KeyboardInterrupt: the ranks are still busy
            _discard(pool)
            raise
    unfinished = [r for r in range(world_size) if r not in replies and r not in died]
    timed_out = ""
    if unfinished and not died and not any(reply.error for reply in replies.values()):
        timed_out = _timeout_message(pool, unfinished, timeout, fn)  # before the ranks stop
    if died or unfinished:
        _discard(pool)
    for r in sorted(replies):
        sys.stdout.write(replies[r].output)
    if died:
        dead = ", ".join(f"rank {r}{code}" for r, code in sorted(died.items()))
        raise CollectiveError(
            f"the {backend} worker process of {dead} died during the run; the pool was "
            "stopped and restarts on the next call"
        )
    errors = {r: reply.error for r, reply in replies.items() if reply.error is not None}
    if errors:
        raise _error(errors, unfinished, backend, fn)
    failures = [replies[r].failure for r in sorted(replies) if replies[r].failure]
    if failures:  # the ranks caught the error of a collective they could not agree on
        raise CollectiveError(failures[0])
    if unfinished:
        raise CollectiveError(timed_out)
    if trace is not None:  # each collective as its group's rank 0 saw it, in time order
        led = [
            (t, e)
            for reply in replies.values()
            for t, e in zip(reply.event_times, reply.events, strict=True)
        ]
        trace.extend([e for _, e in sorted(led, key=lambda item: item[0])])
    return [replies[r].value for r in range(world_size)]


def _timeout_message(pool: Pool, unfinished: list[int], timeout: float, fn: Any) -> str:
    """Why a run timed out, in the simulated world's words: the collective the waiting ranks
    are in, and the line each rank that never reached it was running."""
    waits = {r: whereabouts.waits_in(pool.folder, r) for r in unfinished}
    waiting = [r for r in unfinished if waits[r] is not None]
    running = [r for r in unfinished if waits[r] is None]
    sources = code_files(fn)
    lines = {r: whereabouts.stack_of(pool.folder, r, pool.pids[r], sources) for r in running}
    where = whereabouts.positions(lines)
    one = len(running) == 1
    stopped = (f" ({where})" if where else "") + (
        f"; the {pool.backend} worker processes were stopped and restart on the next call; "
        "pass timeout= to dist.run to wait longer"
    )
    if running and waiting and len({waits[r] for r in waiting}) == 1:
        still = "was still running its" if one else "were still running their"
        return (
            f"{waits[waiting[0]]} timed out after {timeout:g} s: {ranks_text(waiting)} arrived "
            f"but {ranks_text(running)} {still} own code" + stopped
        )
    if running and not waiting:
        own = "its" if one else "their"
        return (
            f"the {pool.backend} run timed out after {timeout:g} s: {ranks_text(running)} ran "
            f"{own} own code for more than {timeout:g} s" + stopped
        )
    described = [f"rank {r} waits in {waits[r]}" for r in waiting]
    if running:
        described.append(f"{ranks_text(running)} {'runs its' if one else 'run their'} own code")
    return (
        f"the {pool.backend} run timed out after {timeout:g} s: {ranks_text(unfinished)} did "
        f"not finish: " + ", ".join(described) + stopped
    )


def _error(
    errors: dict[int, RemoteError], unfinished: list[int], backend: str, fn: Callable[..., Any]
) -> Exception:
    """The error of a run in which ranks raised: the lowest rank's exception of its own
    (RankError), else the collective the ranks could not agree on (CollectiveError)."""
    raised = {r: e for r, e in errors.items() if not e.collective}
    if not raised:
        failed = {r: e for r, e in errors.items() if not e.aborted} or errors
        return CollectiveError(failed[min(failed)].message)
    first = min(raised)
    error = raised[first]
    exc = RankError(first, error.exc_type, error.message, restore_source_lines(error.traceback, fn))
    others = sorted(set(raised) - {first})
    if others:
        exc.add_note(f"{ranks_text(others)} also raised")
    waiting = sorted(r for r, e in errors.items() if e.aborted) + unfinished
    if waiting:
        what = "it was" if len(waiting) == 1 else "they were"
        exc.add_note(
            f"{ranks_text(waiting)} did not finish: {what} waiting in a collective for rank "
            f"{first}"
            + (
                f"; the {backend} worker processes were stopped and restart on the next call"
                if unfinished
                else ""
            )
        )
    return exc


def code_files(fn: Callable[..., Any]) -> dict[str, set[str]]:
    """Function name -> the files it comes from, for ``fn``, the functions nested in it and
    those it can reach in its module's globals: the code a rank may run of the caller's."""
    files: dict[str, set[str]] = {}

    def collect(code: Any) -> None:
        files.setdefault(code.co_name, set()).add(code.co_filename)
        for const in code.co_consts:
            if hasattr(const, "co_filename"):
                collect(const)

    code = getattr(fn, "__code__", None)
    if code is not None:
        collect(code)
        for value in getattr(fn, "__globals__", {}).values():
            if getattr(value, "__module__", None) == fn.__module__ and hasattr(value, "__code__"):
                collect(value.__code__)
    return files


_DYNAMIC_FRAME = re.compile(r'^(\s*)File "<dynamic-code>", line (\d+), in (\S+)$')


def restore_source_lines(text: str, fn: Callable[..., Any]) -> str:
    """Put file names and source lines back into a rank's traceback.

    cloudpickle sends functions from ``__main__`` (a notebook cell) by value and their file
    becomes ``<dynamic-code>``, so the rank's traceback has no source. The caller still has
    the original code objects: ``fn``'s, those nested in it, and those of the functions it
    can reach in its module's globals.
    """
    if "<dynamic-code>" not in text:
        return text
    files = code_files(fn)
    lines = []
    for line in text.splitlines():
        match = _DYNAMIC_FRAME.match(line)
        names = files.get(match.group(3), set()) if match else set()
        if match and len(names) == 1:
            indent, number, name = match.groups()
            filename = next(iter(names))
            lines.append(f'{indent}File "{filename}", line {number}, in {name}')
            source = linecache.getline(filename, int(number)).strip()
            if source:
                lines.append(f"{indent}  {source}")
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"
