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
regrading gives the same scores. Every variant is also validated as a student would (the
visible tests only): right ones pass, and every wrong one fails, except the few special-cased
ones that only the hidden tests can catch, each listed with the reason.
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
    validate_many,
    write_submission,
)
from chainrule.grading import validate_notebook
from chainrule.grading.config import load_config
from chainrule.grading.hidden import split_hidden_tests

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]

VARIANTS = {name: load_variants(name) for name in NOTEBOOKS}
WRONG = {name: [v for v in VARIANTS[name].values() if not v.is_right] for name in NOTEBOOKS}
RIGHT = {name: [v for v in VARIANTS[name].values() if v.is_right] for name in NOTEBOOKS}
WRONG_STUDENTS = [f"wrong_{i + 1}" for i in range(max(len(w) for w in WRONG.values()))]
RIGHT_STUDENTS = [f"right_{i + 1}" for i in range(max(len(r) for r in RIGHT.values()))]


def test_every_exercise_has_enough_wrong_and_right_solutions():
    for name in NOTEBOOKS:
        assert len(WRONG[name]) >= 6 and len(RIGHT[name]) >= 1, name


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
            notebooks = {  # only the notebooks this student has a variant of
                name: build_submission(name, group[name][i].cells)
                for name in NOTEBOOKS
                if i < len(group[name])
            }
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
        statuses = {nb.name: nb.status for nb in outcome.notebooks if nb.submitted}
        assert set(statuses.values()) == {"graded"}, outcome.student
        if outcome.student in ("instructor", "blank"):
            assert sorted(statuses) == sorted(NOTEBOOKS)


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


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    """Validate (the visible tests only, in the student's kernel) on every variant."""
    folder = tmp_path_factory.mktemp("validate")
    shutil.copy2(REPO / "nbgrader_config.py", folder / "nbgrader_config.py")
    paths = {}
    for name in NOTEBOOKS:
        for variant in VARIANTS[name].values():
            path = folder / f"{name}__{variant.name}.ipynb"
            nbformat.write(build_submission(name, variant.cells, written=True), path)
            paths[(name, variant.name)] = path
    results = validate_many(folder, paths.values())
    return {key: results[path] for key, path in paths.items()}


@pytest.mark.parametrize(
    "variant",
    [v for name in NOTEBOOKS for v in VARIANTS[name].values()],
    ids=lambda v: f"{v.notebook}-{v.name}",
)
def test_validate_says_what_grading_will(validated, variant):
    """Right solutions pass Validate; every wrong one fails it, unless only a hard-coded or
    special-cased solution gets past the visible tests (``hidden_only`` says why)."""
    code, report = validated[(variant.notebook, variant.name)]
    if variant.is_right or variant.hidden_only:
        assert code == 0, report[-3000:]
    else:
        assert code == 1, report[-3000:]
        assert "VALIDATION FAILED" in report


def test_the_wrong_solutions_only_the_hidden_tests_catch(validated):
    """Per exercise, which wrong solutions pass Validate and why: special-cased ones only."""
    listing = {
        name: {v.name: v.hidden_only for v in WRONG[name] if v.hidden_only} for name in NOTEBOOKS
    }
    passing = {
        name: {v.name for v in WRONG[name] if validated[(name, v.name)][0] == 0}
        for name in NOTEBOOKS
    }
    assert {name: set(v) for name, v in listing.items()} == passing, listing
    for name, reasons in listing.items():
        assert len(reasons) <= len(WRONG[name]) // 3, (
            name,
            reasons,
        )  # the visible tests do the work
        for variant, why in reasons.items():
            assert len(why) > 40, (name, variant)  # a reason a reader can check


def test_plain_nbgrader_autograde_still_grades_in_the_kernel(tmp_path):
    """Without the course's grader the test cells run in the student's kernel, as nbgrader
    always does (unprotected, see the README): the instructor's solution still gets every
    point, hidden tests included."""
    from nbgrader.apps import NbGraderAPI

    course = make_course(tmp_path)
    write_submission(course, "plain", {"ex1_equal_shards": build_submission("ex1_equal_shards")})
    api = NbGraderAPI(config=load_config(course))
    result = api.autograde(ASSIGNMENT, "plain")
    assert result["success"], result.get("error", "")[-3000:]
    cells = _autograded(course, "plain", "ex1_equal_shards")
    assert cells and all(c.score == c.max_score for c in cells.values()), _report(cells)


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
        handed_in = sorted(
            p.stem for p in (course / "submitted" / student / ASSIGNMENT).glob("*.ipynb")
        )
        assert [p.stem for p in pages] == handed_in, student
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
    assert {row["status"] for row in rows} == {"graded", "not submitted"}
    assert {row["score"] for row in rows if row["student"] == "blank"} == {"0"}
