"""Grading over a distributed task queue: one job per student's submission.

This module is the whole of what the queue (:mod:`chainrule.classroom.tasks`, on Celery) needs
from the grading pipeline, on both of its sides:

- **The instructor's side** (:func:`prepare`, :func:`make_job`, :func:`install_result`,
  :func:`finish`): the batch's snapshots are taken exactly as the one-machine batch grader
  takes them (:mod:`.snapshot`), and each student's snapshot travels *in* the job, as a
  compressed archive of regular files, so a worker needs no shared file system. Results come
  back the same way: the student's outcome, the log, and the autograded notebooks, which are
  written into the course's ``autograded/``. The batch then ends as the one-machine batch
  does (:func:`chainrule.grading.batch.finish_batch`): failed notebooks flagged, feedback
  without hidden tests, nbgrader's CSV export and the summary.
- **A worker's side** (:func:`grade_job`): the job is graded by the batch grader's own
  :func:`~chainrule.grading.grader.grade_student_safely`, in the same limited child and the same
  bubblewrap sandbox, into a *private* gradebook and ``autograded/`` folder of the job's own: an
  SQLite file seeded from the shared gradebook with the assignment and this student's earlier
  rows (so autograde keeps manual grades as it does on the shared one). Only when grading is
  over is the student's submission written into the shared gradebook
  (:func:`chainrule.grading.gradebooks.merge_submissions`), in one step under a lock held for
  that student. Writing it twice gives the same rows as writing it once, so a job that is run
  again, after the worker that had it died, records its grade once; and whatever a killed
  worker's grading child leaves running can only write to its private copy.

A worker grades against its own copy of the course (``source/`` and ``nbgrader_config.py``); a
job carries the digest of the instructor's ``source/<assignment>``, and a worker whose copy
differs fails the job and says so instead of grading against other tests.
"""

from __future__ import annotations

import base64
import hashlib
import io
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from traitlets.config import Config

from chainrule.grading import scratch
from chainrule.grading.batch import (
    NOT_ISOLATED,
    BatchOptions,
    BatchResult,
    SandboxUnavailable,
    finish_batch,
    submitted_students,
    workspaces_folder,
)
from chainrule.grading.batch import (
    make_job as make_batch_job,
)
from chainrule.grading.config import CourseLayout, grading_env, load_config
from chainrule.grading.gradebooks import merge_submissions
from chainrule.grading.grader import grade_student_safely
from chainrule.grading.outcomes import GRADER_CRASHED, NotebookOutcome, StudentOutcome
from chainrule.grading.sandbox import sandbox_problem, uses_torch
from chainrule.grading.snapshot import Snapshots, take_snapshots
from chainrule.grading.worker import GradingJob, GradingTarget

#: The largest archive of one submission a job carries (the snapshot's own bound is larger:
#: a submission over this fails alone, with this reason).
MAX_ARCHIVE_BYTES = 32 * 1024 * 1024
#: How much of a student's grading log comes back with the result.
LOG_TAIL_CHARS = 20000

Job = dict[str, Any]
Result = dict[str, Any]

__all__ = [
    "NOT_ISOLATED",
    "BatchOptions",
    "BatchResult",
    "SandboxUnavailable",
    "QueuedBatch",
    "finish",
    "grade_job",
    "install_result",
    "make_job",
    "outcome_from_dict",
    "prepare",
    "submitted_students",
]


# -- archives -----------------------------------------------------------------------------------


def pack_folder(folder: Path) -> str:
    """A folder's regular files and sub-folders as a gzip'd tar archive, in base64 text."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        if folder.is_dir():
            for path in sorted(folder.rglob("*")):
                if path.is_symlink() or not (path.is_file() or path.is_dir()):
                    continue
                archive.add(path, arcname=str(path.relative_to(folder)), recursive=False)
    data = buffer.getvalue()
    if len(data) > MAX_ARCHIVE_BYTES:
        raise ValueError(f"{folder.name} is {len(data)} bytes packed, over {MAX_ARCHIVE_BYTES}")
    return base64.b64encode(data).decode("ascii")


def unpack_folder(text: str, folder: Path) -> None:
    """Unpack :func:`pack_folder`'s archive into ``folder`` (regular files and folders only:
    tarfile's ``data`` filter refuses links, devices and paths outside ``folder``)."""
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(text)), mode="r:gz") as archive:
        archive.extractall(folder, filter="data")


