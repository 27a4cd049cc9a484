"""End to end on the real assignment: ``check_yourself`` graded by the batch pipeline.

Two submissions in one batch with two workers: the instructor's solutions (every autograded
test passes) and the untouched release (every autograded test fails: a real zero, reported as
graded). Feedback is generated for both and shows none of the hidden tests' source lines, which
the autograded notebooks do contain.
"""

from __future__ import annotations

import csv
import html
import io
import re

import nbformat
import pytest
from assignment_fixtures import (
    ASSIGNMENT,
    COURSE_ID,
    NOTEBOOKS,
    RELEASE_DIR,
    SOURCE_DIR,
    build_submission,
    graded_test_ids,
    make_course,
    write_submission,
)
from chainrule.grading import BatchOptions, run_batch
from chainrule.grading.gradebooks import snapshot
from chainrule.grading.hidden import split_hidden_tests

pytestmark = pytest.mark.slow


def _text(path):
    """A file's text as a reader sees it: HTML tags dropped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text()))


def hidden_lines() -> set[str]:
    """Lines of the hidden tests that appear nowhere else: not in the release, not in the
    instructor's solutions (which the ``solution`` student submits)."""
    sources = [nbformat.read(SOURCE_DIR / f"{name}.ipynb", 4) for name in NOTEBOOKS]
    releases = [nbformat.read(RELEASE_DIR / f"{name}.ipynb", 4) for name in NOTEBOOKS]
    visible = "\n".join(cell.source for nb in releases for cell in nb.cells)
    visible += "\n".join(split_hidden_tests(c.source).visible for nb in sources for c in nb.cells)
    lines = set()
    for nb in sources:
        for cell in nb.cells:
            for line in split_hidden_tests(cell.source).hidden_lines:
                line = line.strip()
                if len(line) > 12 and "HIDDEN TESTS" not in line and line not in visible:
                    lines.add(line)
    return lines


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    course = make_course(tmp_path_factory.mktemp("check_yourself"))
    write_submission(course, "solution", {nb: build_submission(nb) for nb in NOTEBOOKS})
    blank = {nb: build_submission(nb, instructor=False) for nb in NOTEBOOKS}
    write_submission(course, "blank", blank)
    options = BatchOptions(ASSIGNMENT, course, workers=2, timeout_per_submission=600)
    return course, run_batch(options, stream=io.StringIO())


def test_solution_gets_every_autograded_point_and_blank_a_real_zero(batch):
    course, result = batch
    statuses = {o.student: o.status for o in result.outcomes}
    assert statuses == {"blank": "graded", "solution": "graded"}
    book = snapshot(f"sqlite:///{course / 'gradebook.db'}", COURSE_ID, ASSIGNMENT)
    for notebook in NOTEBOOKS:
        tests = graded_test_ids(notebook)
        assert tests, notebook
        solution = book["solution"]["notebooks"][notebook]["grades"]
        blank = book["blank"]["notebooks"][notebook]["grades"]
        for test in tests:
            assert solution[test]["auto_score"] > 0, (notebook, test)
            assert blank[test]["auto_score"] == 0, (notebook, test)
    rows = {row.outcome.student: row for row in result.rows}
    assert rows["blank"].total == 0


def test_feedback_for_both_without_hidden_test_source(batch):
    course, _ = batch
    hidden = hidden_lines()
    assert hidden  # the assignment has hidden tests
    autograded = "\n".join(
        _text(p) for p in (course / "autograded" / "solution" / ASSIGNMENT).glob("*.ipynb")
    )
    assert any(line in autograded for line in hidden)  # nbgrader itself would show them
    for student in ("solution", "blank"):
        pages = sorted((course / "feedback" / student / ASSIGNMENT).glob("*.html"))
        assert [p.stem for p in pages] == sorted(NOTEBOOKS)
        for page in pages:
            text = _text(page)
            leaked = [line for line in hidden if line in text]
            assert leaked == [], (page.name, leaked[:3])


def test_grades_and_statuses_are_exported(batch):
    _, result = batch
    export = result.export_csv.read_text().splitlines()
    assert export[0].startswith("assignment,duedate,timestamp,student_id")
    assert {line.split(",")[3] for line in export[1:]} == {"blank", "solution"}
    with result.summary_csv.open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 * len(NOTEBOOKS)
    assert all(row["status"] == "graded" for row in rows)
    assert {row["score"] for row in rows if row["student"] == "blank"} == {"0"}
