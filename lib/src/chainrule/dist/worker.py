"""The processes of a worker pool: one launcher imports torch, then forks one process per rank.

:class:`chainrule.dist.pool.Pool` starts the launcher as a fresh interpreter running
:data:`LAUNCH`, writes the pool's configuration (a line of JSON: the caller's import path
first) to its stdin and keeps stdin open: when the pool's owner exits, stdin ends, and so do
the launcher and every rank. The launcher imports
torch once, forks the P ranks (a forked rank shares the import instead of repeating it: the
import is most of a rank's start-up), then reports each rank's exit code until all have ended.
Each rank connects to the pool's socket, joins the process group and serves tasks: it runs
the SPMD function, sends back a :class:`Reply` (its result or its error, its trace events,
what it printed), and tells the other ranks it returned (:meth:`TorchWorld.finish`).

Every message is one cloudpickled object. Functions travel by value when they come from
``__main__`` (a notebook cell), so they run here although this process never imports the
caller's ``__main__``. No rank initialises CUDA before the forks, so NCCL ranks start the same
way.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import socket
import sys
import threading
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from chainrule.dist.trace import CollectiveEvent
from chainrule.dist.world import CollectiveAborted, CollectiveError

# -- the messages -----------------------------------------------------------------------------


@dataclass
class Task:
    """Run ``fn(*args, **kwargs)`` on every rank, with the caller's import path."""

    fn: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    sys_path: list[str]
    tracing: bool


@dataclass
class RemoteError:
    """An exception raised on a rank, as text (the exception itself may not travel).

    ``collective``: a :class:`~chainrule.dist.world.CollectiveError` (the ranks could not
    agree, or the library refused a misuse); ``aborted``: the rank was released because the
    run failed elsewhere.
    """

    exc_type: str
    message: str
    traceback: str
    collective: bool = False
    aborted: bool = False

    @classmethod
    def of(cls, exc: BaseException) -> RemoteError:
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        return cls(
            type(exc).__name__,
            str(exc),
            "".join(traceback.format_exception(type(exc), exc, tb)),
            isinstance(exc, CollectiveError),
            isinstance(exc, CollectiveAborted),
        )


@dataclass
class Hello:
    """A process of the pool connected: the launcher (rank None) or a rank, and its pid."""

    rank: int | None
    pid: int


@dataclass
class Ready:
    """A rank joined the process group (or failed to: ``error``); the launcher sends one with
    an error when it cannot import torch."""

    rank: int | None
    error: RemoteError | None = None


@dataclass
class Exited:
    """The launcher saw rank ``rank``'s process end with ``code``."""

    rank: int
    code: int


@dataclass
class Reply:
    """What a rank sends back for a task: its result, or its error; ``failure``: why the ranks
    could not agree on a collective, when they could not (even if the function caught it);
    ``events``: the collectives it led (as its group's rank 0), at ``event_times``."""

    rank: int
    value: Any = None
    error: RemoteError | None = None
    events: list[CollectiveEvent] = field(default_factory=list)
    event_times: list[float] = field(default_factory=list)
    output: str = ""
    failure: str | None = None


def send(conn: Connection, message: object) -> None:
    conn.send_bytes(cloudpickle.dumps(message))


