"""Two instructors grading at once in the class's PostgreSQL gradebook lose no grade.

Each instructor is a process of its own with a long-lived nbgrader ``Gradebook`` session, as the
formgrader keeps one, and grades by hand, one commit per grade, at the same time as the other:
the first instructor gives every student's ``test_square`` a manual score and a comment, the
second every ``test_cube``, in the opposite order of students, so that both write the same
submissions' rows at the same moments. Afterwards every one of the grades and comments is there.
(nbgrader's FAQ: an SQLite gradebook is not safe with several graders; PostgreSQL is.)
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
from grading_course import make_course
from running_class import Classroom

pytestmark = [pytest.mark.hub]

STUDENTS = [f"p{i:02d}" for i in range(30)]
COURSE_ID = "graders-test"


def grade_as_instructor(
    db_url: str,
    cell: str,
    answer: str,
    points: float,
    students: list[str],
    start: object,
    done: object,
) -> None:
    """One instructor: a score for the test ``cell`` and a comment on the ``answer`` cell of
    each student, a commit each."""
    from nbgrader.api import Gradebook

    with Gradebook(db_url, COURSE_ID) as gb:
        start.wait(timeout=60)  # type: ignore[attr-defined]
        for student in students:
            grade = gb.find_grade(cell, "squares", "tiny", student)
            grade.manual_score = points
            gb.db.commit()
            comment = gb.find_comment(answer, "squares", "tiny", student)
            comment.manual_comment = f"{answer} of {student}, by the instructor of {cell}"
            gb.db.commit()
    done.put(len(students))  # type: ignore[attr-defined]


def test_two_instructors_grading_at_once_lose_no_grade(
    classroom: Classroom, tmp_path: Path
) -> None:
    from nbgrader.api import Gradebook

    db_url = classroom.database("graders_test")
    make_course(
        tmp_path / "course",
        extra_config=f'c.CourseDirectory.course_id = "{COURSE_ID}"\n'
        f'c.CourseDirectory.db_url = "{db_url}"\n',
    )
    with Gradebook(db_url, COURSE_ID) as gb:
        for student in STUDENTS:
            gb.update_or_create_student(student)
            gb.add_submission("tiny", student)

    context = multiprocessing.get_context("spawn")
    start, done = context.Barrier(2), context.Queue()
    instructors = [
        context.Process(
            target=grade_as_instructor,
            args=(db_url, "test_square", "square", 1.5, STUDENTS, start, done),
        ),
        context.Process(
            target=grade_as_instructor,
            args=(db_url, "test_cube", "cube", 0.5, STUDENTS[::-1], start, done),
        ),
    ]
    for process in instructors:
        process.start()
    graded = [done.get(timeout=120) for _ in instructors]
    for process in instructors:
        process.join(timeout=30)
        assert process.exitcode == 0
    assert graded == [len(STUDENTS)] * 2

    with Gradebook(db_url, COURSE_ID) as gb:
        for student in STUDENTS:
            for cell, answer, points in (
                ("test_square", "square", 1.5),
                ("test_cube", "cube", 0.5),
            ):
                grade = gb.find_grade(cell, "squares", "tiny", student)
                assert grade.manual_score == points, (student, cell)
                comment = gb.find_comment(answer, "squares", "tiny", student)
                assert comment.manual_comment.startswith(f"{answer} of {student}"), (student, cell)
