"""The course's students of every assignment, built from the fixtures of ``tests/fixtures``.

Students, each a submission built from the assignment's release:

- ``instructor``: the instructor's solutions, must get every autograded point;
- ``blank``: the release as handed out, must get none, every test cell failing;
- ``right_1`` …: each notebook's alternative correct solutions (written differently), full
  marks;
- ``wrong_1`` … ``wrong_k``: the i-th wrong fixture of every notebook, each losing points exactly
  on the test cells its fixture names. A student submits only the notebooks it has a variant of.

``test_exercise_fixtures`` judges every fixture in-process; ``test_assignment_grading`` grades
``BATCH_STUDENTS`` of each assignment end to end.
"""

from __future__ import annotations

import html
import re

import nbformat
from assignment_fixtures import ASSIGNMENTS
from chainrule.grading.hidden import split_hidden_tests

VARIANTS = {(a.name, nb): a.load_variants(nb) for a in ASSIGNMENTS for nb in a.notebooks}
WRONG = {
    key: [v for v in variants.values() if not v.is_right] for key, variants in VARIANTS.items()
}
RIGHT = {key: [v for v in variants.values() if v.is_right] for key, variants in VARIANTS.items()}
NOTEBOOKS = [(a.name, nb) for a in ASSIGNMENTS for nb in a.notebooks]


def students_of(assignment, group, prefix):
    most = max(len(group[(assignment.name, nb)]) for nb in assignment.notebooks)
    return [f"{prefix}_{i + 1}" for i in range(most)]


WRONG_STUDENTS = {a.name: students_of(a, WRONG, "wrong") for a in ASSIGNMENTS}
RIGHT_STUDENTS = {a.name: students_of(a, RIGHT, "right") for a in ASSIGNMENTS}
#: The students graded end to end: every kind, two of the wrong ones.
BATCH_STUDENTS = {
    a.name: ["instructor", "blank", *RIGHT_STUDENTS[a.name][:1], *WRONG_STUDENTS[a.name][:2]]
    for a in ASSIGNMENTS
}


def _ids(key):
    return f"{key[0]}-{key[1]}"


def _variant_id(variant):
    return f"{variant.assignment}-{variant.notebook}-{variant.name}"


def ids(key):
    return f"{key[0]}-{key[1]}"


def variant_id(variant):
    return f"{variant.assignment}-{variant.notebook}-{variant.name}"


def submission_of(assignment, student):
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


def build(assignment, notebook, cells, written=False):
    if cells is None:
        return assignment.build_submission(notebook, instructor=False, written=written)
    return assignment.build_submission(notebook, cells, written=written)


def losing(verdict):
    return {cell for cell, error in verdict.errors.items() if error is not None}


def judged_name(assignment, student, notebook):
    """The name the in-process judge knows ``student``'s ``notebook`` by (``None``: not
    handed in)."""
    if student in ("instructor", "blank"):
        return student
    cells = submission_of(assignment, student).get(notebook)
    if cells is None:
        return None
    (variant,) = [v for v in VARIANTS[(assignment.name, notebook)].values() if v.cells is cells]
    return variant.name


def page_text(path):
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
