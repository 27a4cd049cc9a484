"""Autograde one student's submission, notebook by notebook, in the student's own sandbox.

The batch grader runs :func:`grade_submission` once per student in a child process of its
own (see :mod:`chainrule.grading.child`), with the batch's :class:`GradingJob`. It starts the
student's sandbox once (:class:`~chainrule.grading.sandbox.StudentSandbox`: one interpreter
with numpy, torch and the course library imported, which forks each notebook's kernel), then
runs nbgrader's ``Autograde`` one notebook at a time, so that a notebook that kills its
kernel or loops forever costs only itself, and classifies each notebook's outcome
(:mod:`chainrule.grading.outcomes`). nbgrader's ``Execute`` is replaced by
:class:`~chainrule.grading.execute.JudgedExecute`: the student's cells run in the sandbox, the
test cells run here. After every notebook it rewrites a JSON record, so that if the parent has
to kill it the record still says which notebooks were finished and which one was running.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from traitlets.config import Config

from chainrule.grading.cgroup import Cgroup
from chainrule.grading.config import REPRODUCIBLE_DEFAULTS, CourseLayout
from chainrule.grading.execute import JudgedExecute
from chainrule.grading.limits import with_output_size_limit
from chainrule.grading.outcomes import (
    LIMIT_ERRORS,
    SANDBOX_FAILED,
    TIMEOUT,
    NotebookOutcome,
    RestoredCells,
    classify_failure,
)
from chainrule.grading.restore import instructor_order, with_restore_cells
from chainrule.grading.sandbox import StudentSandbox, new_workspace
from chainrule.grading.tamper import find_restored_cells, released_cells


@dataclass(frozen=True)
class GradingTarget:
    """Where one grader writes: its gradebook and its autograded folder (``None``: the course's)."""

    index: int = 0
    db_url: str | None = None
    autograded: Path | None = None


@dataclass(frozen=True)
class GradingJob:
    """What every student's grading shares, decided once by the batch: the assignment, the
    course and its configuration, the notebooks, where the snapshots, logs and sandboxes
    are, the limits, the folders no sandbox may see, and whether its sandboxes import torch
    before the first kernel (:func:`~chainrule.grading.sandbox.uses_torch`)."""

    assignment: str
    layout: CourseLayout
    config: Config
    notebooks: tuple[str, ...]
    logs: Path
    env: dict[str, str]
    timeout_s: float | None
    memory_limit_mb: int | None
    snapshots: Path
    workspaces: Path
    isolate: bool = True
    hidden: tuple[str, ...] = ()
    preload_torch: bool = True

    def autograded_dir(self, student: str, target: GradingTarget) -> Path:
        """The folder the worker writes this student's autograded notebooks to."""
        root = target.autograded or self.layout.autograded
        return root / student / self.assignment

    def files_of(self, student: str) -> Path:
        """The snapshot of everything the student submitted (their sandbox's home)."""
        return self.snapshots / "files" / student / self.assignment

    def nbgrader_config(self, target: GradingTarget) -> Config:
        """The course's configuration, reading the snapshots, writing to ``target``."""
        config = Config(self.config)
        config.CourseDirectory.submitted_directory = str(self.snapshots / "notebooks")
        if target.db_url:
            config.CourseDirectory.db_url = target.db_url
        if target.autograded:
            config.CourseDirectory.autograded_directory = str(target.autograded)
        return config


def detect_restored(
    layout: CourseLayout, config: Config, assignment: str, notebook: str, path: Path
) -> RestoredCells:
    """The instructor's cells of a submitted notebook that grading restores (empty if the
    notebook cannot be read)."""
    from nbgrader.api import Gradebook

    try:
        nb = nbformat.read(path, as_version=4)
    except Exception:  # a corrupt notebook fails grading and is reported there
        return RestoredCells()
    begin = config.ClearHiddenTests.get("begin_test_delimeter", "BEGIN HIDDEN TESTS")
    end = config.ClearHiddenTests.get("end_test_delimeter", "END HIDDEN TESTS")
    with Gradebook(layout.db_url, layout.course_id) as gb:
        released = released_cells(gb, notebook, assignment, str(begin), str(end))
    try:
        order = instructor_order(config, assignment, notebook)
    except FileNotFoundError:  # grading fails on it, and says why
        order = []
    return find_restored_cells(nb, released, order)


def run_autograde(
    config: Config, assignment: str, student: str, notebook: str, executor: JudgedExecute
) -> dict[str, Any]:
    """nbgrader's ``Autograde`` for one notebook: ``{"success", "log", "error"}`` like its API,
    with ``executor`` in place of nbgrader's ``Execute``."""
    from nbgrader.converters import Autograde
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.preprocessors import Execute
    from nbgrader.utils import capture_log

    coursedir = CourseDirectory(config=config)
    coursedir.assignment_id = assignment
    coursedir.student_id = student
    coursedir.notebook_id = notebook
    app = Autograde(coursedir=coursedir, config=config)
    app.sanitize_preprocessors = with_restore_cells(list(app.sanitize_preprocessors))
    chain = [executor if p is Execute else p for p in app.autograde_preprocessors]
    app.autograde_preprocessors = with_output_size_limit(chain)
    app.force = True
    app.create_student = True
    return capture_log(app)


def limit_hit(autograded: Path) -> tuple[str | None, str]:
    """Whether a grading limit cut a graded notebook short: ``(reason, detail)`` or no reason."""
    nb = nbformat.read(autograded, as_version=4)
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error" and output.get("ename") in LIMIT_ERRORS:
                name = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", f"cell {index}")
                return LIMIT_ERRORS[output["ename"]], f"{output['ename']} in {name}"
    return None, ""


def grade_notebook(
    job: GradingJob, target: GradingTarget, student: str, notebook: str, sandbox: StudentSandbox
) -> NotebookOutcome:
    """Autograde one notebook in the student's sandbox and say how it went."""
    config = job.nbgrader_config(target)
    submitted = job.snapshots / "notebooks" / student / job.assignment / f"{notebook}.ipynb"
    if not submitted.exists():
        return NotebookOutcome(notebook, submitted=False)
    start = time.monotonic()
    restored = detect_restored(job.layout, config, job.assignment, notebook, submitted)
    executor = JudgedExecute(sandbox, notebook, config=config)
    cpu_before = sandbox.group.cpu_seconds() if sandbox.group is not None else 0.0
    result = run_autograde(config, job.assignment, student, notebook, executor)
    report = executor.report
    outcome = NotebookOutcome(
        notebook,
        restored=restored,
        not_as_written=list(report.not_as_written),
        reaches_into_grader=list(report.reaches_into_grader),
        kernel_died=report.kernel_died,
    )
    autograded = job.autograded_dir(student, target) / f"{notebook}.ipynb"
    if result.get("success") and autograded.exists():
        outcome.graded = True
        outcome.reason, outcome.detail = limit_hit(autograded)
    else:
        text = result.get("log", "") + "\n" + result.get("error", "")
        outcome.reason, outcome.detail = classify_failure(text)
    if sandbox.group is not None and sandbox.group.memory_limit_hit() and outcome.kernel_died:
        outcome.kernel_died += (
            f" (the sandbox reached its memory limit of {job.memory_limit_mb} MB)"
        )
    outcome.seconds = round(time.monotonic() - start, 2)
    parts = dict(report.seconds)
    parts["nbgrader"] = max(0.0, outcome.seconds - sum(parts.values()))
    if sandbox.group is not None:
        parts["cpu"] = sandbox.group.cpu_seconds() - cpu_before
    outcome.parts = {k: round(v, 3) for k, v in parts.items()}
    return outcome


class WorkerRecord:
    """The JSON file the parent reads: finished notebooks, the one in progress, and the
    sandbox's start-up time."""

    def __init__(self, path: Path, student: str) -> None:
        self.path = path
        self.data: dict[str, Any] = {"student": student, "current": None, "notebooks": []}

    def note(self, **values: Any) -> None:
        """Record student-level facts (``sandbox_s=...``)."""
        self.data.update(values)
        self._write()

    def start(self, notebook: str) -> None:
        """Note that ``notebook`` is being graded now."""
        self.data["current"] = notebook
        self._write()

    def finish(self, outcome: NotebookOutcome) -> None:
        """Add a finished notebook's outcome."""
        self.data["current"] = None
        self.data["notebooks"].append(outcome.to_dict())
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)


