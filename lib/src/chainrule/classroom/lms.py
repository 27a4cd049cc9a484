"""The grades as a CSV file that a learning-management system imports.

One row per student of the gradebook, one column per assignment (its maximum in the header,
as Canvas and Moodle grade-import files have it), plus the identifiers an LMS matches rows on:
the login, ``lms_user_id`` and e-mail that nbgrader's gradebook keeps. A cell is the
assignment's score; it is *empty*, never 0, where there is nothing to report yet: no
submission, or a notebook that could not be graded or still waits for manual grading (then the
``needs attention`` column names the assignment). ``nbgrader export`` writes 0 in those places.
"""

from __future__ import annotations

import csv
from pathlib import Path

from traitlets.config import Config

from chainrule.grading.config import CourseLayout

IDENTITY = ("login", "lms_user_id", "email", "first_name", "last_name")


def lms_rows(db_url: str, course_id: str) -> tuple[list[str], list[dict[str, str]]]:
    """The header and the rows (see the module docstring)."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(db_url, course_id) as gb:
        assignments = sorted(gb.assignments, key=lambda a: (a.duedate is None, a.duedate, a.name))
        columns = {a.name: f"{a.name} ({a.max_score:g} pts)" for a in assignments}
        header = [*IDENTITY, *columns.values(), "needs attention"]
        rows = []
        for student in sorted(gb.students, key=lambda s: s.id):
            row = {
                "login": student.id,
                "lms_user_id": student.lms_user_id or "",
                "email": student.email or "",
                "first_name": student.first_name or "",
                "last_name": student.last_name or "",
            }
            attention = []
            for assignment in assignments:
                try:
                    submission = gb.find_submission(assignment.name, student.id)
                except MissingEntry:
                    row[columns[assignment.name]] = ""
                    continue
                waiting = submission.needs_manual_grade or any(
                    nb.flagged for nb in submission.notebooks
                )
                if waiting:
                    attention.append(assignment.name)
                row[columns[assignment.name]] = "" if waiting else f"{submission.score:g}"
            row["needs attention"] = " ".join(attention)
            rows.append(row)
    return header, rows


def write_lms_csv(config: Config, destination: Path) -> Path:
    """Write the course's LMS grades file to ``destination``."""
    layout = CourseLayout.from_config(config)
    header, rows = lms_rows(layout.db_url, layout.course_id)
    destination.parent.mkdir(parents=True, exist_ok=True)
    with destination.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    return destination
