"""Grade one student's submission in an isolated, limited child process.

:func:`grade_student` removes any earlier autograded copy, runs
:mod:`chainrule.grading.worker` through :func:`chainrule.grading.child.run_limited`, and turns
the worker's record (plus how the child ended) into a :class:`StudentOutcome`. A notebook the
record does not cover was cut off: by the wall-clock limit (``timeout``), or by the child dying.
If any notebook ended without an autograded notebook, the student's whole
``autograded/<student>/<assignment>`` folder is removed, as nbgrader does itself, so that a later
plain ``nbgrader autograde`` grades it again instead of skipping it.
"""

from __future__ import annotations

import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from traitlets.config import Config

from chainrule.grading.child import LimitedRun, run_limited
from chainrule.grading.config import CourseLayout
from chainrule.grading.outcomes import (
    GRADER_CRASHED,
    MEMORY_LIMIT,
    TIMEOUT,
    NotebookOutcome,
    StudentOutcome,
)
from chainrule.grading.worker import read_record

WORKER = "chainrule.grading.worker:main"


@dataclass(frozen=True)
class GradingTarget:
    """Where one grader writes: its gradebook and its autograded folder (``None``: the course's)."""

    index: int = 0
    db_url: str | None = None
    autograded: Path | None = None


@dataclass
class GradingJob:
    """What every student's grading shares: the assignment, the course, the limits."""

    assignment: str
    layout: CourseLayout
    config: Config
    notebooks: list[str]
    logs: Path
    env: dict[str, str]
    timeout_s: float | None
    memory_limit_mb: int | None
    config_files: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    isolate: bool = True
    snapshots: Path | None = None
    workspaces: Path | None = None

    def autograded_dir(self, student: str, target: GradingTarget) -> Path:
        """The folder the worker writes this student's autograded notebooks to."""
        root = target.autograded or self.layout.autograded
        return root / student / self.assignment

    def worker_argv(self, student: str, record: Path, target: GradingTarget) -> list[str]:
        """Arguments of :func:`chainrule.grading.worker.main` for one student."""
        argv = [self.assignment, student, "--course-root", str(self.layout.root)]
        argv += ["--record", str(record)]
        for path in self.config_files:
            argv += ["--config-file", str(path)]
        if target.db_url:
            argv += ["--db-url", target.db_url]
        if target.autograded:
            argv += ["--autograded-dir", str(target.autograded)]
        if self.snapshots:
            argv += ["--submitted-dir", str(self.snapshots)]
        if self.memory_limit_mb:
            argv += ["--memory-limit-mb", str(self.memory_limit_mb)]
        if not self.isolate:
            argv += ["--no-sandbox"]
        if self.workspaces:
            argv += ["--workspaces", str(self.workspaces)]
        return argv + list(self.overrides)


def _cut_off(run: LimitedRun, job: GradingJob, log_tail: str, current: bool) -> tuple[str, str]:
    """Why a notebook the worker never finished was not graded, and a detail line."""
    if run.timed_out:
        return TIMEOUT, (
            f"submission ran over its {job.timeout_s:g} s limit"
            + (" while grading this notebook" if current else " before this notebook started")
        )
    if "MemoryError" in log_tail:
        return MEMORY_LIMIT, f"grader ran out of memory (limit {job.memory_limit_mb} MB)"
    return GRADER_CRASHED, f"grading process exited with status {run.returncode}"


def assemble_outcome(
    job: GradingJob, student: str, record: Path, run: LimitedRun, log_path: Path
) -> StudentOutcome:
    """One outcome per notebook of the assignment, from the record and how the child ended."""
    finished, current = read_record(record)
    by_name = {nb.name: nb for nb in finished}
    log_tail = log_path.read_text(errors="replace")[-20000:] if log_path.exists() else ""
    notebooks = []
    for name in job.notebooks:
        if name in by_name:
            notebooks.append(by_name[name])
            continue
        reason, detail = _cut_off(run, job, log_tail, current == name)
        notebooks.append(NotebookOutcome(name, reason=reason, detail=detail))
    return StudentOutcome(student, notebooks, seconds=run.seconds, log_path=str(log_path))


def grade_student(job: GradingJob, student: str, target: GradingTarget) -> StudentOutcome:
    """Autograde one submission in a limited child; leave no partial autograded folder."""
    dest = job.autograded_dir(student, target)
    if dest.exists():
        shutil.rmtree(dest)
    log_path = job.logs / f"{student}.log"
    record = job.logs / f"{student}.json"
    for path in (log_path, record):
        path.unlink(missing_ok=True)
    run = run_limited(
        WORKER,
        job.worker_argv(student, record, target),
        job.timeout_s,
        log_path,
        job.env,
        job.layout.root,
        job.memory_limit_mb,
    )
    outcome = assemble_outcome(job, student, record, run, log_path)
    outcome.worker = target.index
    if not outcome.fully_graded and dest.exists():
        shutil.rmtree(dest)
    return outcome


def grade_student_safely(job: GradingJob, student: str, target: GradingTarget) -> StudentOutcome:
    """:func:`grade_student`, but an error in the pipeline itself fails only this student."""
    try:
        return grade_student(job, student, target)
    except Exception as error:  # the batch must go on to the next student
        detail = f"{type(error).__name__}: {error}"
        notebooks = [
            NotebookOutcome(n, reason=GRADER_CRASHED, detail=detail) for n in job.notebooks
        ]
        return StudentOutcome(student, notebooks, worker=target.index)


class Progress:
    """One line per student as it finishes: count, name, status, its time and the total."""

    def __init__(self, total: int, stream: TextIO, name_width: int = 12) -> None:
        self.total = total
        self.stream = stream
        self.name_width = name_width
        self.done = 0
        self.start = time.monotonic()
        self._lock = threading.Lock()

    def report(self, outcome: StudentOutcome) -> None:
        """Print the line for a finished student (thread-safe)."""
        with self._lock:
            self.done += 1
            elapsed = time.monotonic() - self.start
            width = len(str(self.total))
            line = (
                f"[{self.done:>{width}}/{self.total}] {outcome.student:<{self.name_width}} "
                f"{outcome.status}  ({outcome.seconds:.1f} s; {elapsed:.0f} s elapsed)"
            )
            print(line, file=self.stream, flush=True)
