"""Ask a fork server for a child: one line of JSON over a Unix socket, one line back.

A fork server is a process that has imported what its children need (torch, above all) and
forks one child per request, so that a child starts in milliseconds instead of the seconds an
import of torch takes. The course's grader runs one in every student's sandbox
(:mod:`chainrule.grading.zygote`): it forks the student's kernels, and a kernel it forked finds
its address in the environment (:data:`ENV`) and asks it for the launchers of its worker pools
(:mod:`chainrule.dist.pool`).

A request is ``{"kind": …, …}``; the child answers ``{"pid": …}`` on the same connection,
which stays open: its other end is the child's to use (a launcher's lifeline, say).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Mapping
from typing import Any

#: The environment variable that holds the address of the fork server this process came from.
ENV = "CHAINRULE_FORK_SERVER"


def request(address: str, kind: str, payload: Mapping[str, Any]) -> tuple[int, socket.socket]:
    """Ask the fork server at ``address`` for a child of ``kind``: its pid and the connection."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address)
        sock.sendall(json.dumps({"kind": kind, **payload}).encode() + b"\n")
        answer = read_line(sock)
    except BaseException:
        sock.close()
        raise
    if "pid" not in answer:
        sock.close()
        raise ConnectionError(f"the fork server at {address} did not start a {kind!r}")
    return int(answer["pid"]), sock


def read_line(sock: socket.socket) -> dict[str, Any]:
    """One line of JSON from ``sock`` (an empty object if it closes first)."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        line += chunk
    try:
        value = json.loads(line) if line.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class ForkedChild:
    """A child that a fork server forked for this process, with the part of
    :class:`subprocess.Popen`'s interface a worker pool uses (``pid``, ``poll``, ``wait``,
    ``stdin``).

    It is the fork server's child, not this process's: the fork server reaps it, and its exit
    code is not known here (``poll`` says 0 once it has ended). ``stdin`` is the connection, the
    child's lifeline: closing it tells the child to end.
    """

    def __init__(self, address: str, kind: str, payload: Mapping[str, Any]) -> None:
        self.pid, self.stdin = request(address, kind, payload)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not _running(self.pid):
            self.returncode = 0
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"process {self.pid}", timeout or 0.0)
            time.sleep(0.005)
        return code


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and has not ended (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
