"""Grading outcomes of every assignment (``assignment_fixtures.ASSIGNMENTS``).

Students, each a submission built from the assignment's release:

- ``instructor``: the instructor's solutions, must get every autograded point;
- ``blank``: the release as handed out, must get none, every test cell failing;
- ``right_1`` …: each notebook's alternative correct solutions (written differently), full
  marks;
- ``wrong_1`` … ``wrong_k``: the i-th wrong fixture of every notebook, each losing points exactly
  on the test cells its fixture names. A student submits only the notebooks it has a variant of.

End to end, each assignment's ``instructor``, ``blank``, ``right_1``, ``wrong_1`` and
``wrong_2`` are graded in one batch with the course's pipeline
(:func:`chainrule.grading.run_batch`: sandboxed kernels, two workers, feedback and exports
included), and ``wrong_1`` a second time, to check that regrading gives the same scores; their
notebooks are also validated as a student would (the visible tests only, in a kernel).

Every fixture's verdicts come from :mod:`judged_in_process`: the grader's own judge and
Validate, with an IPython shell for the kernel, at the cost of the fixtures' code. That they
are the verdicts of the pipeline is checked on the batch's students, notebook by notebook: the
same cells lose points with the same errors, and Validate says the same. Right fixtures pass
Validate; every wrong one fails it, except the few special-cased ones that only the hidden
tests can catch, each listed with the reason.
"""

from __future__ import annotations

import csv
import html
import re
import shutil

import nbformat
import pytest
from assignment_fixtures import ASSIGNMENTS, BY_NAME, REPO, validate_many
from busy_machine import every_core_busy
from chainrule.grading.config import load_config
from chainrule.grading.hidden import split_hidden_tests
from judged_in_process import judge_many

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]

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
#: The students graded end to end: every kind, two of the wrong ones.
BATCH_STUDENTS = {
    a.name: ["instructor", "blank", *RIGHT_STUDENTS[a.name][:1], *WRONG_STUDENTS[a.name][:2]]
    for a in ASSIGNMENTS
}


def _ids(key):
    return f"{key[0]}-{key[1]}"


def _variant_id(variant):
    return f"{variant.assignment}-{variant.notebook}-{variant.name}"


def test_every_exercise_has_enough_wrong_and_right_solutions():
    for key in NOTEBOOKS:
        assert len(WRONG[key]) >= 6 and len(RIGHT[key]) >= 1, key


def _submission_of(assignment, student):
    """The notebooks ``student`` hands in: ``{notebook: its cells}`` (``None`` for the
    release as handed out), only those the student has a variant of."""
    notebooks = assignment.notebooks
    if student == "instructor":
        return {n: {} for n in notebooks}
    if student == "blank":
        return {n: None for n in notebooks}
    prefix, number = student.rsplit("_", 1)
    group, i = (RIGHT if prefix == "right" else WRONG), int(number) - 1
    return {
        n: group[(assignment.name, n)][i].cells
        for n in notebooks
        if i < len(group[(assignment.name, n)])
    }


def _build(assignment, notebook, cells, written=False):
    if cells is None:
        return assignment.build_submission(notebook, instructor=False, written=written)
    return assignment.build_submission(notebook, cells, written=written)


def _grade(assignment, tmp_path_factory):
    """The course copy with the batch's students of ``assignment`` autograded once."""
    course = assignment.make_course(tmp_path_factory.mktemp(assignment.name))
    students = BATCH_STUDENTS[assignment.name]
    for student in students:
        submitted = _submission_of(assignment, student)
        notebooks = {n: _build(assignment, n, cells) for n, cells in submitted.items()}
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


# -- every fixture, judged in-process ------------------------------------------------------------


@pytest.fixture(scope="session")
def judged(graded_courses):
    """Every variant of every notebook (and the instructor's solutions, and the release),
    graded and validated by :mod:`judged_in_process` against the gradebook of the
    assignment's batch (which it only reads): ``judged[(assignment, notebook, name, mode)]``
    is a ``Verdict``, ``name`` a variant's, ``"instructor"`` or ``"blank"``, ``mode``
    ``"grade"`` or ``"validate"``."""
    keys, jobs = [], []
    for assignment in ASSIGNMENTS:
        course = graded_courses(assignment.name)[0]
        for notebook in assignment.notebooks:
            cases = {"instructor": {}, "blank": None}
            cases.update({v.name: v.cells for v in VARIANTS[(assignment.name, notebook)].values()})
            for name, cells in cases.items():
                for mode in ("grade", "validate"):
                    keys.append((assignment.name, notebook, name, mode))
                    jobs.append((course, (assignment.name, notebook, cells, mode)))
    verdicts = judge_many(jobs)
    return dict(zip(keys, verdicts, strict=True))


def _losing(verdict):
    return {cell for cell, error in verdict.errors.items() if error is not None}


