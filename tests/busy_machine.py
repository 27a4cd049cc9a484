"""A machine whose cores are all busy, for the tests that grade a class again on one.

Grades must not depend on how busy the machine is, so the grading tests grade some classes
again on a busy machine and compare. What a busy machine does to a grader is to give it a share
of the cores instead of all of them: its wall clock runs faster than its own CPU time, by the
factor its share is short of what it asks for. :func:`every_core_busy` makes that happen in
one of two ways:

- where the kernel's ``cpu`` controller is at hand (cgroup v1 as root, as on the course's
  machines and in CI), the test process, what it has started in its session and every
  process started in the block run in a control group held to :data:`SHARE_OF_CORES` of the
  machine's cores, as if processes of equal weight kept every core busy beside the grader.
  Nothing else pays for it: the CPU the grader is refused goes to the rest of the machine's
  work;
- elsewhere one process per core spins (pure CPU, never sleeps) for the block's length.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
from chainrule.grading.cgroup import own_v1_group

#: The share of the machine's cores the block's processes get: a half, what a grader with as
#: many busy processes as there are cores gets when one spinning process per core runs beside it.
SHARE_OF_CORES = 0.5
PERIOD_US = 100_000


def _move(pids: list[int], group: Path) -> None:
    for pid in pids:
        try:
            (group / "cgroup.procs").write_text(str(pid))
        except OSError:  # it ended meanwhile (ESRCH)
            continue


def _this_session() -> list[int]:
    """This process and its descendants in its session: what it started itself (a fork server
    of the grader's), not the services it runs in sessions of their own (a JupyterLab, a hub),
    whose work is not the block's."""
    me = psutil.Process()
    session = os.getsid(0)
    found = [me.pid]
    for child in me.children(recursive=True):
        try:
            if os.getsid(child.pid) == session:
                found.append(child.pid)
        except ProcessLookupError:
            continue
    return found


@contextmanager
def _held_to_a_share(cores: int) -> Iterator[bool]:
    """Run the block with this process and its session (:func:`_this_session`) in a v1 ``cpu``
    group whose quota is :data:`SHARE_OF_CORES` of ``cores``; yields ``False`` (and changes
    nothing) where no such group can be made."""
    own = own_v1_group("cpu")
    if not (own / "cpu.cfs_quota_us").exists() or not os.access(own, os.W_OK):
        yield False
        return
    group = own / f"chainrule-busy-machine-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(int(PERIOD_US * cores * SHARE_OF_CORES)))
    except OSError:
        if group.is_dir():
            group.rmdir()
        yield False
        return
    try:
        _move(_this_session(), group)
        yield True
    finally:
        for _ in range(50):  # what the block started and left running goes back with the test
            left = [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
            _move(left, own)
            try:
                group.rmdir()
                break
            except OSError:  # a process forked while it was being moved
                time.sleep(0.02)


@contextmanager
def every_core_busy() -> Iterator[str]:
    """The block runs as on a machine whose every core is busy with other work; yields how:
    ``"quota"`` or ``"spinners"``."""
    count = os.cpu_count() or 2
    with _held_to_a_share(count) as held:
        if held:
            yield "quota"
            return
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield "spinners"
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()
