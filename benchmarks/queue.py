"""Grading on the task queue: submissions per minute with one and two workers against the
one-machine batch grader on the same submissions, and a class of 1,000 per added machine.

Everything runs in a temporary class folder with its own PostgreSQL and Redis (started by
:mod:`chainrule.classroom.services`, as ``make hub`` starts them), never the repository's
gradebook. The submissions are those of the *grading* family (``check_yourself`` with the
instructor's solutions, each student but the first missing one solution cell, so their grades
differ). The same submissions are graded

- by ``python -m chainrule.grading batch`` (SQLite gradebook) sequentially and with
  ``--workers 2``: the baselines;
- on the queue (``python -m chainrule.classroom grade``, PostgreSQL gradebook) with one and
  then two worker processes (``python -m chainrule.classroom worker``) on this machine.

*identical grades*: every student's per-notebook status and score agree with the batch grader.
*class of 1,000*: on machines like this one (2 cores, so 2 workers each), 1,000 submissions take
``1000 / (m · r)`` with ``r`` the 2-worker queue's submissions per second and ``m`` machines: the
workers share nothing but the broker and the gradebook, whose work per submission (one job
message, one write of the student's grades) is small next to grading it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from chainrule.classroom.deploy import Deployment
from chainrule.classroom.settings import ClassSettings

from benchmarks.grading import (
    grade_batch,
    grade_differences,
    prepare_course,
    read_grades,
    write_submissions,
)
from benchmarks.harness import Row, bench_env, make_row

ASSIGNMENT = "check_yourself"
COURSE_ID = "bench-queue"
MACHINES = (1, 2, 4, 8, 16)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def queue_course(template: Path, root: Path, settings: ClassSettings, database: str) -> Path:
    """A copy of ``template`` whose gradebook is the PostgreSQL database ``database``."""
    course = root / f"queue-{database}"
    shutil.copytree(template, course)
    (course / "gradebook.db").unlink(missing_ok=True)
    shutil.rmtree(course / "grades", ignore_errors=True)
    url = settings.db_url.replace(f"/{settings.database}", f"/{database}").replace(
        f"//{settings.database}:", f"//{database}:"
    )
    with (course / "nbgrader_config.py").open("a") as config:
        config.write(f'\nc.CourseDirectory.course_id = "{COURSE_ID}"\n')
        config.write(f'c.CourseDirectory.db_url = "{url}"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "nbgrader", "generate_assignment", ASSIGNMENT, "--force"],
        cwd=course,
        env=bench_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"generate_assignment failed:\n{proc.stderr[-3000:]}")
    return course


def grade_on_queue(
    deployment: Deployment, course: Path, workers: int
) -> tuple[float, dict, list[str]]:
    """Wall seconds of a queued batch with ``workers`` workers (started before the clock), the
    grades and the workers' names that graded."""
    names = [f"bench{workers}-{k + 1}" for k in range(workers)]
    for name in names:
        deployment.start_worker(name, course)
    try:
        args = [sys.executable, "-m", "chainrule.classroom", "grade", ASSIGNMENT]
        args += ["--settings", str(deployment.settings.path), "--course-root", str(course)]
        args += ["--no-feedback"]
        time.sleep(3)  # the workers connect (their start is not part of a batch)
        start = time.perf_counter()
        proc = subprocess.run(
            args, cwd=course, env=bench_env(), capture_output=True, text=True, timeout=7200
        )
        seconds = time.perf_counter() - start
    finally:
        for name in names:
            deployment.stop_worker(name)
    summary = course / "grades" / ASSIGNMENT / "summary.json"
    if proc.returncode not in (0, 3) or not summary.exists():
        raise RuntimeError(f"queued batch failed ({proc.returncode}):\n{proc.stdout[-4000:]}")
    return seconds, read_grades(summary), names


def measure(quick: bool = False, submissions: int | None = None) -> list[Row]:
    """The rows of the module docstring (``submissions``: default 8, 3 when ``quick``)."""
    count = submissions or (3 if quick else 8)
    rows: list[Row] = []
    root = Path(tempfile.mkdtemp(prefix="bench-queue-", dir="/tmp"))
    root.chmod(0o755)
    settings = ClassSettings(
        root=root, course_id=COURSE_ID, postgres_port=_free_port(), redis_port=_free_port()
    )
    settings.logs.mkdir(parents=True)
    settings.write()
    deployment = Deployment(settings)
    try:
        deployment.start_services()
        template = prepare_course(root / "template")
        write_submissions(template, count)
        batch = {}
        for workers in (1, 2):
            copy = root / f"batch-{workers}"
            shutil.copytree(template, copy)
            batch[workers] = (*grade_batch(copy, workers), copy)
        for workers in (1, 2):
            database = f"queue{workers}"
            deployment.postgres.ensure_gradebook(database, settings.db_password)
            course = queue_course(template, root, settings, database)
            seconds, grades, names = grade_on_queue(deployment, course, workers)
            base_s, base_grades, base_course = batch[workers]
            differences = grade_differences(
                ("batch", base_course, base_grades), ("queue", course, grades)
            )
            noted = {"differences": "; ".join(differences)} if differences else {}
            rows.append(
                make_row(
                    f"queue.workers-{workers}",
                    f"{count} check_yourself submissions on the queue, {workers} worker(s)",
                    seconds,
                    base_s,
                    f"chainrule.grading batch, {'sequential' if workers == 1 else '--workers 2'}",
                    seconds / base_s,
                    per_minute=60 * count / seconds,
                    batch_per_minute=60 * count / base_s,
                    identical_grades=not differences,
                    **noted,
                )
            )
        two_workers_s = next(r for r in rows if r["key"] == "queue.workers-2")["seconds"]
        rate = count / two_workers_s  # one machine of this kind: 2 workers
        extra = {f"hours_{m}_machines": 1000 / (m * rate) / 3600 for m in MACHINES}
        rows.append(
            make_row(
                "queue.class-1000",
                "1,000 submissions on the queue, one 2-core machine (2 workers); more in extra",
                1000 / rate,
                **extra,
            )
        )
    finally:
        deployment.stop()
        shutil.rmtree(root, ignore_errors=True)
    return rows


if __name__ == "__main__":  # pragma: no cover - by hand
    os.environ.setdefault("PYTHONHASHSEED", "0")
    for row in measure(quick=True):
        print(row)
