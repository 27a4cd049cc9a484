"""Grading a class on the task queue: 40 submissions, two workers, one of them killed.

The submissions are synthetic and tiny (one notebook with two solution cells, a visible and a
hidden test: scores 0 to 3), so that 40 of them fit in the test suite's time; the real
``check_yourself`` goes through the queue in the hub's test. The submissions are of four kinds
(every fourth the same notebook); one of each kind is graded by the one-machine batch grader
(``python -m chainrule.grading batch``, two workers, SQLite gradebook) while the queue recovers
from the killed worker, and every student on the queue must get the grades of their kind.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from chainrule.classroom.__main__ import app_for
from chainrule.classroom.dispatch import grade_on_queue
from chainrule.grading.gradebooks import snapshot
from chainrule.grading.queue import BatchOptions
from grading_course import answer, make_course, solve, source_notebooks, submit
from running_class import Classroom

pytestmark = [pytest.mark.hub, pytest.mark.sandbox, pytest.mark.slow]

STUDENTS = 40
COURSE_ID = "queue-test"
#: Seconds before a job a dead worker held goes back to the queue (a job here takes seconds).
VISIBILITY_S = 20.0


def squares_only() -> dict:
    return {"squares": source_notebooks()["squares"]}


#: The kinds of submission (:func:`answers`): student ``i`` hands in kind ``i % KINDS``.
KINDS = 4


def answers(index: int):
    """Four kinds of submissions: right, square wrong on negatives (hidden test fails), cube
    wrong, untouched."""

    def edit(notebooks: dict) -> None:
        kind = index % KINDS
        if kind == 3:
            return
        solve(notebooks)
        if kind == 1:
            answer(notebooks["squares"], "square", "def square(x):\n    return abs(x) * x")
        if kind == 2:
            answer(notebooks["squares"], "cube", "def cube(x):\n    return x * x")

    return edit


def _named(process: psutil.Process) -> str:
    """A process's name, or "" once it has ended (between listing it and asking its name)."""
    try:
        return process.name()
    except psutil.NoSuchProcess:
        return ""


def _scratch_folders(processes: list[psutil.Process]) -> set[str]:
    """The grading scratch folders (a job's, its kernels') that these processes name on their
    command lines or hold files open in."""
    found = set()
    for process in processes:
        try:
            names = [*process.cmdline(), *(f.path for f in process.open_files())]
        except psutil.Error:
            continue
        found.update(re.findall(r"/\S*?/chainrule-(?:job|kernels)-[^/\s]+", " ".join(names)))
    return found


