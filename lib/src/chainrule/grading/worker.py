"""``python -m chainrule.grading.worker``: autograde one student's submission, notebook by notebook.

The batch grader starts this module once per student in a child process (see
:mod:`chainrule.grading.child`). It caps its own memory, then runs nbgrader's ``Autograde`` one
notebook at a time, so that a notebook that kills its kernel or loops forever costs only itself,
and classifies each notebook's outcome (:mod:`chainrule.grading.outcomes`). nbgrader's
``Execute`` is replaced by :class:`~chainrule.grading.execute.JudgedExecute`: the student's
cells run in a sandboxed kernel that sees only a private copy of the student's snapshot, and
the test cells run here. After every notebook it rewrites a JSON record, so that if the parent
has to kill it the record still says which notebooks were finished and which one was running.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
from traitlets.config import Config

from chainrule.grading.child import apply_memory_limit
from chainrule.grading.config import CourseLayout, load_config
from chainrule.grading.execute import JudgedExecute
from chainrule.grading.gradebooks import assignment_notebooks
from chainrule.grading.limits import with_output_size_limit
from chainrule.grading.outcomes import (
    LIMIT_ERRORS,
    NotebookOutcome,
    RestoredCells,
    classify_failure,
)
from chainrule.grading.restore import instructor_order, with_restore_cells
from chainrule.grading.tamper import find_restored_cells, released_cells


@dataclass(frozen=True)
class SandboxOptions:
    """How this worker confines kernels: the sandbox on or off, the memory limit, and the
    folder where :class:`JudgedExecute` writes its reports."""

    isolate: bool
    memory_limit_mb: int | None
    reports: Path
    workspaces: Path | None = None


def detect_restored(
    layout: CourseLayout, config: Config, assignment: str, notebook: str, path: Path
) -> RestoredCells:
    """The locked cells of a submitted notebook that nbgrader will restore (empty if unreadable)."""
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


def judged_preprocessors(preprocessors: list[Any]) -> list[Any]:
    """nbgrader's autograde preprocessors, with the judge in place of ``Execute``."""
    from nbgrader.preprocessors import Execute

    judged = [JudgedExecute if p is Execute else p for p in preprocessors]
    return with_output_size_limit(judged)


def run_autograde(
    config: Config, assignment: str, student: str, notebook: str, judging: Config
) -> dict[str, Any]:
    """nbgrader's ``Autograde`` for one notebook: ``{"success", "log", "error"}`` like its API.

    ``judging`` is the :class:`JudgedExecute` configuration of this notebook (the submission's
    folder, the sandbox, the report file).
    """
    from nbgrader.converters import Autograde
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.utils import capture_log

    config = Config(config)
    config.merge(judging)
    coursedir = CourseDirectory(config=config)
    coursedir.assignment_id = assignment
    coursedir.student_id = student
    coursedir.notebook_id = notebook
    app = Autograde(coursedir=coursedir, config=config)
    app.sanitize_preprocessors = with_restore_cells(list(app.sanitize_preprocessors))
    app.autograde_preprocessors = judged_preprocessors(list(app.autograde_preprocessors))
    app.force = True
    app.create_student = True
    return capture_log(app)


def read_report(path: Path) -> dict[str, Any]:
    """What :class:`JudgedExecute` reported for one notebook (empty if it wrote nothing)."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return report if isinstance(report, dict) else {}


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
    layout: CourseLayout,
    config: Config,
    assignment: str,
    student: str,
    notebook: str,
    sandbox: SandboxOptions,
) -> NotebookOutcome:
    """Autograde one notebook and say how it went."""
    folder = layout.submission_dir(student, assignment)
    submitted = folder / f"{notebook}.ipynb"
    if not submitted.exists():
        return NotebookOutcome(notebook, submitted=False)
    start = time.monotonic()
    restored = detect_restored(layout, config, assignment, notebook, submitted)
    report_file = sandbox.reports / f"{student}.{notebook}.json"
    report_file.unlink(missing_ok=True)
    judging = Config()
    judging.JudgedExecute.submission = str(folder)
    judging.JudgedExecute.isolate = sandbox.isolate
    judging.JudgedExecute.memory_limit_mb = sandbox.memory_limit_mb or 0
    judging.JudgedExecute.report_file = str(report_file)
    if sandbox.workspaces:
        judging.JudgedExecute.workspace_root = str(sandbox.workspaces)
    result = run_autograde(config, assignment, student, notebook, judging)
    report = read_report(report_file)
    outcome = NotebookOutcome(
        notebook,
        restored=restored,
        not_as_written=[str(r) for r in report.get("not_as_written", [])],
        reaches_into_grader=[str(r) for r in report.get("reaches_into_grader", [])],
    )
    autograded = layout.autograded_dir(student, assignment) / f"{notebook}.ipynb"
    if result.get("success") and autograded.exists():
        outcome.graded = True
        outcome.reason, outcome.detail = limit_hit(autograded)
    else:
        text = result.get("log", "") + "\n" + result.get("error", "")
        outcome.reason, outcome.detail = classify_failure(text)
    outcome.seconds = round(time.monotonic() - start, 2)
    return outcome


class WorkerRecord:
    """The JSON file the parent reads: finished notebooks and the one in progress."""

    def __init__(self, path: Path, student: str) -> None:
        self.path = path
        self.data: dict[str, Any] = {"student": student, "current": None, "notebooks": []}

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


def read_record(path: Path) -> tuple[list[NotebookOutcome], str | None]:
    """The finished outcomes and the notebook in progress from a worker's record."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return [], None
    return [NotebookOutcome.from_dict(r) for r in data["notebooks"]], data.get("current")


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The worker's arguments; unknown ``--Class.trait=value`` ones are config overrides."""
    parser = argparse.ArgumentParser(prog="python -m chainrule.grading.worker")
    parser.add_argument("assignment")
    parser.add_argument("student")
    parser.add_argument("--course-root", default=".")
    parser.add_argument("--record", required=True, type=Path)
    parser.add_argument("--config-file", action="append", default=[])
    parser.add_argument("--db-url")
    parser.add_argument("--autograded-dir")
    parser.add_argument("--submitted-dir")
    parser.add_argument("--memory-limit-mb", type=int)
    parser.add_argument("--no-sandbox", action="store_true")
    parser.add_argument("--reports", type=Path)
    parser.add_argument("--workspaces", type=Path)
    return parser.parse_known_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Grade every notebook of one submission; the record holds the outcomes."""
    args, overrides = parse_args(argv)
    apply_memory_limit(args.memory_limit_mb)
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s] %(message)s")
    config = load_config(args.course_root, args.config_file, overrides)
    if args.db_url:
        config.CourseDirectory.db_url = args.db_url
    if args.autograded_dir:
        config.CourseDirectory.autograded_directory = args.autograded_dir
    if args.submitted_dir:
        config.CourseDirectory.submitted_directory = args.submitted_dir
    layout = CourseLayout.from_config(config)
    record = WorkerRecord(args.record, args.student)
    sandbox = SandboxOptions(
        isolate=not args.no_sandbox,
        memory_limit_mb=args.memory_limit_mb,
        reports=args.reports or args.record.parent,
        workspaces=args.workspaces,
    )
    for notebook in assignment_notebooks(layout.db_url, layout.course_id, args.assignment):
        record.start(notebook)
        outcome = grade_notebook(layout, config, args.assignment, args.student, notebook, sandbox)
        logging.info("%s/%s: %s %s", args.student, notebook, outcome.status, outcome.detail)
        record.finish(outcome)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
