"""``python -P -m chainrule.grading.zygote <socket> [--without-torch]``: a student's kernels,
forked warm.

The course's grader starts this program once per student, inside that student's sandbox
(:mod:`chainrule.grading.sandbox`). It imports what every exercise imports (numpy, torch,
torch.distributed and PyTorch's DistributedDataParallel, the course library, IPython's kernel)
once, then serves forks on the Unix socket ``<socket>`` (:func:`serve`; the grader asks with
:func:`chainrule.dist.forks.request`). One request is one line of JSON, ``{"kind": …, …}``; the
zygote forks, the child answers ``{"pid": …}`` on the same connection and then does what
``kind`` says:

- ``kernel``: the kernel of one notebook (``connection_file``, ``home``, ``env``), an
  ipykernel that starts in milliseconds because everything it would import is imported;
- ``launcher``: the launcher of a kernel's worker pool of gloo ranks (``config``), whose
  ranks then share this process's import of torch (:mod:`chainrule.dist.forks`);
- ``signal``: send a signal to the process group of a process of the sandbox (from the
  grader, whose pids are not the sandbox's);
- ``reset``: kill every process of the sandbox but this one (what a notebook's code left
  running before the next notebook starts).

Why: a submission's grading then costs one interpreter start and one import of torch, instead
of one per notebook and one more per world of ranks (measured in ``BENCHMARKS.md``, family
``grading``). Every kernel is a fresh fork of the same clean process, so the notebooks of one
submission never see each other's state; nothing here outlives the sandbox.

``--without-torch`` leaves torch out of the imports (:data:`TORCH_PRELOAD`): for an assignment
none of whose notebooks uses torch or gloo (``sharded`` runs on the simulated world), where
importing it would be most of the sandbox's start and buy nothing. A notebook that imports it
anyway still works: its kernel imports torch itself.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from chainrule.dist import forks
from chainrule.dist.forks import read_line

#: What one kind of request runs in the forked child: the request and its connection.
Handler = Callable[[dict[str, Any], socket.socket], None]

#: What the exercises import, imported once before any fork.
PRELOAD = (
    "numpy",
    "cloudpickle",
    "IPython",
    "ipykernel.kernelapp",
    "ipykernel.ipkernel",
    "ipykernel.debugger",
    "chainrule",
    "chainrule.course.checks",
    "chainrule.dist",
    "chainrule.dist.pool",
    "chainrule.dist.worker",
    "chainrule.judging.agent",
    "chainrule.course.restart_hint",
)

#: What the exercises that use torch or gloo import besides (see ``--without-torch``).
TORCH_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    # What torch imports on a process's first backward(gradient): sympy, 0.3 s of CPU that
    # every kernel and every rank would otherwise pay again.
    "torch.fx.experimental.symbolic_shapes",
    "chainrule.dist.torch_backend",
)


def start_kernel(request: dict[str, Any], connection: socket.socket) -> None:
    """The kernel of one notebook, in its own home, with the connection file given."""
    os.environ.update({str(k): str(v) for k, v in request.get("env", {}).items()})
    os.chdir(request["home"])
    from ipykernel.kernelapp import IPKernelApp

    arguments = [str(a) for a in request.get("arguments", [])]
    sys.argv = ["ipykernel_launcher", "-f", request["connection_file"], *arguments]
    app = IPKernelApp.instance()
    app.initialize(sys.argv[1:])
    app.start()


def start_launcher(request: dict[str, Any], connection: socket.socket) -> None:
    """The launcher of a worker pool of a kernel forked here (:mod:`chainrule.dist.pool`):
    its ranks, forked from it, share this process's import of torch instead of each pool
    importing it anew. The connection is its lifeline, as a launcher's standard input is: it
    ends when the pool's owner closes it."""
    config = request["config"]
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in request.get("env", {}).items()})
    os.chdir(request.get("cwd", os.getcwd()))
    os.dup2(connection.fileno(), 0)
    sys.path[:0] = [p for p in config["sys_path"] if p not in sys.path]
    from chainrule.dist.worker import main

    main(config)


def send_signal(request: dict[str, Any], connection: socket.socket) -> None:
    """Signal the process group of ``pid`` (a kernel is the leader of its own)."""
    pid, signum = int(request["pid"]), int(request["signal"])
    try:
        os.killpg(pid, signum)
    except OSError:
        try:
            os.kill(pid, signum)
        except OSError:
            pass


def reset(request: dict[str, Any], connection: socket.socket) -> None:
    """Kill every process of the sandbox but the zygote, its ancestors and this one (without
    the sandbox, ``--no-sandbox``: every descendant of the zygote but this one)."""
    zygote = os.getppid()
    keep = {os.getpid(), *_ancestors(os.getpid())}
    sandboxed = os.environ.get("CHAINRULE_SANDBOXED") == "1"
    for _ in range(20):
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in keep]
        if not sandboxed:
            pids = [p for p in pids if zygote in _ancestors(p)]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _ancestors(pid: int) -> list[int]:
    found = []
    while (pid := _parent(pid)) > 0:
        found.append(pid)
    return found


def serve(address: str, handlers: Mapping[str, Handler]) -> None:
    """Fork one child per request on the Unix socket ``address``, until standard input
    closes (the grader holds its other end: when the grader goes, so does the zygote)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(16)
    signal.signal(signal.SIGCHLD, _reap)
    threading.Thread(target=_exit_with_stdin, daemon=True).start()
    while True:
        try:
            connection, _ = listener.accept()
        except InterruptedError:
            continue
        request = read_line(connection)
        handler = handlers.get(str(request.get("kind")))
        if handler is None:  # a probe, or a request of no known kind
            connection.close()
            continue
        if os.fork() == 0:
            _run_child(listener, connection, handler, request)
        connection.close()


def _run_child(
    listener: socket.socket, connection: socket.socket, handler: Handler, request: dict[str, Any]
) -> None:
    """In the forked child: a process group of its own, default signals, then the handler."""
    try:
        listener.close()
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        connection.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
        handler(request, connection)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _reap(*_: Any) -> None:
    """Collect every child that has exited (kernels, helpers), so none stays a zombie."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _exit_with_stdin() -> None:
    while os.read(0, 1):
        pass
    os._exit(0)


HANDLERS = {
    "kernel": start_kernel,
    "launcher": start_launcher,
    "signal": send_signal,
    "reset": reset,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Import, say so, then serve forks until the grader closes our standard input."""
    import importlib

    args = list(sys.argv[1:] if argv is None else argv)
    without_torch = "--without-torch" in args
    (address,) = [arg for arg in args if arg != "--without-torch"]
    started = time.monotonic()
    for module in (*TORCH_PRELOAD[: 0 if without_torch else None], *PRELOAD):
        importlib.import_module(module)
    with open(address + ".starting", "w") as ready:  # written whole, then renamed: read whole
        json.dump({"pid": os.getpid(), "imports_s": time.monotonic() - started}, ready)
    os.replace(address + ".starting", address + ".ready")
    os.environ[forks.ENV] = address  # every kernel forked here asks here for its pools' launchers
    serve(address, HANDLERS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
