"""Grading outcomes of the check_yourself assignment, autograded in a temporary course copy.

Students, each a full submission of the five notebooks built from the release:

- ``instructor``: the instructor's solutions, must get every autograded point;
- ``blank``: the release as handed out, must get none, every test cell failing;
- ``right_1`` …: each notebook's alternative correct solutions (written differently), full
  marks;
- ``wrong_1`` … ``wrong_k``: the i-th wrong fixture of every notebook (the instructor's
  solution where a notebook has fewer), each losing points exactly on the test cells its
  fixture names.

All of them are graded with the course's pipeline (:func:`chainrule.grading.run_batch`, two
workers); ``wrong_1`` is graded a second time to check that regrading gives the same scores.
"""

from __future__ import annotations

import io
import shutil

import nbformat
import pytest
from assignment_fixtures import (
    NOTEBOOKS,
    REPO,
    autograde,
    build_submission,
    cell_scores,
    graded_test_ids,
    load_variants,
    make_course,
    write_submission,
)
from chainrule.grading import validate_notebook

pytestmark = pytest.mark.slow

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
    outcomes = autograde(course, ["instructor", "blank", *RIGHT_STUDENTS, *WRONG_STUDENTS])
    return course, {o.student: o for o in outcomes}


@pytest.fixture(scope="module")
def course(graded):
    return graded[0]


def test_every_notebook_of_every_submission_is_graded(graded):
    _, outcomes = graded
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
