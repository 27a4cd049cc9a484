"""Grading outcomes of every assignment (``assignment_fixtures.ASSIGNMENTS``), autograded in a
temporary copy of the course, one batch per assignment.

Students, each a submission built from the assignment's release:

- ``instructor``: the instructor's solutions, must get every autograded point;
- ``blank``: the release as handed out, must get none, every test cell failing;
- ``right_1`` …: each notebook's alternative correct solutions (written differently), full
  marks;
- ``wrong_1`` … ``wrong_k``: the i-th wrong fixture of every notebook, each losing points exactly
  on the test cells its fixture names. A student submits only the notebooks it has a variant of.

Each assignment's students are graded in one batch with the course's pipeline
(:func:`chainrule.grading.run_batch`, two workers, feedback and exports included); ``wrong_1`` is
graded a second time to check that regrading gives the same scores. Every variant is also
validated as a student would (the visible tests only): right ones pass, and every wrong one
fails, except the few special-cased ones that only the hidden tests can catch, each listed with
the reason.
"""

from __future__ import annotations

import csv
import html
import re
import shutil

import nbformat
import pytest
from assignment_fixtures import ASSIGNMENTS, REPO, validate_many
from chainrule.grading.config import load_config
from chainrule.grading.hidden import split_hidden_tests

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]

BY_NAME = {a.name: a for a in ASSIGNMENTS}
VARIANTS = {(a.name, nb): a.load_variants(nb) for a in ASSIGNMENTS for nb in a.notebooks}
WRONG = {
    key: [v for v in variants.values() if not v.is_right] for key, variants in VARIANTS.items()
}
RIGHT = {key: [v for v in variants.values() if v.is_right] for key, variants in VARIANTS.items()}
NOTEBOOKS = [(a.name, nb) for a in ASSIGNMENTS for nb in a.notebooks]


def _students(assignment, group, prefix):
    most = max(len(group[(assignment.name, nb)]) for nb in assignment.notebooks)
    return [f"{prefix}_{i + 1}" for i in range(most)]


WRONG_STUDENTS = {a.name: _students(a, WRONG, "wrong") for a in ASSIGNMENTS}
RIGHT_STUDENTS = {a.name: _students(a, RIGHT, "right") for a in ASSIGNMENTS}


def _ids(key):
    return f"{key[0]}-{key[1]}"


def _variant_id(variant):
    return f"{variant.assignment}-{variant.notebook}-{variant.name}"


def test_every_exercise_has_enough_wrong_and_right_solutions():
    for key in NOTEBOOKS:
        assert len(WRONG[key]) >= 6 and len(RIGHT[key]) >= 1, key


def _student_of(variant):
    key = (variant.assignment, variant.notebook)
    if variant.is_right:
        return RIGHT_STUDENTS[variant.assignment][RIGHT[key].index(variant)]
    return WRONG_STUDENTS[variant.assignment][WRONG[key].index(variant)]


def _grade(assignment, tmp_path_factory):
    """The course copy with every student's submission of ``assignment`` autograded once."""
    course = assignment.make_course(tmp_path_factory.mktemp(assignment.name))
    notebooks = assignment.notebooks
    build = assignment.build_submission
    assignment.write_submission(course, "instructor", {n: build(n) for n in notebooks})
    blank = {n: build(n, instructor=False) for n in notebooks}
    assignment.write_submission(course, "blank", blank)
    for group, students in (
        (WRONG, WRONG_STUDENTS[assignment.name]),
        (RIGHT, RIGHT_STUDENTS[assignment.name]),
    ):
        for i, student in enumerate(students):
            submitted = {  # only the notebooks this student has a variant of
                name: build(name, group[(assignment.name, name)][i].cells)
                for name in notebooks
                if i < len(group[(assignment.name, name)])
            }
            assignment.write_submission(course, student, submitted)
    students = [
        "instructor",
        "blank",
        *RIGHT_STUDENTS[assignment.name],
        *WRONG_STUDENTS[assignment.name],
    ]
    result = assignment.grade_batch(course, students, feedback=True)
    with result.summary_csv.open() as handle:  # read now: a regrade rewrites the exports
        exports = {
            "nbgrader": result.export_csv.read_text(),
            "summary": list(csv.DictReader(handle)),
        }
    return course, {o.student: o for o in result.outcomes}, exports


@pytest.fixture(scope="session")  # graded once per process, whichever test asks first
def graded_courses(tmp_path_factory):
    """Each assignment graded on first use: ``graded_courses(name)`` is (course, outcomes,
    exports)."""
    done = {}

    def get(name):
        if name not in done:
            done[name] = _grade(BY_NAME[name], tmp_path_factory)
        return done[name]

    return get


@pytest.fixture(scope="module", params=[a.name for a in ASSIGNMENTS])
def graded(request, graded_courses):
    return BY_NAME[request.param], *graded_courses(request.param)