def connect(address: str) -> Connection:
    """A connection to the pool's socket at ``address``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address)
    return Connection(sock.detach())


# -- the launcher -----------------------------------------------------------------------------

LAUNCH = (
    "import json, sys\n"
    "config = json.loads(sys.stdin.readline())\n"
    "sys.path[:0] = [p for p in config['sys_path'] if p not in sys.path]\n"
    "from chainrule.dist.worker import main\n"
    "main(config)\n"
)
"""The launcher's program (``python -c``): the caller's import path, then :func:`main`."""


def main(config: dict[str, Any]) -> None:
    """The launcher: import torch, fork the ranks, report their exits."""
    # Ctrl-C and a notebook's interrupt are for the pool's owner, which stops the pool.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = connect(config["address"])
    send(conn, Hello(None, os.getpid()))
    try:
        import torch.distributed  # noqa: F401 - before the forks: the ranks share the import

        # What torch imports on a process's first backward(gradient) (sympy, 0.3 s of CPU):
        # imported once here instead of once in every rank.
        import torch.fx.experimental.symbolic_shapes  # noqa: F401

        from chainrule.dist import torch_backend  # noqa: F401
    except BaseException as exc:  # noqa: BLE001 - reported to the pool
        send(conn, Ready(None, RemoteError.of(exc)))
        return
    ranks = {}
    for rank in range(config["world_size"]):
        pid = os.fork()
        if pid == 0:  # the new rank: it serves, and never returns here
            try:
                conn.close()
                serve(rank, config)
            finally:
                os._exit(0)
        ranks[pid] = rank
    _exit_with_owner(remove=config["folder"])
    while ranks:
        pid, status = os.wait()
        try:
            send(conn, Exited(ranks.pop(pid), os.waitstatus_to_exitcode(status)))
        except OSError:
            pass  # the pool's owner no longer listens: it is closing the pool, or it died
    # The pool is over. Its owner removes the folder when it closes the pool; but an owner that
    # died (its ranks then end on their own) never will.
    shutil.rmtree(config["folder"], ignore_errors=True)
    os._exit(0)  # skip the interpreter's teardown: tenths of a second with torch loaded


def _exit_with_owner(remove: str | None = None) -> None:
    """End this process when the pool's owner closes stdin or exits (a daemon thread).

    The launcher passes the pool's folder as ``remove``: an owner that was killed (a kernel
    stopped with SIGKILL, say) never removes it, so the launcher does before it ends (here, or
    in :func:`main` if its ranks end first)."""

    def watch() -> None:
        while os.read(0, 1):
            pass
        if remove is not None:
            shutil.rmtree(remove, ignore_errors=True)
        os._exit(1)

    threading.Thread(target=watch, name="chainrule-worker-lifeline", daemon=True).start()


# -- a rank -----------------------------------------------------------------------------------


def serve(rank: int, config: dict[str, Any]) -> None:
    """Join the process group as ``rank``, then run tasks until told to stop (None)."""
    import torch
    import torch.distributed as td

    from chainrule.dist import torchrun, whereabouts
    from chainrule.dist.torch_backend import TorchWorld
    from chainrule.dist.world import set_process_world

    status = whereabouts.install(config["folder"], rank)
    conn = connect(config["address"])
    send(conn, Hello(rank, os.getpid()))
    _exit_with_owner()
    backend = config["backend"]
    try:
        torch.set_num_threads(1)  # P processes share the machine's cores
        device = torchrun.device_for(backend, rank)
        td.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{config['port']}",
            rank=rank,
            world_size=config["world_size"],
            **({"device_id": device} if backend == "nccl" else {}),
        )
        world = TorchWorld(backend, device, status)
        set_process_world(world)
    except BaseException as exc:  # noqa: BLE001 - reported to the pool
        send(conn, Ready(rank, RemoteError.of(exc)))
        return
    send(conn, Ready(rank))
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            return
        reply = run_task(message, rank, world)
        if reply is None:
            return
        try:
            conn.send_bytes(cloudpickle.dumps(reply))
        except Exception as exc:  # the result could not be pickled
            send(conn, Reply(rank, error=RemoteError.of(exc), output=reply.output))
        world.finish(raised=reply.error is not None)


def run_task(message: bytes, rank: int, world: Any) -> Reply | None:
    """Run one task; its :class:`Reply` (None for the stop message).

    What the function prints goes back to the caller, which shows it (in a notebook, under
    the cell) in rank order.
    """
    output = io.StringIO()
    world.start(tracing=False)
    try:
        task = cloudpickle.loads(message)
        if task is None:
            return None
        world.start(tracing=task.tracing)
        sys.path[:0] = [p for p in task.sys_path if p not in sys.path]
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            reply = Reply(rank, value=_to_cpu(task.fn(*task.args, **task.kwargs)))
    except BaseException as exc:  # noqa: BLE001 - reported to the caller
        reply = Reply(rank, error=RemoteError.of(exc))
    reply.events, reply.output = world.events or [], output.getvalue()
    reply.event_times = list(getattr(world, "event_times", []))
    reply.failure = world.failure or world.pairs.failure
    return reply


def _to_cpu(value: Any) -> Any:
    """Torch tensors anywhere in lists, tuples and dicts moved to the CPU (to be pickled)."""
    from chainrule.engine import interop

    if interop.is_torch(value):
        return value.detach().cpu()
    if isinstance(value, list | tuple):
        converted = [_to_cpu(v) for v in value]
        return type(value)(converted) if not hasattr(value, "_fields") else type(value)(*converted)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value
