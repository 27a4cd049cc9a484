"""Every fixture of every exercise judged in-process: where each wrong one loses points, that
each right one gets them all, and what Validate says of each.

The verdicts come from :mod:`judged_in_process`: the grader's own judge and Validate, with an
IPython shell for the kernel, at the cost of the fixtures' code (``test_assignment_grading``
checks on the students it grades end to end that these are the pipeline's verdicts). Right
fixtures pass Validate; every wrong one fails it, except the few special-cased ones that only
the hidden tests can catch, each listed with the reason.
"""

from __future__ import annotations

import pytest
from assignment_fixtures import ASSIGNMENTS, BY_NAME
from assignment_students import (
    NOTEBOOKS,
    RIGHT,
    VARIANTS,
    WRONG,
    hidden_lines,
    ids,
    losing,
    variant_id,
)

pytestmark = [pytest.mark.slow]


def test_every_exercise_has_enough_wrong_and_right_solutions():
    for key in NOTEBOOKS:
        assert len(WRONG[key]) >= 6 and len(RIGHT[key]) >= 2, key


@pytest.mark.parametrize("variant", [v for key in NOTEBOOKS for v in WRONG[key]], ids=variant_id)
def test_wrong_solution_loses_points_exactly_where_expected(judged, variant):
    verdict = judged[(variant.assignment, variant.notebook, variant.name, "grade")]
    assert verdict.not_as_written == []
    lost = losing(verdict)
    assert lost == set(variant.loses), verdict.errors
    if variant.message:
        assert any(variant.message in verdict.errors[c] for c in lost), verdict.errors


@pytest.mark.parametrize("variant", [v for key in NOTEBOOKS for v in RIGHT[key]], ids=variant_id)
def test_alternative_correct_solution_gets_every_autograded_point(judged, variant):
    verdict = judged[(variant.assignment, variant.notebook, variant.name, "grade")]
    assert verdict.not_as_written == [] and losing(verdict) == set(), verdict.errors


@pytest.mark.parametrize("key", NOTEBOOKS, ids=ids)
def test_the_instructor_and_the_release_in_process(judged, key):
    instructor = judged[(*key, "instructor", "grade")]
    blank = judged[(*key, "blank", "grade")]
    assert sorted(instructor.errors) == sorted(BY_NAME[key[0]].graded_test_ids(key[1]))
    assert losing(instructor) == set() and instructor.not_as_written == [], instructor.errors
    assert losing(blank) == set(blank.errors), blank.errors


@pytest.mark.parametrize("assignment", ASSIGNMENTS, ids=str)
def test_no_verdict_shows_hidden_test_source(judged, assignment):
    """The errors of every fixture, as its feedback would show them, quote no line of the
    hidden tests (``test_feedback_shows_no_hidden_test_source`` reads the batch's pages)."""
    hidden = hidden_lines(assignment)
    for key, verdict in judged.of(assignment.name).items():
        if key[3] != "grade":
            continue
        variant = VARIANTS[(key[0], key[1])].get(key[2])
        submitted = "\n".join(variant.cells.values()) if variant else ""
        shown = "\n".join(e for e in verdict.errors.values() if e)
        leaked = [line for line in hidden if line in shown and line not in submitted]
        assert leaked == [], (key, leaked[:3])


@pytest.mark.parametrize(
    "variant", [v for key in NOTEBOOKS for v in VARIANTS[key].values()], ids=variant_id
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