def kill_when_grading(
    worker: subprocess.Popen, log: Path, after_jobs: int = 3, timeout_s: float = 240
) -> set[str]:
    """SIGKILL the worker's whole process tree (its machine dies) while it grades a job: once
    it has finished ``after_jobs`` jobs, as soon as one of its descendants is a sandbox
    (``bwrap``). Returns the scratch folders the job was graded in, which the killed worker
    could not remove."""
    deadline = time.monotonic() + timeout_s
    parent = psutil.Process(worker.pid)
    while time.monotonic() < deadline:
        family = [parent, *parent.children(recursive=True)]
        finished = log.read_text(errors="replace").count(" succeeded in ") if log.exists() else 0
        grading = any(_named(p) == "bwrap" for p in family)
        if finished >= after_jobs and grading:
            left = _scratch_folders(family)
            for proc in family:
                try:
                    proc.kill()
                except psutil.NoSuchProcess:
                    pass
            try:
                os.killpg(worker.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            worker.wait()
            return left
        time.sleep(0.05)
    raise AssertionError("the worker never started grading")


def grades(db_url: str) -> dict:
    """Each student's score and per-notebook grades (what the gradebook records)."""
    return {
        student: {
            "score": record["score"],
            "notebooks": {
                name: {"score": nb["score"], "grades": nb["grades"], "flagged": nb["flagged"]}
                for name, nb in record["notebooks"].items()
            },
        }
        for student, record in snapshot(db_url, COURSE_ID, "tiny").items()
    }


def test_forty_submissions_on_two_workers_grade_as_the_batch_grader_despite_a_killed_worker(
    classroom: Classroom, tmp_path: Path
) -> None:
    settings = classroom.settings
    db_url = classroom.database("queue_test")
    course_line = f'c.CourseDirectory.course_id = "{COURSE_ID}"\n'
    queued = make_course(
        tmp_path / "queued",
        notebooks=squares_only,
        extra_config=course_line + f'c.CourseDirectory.db_url = "{db_url}"\n',
    )
    batch = make_course(tmp_path / "batch", notebooks=squares_only, extra_config=course_line)
    students = [f"s{i:02d}" for i in range(STUDENTS)]
    for index, student in enumerate(students):
        submit(queued, student, answers(index))
    kinds = students[:KINDS]  # the batch's reference: one student of each kind
    for index, student in enumerate(kinds):
        submit(batch, student, answers(index))

    deployment = classroom.deployment
    workers = {
        name: deployment.start_worker(name, queued.root, visibility_timeout_s=VISIBILITY_S)
        for name in ("queue1", "queue2")
    }
    app = app_for(settings, queued.root, VISIBILITY_S)
    stream = io.StringIO()
    outcome: dict = {}

    def dispatch() -> None:
        options = BatchOptions(assignment="tiny", course_root=queued.root)
        outcome["result"] = grade_on_queue(app, options, stream=stream)

    started = time.monotonic()
    dispatcher = threading.Thread(target=dispatch)
    dispatcher.start()
    try:
        abandoned = kill_when_grading(workers["queue1"], settings.logs / "queue1.log")
        deployment.workers.pop("queue1")
        # the machine is replaced, as a service manager restarts a worker
        deployment.start_worker("queue3", queued.root, visibility_timeout_s=VISIBILITY_S)
        env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
        baseline = subprocess.run(
            [sys.executable, "-m", "chainrule.grading", "batch", "tiny", "--workers", "2"],
            cwd=batch.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert baseline.returncode == 0, baseline.stdout[-3000:] + baseline.stderr[-3000:]
        dispatcher.join(timeout=600)
        assert not dispatcher.is_alive(), stream.getvalue()[-3000:]
    finally:
        dispatcher.join(timeout=1)
        for name in ("queue2", "queue3"):
            if name in deployment.workers:
                deployment.stop_worker(name)
    seconds = time.monotonic() - started
    result = outcome["result"]
    log = stream.getvalue()
    assert result.all_graded, log[-4000:]

    # every student has the grades the one-machine batch grader gave their kind
    batch_url = f"sqlite:///{batch.root / 'gradebook.db'}"
    queued_grades, batch_grades = grades(db_url), grades(batch_url)
    assert sorted(queued_grades) == students and sorted(batch_grades) == kinds
    for index, student in enumerate(students):
        assert queued_grades[student] == batch_grades[kinds[index % KINDS]], student
    assert len({json.dumps(g, sort_keys=True) for g in batch_grades.values()}) == KINDS
    assert sorted(r["score"] for r in queued_grades.values()) != [3.0] * STUDENTS  # grades differ

    # the killed worker's job was graded again by the other worker, and recorded once
    progress = json.loads((queued.root / "grades" / "tiny" / "queue-progress.json").read_text())
    again = [s for s in progress["students"] if s["attempt"] > 1]
    assert again, log[-4000:]
    assert all(not s["worker"].startswith("queue1@") for s in again), again
    assert {s["student"] for s in progress["students"] if s["state"] == "done"} == set(students)
    assert len(snapshot(db_url, COURSE_ID, "tiny")) == STUDENTS

    # what the killed worker left in the temporary folder, the next jobs removed
    assert any("chainrule-job-" in folder for folder in abandoned), abandoned
    assert [folder for folder in abandoned if os.path.exists(folder)] == []

    # the progress lines name the worker, and estimate the time left
    lines = [line for line in log.splitlines() if line.startswith("[")]
    assert len(lines) == STUDENTS, log[-3000:]
    assert "left" in lines[0] and "on queue1@" in log and "on queue2@" in log

    # the LMS export: one row per student, the score where there is one
    rows = list(csv.DictReader((result.out_dir / "lms-grades.csv").open()))
    assert sorted(r["login"] for r in rows) == students
    column = "tiny (3 pts)"
    assert {r["login"]: float(r[column]) for r in rows} == {
        s: queued_grades[s]["score"] for s in students
    }
    print(f"40 submissions on the queue with a worker killed: {seconds:.0f} s")
