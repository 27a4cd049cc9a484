"""Gradebook operations of the grading pipeline: list, copy, merge back, snapshot, flag.

nbgrader's SQLite gradebook is not safe for concurrent writers, so each parallel worker grades
into its own copy (:func:`copy_gradebook`), and :func:`merge_submissions` writes what autograde
recorded for that worker's students back into the course gradebook through nbgrader's
``Gradebook`` API: the student, the submission and its timestamp, and per notebook the late
penalty, the flag, every grade (auto/manual score, extra credit, needs-manual-grade) and every
comment. :func:`snapshot` reads the same fields back, so two gradebooks can be compared.
"""

from __future__ import annotations

import sqlite3
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from nbgrader.api import Gradebook, MissingEntry
from sqlalchemy.exc import SAWarning

from chainrule.grading.config import sqlite_path
from chainrule.grading.outcomes import StudentOutcome

STUDENT_FIELDS = ("first_name", "last_name", "email", "lms_user_id")
SUBMISSION_FIELDS = ("timestamp", "extension")
NOTEBOOK_FIELDS = ("flagged", "late_submission_penalty")
GRADE_FIELDS = ("auto_score", "manual_score", "extra_credit", "needs_manual_grade")
COMMENT_FIELDS = ("auto_comment", "manual_comment")


def assignment_notebooks(db_url: str, course_id: str, assignment: str) -> list[str]:
    """The notebook names of ``assignment``, in order (``LookupError`` if it was never
    generated)."""
    with Gradebook(db_url, course_id) as gb:
        try:
            return [nb.name for nb in gb.find_assignment(assignment).notebooks]
        except MissingEntry:
            raise LookupError(
                f"assignment {assignment!r} is not in the gradebook {db_url}: "
                f"generate it first with `make release ASSIGNMENT={assignment}` (that is "
                f"`nbgrader generate_assignment {assignment} --force`)"
            ) from None


def copy_gradebook(db_url: str, destination: Path) -> str:
    """Copy an SQLite gradebook consistently (SQLite's backup API); return the copy's URL."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    source = sqlite3.connect(sqlite_path(db_url))
    target = sqlite3.connect(destination)
    try:
        source.backup(target)
    finally:
        target.close()
        source.close()
    return f"sqlite:///{destination.resolve()}"


def _copy_fields(source: object, target: object, fields: Iterable[str]) -> None:
    for name in fields:
        setattr(target, name, getattr(source, name))


def _merge_one(src: Gradebook, dst: Gradebook, assignment: str, student_id: str) -> None:
    """Copy one student's submission of ``assignment`` from ``src`` into ``dst``."""
    try:
        submission = src.find_submission(assignment, student_id)
    except MissingEntry:
        return
    student = src.find_student(student_id)
    dst.update_or_create_student(
        student_id, **{name: getattr(student, name) for name in STUDENT_FIELDS}
    )
    try:
        target = dst.find_submission(assignment, student_id)
    except MissingEntry:
        target = dst.add_submission(assignment, student_id)
    _copy_fields(submission, target, SUBMISSION_FIELDS)
    for notebook in submission.notebooks:
        target_nb = dst.find_submission_notebook(notebook.name, assignment, student_id)
        _copy_fields(notebook, target_nb, NOTEBOOK_FIELDS)
        target_grades = {grade.name: grade for grade in target_nb.grades}
        for grade in notebook.grades:
            _copy_fields(grade, target_grades[grade.name], GRADE_FIELDS)
        target_comments = {comment.name: comment for comment in target_nb.comments}
        for comment in notebook.comments:
            _copy_fields(comment, target_comments[comment.name], COMMENT_FIELDS)
    dst.db.commit()


def merge_submissions(
    sources: Sequence[tuple[str, str]], target_url: str, course_id: str, assignment: str
) -> None:
    """Write each ``(student, source_url)`` submission into the gradebook ``target_url``.

    Students are added in the order given, so that listings ordered by insertion (nbgrader's
    export) come out as they would after grading one after another.
    """
    opened: dict[str, Gradebook] = {}
    try:
        with Gradebook(target_url, course_id) as dst, warnings.catch_warnings():
            # nbgrader's add_submission builds rows under autoflush, which SQLAlchemy warns
            # about (the rows are added by cascade all the same).
            warnings.simplefilter("ignore", SAWarning)
            for student, source_url in sources:
                if source_url not in opened:
                    opened[source_url] = Gradebook(source_url, course_id)
                _merge_one(opened[source_url], dst, assignment, student)
    finally:
        for gradebook in opened.values():
            gradebook.close()


def snapshot(db_url: str, course_id: str, assignment: str) -> dict[str, Any]:
    """Every student's recorded submission of ``assignment``, as plain nested dicts."""
    result: dict[str, Any] = {}
    with Gradebook(db_url, course_id) as gb:
        for submission in gb.assignment_submissions(assignment):
            notebooks = {}
            for nb in submission.notebooks:
                notebooks[nb.name] = {
                    **{name: getattr(nb, name) for name in NOTEBOOK_FIELDS},
                    "score": nb.score,
                    "max_score": nb.max_score,
                    "grades": {
                        g.name: {name: getattr(g, name) for name in GRADE_FIELDS} for g in nb.grades
                    },
                    "comments": {
                        c.name: {name: getattr(c, name) for name in COMMENT_FIELDS}
                        for c in nb.comments
                    },
                }
            result[submission.student_id] = {
                **{name: getattr(submission, name) for name in SUBMISSION_FIELDS},
                "score": submission.score,
                "notebooks": notebooks,
            }
    return result


def flag_failed(
    db_url: str, course_id: str, assignment: str, outcomes: Iterable[StudentOutcome]
) -> None:
    """Mark failed and flagged notebooks in the gradebook so the formgrader lists them.

    A failed notebook is flagged and its grades need manual grading; one that was not graded
    at all also loses any auto score left from an earlier run, since that is not this
    submission's score. A notebook that was graded but flagged (tests that did not run as
    written, code that reaches into the grader) is flagged and keeps its scores.
    """
    with Gradebook(db_url, course_id) as gb:
        for outcome in outcomes:
            for nb_outcome in outcome.notebooks:
                if not (nb_outcome.failed or nb_outcome.flags):
                    continue
                try:
                    nb = gb.find_submission_notebook(nb_outcome.name, assignment, outcome.student)
                except MissingEntry:
                    continue
                nb.flagged = True
                if not nb_outcome.failed:
                    continue
                for grade in nb.grades:
                    grade.needs_manual_grade = True
                    if not nb_outcome.graded:
                        grade.auto_score = None
        gb.db.commit()
