"""Grading outcomes of the check_yourself assignment, autograded in a temporary course copy.

Students, each a full submission of the five notebooks built from the release:

- ``instructor``: the instructor's solutions, must get every autograded point;
- ``blank``: the release as handed out, must get none, every test cell failing;
- ``right_1`` …: each notebook's alternative correct solutions (written differently), full
  marks;
- ``wrong_1`` … ``wrong_k``: the i-th wrong fixture of every notebook (the instructor's
  solution where a notebook has fewer), each losing points exactly on the test cells its
  fixture names.

All of them are graded in one batch with the course's pipeline (:func:`chainrule.grading.run_batch`,
two workers, feedback and exports included); ``wrong_1`` is graded a second time to check that
regrading gives the same scores.
"""

from __future__ import annotations

import csv
import html
import io
import re
import shutil

import nbformat
import pytest
from assignment_fixtures import (
    ASSIGNMENT,
    NOTEBOOKS,
    RELEASE_DIR,
    REPO,
    SOURCE_DIR,
    autograde,
    build_submission,
    cell_scores,
    grade_batch,
    graded_test_ids,
    load_variants,
    make_course,
    write_submission,
)
from chainrule.grading import validate_notebook
from chainrule.grading.hidden import split_hidden_tests

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]

VARIANTS = {name: load_variants(name) for name in NOTEBOOKS}
WRONG = {name: [v for v in VARIANTS[name].values() if not v.is_right] for name in NOTEBOOKS}
RIGHT = {name: [v for v in VARIANTS[name].values() if v.is_right] for name in NOTEBOOKS}
WRONG_STUDENTS = [f"wrong_{i + 1}" for i in range(max(len(w) for w in WRONG.values()))]
RIGHT_STUDENTS = [f"right_{i + 1}" for i in range(max(len(r) for r in RIGHT.values()))]


def _student_of(variant):
    group, students = (WRONG, WRONG_STUDENTS) if not variant.is_right else (RIGHT, RIGHT_STUDENTS)
    return students[group[variant.notebook].index(variant)]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The course copy with every student's submission autograded once, and the outcomes."""
    course = make_course(tmp_path_factory.mktemp("check_yourself"))
    write_submission(course, "instructor", {n: build_submission(n) for n in NOTEBOOKS})
    write_submission(course, "blank", {n: build_submission(n, instructor=False) for n in NOTEBOOKS})
    for group, students in ((WRONG, WRONG_STUDENTS), (RIGHT, RIGHT_STUDENTS)):
        for i, student in enumerate(students):
            notebooks = {}
            for name in NOTEBOOKS:
                variants = group[name]
                cells = variants[i].cells if i < len(variants) else {}
                notebooks[name] = build_submission(name, cells)
            write_submission(course, student, notebooks)
    students = ["instructor", "blank", *RIGHT_STUDENTS, *WRONG_STUDENTS]
    result = grade_batch(course, students, feedback=True)
    with result.summary_csv.open() as handle:  # read now: a regrade rewrites the exports
        exports = {
            "nbgrader": result.export_csv.read_text(),
            "summary": list(csv.DictReader(handle)),
        }
    return course, {o.student: o for o in result.outcomes}, exports


@pytest.fixture(scope="module")
def course(graded):
    return graded[0]


def test_every_notebook_of_every_submission_is_graded(graded):
    _, outcomes, _ = graded
    assert sorted(outcomes) == sorted(["instructor", "blank", *RIGHT_STUDENTS, *WRONG_STUDENTS])
    for outcome in outcomes.values():
        statuses = {nb.name: nb.status for nb in outcome.notebooks}
        assert statuses == dict.fromkeys(NOTEBOOKS, "graded"), outcome.student


def _autograded(course, student, notebook):
    return {k: v for k, v in cell_scores(course, student, notebook).items() if v.autograded}


def _report(cells):
    return "; ".join(
        f"{c.grade_id} {c.score}/{c.max_score}" + (f" [{c.error[:300]}]" if c.error else "")
        for c in cells.values()
    )


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_instructor_solution_gets_every_autograded_point(course, notebook):
    cells = _autograded(course, "instructor", notebook)
    assert sorted(cells) == sorted(graded_test_ids(notebook))
    assert all(c.score == c.max_score for c in cells.values()), _report(cells)
    assert all(c.error is None for c in cells.values()), _report(cells)


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_blank_release_gets_nothing_and_every_test_cell_fails(course, notebook):
    scores = cell_scores(course, "blank", notebook)
    assert all(c.score == 0 for c in scores.values()), _report(scores)
    for cell in scores.values():
        if cell.autograded:
            assert cell.error is not None, f"{cell.grade_id} passes on the blank notebook"


