"""Grade with several workers, each into its own gradebook copy, then merge back.

nbgrader grades one submission after another (#174) and its SQLite gradebook is not safe for
concurrent writers. Here each of N worker threads takes the next student from a shared queue and
grades it (in its own limited child process) into the worker's *own* copy of the course gradebook
and its own autograded folder. When all are done, each worker's submissions are merged into the
course gradebook (:func:`chainrule.grading.gradebooks.merge_submissions`) and its autograded
folders are moved into the course's. Every copy starts as the course gradebook and autograde
touches only the graded student's rows, so the result equals grading one after another.
"""

from __future__ import annotations

import queue
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from chainrule.grading.gradebooks import copy_gradebook, merge_submissions
from chainrule.grading.grader import grade_student_safely
from chainrule.grading.outcomes import StudentOutcome
from chainrule.grading.worker import GradingJob, GradingTarget

Report = Callable[[StudentOutcome], None]


def prepare_targets(job: GradingJob, workers: int, staging: Path) -> list[GradingTarget]:
    """One gradebook copy and one autograded folder per worker, under ``staging``."""
    targets = []
    for index in range(workers):
        folder = staging / f"worker-{index + 1}"
        db_url = copy_gradebook(job.layout.db_url, folder / "gradebook.db")
        targets.append(GradingTarget(index + 1, db_url, folder / "autograded"))
    return targets


def _work(
    job: GradingJob,
    target: GradingTarget,
    students: queue.SimpleQueue[str],
    results: dict[str, StudentOutcome],
    report: Report,
) -> None:
    """One worker: grade students from the queue until it is empty."""
    while True:
        try:
            student = students.get_nowait()
        except queue.Empty:
            return
        outcome = grade_student_safely(job, student, target)
        results[student] = outcome
        report(outcome)


def merge_back(
    job: GradingJob, targets: Sequence[GradingTarget], outcomes: Sequence[StudentOutcome]
) -> None:
    """Write every worker's students, in the order given, into the course gradebook and move
    their autograded folders into the course's."""
    by_index = {target.index: target for target in targets}
    sources = [(o.student, by_index[o.worker].db_url or "") for o in outcomes]
    merge_submissions(sources, job.layout.db_url, job.layout.course_id, job.assignment)
    for outcome in outcomes:
        final = job.autograded_dir(outcome.student, GradingTarget())
        if final.exists():
            shutil.rmtree(final)
        staged = job.autograded_dir(outcome.student, by_index[outcome.worker])
        if staged.exists():
            final.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(staged), str(final))


def grade_in_parallel(
    job: GradingJob, students: Sequence[str], workers: int, report: Report
) -> list[StudentOutcome]:
    """Grade ``students`` with ``workers`` workers; return outcomes in the order given."""
    results: dict[str, StudentOutcome] = {}
    todo: queue.SimpleQueue[str] = queue.SimpleQueue()
    for student in students:
        todo.put(student)
    staging = Path(tempfile.mkdtemp(prefix=".grading-workers-", dir=job.logs))
    try:
        targets = prepare_targets(job, workers, staging)
        threads = [
            threading.Thread(target=_work, args=(job, t, todo, results, report), daemon=True)
            for t in targets
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        merge_back(job, targets, [results[s] for s in students])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [results[s] for s in students]
