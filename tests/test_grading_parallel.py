"""Parallel grading gives exactly the grades of sequential grading, run after run.

Six submissions (full marks, a real zero, a hidden-test failure, an edited and a deleted test
cell, a dead kernel) are graded once by one worker into the course gradebook and once by two
workers, each into its own gradebook copy, merged back. The two gradebooks must hold the same
submissions, timestamps, scores, comments and flags, and the same autograded notebooks.
"""

from __future__ import annotations

import io
import shutil

import nbformat
import pytest
from busy_machine import every_core_busy
from chainrule.grading import BatchOptions, run_batch
from chainrule.grading.gradebooks import snapshot
from grading_course import answer, delete_cell, make_course, solve, submit

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]


def _hidden_fail(notebooks):
    solve(notebooks)
    answer(notebooks["squares"], "square", "def square(x):\n    return abs(x) * x")


def _edited(notebooks):
    solve(notebooks)
    answer(notebooks["squares"], "test_cube", "pass")


def _deleted(notebooks):
    solve(notebooks)
    delete_cell(notebooks["doubles"], "test_double")


def _kill(notebooks):
    solve(notebooks)
    answer(notebooks["doubles"], "double", "import os\nos.kill(os.getpid(), 9)")


STUDENTS = {
    "ann": solve,
    "ben": None,
    "cat": _hidden_fail,
    "dan": _edited,
    "eve": _deleted,
    "fay": _kill,
}


def _grade(root, workers):
    options = BatchOptions("tiny", root, workers=workers, timeout_per_submission=240)
    options.feedback = False
    return run_batch(options, stream=io.StringIO())


def _autograded(root):
    """Every autograded notebook's cell sources and outputs, by path."""
    notebooks = {}
    for path in sorted((root / "autograded").rglob("*.ipynb")):
        nb = nbformat.read(path, 4)
        notebooks[str(path.relative_to(root))] = [
            (cell.source, [o.get("text", o.get("ename")) for o in cell.get("outputs", [])])
            for cell in nb.cells
        ]
    return notebooks


def test_two_workers_give_the_same_gradebook_as_one(tmp_path):
    sequential = make_course(tmp_path / "sequential")
    for student, edit in STUDENTS.items():
        submit(sequential, student, edit, timestamp=f"2026-01-1{len(student)} 09:30:00 UTC")
    parallel_root = tmp_path / "parallel"
    shutil.copytree(sequential.root, parallel_root)

    one = _grade(sequential.root, workers=1)
    two = _grade(parallel_root, workers=2)

    assert {o.worker for o in one.outcomes} == {0}
    assert {o.worker for o in two.outcomes} == {1, 2}
    assert [o.status for o in one.outcomes] == [o.status for o in two.outcomes]
    course_id = "autograd-distributed"
    book_one = snapshot(f"sqlite:///{sequential.root / 'gradebook.db'}", course_id, "tiny")
    book_two = snapshot(f"sqlite:///{parallel_root / 'gradebook.db'}", course_id, "tiny")
    assert sorted(book_one) == sorted(STUDENTS)
    assert book_one == book_two
    assert book_one["ann"]["score"] == 4 and book_one["ben"]["score"] == 0
    assert book_one["fay"]["notebooks"]["doubles"]["flagged"]
    assert _autograded(sequential.root) == _autograded(parallel_root)
    assert one.export_csv.read_text() == two.export_csv.read_text()


def test_repeated_parallel_runs_give_identical_grades_on_a_busy_machine_too(tmp_path):
    """Three runs, the last two as on a machine with every core busy
    (:func:`busy_machine.every_core_busy`): the same grades and statuses each time (time
    limits stop runaway code, not a slow machine)."""
    course = make_course(tmp_path / "course")
    for student in ("ann", "cat", "fay"):
        submit(course, student, STUDENTS[student])
    course_id = "autograd-distributed"
    books, statuses = [], []

    def grade():
        # Kernels talk over sockets in folders of their own: nothing to collide.
        result = _grade(course.root, workers=2)
        statuses.append([o.status for o in result.outcomes])
        books.append(snapshot(f"sqlite:///{course.root / 'gradebook.db'}", course_id, "tiny"))

    grade()
    with every_core_busy():
        grade()
        grade()
    assert all(book == books[0] for book in books[1:])
    assert all(status == statuses[0] for status in statuses[1:])
    assert not any("failed" in s for s in statuses[0])  # no kernel lost to a collision
