"""Where a rank of a worker pool is, read by the pool's owner while the rank is stuck.

A rank that waits in a collective is blocked inside gloo or NCCL, and a rank that loops in its
own code never looks at its connection: neither can answer a question. Two things can still be
read from outside, and a timeout's message is made of them:

- **the collective it waits in.** Before the ranks agree on a collective, the rank writes its
  name (``"barrier #0"``) into a small file mapped into memory (:class:`Status`), and clears it
  once the ranks have agreed: a write of a few bytes, no system call;
- **the line it runs.** Python's :mod:`faulthandler` writes the stack of every thread when the
  rank receives ``SIGUSR1``, from a C signal handler that needs neither the interpreter's lock
  nor the rank's cooperation (as ``py-spy dump`` or torch's flight recorder would, without
  either): :func:`stack_of` sends the signal and reads the rank's innermost line of its own code.
"""

from __future__ import annotations

import faulthandler
import linecache
import mmap
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

SIZE = 256  # bytes of the status file: a collective's name and its group
DUMP_SIGNAL = signal.SIGUSR1
DYNAMIC = "<dynamic-code>"  # the file of code that cloudpickle sent by value
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.+)$')
_LIBRARY = str(Path(__file__).resolve().parents[1])  # the chainrule package
_PYTHON = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})


def status_path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"rank-{rank}.waits-in")


def stack_path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"rank-{rank}.stack")


class Status:
    """This rank's collective, while it waits in one: the rank's side of the status file."""

    def __init__(self, path: str) -> None:
        self.folder = os.path.dirname(path)  # where the other ranks' status files are too
        with open(path, "w+b") as handle:
            handle.truncate(SIZE)
            self._map = mmap.mmap(handle.fileno(), SIZE)

    def waiting_in(self, collective: str | None) -> None:
        """Record the collective this rank now waits in (None: it runs its own code)."""
        if collective is None:
            self._map[0:1] = b"\0"
            return
        data = collective.encode()[: SIZE - 1]
        self._map[: len(data) + 1] = data + b"\0"


_dump_file: IO[str] | None = None  # kept open: faulthandler writes to its descriptor


def install(folder: str, rank: int) -> Status:
    """In a new rank: its status file, and its stack written to a file on ``SIGUSR1``."""
    global _dump_file
    _dump_file = open(stack_path(folder, rank), "w")  # noqa: SIM115 - open for the process's life
    faulthandler.register(DUMP_SIGNAL, file=_dump_file, all_threads=True)
    return Status(status_path(folder, rank))


def waits_in(folder: str, rank: int) -> str | None:
    """The collective ``rank`` waits in, or None (its own code, or nothing recorded)."""
    try:
        data = Path(status_path(folder, rank)).read_bytes()
    except OSError:
        return None
    text = data.split(b"\0", 1)[0].decode(errors="replace")
    return text or None


@dataclass(frozen=True)
class Line:
    """A line of code a rank was running: the function, the line's number and its text."""

    function: str
    number: int
    text: str

    def __str__(self) -> str:
        source = f": {self.text}" if self.text else ""
        return f"line {self.number} of {self.function}{source}"


def stack_of(folder: str, rank: int, pid: int, sources: dict[str, set[str]]) -> Line | None:
    """The innermost line of the caller's own code that ``rank`` (process ``pid``) runs now.

    ``sources``: function name -> the files its code comes from in the caller, for the
    functions that travelled by value (their file is :data:`DYNAMIC` on the rank).
    None when the rank is in none of the caller's code, or did not write its stack in time.
    """
    path = stack_path(folder, rank)
    try:
        before = os.path.getsize(path)
        os.kill(pid, DUMP_SIGNAL)
    except OSError:
        return None
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        time.sleep(0.02)
        try:
            text = Path(path).read_text(errors="replace")[before:]
        except OSError:
            return None
        if "run_task" in text:
            return own_line(text, sources)
    return None


def positions(lines: dict[int, Line | None]) -> str:
    """Where stuck ranks were: "at line 3 of f: x += 1" for one rank, each rank named for
    several; "" when no line is known."""
    known = {r: line for r, line in sorted(lines.items()) if line is not None}
    if len(lines) == 1:
        return "".join(f"at {line}" for line in known.values())
    return "; ".join(f"rank {r} at {line}" for r, line in known.items())


def line_of_frame(frame: FrameType | None) -> Line | None:
    """The innermost line of the caller's own code from ``frame`` outwards (a rank of the
    simulated world that its watchdog stops)."""
    while frame is not None:
        code = frame.f_code
        if _own(code.co_filename):
            number = frame.f_lineno
            return Line(code.co_name, number, linecache.getline(code.co_filename, number).strip())
        frame = frame.f_back
    return None


def _own(filename: str) -> bool:
    """Whether code of ``filename`` is the caller's: not Python's (its frozen modules too), a
    package's or this library's."""
    return not filename.startswith((_LIBRARY, *_PYTHON, "<frozen "))


def own_line(dump: str, sources: dict[str, set[str]]) -> Line | None:
    """In a faulthandler dump, the main thread's innermost frame of the caller's code: not of
    Python, its packages or this library."""
    for block in dump.split("\n\n"):
        frames = [m.groups() for m in map(_FRAME.match, block.splitlines()) if m]
        if not any(name == "run_task" for _, _, name in frames):
            continue  # another thread
        for filename, number, name in frames:  # innermost first
            if not _own(filename):
                continue
            lineno, files = int(number), sources.get(name, set())
            known = next(iter(files)) if filename == DYNAMIC and len(files) == 1 else filename
            return Line(name, lineno, linecache.getline(known, lineno).strip())
    return None