def source_digest(config: Config, assignment: str) -> str:
    """SHA-256 over the relative paths and contents of the files of ``source/<assignment>``."""
    from nbgrader.coursedir import CourseDirectory

    coursedir = CourseDirectory(config=config)
    folder = Path(coursedir.format_path(coursedir.source_directory, ".", assignment))
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        parts = path.relative_to(folder).parts
        if not path.is_file() or any(p in (".ipynb_checkpoints", "__pycache__") for p in parts):
            continue
        digest.update("/".join(parts).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


# -- the instructor's side ----------------------------------------------------------------------


class QueuedBatch:
    """A batch prepared for the queue: the grading job every student shares, the snapshots,
    the students to grade and those whose submission could not be copied."""

    def __init__(self, options: BatchOptions, job: GradingJob, snapshots: Snapshots) -> None:
        self.options = options
        self.job = job
        self.snapshots = snapshots
        self.students = list(snapshots.students)
        self.copied = [s for s in self.students if snapshots.students[s].error is None]
        self.digest = source_digest(job.config, options.assignment)

    @property
    def out_dir(self) -> Path:
        return self.job.logs.parent


def prepare(options: BatchOptions) -> QueuedBatch:
    """Snapshot every submission of the batch, as the one-machine batch grader does."""
    if options.sandbox:
        problem = sandbox_problem()
        if problem:
            raise SandboxUnavailable(f"refusing to grade without a sandbox: {problem}")
    root = Path(options.course_root).resolve()
    out_dir = (options.out_dir or root / "grades" / options.assignment).resolve()
    workspaces = workspaces_folder()  # the batch's own: no kernel runs on this side
    scratch.remove(workspaces)
    job = make_batch_job(options, out_dir, workspaces)
    students = options.students or submitted_students(job.layout, options.assignment)
    snapshots = take_snapshots(
        job.layout.submitted, options.assignment, students, job.notebooks, job.snapshots
    )
    return QueuedBatch(options, job, snapshots)


def make_job(batch: QueuedBatch, student: str) -> Job:
    """The queue's job for one student: plain JSON, the snapshot inside."""
    snapshot = batch.snapshots.students[student]
    options = batch.options
    return {
        "course_id": batch.job.layout.course_id,
        "assignment": options.assignment,
        "student": student,
        "notebooks": list(batch.job.notebooks),
        "source_digest": batch.digest,
        "timeout_s": options.timeout_per_submission,
        "memory_limit_mb": options.memory_limit_mb,
        "sandbox": options.sandbox,
        "overrides": list(options.overrides),
        "notebooks_archive": pack_folder(snapshot.notebooks),
        "files_archive": pack_folder(snapshot.files),
    }


def outcome_from_dict(record: dict[str, Any]) -> StudentOutcome:
    """Inverse of :meth:`StudentOutcome.to_dict`."""
    return StudentOutcome(
        student=record["student"],
        notebooks=[NotebookOutcome.from_dict(n) for n in record["notebooks"]],
        seconds=float(record.get("seconds", 0.0)),
        worker=int(record.get("worker", 0)),
        log_path=str(record.get("log_path", "")),
        sandbox_s=float(record.get("sandbox_s", 0.0)),
        imports_s=float(record.get("imports_s", 0.0)),
    )


def install_result(batch: QueuedBatch, result: Result) -> StudentOutcome:
    """Write a job's autograded notebooks into the course's ``autograded/`` and its log into
    the batch's ``logs/``; the student's outcome."""
    outcome = outcome_from_dict(result["outcome"])
    final = batch.job.autograded_dir(outcome.student, GradingTarget())
    if final.exists():
        shutil.rmtree(final)
    if result.get("autograded"):
        unpack_folder(result["autograded"], final)
    log_path = batch.job.logs / f"{outcome.student}.log"
    log_path.write_text(f"graded by {result.get('worker', '?')}\n{result.get('log', '')}")
    outcome.log_path = str(log_path)
    return outcome


def failed_outcome(batch: QueuedBatch, student: str, detail: str) -> StudentOutcome:
    """The outcome of a student whose job could not be graded at all (every notebook failed)."""
    notebooks = [
        NotebookOutcome(n, reason=GRADER_CRASHED, detail=detail) for n in batch.job.notebooks
    ]
    return StudentOutcome(student, notebooks)


def finish(
    batch: QueuedBatch, graded: dict[str, StudentOutcome], stream: TextIO | None = None
) -> BatchResult:
    """Flag, give feedback, export and summarise, as the one-machine batch does."""
    return finish_batch(
        batch.options, batch.job, batch.snapshots, batch.students, graded, stream=stream
    )


# -- a worker's side ----------------------------------------------------------------------------

_TEMPLATE_LOCK = threading.Lock()
_TEMPLATES: dict[str, bytes] = {}


def _empty_gradebook(course_id: str) -> bytes:
    """The file of an empty SQLite gradebook (nbgrader's tables and alembic version), made once
    per process (nbgrader asks ``alembic`` for its version in a subprocess for every new file)
    in a temporary folder that is removed at once: a worker leaves no file behind, even when
    it is killed."""
    from nbgrader.api import Gradebook

    with _TEMPLATE_LOCK:
        data = _TEMPLATES.get(course_id)
        if data is None:
            with tempfile.TemporaryDirectory(prefix="chainrule-gradebook-") as folder:
                path = Path(folder) / "empty.db"
                Gradebook(f"sqlite:///{path}", course_id).close()
                data = path.read_bytes()
            _TEMPLATES[course_id] = data
        return data


def private_gradebook(
    shared_url: str, course_id: str, assignment: str, student: str, destination: Path
) -> str:
    """An SQLite gradebook at ``destination`` holding, from the shared one, the course, the
    assignment with its notebooks and cells, the student and the student's earlier submission
    of it (grades and comments); its URL."""
    from nbgrader.api import Base
    from sqlalchemy import create_engine, delete, insert, select

    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.write_bytes(_empty_gradebook(course_id))
    url = f"sqlite:///{destination.resolve()}"
    t = Base.metadata.tables
    shared = create_engine(shared_url)
    private = create_engine(url)
    try:
        with shared.connect() as src, private.begin() as dst:

            def rows(table: str, column: str, values: Sequence[Any]) -> list[dict[str, Any]]:
                if not values:
                    return []
                query = select(t[table]).where(t[table].c[column].in_(list(values)))
                return [dict(r) for r in src.execute(query).mappings()]

            def copy(table: str, records: list[dict[str, Any]]) -> None:
                if records:
                    dst.execute(insert(t[table]), records)

            dst.execute(delete(t["course"]))
            copy("course", rows("course", "id", [course_id]))
            assignments = [
                a for a in rows("assignment", "name", [assignment]) if a["course_id"] == course_id
            ]
            copy("assignment", assignments)
            notebooks = rows("notebook", "assignment_id", [a["id"] for a in assignments])
            copy("notebook", notebooks)
            notebook_ids = [n["id"] for n in notebooks]
            cells = rows("base_cell", "notebook_id", notebook_ids)
            copy("base_cell", cells)
            for table in ("grade_cells", "solution_cells", "task_cells"):
                copy(table, rows(table, "id", [c["id"] for c in cells]))
            copy("source_cell", rows("source_cell", "notebook_id", notebook_ids))
            copy("student", rows("student", "id", [student]))
            submissions = [
                s
                for s in rows("submitted_assignment", "student_id", [student])
                if s["assignment_id"] in {a["id"] for a in assignments}
            ]
            copy("submitted_assignment", submissions)
            submitted = rows("submitted_notebook", "assignment_id", [s["id"] for s in submissions])
            copy("submitted_notebook", submitted)
            for table in ("grade", "comment"):
                copy(table, rows(table, "notebook_id", [n["id"] for n in submitted]))
    finally:
        shared.dispose()
        private.dispose()
    return url


def write_to_shared(
    private_url: str, shared_url: str, course_id: str, assignment: str, student: str
) -> None:
    """Write the student's submission from the private gradebook into the shared one, under a
    lock held for that student (PostgreSQL's advisory lock), so that two writers of the same
    submission (a job run again while its first run still ends) write one after the other."""
    from sqlalchemy import create_engine, text

    engine = create_engine(shared_url)
    try:
        with engine.connect() as connection:
            locking = connection.dialect.name == "postgresql"
            key = f"{course_id}/{assignment}/{student}"
            if locking:
                connection.execute(text("SELECT pg_advisory_lock(hashtext(:k))"), {"k": key})
                connection.commit()
            try:
                merge_submissions([(student, private_url)], shared_url, course_id, assignment)
            finally:
                if locking:
                    connection.execute(text("SELECT pg_advisory_unlock(hashtext(:k))"), {"k": key})
                    connection.commit()
    finally:
        engine.dispose()


def grade_job(course_root: str | Path, job: Job, worker: str = "") -> Result:
    """Grade one queued submission on this machine (see the module docstring); the result
    is plain JSON: the outcome, the grading log's tail and the autograded notebooks."""
    student, assignment = job["student"], job["assignment"]
    config = load_config(course_root, (), job.get("overrides", ()))
    layout = CourseLayout.from_config(config)
    folder = scratch.make("chainrule-job-")
    workspaces = workspaces_folder()
    try:
        if layout.course_id != job["course_id"]:
            raise ValueError(f"this worker grades {layout.course_id!r}, not {job['course_id']!r}")
        if source_digest(config, assignment) != job["source_digest"]:
            raise ValueError(
                f"this worker's source/{assignment} differs from the instructor's: update the "
                f"worker's copy of the course ({Path(course_root).resolve()})"
            )
        snapshots = folder / "snapshots"
        unpack_folder(job["notebooks_archive"], snapshots / "notebooks" / student / assignment)
        unpack_folder(job["files_archive"], snapshots / "files" / student / assignment)
        logs = folder / "logs"
        logs.mkdir()
        private_url = private_gradebook(
            layout.db_url, layout.course_id, assignment, student, folder / "gradebook.db"
        )
        exchange = str(config.Exchange.get("root", "")) if "Exchange" in config else ""
        grading = GradingJob(
            assignment=assignment,
            layout=layout,
            config=config,
            notebooks=tuple(job["notebooks"]),
            logs=logs,
            env=grading_env(),
            timeout_s=job["timeout_s"],
            memory_limit_mb=job["memory_limit_mb"],
            snapshots=snapshots,
            workspaces=workspaces,
            isolate=bool(job["sandbox"]),
            hidden=tuple(p for p in (str(layout.root), str(folder), exchange) if p),
            preload_torch=uses_torch(layout.source_notebooks(assignment)),
        )
        target = GradingTarget(1, private_url, folder / "autograded")
        outcome = grade_student_safely(grading, student, target)
        write_to_shared(private_url, layout.db_url, layout.course_id, assignment, student)
        log = logs / f"{student}.log"
        return {
            "student": student,
            "worker": worker,
            "outcome": outcome.to_dict(),
            "log": log.read_text(errors="replace")[-LOG_TAIL_CHARS:] if log.exists() else "",
            "autograded": pack_folder(grading.autograded_dir(student, target))
            if grading.autograded_dir(student, target).exists()
            else "",
        }
    finally:
        scratch.remove(folder)
        scratch.remove(workspaces)