@pytest.mark.parametrize("variant", [v for key in NOTEBOOKS for v in WRONG[key]], ids=_variant_id)
def test_wrong_solution_loses_points_exactly_where_expected(judged, variant):
    verdict = judged[(variant.assignment, variant.notebook, variant.name, "grade")]
    assert verdict.not_as_written == []
    losing = _losing(verdict)
    assert losing == set(variant.loses), verdict.errors
    if variant.message:
        assert any(variant.message in verdict.errors[c] for c in losing), verdict.errors


@pytest.mark.parametrize("variant", [v for key in NOTEBOOKS for v in RIGHT[key]], ids=_variant_id)
def test_alternative_correct_solution_gets_every_autograded_point(judged, variant):
    verdict = judged[(variant.assignment, variant.notebook, variant.name, "grade")]
    assert verdict.not_as_written == [] and _losing(verdict) == set(), verdict.errors


@pytest.mark.parametrize("key", NOTEBOOKS, ids=_ids)
def test_the_instructor_and_the_release_in_process(judged, key):
    instructor = judged[(*key, "instructor", "grade")]
    blank = judged[(*key, "blank", "grade")]
    assert sorted(instructor.errors) == sorted(BY_NAME[key[0]].graded_test_ids(key[1]))
    assert _losing(instructor) == set() and instructor.not_as_written == [], instructor.errors
    assert _losing(blank) == set(blank.errors), blank.errors


@pytest.mark.parametrize("assignment", ASSIGNMENTS, ids=str)
def test_no_verdict_shows_hidden_test_source(judged, assignment):
    """The errors of every fixture, as its feedback would show them, quote no line of the
    hidden tests (``test_feedback_shows_no_hidden_test_source`` reads the batch's pages)."""
    hidden = hidden_lines(assignment)
    for key, verdict in judged.items():
        if key[0] != assignment.name or key[3] != "grade":
            continue
        variant = VARIANTS[(key[0], key[1])].get(key[2])
        submitted = "\n".join(variant.cells.values()) if variant else ""
        shown = "\n".join(e for e in verdict.errors.values() if e)
        leaked = [line for line in hidden if line in shown and line not in submitted]
        assert leaked == [], (key, leaked[:3])


def _batch_verdicts(assignment, course, student, notebook):
    cells = _autograded(assignment, course, student, notebook)
    return {c.grade_id: c.error if c.score < c.max_score else None for c in cells.values()}


def _judged_name(assignment, student, notebook):
    """The name :func:`judged` knows ``student``'s ``notebook`` by (``None``: not handed in)."""
    if student in ("instructor", "blank"):
        return student
    cells = _submission_of(assignment, student).get(notebook)
    if cells is None:
        return None
    (variant,) = [v for v in VARIANTS[(assignment.name, notebook)].values() if v.cells is cells]
    return variant.name


def test_the_batch_and_the_in_process_judge_give_the_same_verdicts(graded, judged):
    """For every notebook of the batch's students: the same test cells lose points, with the
    same errors, graded end to end and in-process."""
    assignment, course, _, _ = graded
    for student in BATCH_STUDENTS[assignment.name]:
        for notebook in assignment.notebooks:
            name = _judged_name(assignment, student, notebook)
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
        for name, cells in _submission_of(assignment, student).items():
            path = folder / f"{assignment.name}__{name}__{student}.ipynb"
            nbformat.write(_build(assignment, name, cells, written=True), path)
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
        name = _judged_name(assignment, student, notebook)
        verdict = judged[(assignment.name, notebook, name, "validate")]
        assert verdict.failed == (code == 1), (notebook, student, report[-2000:])
        if code == 1:
            assert "VALIDATION FAILED" in report


@pytest.mark.parametrize(
    "variant", [v for key in NOTEBOOKS for v in VARIANTS[key].values()], ids=_variant_id
)
def test_validate_says_what_grading_will(judged, variant):
    """Right solutions pass Validate; every wrong one fails it, unless only a hard-coded or
    special-cased solution gets past the visible tests (``hidden_only`` says why)."""
    verdict = judged[(variant.assignment, variant.notebook, variant.name, "validate")]
    if variant.is_right or variant.hidden_only:
        assert not verdict.failed, verdict.errors
    else:
        assert verdict.failed, verdict.errors


@pytest.mark.parametrize("assignment", ASSIGNMENTS, ids=str)
def test_the_wrong_solutions_only_the_hidden_tests_catch(judged, assignment):
    """Per exercise, which wrong solutions pass Validate and why: special-cased ones only."""
    notebooks = [(assignment.name, name) for name in assignment.notebooks]
    listing = {
        key: {v.name: v.hidden_only for v in WRONG[key] if v.hidden_only} for key in notebooks
    }
    passing = {
        key: {v.name for v in WRONG[key] if not judged[(*key, v.name, "validate")].failed}
        for key in notebooks
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


def test_regrading_on_a_busy_machine_gives_the_same_grades(graded):
    """The instructor's solution and a wrong one graded again with every core busy with
    spinning processes: every notebook graded, the same score on every cell."""
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
