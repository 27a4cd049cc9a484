"""The lessons' runner (:mod:`notebook_runner`) leaves nothing running: each lesson's kernel,
and the worker pools it started, end before the next lesson runs."""

from __future__ import annotations

import os
import time

import nbformat
import psutil
from notebook_runner import execute

STARTS_A_POOL = """
import os
from chainrule import dist
from chainrule.dist import pool
assert dist.run(dist.rank, 2, backend="gloo") == [0, 1]
kernel, folder = os.getpid(), pool._pools["gloo", 2].folder
# The runner's zygote forked this kernel and the pool's launcher, which forked the ranks.
forked = __import__("psutil").Process(os.getppid()).children(recursive=True)
workers = [p.pid for p in forked if p.pid != kernel]
"""


def test_the_kernel_and_its_worker_pool_end_when_the_notebook_has_run(tmp_path):
    path = tmp_path / "pool.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(STARTS_A_POOL)]), path)
    _, values = execute(path, fetch=["kernel", "folder", "workers"])
    assert len(values["workers"]) == 3  # the launcher and two ranks
    pids = [values["kernel"], *values["workers"]]
    deadline = time.monotonic() + 15.0  # the launcher ends the ranks once the kernel is gone
    while time.monotonic() < deadline and (
        any(_running(pid) for pid in pids) or os.path.exists(values["folder"])
    ):
        time.sleep(0.05)
    assert [pid for pid in pids if _running(pid)] == []
    assert not os.path.exists(values["folder"])


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
