"""This test process's descendants that the course's code started.

Two kinds of descendant are not the distributed pools' and are left out:

- Python's multiprocessing keeps a fork server and a resource tracker for the rest of a process's
  life once any code of it used them (the grading tests do, and may run earlier in the same test
  process);
- a test process runs other tests' long-lived fixtures too (a browser and its driver, a
  JupyterLab server): :func:`note_other_children`, called as each test starts, notes the children
  that are not a worker pool's, and what they start is left out for the rest of the test.
"""

from __future__ import annotations

import sys

import psutil

#: Command-line marks of multiprocessing's own long-lived helper processes.
MULTIPROCESSING_HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")

#: Children of this process that other tests' fixtures started: (pid, start time).
_others: set[tuple[int, float]] = set()


def _pool_launchers() -> set[int]:
    """The launchers of the live worker pools (none unless ``chainrule.dist`` was imported)."""
    pool = sys.modules.get("chainrule.dist.pool")
    if pool is None:
        return set()
    return {p.launcher.pid for p in pool._pools.values()}


def note_other_children() -> None:
    """Note this process's children that no worker pool started (another fixture's)."""
    launchers = _pool_launchers()
    _others.clear()
    for proc in psutil.Process().children():
        try:
            if proc.pid not in launchers:
                _others.add((proc.pid, proc.create_time()))
        except psutil.NoSuchProcess:
            continue


def descendants() -> list[psutil.Process]:
    """The live descendants of this process, without multiprocessing's helpers, the children
    noted by :func:`note_other_children`, and what those started."""
    me = psutil.Process().pid
    found, left_out = [], set()
    for proc in psutil.Process().children(recursive=True):  # parents come before children
        try:
            other = proc.ppid() == me and (proc.pid, proc.create_time()) in _others
            if other or any(mark in " ".join(proc.cmdline()) for mark in MULTIPROCESSING_HELPERS):
                left_out.add(proc.pid)
            elif proc.ppid() in left_out:
                left_out.add(proc.pid)
            elif proc.is_running():
                found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found
