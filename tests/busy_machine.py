"""A machine whose cores are all busy: processes that spin until the block ends.

Grades must not depend on how busy the machine is, so the grading tests grade some classes
again beside spinning processes (one per core) and compare.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def every_core_busy() -> Iterator[int]:
    """Run one process per core that spins (pure CPU, never sleeps) for the block's length;
    yields how many."""
    count = os.cpu_count() or 2
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield count
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()