@pytest.mark.parametrize(
    "variant",
    [v for name in NOTEBOOKS for v in WRONG[name]],
    ids=lambda v: f"{v.notebook}-{v.name}",
)
def test_wrong_solution_loses_points_exactly_where_expected(course, variant):
    cells = _autograded(course, _student_of(variant), variant.notebook)
    losing = {c.grade_id for c in cells.values() if c.score < c.max_score}
    assert losing == set(variant.loses), _report(cells)
    for cell_id in losing:
        assert cells[cell_id].error, f"{cell_id} lost points without an error message"
    if variant.message:
        assert any(variant.message in cells[c].error for c in losing), _report(cells)


@pytest.mark.parametrize(
    "variant",
    [v for name in NOTEBOOKS for v in RIGHT[name]],
    ids=lambda v: f"{v.notebook}-{v.name}",
)
def test_alternative_correct_solution_gets_every_autograded_point(course, variant):
    cells = _autograded(course, _student_of(variant), variant.notebook)
    assert all(c.score == c.max_score for c in cells.values()), _report(cells)


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_instructor_solution_passes_validate(tmp_path, notebook):
    """What a student with the instructor's answers sees on pressing Validate: success, so no
    visible test depends on code that only the hidden tests define."""
    shutil.copy2(REPO / "nbgrader_config.py", tmp_path / "nbgrader_config.py")
    path = tmp_path / f"{notebook}.ipynb"
    nbformat.write(build_submission(notebook, written=True), path)
    report = io.StringIO()
    assert validate_notebook(path, course_root=tmp_path, stream=report) == 0, report.getvalue()


def test_regrading_gives_the_same_scores(course):
    student = WRONG_STUDENTS[0]
    before = {n: cell_scores(course, student, n) for n in NOTEBOOKS}
    (outcome,) = autograde(course, [student])
    assert [nb.status for nb in outcome.notebooks] == ["graded"] * len(NOTEBOOKS)
    after = {n: cell_scores(course, student, n) for n in NOTEBOOKS}
    assert {n: {k: c.score for k, c in v.items()} for n, v in after.items()} == {
        n: {k: c.score for k, c in v.items()} for n, v in before.items()
    }
    assert any(c.score < c.max_score for v in after.values() for c in v.values())


# -- feedback and exports ------------------------------------------------------------------------


def _text(path):
    """A file's text as a reader sees it: HTML tags dropped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text()))


def hidden_lines() -> set[str]:
    """Lines of the hidden tests that appear nowhere else: not in the release, not in the
    instructor's solutions (which the ``instructor`` student submits)."""
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


def test_feedback_shows_no_hidden_test_source(graded):
    course, outcomes, _ = graded
    hidden = hidden_lines()
    assert hidden  # the assignment has hidden tests
    autograded = "\n".join(
        _text(p) for p in (course / "autograded" / "instructor" / ASSIGNMENT).glob("*.ipynb")
    )
    assert any(line in autograded for line in hidden)  # nbgrader itself would show them
    for student in outcomes:
        pages = sorted((course / "feedback" / student / ASSIGNMENT).glob("*.html"))
        assert [p.stem for p in pages] == sorted(NOTEBOOKS), student
        submitted = "\n".join(
            cell.source
            for path in (course / "submitted" / student / ASSIGNMENT).glob("*.ipynb")
            for cell in nbformat.read(path, 4).cells
        )
        for page in pages:
            # A line the student wrote themselves may of course appear in their feedback.
            leaked = [x for x in hidden if x in _text(page) and x not in submitted]
            assert leaked == [], (student, page.name, leaked[:3])


def test_grades_and_statuses_are_exported_to_csv(graded):
    _, outcomes, exports = graded
    export = exports["nbgrader"].splitlines()
    assert export[0].startswith("assignment,duedate,timestamp,student_id")
    assert {line.split(",")[3] for line in export[1:]} == set(outcomes)
    rows = exports["summary"]
    assert len(rows) == len(outcomes) * len(NOTEBOOKS)
    assert all(row["status"] == "graded" for row in rows)
    assert {row["score"] for row in rows if row["student"] == "blank"} == {"0"}
