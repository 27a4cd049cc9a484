"""A batch graded on the task queue: ``python -m chainrule.classroom grade <assignment>``.

The queue's counterpart of ``python -m chainrule.grading batch``, with the same results:

1. every submission is snapshotted as the batch grader does, and every student the gradebook
   does not know yet is added to it with a name (so that a worker on a machine without the
   students' accounts names nobody "None, None");
2. one job per student goes to the course's queue (:mod:`.tasks`); any number of workers, on
   any machines, take them;
3. while they run, a line per finished student says who graded it, how many are grading and
   queued, and about how long is left (:mod:`.progress`); the same is in
   ``grades/<assignment>/queue-progress.json`` and on the formgrader's batch page;
4. each result's autograded notebooks are written into ``autograded/``, and the batch ends as
   the one-machine batch does: failed notebooks flagged, feedback without hidden tests,
   nbgrader's CSV export, the summary, and the LMS export (:mod:`.lms`).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from celery import Celery
from celery.result import AsyncResult

from chainrule.classroom.lms import write_lms_csv
from chainrule.classroom.progress import BatchProgress
from chainrule.classroom.tasks import HARD_LIMIT_MARGIN_S, TASK_NAME
from chainrule.grading import queue
from chainrule.grading.outcomes import StudentOutcome

POLL_S = 0.5


def name_new_students(batch: queue.QueuedBatch) -> None:
    """Add the batch's students that the gradebook lacks, named after their accounts."""
    from nbgrader.api import Gradebook, MissingEntry

    from chainrule.grading.students import student_names

    layout = batch.job.layout
    with Gradebook(layout.db_url, layout.course_id) as gb:
        for student in batch.students:
            try:
                gb.find_student(student)
            except MissingEntry:
                first, last = student_names(student)
                gb.update_or_create_student(student, first_name=first, last_name=last)


def send_jobs(app: Celery, batch: queue.QueuedBatch, batch_id: str) -> dict[str, AsyncResult]:
    """One job per student whose submission was copied; ``{student: its result handle}``."""
    handles = {}
    limit = batch.options.timeout_per_submission
    for student in batch.copied:
        handles[student] = app.send_task(
            TASK_NAME,
            args=[queue.make_job(batch, student)],
            task_id=f"{batch_id}.{student}",
            time_limit=(limit + HARD_LIMIT_MARGIN_S) if limit else None,
        )
    return handles


def wait_for_results(
    batch: queue.QueuedBatch,
    handles: dict[str, AsyncResult],
    progress: BatchProgress,
    stream: TextIO,
    status_path: Path | None = None,
) -> dict[str, StudentOutcome]:
    """Follow the jobs until every one is done; install each result as it comes."""
    graded: dict[str, StudentOutcome] = {}
    pending = dict(handles)
    while pending:
        for student, handle in list(pending.items()):
            state = handle.state
            if state == "STARTED" and isinstance(handle.info, dict):
                info = handle.info
                progress.grading(student, str(info.get("worker", "")), int(info.get("attempt", 1)))
                continue
            if state not in ("SUCCESS", "FAILURE", "REVOKED"):
                continue
            del pending[student]
            if state == "SUCCESS":
                result = handle.result
                outcome = queue.install_result(batch, result)
                progress.grading(student, result.get("worker", ""), int(result.get("attempt", 1)))
                worker = str(result.get("worker", ""))
            else:
                outcome = queue.failed_outcome(batch, student, f"job failed: {handle.result!r}")
                worker = ""
            graded[student] = outcome
            progress.done(student, outcome.status, outcome.seconds, worker)
            print(progress.line(student), file=stream, flush=True)
        if status_path is not None:
            status_path.write_text(json.dumps(progress.to_json(), indent=1))
        if pending:
            time.sleep(POLL_S)
    return graded


def grade_on_queue(
    app: Celery,
    options: queue.BatchOptions,
    stream: TextIO | None = None,
    on_start: Callable[[BatchProgress], None] | None = None,
) -> queue.BatchResult:
    """Grade one assignment's submissions on the queue (see the module docstring)."""
    stream = stream or sys.stdout
    batch = queue.prepare(options)
    name_new_students(batch)
    progress = BatchProgress(options.assignment, batch.students)
    if on_start is not None:
        on_start(progress)
    print(
        f"Grading {options.assignment} on the queue {app.conf.task_default_queue}: "
        f"{len(batch.students)} submissions, limits {options.timeout_per_submission} s and "
        f"{options.memory_limit_mb} MB per submission, "
        + ("each kernel in a sandbox" if options.sandbox else queue.NOT_ISOLATED),
        file=stream,
        flush=True,
    )
    batch_id = f"{options.assignment}.{uuid.uuid4().hex[:12]}"
    try:
        handles = send_jobs(app, batch, batch_id)
        status_path = batch.out_dir / "queue-progress.json"
        graded = wait_for_results(batch, handles, progress, stream, status_path)
        for handle in handles.values():
            handle.forget()
        result = queue.finish(batch, graded, stream)
        write_lms_csv(batch.job.config, result.out_dir / "lms-grades.csv")
    except BaseException as error:
        progress.end(error=f"{type(error).__name__}: {error}")
        raise
    progress.end(summary=result.summary_txt.read_text())
    status_path.write_text(json.dumps(progress.to_json(), indent=1))
    return result