@dataclass
class RecordRead:
    """What a worker's record says: finished outcomes, the notebook in progress, the rest."""

    notebooks: list[NotebookOutcome] = field(default_factory=list)
    current: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def read_record(path: Path) -> RecordRead:
    """The finished outcomes and the notebook in progress from a worker's record."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return RecordRead()
    extra = {k: v for k, v in data.items() if k not in ("notebooks", "current", "student")}
    notebooks = [NotebookOutcome.from_dict(r) for r in data["notebooks"]]
    return RecordRead(notebooks, data.get("current"), extra)


#: A notebook whose first run ends for one of these reasons is graded once more, from a fresh
#: kernel: a time limit exists to stop runaway code, and a busy machine can make right code
#: reach it. Runaway code reaches it again; the second run's grade is the grade.
RETRIED_REASONS = (TIMEOUT,)


def grade_submission(
    job: GradingJob, student: str, target: GradingTarget, record: Path, group: Cgroup | None
) -> int:
    """Grade every notebook of one submission in one sandbox (whose processes are all in
    ``group``, when there is one); the record holds the outcomes."""
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s] %(message)s", force=True)
    log = WorkerRecord(record, student)
    sandbox = StudentSandbox(
        workspace=new_workspace(job.workspaces),
        files=job.files_of(student),
        memory_limit_mb=job.memory_limit_mb,
        isolate=job.isolate,
        hidden=list(job.hidden),
        environment={k: os.environ[k] for k in REPRODUCIBLE_DEFAULTS if k in os.environ},
        group=group,
        preload_torch=job.preload_torch,
    )
    try:
        try:
            sys.stdout.flush()
            sandbox.start(log=sys.stdout)
        except Exception as error:  # every notebook fails, and says why
            detail = f"{type(error).__name__}: {error}"
            for notebook in job.notebooks:
                log.finish(NotebookOutcome(notebook, reason=SANDBOX_FAILED, detail=detail))
            return 0
        log.note(
            sandbox_s=round(sandbox.started_s, 3),
            imports_s=round(sandbox.imports_s, 3),
            cgroup=sandbox.group is not None,
        )
        for notebook in job.notebooks:
            log.start(notebook)
            outcome = grade_notebook(job, target, student, notebook, sandbox)
            sandbox.reset()
            if outcome.reason in RETRIED_REASONS:
                first = f"{outcome.reason}: {outcome.detail}" if outcome.detail else outcome.reason
                logging.info("%s/%s: %s; graded again", student, notebook, first)
                outcome = grade_notebook(job, target, student, notebook, sandbox)
                outcome.retried = first or ""
                sandbox.reset()
            logging.info("%s/%s: %s %s", student, notebook, outcome.status, outcome.detail)
            log.finish(outcome)
    finally:
        sandbox.stop()
        shutil.rmtree(sandbox.workspace, ignore_errors=True)
    return 0
