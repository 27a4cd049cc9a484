"""This test process's descendants that the course's code started.

Python's multiprocessing keeps a fork server and a resource tracker for the rest of a process's
life once any code of it used them (the grading tests do, and may run earlier in the same test
process): those, and what they started, are not the distributed pools' and are left out.
"""

from __future__ import annotations

import psutil

#: Command-line marks of multiprocessing's own long-lived helper processes.
MULTIPROCESSING_HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


def descendants() -> list[psutil.Process]:
    """The live descendants of this process, without multiprocessing's helpers and theirs."""
    found, helpers = [], set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if any(mark in " ".join(proc.cmdline()) for mark in MULTIPROCESSING_HELPERS):
                helpers.add(proc.pid)
            elif proc.is_running() and proc.ppid() not in helpers:
                found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found
