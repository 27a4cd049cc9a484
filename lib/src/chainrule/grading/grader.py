"""Grade one student's submission in an isolated, limited child process.

:func:`grade_student` removes any earlier autograded copy, runs
:func:`chainrule.grading.worker.grade_submission` through
:func:`chainrule.grading.child.run_limited`, and turns the worker's record (plus how the child
ended) into a :class:`StudentOutcome`. A notebook the record does not cover was cut off: by the
wall-clock limit (``timeout``), or by the child dying. If any notebook ended without an
autograded notebook, the student's whole ``autograded/<student>/<assignment>`` folder is
removed, as nbgrader does itself, so that a later plain ``nbgrader autograde`` grades it again
instead of skipping it.
"""

from __future__ import annotations

import shutil
import threading
import time
from typing import TextIO

from chainrule.grading import cgroup
from chainrule.grading.child import LimitedRun, run_limited
from chainrule.grading.outcomes import (
    GRADER_CRASHED,
    MEMORY_LIMIT,
    TIMEOUT,
    NotebookOutcome,
    StudentOutcome,
)
from chainrule.grading.worker import GradingJob, GradingTarget, grade_submission, read_record


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


def grade_student(job: GradingJob, student: str, target: GradingTarget) -> StudentOutcome:
    """Autograde one submission in a limited child; leave no partial autograded folder."""
    dest = job.autograded_dir(student, target)
    if dest.exists():
        shutil.rmtree(dest)
    log_path = job.logs / f"{student}.log"
    record = job.logs / f"{student}.json"
    for path in (log_path, record):
        path.unlink(missing_ok=True)
    group = cgroup.create(job.memory_limit_mb, label=f"w{target.index}")
    try:
        run = run_limited(
            grade_submission,
            (job, student, target, record, group),
            job.timeout_s,
            log_path,
            job.env,
            job.layout.root,
            job.memory_limit_mb,
        )
    finally:  # whatever the sandbox started ends here, even if the grader was killed
        if group is not None:
            group.remove()
    read = read_record(record)
    by_name = {nb.name: nb for nb in read.notebooks}
    log_tail = log_path.read_text(errors="replace")[-20000:] if log_path.exists() else ""
    notebooks = []
    for name in job.notebooks:
        if name in by_name:
            notebooks.append(by_name[name])
            continue
        reason, detail = _cut_off(run, job, log_tail, read.current == name)
        notebooks.append(NotebookOutcome(name, reason=reason, detail=detail))
    outcome = StudentOutcome(
        student,
        notebooks,
        seconds=run.seconds,
        worker=target.index,
        log_path=str(log_path),
        sandbox_s=float(read.extra.get("sandbox_s", 0.0)),
        imports_s=float(read.extra.get("imports_s", 0.0)),
    )
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
