"""Run one grading job in a child process under a wall-clock limit and a memory limit.

nbgrader has no whole-notebook time limit and no memory limit, and a kernel it starts lives in a
session of its own. So each submission is graded in a child process that first caps its own
address space (``RLIMIT_AS``, inherited by every kernel it starts: an allocation past the cap
raises a clean ``MemoryError`` instead of waking the OOM killer), and the parent kills the
child's whole process tree, kernels included, when the wall clock runs out.

Children are forked from a ``multiprocessing`` fork server that has imported nbgrader once:
importing nbgrader costs seconds of CPU, more than grading a small notebook. The cap is set in the
child itself, right after the fork, which is what ``preexec_fn`` would do without its thread
hazards (the parallel grader starts children from several threads).
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

#: Modules the fork server imports once, so that each grading child starts warm.
PRELOAD = ("chainrule.grading.preload",)

#: A submission's limits unless the batch says otherwise: wall-clock seconds, and MiB of
#: address space for the grader and each kernel.
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_MEMORY_MB = 4096

_context_lock = threading.Lock()
_context: Any = None


def _fork_context() -> Any:
    """The fork-server context, with nbgrader preloaded (plain fork where there is no server)."""
    global _context
    with _context_lock:
        if _context is None:
            if "forkserver" in multiprocessing.get_all_start_methods():
                forkserver = multiprocessing.get_context("forkserver")
                forkserver.set_forkserver_preload(list(PRELOAD))
                _context = forkserver
            else:
                _context = multiprocessing.get_context("spawn")
        return _context


def start_fork_server() -> None:
    """Start the fork server now rather than at the first child: its imports (nbgrader, torch,
    seconds of CPU on one core) then run while the caller does its own work, instead of
    delaying the first submission of every worker."""
    if _fork_context().get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def apply_memory_limit(megabytes: int | None) -> None:
    """Cap this process's address space (and its future children's) at ``megabytes`` MiB.

    The hard limit is lowered too: a soft limit alone can be raised again by the process.
    """
    if not megabytes:
        return
    limit = int(megabytes) * 1024 * 1024
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@dataclass(frozen=True)
class LimitedRun:
    """How a limited child ended: exit status (``None`` if killed for time) and wall time."""

    returncode: int | None
    timed_out: bool
    seconds: float


def _descendants(pid: int) -> list[psutil.Process]:
    """The live process and its descendants, plus kernels it started that outlived it.

    A kernel runs in a session of its own and is re-parented when its grader dies, but
    jupyter_client gives it ``JPY_PARENT_PID``, which its own children inherit too.
    """
    family: list[psutil.Process] = []
    try:
        parent = psutil.Process(pid)
        family = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        pass
    known = {proc.pid for proc in family}
    for proc in psutil.process_iter():
        if proc.pid in known:
            continue
        try:
            if proc.environ().get("JPY_PARENT_PID") == str(pid):
                family.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return family


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant, including kernels in sessions of their own."""
    family = _descendants(pid)
    for proc in family:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=5)


def _child(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    log_path: str,
    env: dict[str, str],
    cwd: str,
    memory_limit_mb: int | None,
) -> None:
    """Body of the child: log to ``log_path``, take ``env`` and ``cwd``, cap memory, run."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    os.setsid()
    apply_memory_limit(memory_limit_mb)
    code = function(*args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code or 0))


def run_limited(
    function: Callable[..., Any],
    args: Sequence[Any],
    timeout_s: float | None,
    log_path: str | Path,
    env: Mapping[str, str],
    cwd: str | Path,
    memory_limit_mb: int | None = None,
) -> LimitedRun:
    """Call ``function(*args)`` (a module-level function; ``args`` are pickled) in a limited
    child process.

    The child's output goes to ``log_path``; after ``timeout_s`` seconds its process tree is
    killed. Whatever happens, no descendant survives the call: a kernel left behind by a
    crashed grader would keep its memory and CPU.
    """
    start = time.monotonic()
    proc = _fork_context().Process(
        target=_child,
        args=(function, tuple(args), str(log_path), dict(env), str(cwd), memory_limit_mb),
        daemon=False,
    )
    proc.start()
    proc.join(timeout_s)
    timed_out = proc.exitcode is None
    kill_tree(proc.pid)
    proc.join()
    returncode = None if timed_out else proc.exitcode
    return LimitedRun(returncode, timed_out, time.monotonic() - start)