def test_every_notebook_of_every_submission_is_graded(graded):
    assignment, _, outcomes, _ = graded
    name = assignment.name
    expected = ["instructor", "blank", *RIGHT_STUDENTS[name], *WRONG_STUDENTS[name]]
    assert sorted(outcomes) == sorted(expected)
    for outcome in outcomes.values():
        statuses = {nb.name: nb.status for nb in outcome.notebooks if nb.submitted}
        assert set(statuses.values()) == {"graded"}, outcome.student
        if outcome.student in ("instructor", "blank"):
            assert sorted(statuses) == sorted(assignment.notebooks)


def _autograded(assignment, course, student, notebook):
    scores = assignment.cell_scores(course, student, notebook)
    return {k: v for k, v in scores.items() if v.autograded}


def _report(cells):
    return "; ".join(
        f"{c.grade_id} {c.score}/{c.max_score}" + (f" [{c.error[:300]}]" if c.error else "")
        for c in cells.values()
    )


@pytest.mark.parametrize("key", NOTEBOOKS, ids=_ids)
def test_instructor_solution_gets_every_autograded_point(graded_courses, key):
    assignment, notebook = BY_NAME[key[0]], key[1]
    course = graded_courses(assignment.name)[0]
    cells = _autograded(assignment, course, "instructor", notebook)
    assert sorted(cells) == sorted(assignment.graded_test_ids(notebook))
    assert all(c.score == c.max_score for c in cells.values()), _report(cells)
    assert all(c.error is None for c in cells.values()), _report(cells)


@pytest.mark.parametrize("key", NOTEBOOKS, ids=_ids)
def test_blank_release_gets_nothing_and_every_test_cell_fails(graded_courses, key):
    assignment, notebook = BY_NAME[key[0]], key[1]
    course = graded_courses(assignment.name)[0]
    scores = assignment.cell_scores(course, "blank", notebook)
    assert all(c.score == 0 for c in scores.values()), _report(scores)
    for cell in scores.values():
        if cell.autograded:
            assert cell.error is not None, f"{cell.grade_id} passes on the blank notebook"


@pytest.mark.parametrize("variant", [v for key in NOTEBOOKS for v in WRONG[key]], ids=_variant_id)
def test_wrong_solution_loses_points_exactly_where_expected(graded_courses, variant):
    assignment = BY_NAME[variant.assignment]
    course = graded_courses(assignment.name)[0]
    cells = _autograded(assignment, course, _student_of(variant), variant.notebook)
    losing = {c.grade_id for c in cells.values() if c.score < c.max_score}
    assert losing == set(variant.loses), _report(cells)
    for cell_id in losing:
        assert cells[cell_id].error, f"{cell_id} lost points without an error message"
    if variant.message:
        assert any(variant.message in cells[c].error for c in losing), _report(cells)


@pytest.mark.parametrize("variant", [v for key in NOTEBOOKS for v in RIGHT[key]], ids=_variant_id)
def test_alternative_correct_solution_gets_every_autograded_point(graded_courses, variant):
    assignment = BY_NAME[variant.assignment]
    course = graded_courses(assignment.name)[0]
    cells = _autograded(assignment, course, _student_of(variant), variant.notebook)
    assert all(c.score == c.max_score for c in cells.values()), _report(cells)


def _validate(assignment, folder):
    """Validate (the visible tests only, in the student's kernel) on every variant of every
    notebook of ``assignment``, and on the instructor's solutions with the written answers
    filled in: ``{(assignment, notebook, variant): (exit code, report)}``."""
    shutil.copy2(REPO / "nbgrader_config.py", folder / "nbgrader_config.py")
    paths = {}
    for name in assignment.notebooks:
        variants = {
            "instructor": {},
            **{v.name: v.cells for v in VARIANTS[(assignment.name, name)].values()},
        }
        for variant, cells in variants.items():
            path = folder / f"{assignment.name}__{name}__{variant}.ipynb"
            nbformat.write(assignment.build_submission(name, cells, written=True), path)
            paths[(assignment.name, name, variant)] = path
    results = validate_many(folder, paths.values())
    return {key: results[path] for key, path in paths.items()}


@pytest.fixture(scope="session")  # graded once per process, whichever test asks first
def validated(tmp_path_factory):
    """Each assignment validated on first use: ``validated(name)[(name, notebook, variant)]``
    is (exit code, report)."""
    done = {}

    def get(name):
        if name not in done:
            done[name] = _validate(BY_NAME[name], tmp_path_factory.mktemp(f"validate-{name}"))
        return done[name]

    return get


@pytest.mark.parametrize("key", NOTEBOOKS, ids=_ids)
def test_instructor_solution_passes_validate(validated, key):
    """What a student with the instructor's answers sees on pressing Validate: success, so no
    visible test depends on code that only the hidden tests define."""
    code, report = validated(key[0])[(*key, "instructor")]
    assert code == 0, report[-3000:]


@pytest.mark.parametrize(
    "variant", [v for key in NOTEBOOKS for v in VARIANTS[key].values()], ids=_variant_id
)
def test_validate_says_what_grading_will(validated, variant):
    """Right solutions pass Validate; every wrong one fails it, unless only a hard-coded or
    special-cased solution gets past the visible tests (``hidden_only`` says why)."""
    code, report = validated(variant.assignment)[
        (variant.assignment, variant.notebook, variant.name)
    ]
    if variant.is_right or variant.hidden_only:
        assert code == 0, report[-3000:]
    else:
        assert code == 1, report[-3000:]
        assert "VALIDATION FAILED" in report


