"""``python -m chainrule.grading validate``: nbgrader's report, and an exit status that means it.

``nbgrader validate`` exits 0 even when tests fail (nbgrader #1908); ours exits 1.
"""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest
from chainrule.grading.__main__ import main
from chainrule.grading.config import grading_env
from grading_course import answer, make_course, solve


@pytest.fixture(scope="module")
def notebooks(tmp_path_factory):
    course = make_course(tmp_path_factory.mktemp("validate") / "course")
    work = course.root / "work"
    work.mkdir()
    solved = {name: course.release(name) for name in ("squares", "doubles")}
    solve(solved)
    nbformat.write(solved["doubles"], work / "solved.ipynb")
    nbformat.write(course.release("doubles"), work / "blank.ipynb")
    edited = course.release("doubles")
    solve({"doubles": edited})
    answer(edited, "test_double", "pass")
    nbformat.write(edited, work / "edited_test.ipynb")
    return course.root, work


def test_a_passing_notebook_exits_zero(notebooks, capsys):
    root, work = notebooks
    assert main(["validate", str(work / "solved.ipynb"), "--course-root", str(root)]) == 0
    assert "Success! Your notebook passes all the tests." in capsys.readouterr().out


@pytest.mark.slow
def test_a_locked_cell_changed_exits_one(notebooks, capsys):
    root, work = notebooks
    assert main(["validate", str(work / "edited_test.ipynb"), "--course-root", str(root)]) == 1
    assert "has changed" in capsys.readouterr().out


def test_a_missing_notebook_exits_two(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "nope.ipynb")]) == 2


@pytest.mark.slow
def test_the_command_exits_one_when_a_test_fails(notebooks):
    root, work = notebooks
    proc = subprocess.run(
        [sys.executable, "-m", "chainrule.grading", "validate", "work/blank.ipynb"],
        cwd=root,  # the course's nbgrader_config.py is found in the working folder
        env=grading_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "VALIDATION FAILED ON 1 CELL(S)!" in proc.stdout
    assert "NotImplementedError" in proc.stdout  # nbgrader's report shows the failing cell


@pytest.fixture(scope="module")
def broken(notebooks):
    root, work = notebooks
    course = make_course(root.parent / "course-short", cell_timeout=3)
    syntax = course.release("squares")
    solve({"squares": syntax})
    answer(syntax, "square", "def square(x):\n    return x *\n")
    nbformat.write(syntax, work / "syntax.ipynb")
    slow = course.release("doubles")
    answer(slow, "double", "import time\ntime.sleep(30)\ndef double(x):\n    return 2 * x")
    nbformat.write(slow, work / "slow.ipynb")
    return course.root, work


@pytest.mark.slow
def test_a_syntax_error_shows_as_itself_on_the_tests_it_breaks(broken, capsys):
    root, work = broken
    assert main(["validate", str(work / "syntax.ipynb"), "--course-root", str(root)]) == 1
    report = capsys.readouterr().out
    assert "SyntaxError in cell 'square'" in report
    assert "return x *" in report  # the line, as Python showed it
    assert "This test then failed with NameError" in report


@pytest.mark.slow
def test_a_cell_over_its_time_limit_is_named_with_the_limit(broken, capsys):
    root, work = broken
    assert main(["validate", str(work / "slow.ipynb"), "--course-root", str(root)]) == 1
    report = capsys.readouterr().out
    assert "cell 'double' ran past its 3 s time limit" in report


def test_kernels_forked_by_a_zygote_give_the_same_verdicts(notebooks, tmp_path):
    """The warm path the assignment tests validate with: the same exit codes as fresh
    kernels, and nothing of one notebook's kernel left for the next."""
    import io

    from chainrule.grading import validate_notebook
    from chainrule.grading.sandbox import StudentSandbox

    root, work = notebooks
    (tmp_path / "files").mkdir()
    sandbox = StudentSandbox(tmp_path / "sandbox", tmp_path / "files", None, isolate=False)
    sandbox.start(log=None)
    try:
        codes = {}
        for name in ("solved", "blank", "solved", "edited_test"):
            report = io.StringIO()
            code = validate_notebook(work / f"{name}.ipynb", root, stream=report, sandbox=sandbox)
            codes.setdefault(name, set()).add(code)
        assert codes == {"solved": {0}, "blank": {1}, "edited_test": {1}}
    finally:
        sandbox.stop()


@pytest.mark.slow
def test_a_failing_test_reads_as_its_message_then_the_students_lines(notebooks, capsys):
    """The report of a failing test, as Validate's dialog shows it too: the test's message
    first, then the line of the student's cell that raised, then the test's line; no traceback
    frames of the grader and no cell numbers of the validating kernel (``In[3]``)."""
    root, work = notebooks
    course = make_course(root.parent / "course-wrong")
    wrong = course.release("squares")
    solve({"squares": wrong})
    answer(wrong, "square", "def square(x):\n    return x + x")
    answer(wrong, "cube", "def cube(x):\n    return [][x]")
    nbformat.write(wrong, work / "wrong.ipynb")
    assert main(["validate", str(work / "wrong.ipynb"), "--course-root", str(root)]) == 1
    report = capsys.readouterr().out
    errors = [part.split("\n\n")[0] for part in report.split("The error was:\n\n")[1:]]
    assert [error.splitlines()[0].strip() for error in errors] == [
        "AssertionError: square(3) should be 9",
        "IndexError: list index out of range",
    ], report
    assert "line 1 of this test: assert square(3) == 9" in errors[0], report
    assert "raised by your code in\n      cell 'cube', line 2, in cube: return [][x]" in errors[1]
    for grader_only in ("Traceback", "In[", "---->", "File "):
        assert grader_only not in report, report
