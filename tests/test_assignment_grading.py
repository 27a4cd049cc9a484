"""Every assignment graded end to end, as an instructor grades it.

Each assignment's ``instructor``, ``blank``, ``right_1``, ``wrong_1`` and ``wrong_2`` (see
:mod:`assignment_students`) are graded in one batch with the course's pipeline
(:func:`chainrule.grading.run_batch`: sandboxed kernels, two workers, feedback and exports
included); the instructor and ``wrong_1`` are graded again with every core busy, to check that
the grades do not depend on the machine's load; their notebooks are also validated as a
student would (the visible tests only, in a kernel). The same students are judged in-process
(:mod:`judged_in_process`, which ``test_exercise_fixtures`` uses for every fixture): the same
cells lose points with the same errors, and Validate says the same.
"""

from __future__ import annotations

import csv
import shutil

import nbformat
import pytest
from assignment_fixtures import ASSIGNMENTS, BY_NAME, REPO, validate_many
from assignment_students import (
    BATCH_STUDENTS,
    NOTEBOOKS,
    WRONG_STUDENTS,
    build,
    hidden_lines,
    ids,
    judged_name,
    page_text,
    submission_of,
)
from busy_machine import every_core_busy
from chainrule.grading.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]


def _grade(assignment, tmp_path_factory):
    """The course copy with the batch's students of ``assignment`` autograded once."""
    course = assignment.make_course(tmp_path_factory.mktemp(assignment.name))
    students = BATCH_STUDENTS[assignment.name]
    for student in students:
        submitted = submission_of(assignment, student)
        notebooks = {n: build(assignment, n, cells) for n, cells in submitted.items()}
        assignment.write_submission(course, student, notebooks)
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
    assert sorted(outcomes) == sorted(BATCH_STUDENTS[name])
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


@pytest.mark.parametrize("key", NOTEBOOKS, ids=ids)
def test_instructor_solution_gets_every_autograded_point(graded_courses, key):
    assignment, notebook = BY_NAME[key[0]], key[1]
    course = graded_courses(assignment.name)[0]
    cells = _autograded(assignment, course, "instructor", notebook)
    assert sorted(cells) == sorted(assignment.graded_test_ids(notebook))
    assert all(c.score == c.max_score for c in cells.values()), _report(cells)
    assert all(c.error is None for c in cells.values()), _report(cells)


@pytest.mark.parametrize("key", NOTEBOOKS, ids=ids)
def test_blank_release_gets_nothing_and_every_test_cell_fails(graded_courses, key):
    assignment, notebook = BY_NAME[key[0]], key[1]
    course = graded_courses(assignment.name)[0]
    scores = assignment.cell_scores(course, "blank", notebook)
    assert all(c.score == 0 for c in scores.values()), _report(scores)
    for cell in scores.values():
        if cell.autograded:
            assert cell.error is not None, f"{cell.grade_id} passes on the blank notebook"


def _batch_verdicts(assignment, course, student, notebook):
    cells = _autograded(assignment, course, student, notebook)
    return {c.grade_id: c.error if c.score < c.max_score else None for c in cells.values()}


def test_the_batch_and_the_in_process_judge_give_the_same_verdicts(graded, judged):
    """For every notebook of the batch's students: the same test cells lose points, with the
    same errors, graded end to end and in-process."""
    assignment, course, _, _ = graded
    for student in BATCH_STUDENTS[assignment.name]:
        for notebook in assignment.notebooks:
            name = judged_name(assignment, student, notebook)
            if name is None:
                continue
            batch = _batch_verdicts(assignment, course, student, notebook)
            in_process = judged[(assignment.name, notebook, name, "grade")].errors
            assert batch.keys() == in_process.keys(), (student, notebook)
            for cell, error in batch.items():
                assert error == in_process[cell], (student, notebook, cell)


# -- Validate ------------------------------------------------------------------------------------


def _validate(assignment, folder):
    """Validate (the visible tests only, in the student's kernel) on every notebook of the
    batch's students, written answers filled in: ``{(notebook, student): (exit code,
    report)}``."""
    shutil.copy2(REPO / "nbgrader_config.py", folder / "nbgrader_config.py")
    paths = {}
    for student in BATCH_STUDENTS[assignment.name]:
        for name, cells in submission_of(assignment, student).items():
            path = folder / f"{assignment.name}__{name}__{student}.ipynb"
            nbformat.write(build(assignment, name, cells, written=True), path)
            paths[(name, student)] = path
    results = validate_many(folder, paths.values())
    return {key: results[path] for key, path in paths.items()}


@pytest.fixture(scope="module", params=[a.name for a in ASSIGNMENTS])
def validated(request, tmp_path_factory):
    """The batch's students validated, one assignment at a time."""
    assignment = BY_NAME[request.param]
    return assignment, _validate(assignment, tmp_path_factory.mktemp(f"validate-{request.param}"))


def test_instructor_solution_passes_validate(validated):
    """What a student with the instructor's answers sees on pressing Validate: success, so no
    visible test depends on code that only the hidden tests define."""
    assignment, results = validated
    for notebook in assignment.notebooks:
        code, report = results[(notebook, "instructor")]
        assert code == 0, (notebook, report[-3000:])
        assert results[(notebook, "blank")][0] == 1, notebook


def test_validate_in_a_kernel_and_in_process_agree(validated, judged):
    assignment, results = validated
    for (notebook, student), (code, report) in results.items():
        name = judged_name(assignment, student, notebook)
        verdict = judged[(assignment.name, notebook, name, "validate")]
        assert verdict.failed == (code == 1), (notebook, student, report[-2000:])
        if code == 1:
            assert "VALIDATION FAILED" in report


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


def test_regrading_on_a_busy_machine_gives_the_same_grades(graded):
    """The instructor's solution and a wrong one graded again as on a machine with every core
    busy (:func:`busy_machine.every_core_busy`): every notebook graded, the same score on every
    cell."""
    assignment, course, _, _ = graded
    students = ["instructor", WRONG_STUDENTS[assignment.name][0]]
    submitted = {
        s: sorted(p.stem for p in (course / "submitted" / s / assignment.name).glob("*.ipynb"))
        for s in students
    }

    def scores():
        return {
            (s, n): {
                k: (c.score, c.max_score) for k, c in _autograded(assignment, course, s, n).items()
            }
            for s in students
            for n in submitted[s]
        }

    before = scores()
    with every_core_busy():
        outcomes = assignment.autograde(course, students)
    for outcome in outcomes:
        statuses = [nb.status for nb in outcome.notebooks if nb.submitted]
        assert statuses == ["graded"] * len(submitted[outcome.student]), outcome.student
    assert scores() == before
    lost = {s for (s, _), cells in before.items() for got, most in cells.values() if got < most}
    assert lost == {students[1]}


# -- feedback and exports ------------------------------------------------------------------------


def test_feedback_shows_no_hidden_test_source(graded):
    assignment, course, outcomes, _ = graded
    hidden = hidden_lines(assignment)
    assert hidden  # the assignment has hidden tests
    autograded = "\n".join(
        page_text(p)
        for p in (course / "autograded" / "instructor" / assignment.name).glob("*.ipynb")
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
            leaked = [x for x in hidden if x in page_text(page) and x not in submitted]
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
