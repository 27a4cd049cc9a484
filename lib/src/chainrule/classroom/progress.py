"""What an instructor sees while a batch is graded on the queue: each student's state, the
workers at work, and an estimate of the time left.

The estimate is the work left at the pace seen so far: with ``n`` of ``N`` submissions done
after ``t`` seconds, ``(N - n) · t / n``. It assumes the submissions left take as long as those
done, and the same workers; it is shown only once one submission is done.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

QUEUED = "queued"
GRADING = "grading"
DONE = "done"


@dataclass
class StudentState:
    """One student's job: its state, the worker grading it, the attempt, the final status."""

    student: str
    state: str = QUEUED
    worker: str = ""
    attempt: int = 0
    status: str = ""
    score: str = ""
    seconds: float = 0.0


@dataclass
class BatchProgress:
    """The batch's progress, safe to read from another thread (the formgrader's page)."""

    assignment: str
    students: list[str]
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    states: dict[str, StudentState] = field(default_factory=dict)
    summary: str = ""
    error: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        for student in self.students:
            self.states.setdefault(student, StudentState(student))

    def grading(self, student: str, worker: str, attempt: int) -> None:
        with self._lock:
            state = self.states[student]
            if state.state != DONE:
                state.state, state.worker, state.attempt = GRADING, worker, attempt

    def done(self, student: str, status: str, seconds: float, worker: str = "") -> None:
        with self._lock:
            state = self.states[student]
            state.state, state.status, state.seconds = DONE, status, seconds
            state.worker = worker or state.worker

    def end(self, summary: str = "", error: str = "") -> None:
        with self._lock:
            self.finished = time.monotonic()
            self.summary, self.error = summary, error

    @property
    def elapsed(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    def counts(self) -> dict[str, int]:
        with self._lock:
            found = {QUEUED: 0, GRADING: 0, DONE: 0}
            for state in self.states.values():
                found[state.state] += 1
            return found

    def seconds_left(self) -> float | None:
        """The estimate of the module docstring (``None`` before the first submission is done,
        0 once all are)."""
        done, total = self.counts()[DONE], len(self.students)
        if done == total:
            return 0.0
        if done == 0:
            return None
        return (total - done) * self.elapsed / done

    def line(self, student: str) -> str:
        """The progress line printed when ``student`` is done."""
        counts = self.counts()
        state = self.states[student]
        width = len(str(len(self.students)))
        left = self.seconds_left()
        eta = "—" if left is None else format_seconds(left)
        return (
            f"[{counts[DONE]:>{width}}/{len(self.students)}] {student} {state.status}  "
            f"({state.seconds:.1f} s on {state.worker or '?'}"
            + (f", attempt {state.attempt}" if state.attempt > 1 else "")
            + f"; {self.elapsed:.0f} s elapsed, about {eta} left, "
            f"{counts[GRADING]} grading, {counts[QUEUED]} queued)"
        )

    def to_json(self) -> dict[str, Any]:
        """Everything the formgrader's batch page shows."""
        left = self.seconds_left()
        with self._lock:
            students = [vars(s).copy() for s in self.states.values()]
        return {
            "assignment": self.assignment,
            "total": len(self.students),
            "counts": self.counts(),
            "elapsed_s": round(self.elapsed, 1),
            "seconds_left": None if left is None else round(left, 1),
            "workers": sorted({s["worker"] for s in students if s["state"] == GRADING}),
            "finished": self.finished is not None,
            "summary": self.summary,
            "error": self.error,
            "students": students,
        }


def format_seconds(seconds: float) -> str:
    """``42 s``, ``3 min 5 s``, ``2 h 4 min``."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"