@pytest.mark.parametrize("assignment", ASSIGNMENTS, ids=str)
def test_the_wrong_solutions_only_the_hidden_tests_catch(validated, assignment):
    """Per exercise, which wrong solutions pass Validate and why: special-cased ones only."""
    notebooks = [(assignment.name, name) for name in assignment.notebooks]
    results = validated(assignment.name)
    listing = {
        key: {v.name: v.hidden_only for v in WRONG[key] if v.hidden_only} for key in notebooks
    }
    passing = {
        key: {v.name for v in WRONG[key] if results[(*key, v.name)][0] == 0} for key in notebooks
    }
    assert {key: set(v) for key, v in listing.items()} == passing, listing
    for key, reasons in listing.items():
        assert len(reasons) <= len(WRONG[key]) // 3, (key, reasons)  # the visible tests do the work
        for variant, why in reasons.items():
            assert len(why) > 40, (key, variant)  # a reason a reader can check


@pytest.mark.parametrize("assignment", ASSIGNMENTS, ids=str)
def test_plain_nbgrader_autograde_still_grades_in_the_kernel(tmp_path, assignment):
    """Without the course's grader the test cells run in the student's kernel, as nbgrader
    always does (unprotected, see the README): the instructor's solution still gets every
    point, hidden tests included."""
    from nbgrader.apps import NbGraderAPI

    notebook = assignment.notebooks[0]
    course = assignment.make_course(tmp_path)
    assignment.write_submission(course, "plain", {notebook: assignment.build_submission(notebook)})
    api = NbGraderAPI(config=load_config(course))
    result = api.autograde(assignment.name, "plain")
    assert result["success"], result.get("error", "")[-3000:]
    cells = _autograded(assignment, course, "plain", notebook)
    assert cells and all(c.score == c.max_score for c in cells.values()), _report(cells)


def test_regrading_gives_the_same_scores(graded):
    assignment, course, _, _ = graded
    student = WRONG_STUDENTS[assignment.name][0]
    submitted = sorted(
        p.stem for p in (course / "submitted" / student / assignment.name).glob("*.ipynb")
    )
    before = {n: assignment.cell_scores(course, student, n) for n in submitted}
    (outcome,) = assignment.autograde(course, [student])
    assert [nb.status for nb in outcome.notebooks if nb.submitted] == ["graded"] * len(submitted)
    after = {n: assignment.cell_scores(course, student, n) for n in submitted}
    assert {n: {k: c.score for k, c in v.items()} for n, v in after.items()} == {
        n: {k: c.score for k, c in v.items()} for n, v in before.items()
    }
    assert any(c.score < c.max_score for v in after.values() for c in v.values())


# -- feedback and exports ------------------------------------------------------------------------


def _text(path):
    """A file's text as a reader sees it: HTML tags dropped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text()))


def hidden_lines(assignment) -> set[str]:
    """Lines of the hidden tests that appear nowhere else: not in the release, not in the
    instructor's solutions (which the ``instructor`` student submits)."""
    sources = [nbformat.read(assignment.source_dir / f"{n}.ipynb", 4) for n in assignment.notebooks]
    releases = [
        nbformat.read(assignment.release_dir / f"{n}.ipynb", 4) for n in assignment.notebooks
    ]
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
    assignment, course, outcomes, _ = graded
    hidden = hidden_lines(assignment)
    assert hidden  # the assignment has hidden tests
    autograded = "\n".join(
        _text(p) for p in (course / "autograded" / "instructor" / assignment.name).glob("*.ipynb")
    )
    assert any(line in autograded for line in hidden)  # nbgrader itself would show them
    for student in outcomes:
        pages = sorted((course / "feedback" / student / assignment.name).glob("*.html"))
        handed_in = sorted(
            p.stem for p in (course / "submitted" / student / assignment.name).glob("*.ipynb")
        )
        assert [p.stem for p in pages] == handed_in, student
        submitted = "\n".join(
            cell.source
            for path in (course / "submitted" / student / assignment.name).glob("*.ipynb")
            for cell in nbformat.read(path, 4).cells
        )
        for page in pages:
            # A line the student wrote themselves may of course appear in their feedback.
            leaked = [x for x in hidden if x in _text(page) and x not in submitted]
            assert leaked == [], (student, page.name, leaked[:3])


def test_grades_and_statuses_are_exported_to_csv(graded):
    assignment, _, outcomes, exports = graded
    export = exports["nbgrader"].splitlines()
    assert export[0].startswith("assignment,duedate,timestamp,student_id")
    assert {line.split(",")[3] for line in export[1:]} == set(outcomes)
    rows = exports["summary"]
    assert len(rows) == len(outcomes) * len(assignment.notebooks)
    statuses = {row["status"] for row in rows}
    assert "graded" in statuses and statuses <= {"graded", "not submitted"}
    assert {row["score"] for row in rows if row["student"] == "blank"} == {"0"}
