"""The batch grader on a tiny course whose submissions fail in every way we know of.

One batch (two workers) grades ten submissions: correct, blank (a real zero), wrong on the hidden
test only, an infinite loop, a kernel that kills itself, a memory hog, corrupt JSON, an edited
test cell, a deleted test cell, and a flood of output. The tests then read what the batch left:
statuses, folders, gradebook flags, feedback, exports. A last test kills a submission that runs
past its wall-clock limit.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import chainrule.grading.batch as batch
import nbformat
import psutil
import pytest
from chainrule.grading import BatchOptions, cgroup, run_batch
from chainrule.grading.config import grading_env
from chainrule.grading.gradebooks import snapshot
from grading_course import HIDDEN_MARKER, answer, delete_cell, make_course, solve, submit

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]

HASH_PROBE = 'print("hash:", hash("chainrule"))'


def _with(**answers):
    """An edit that solves everything, then replaces some cells (``notebook__grade_id=src``)."""

    def edit(notebooks):
        solve(notebooks)
        for key, source in answers.items():
            notebook, grade_id = key.split("__")
            answer(notebooks[notebook], grade_id, source)

    return edit


def _good(notebooks):
    solve(notebooks)
    notebooks["doubles"].cells.append(nbformat.v4.new_code_cell(HASH_PROBE))


def _deleted(notebooks):
    solve(notebooks)
    delete_cell(notebooks["squares"], "test_square")


# A cell that runs past its limit the first time only, as right code can on a busy machine (the
# marker lives beside the notebooks' homes, which outlive one notebook's kernel).
SLOW_ONCE = """import os, time
marker = os.path.join(os.path.dirname(os.environ["HOME"]), "slow_once")
if not os.path.exists(marker):
    open(marker, "w").close()
    time.sleep(60)
def square(x):
    return x * x"""

SUBMISSIONS = {
    "good": dict(edit=_good),
    "blank": dict(),
    "hidden_fail": dict(edit=_with(squares__square="def square(x):\n    return abs(x) * x")),
    "loop": dict(edit=_with(squares__square="while True:\n    pass")),
    "slow_once": dict(edit=_with(squares__square=SLOW_ONCE)),
    "kill": dict(edit=_with(squares__square="import os\nos.kill(os.getpid(), 9)")),
    "segfault": dict(edit=_with(squares__square="import ctypes\nctypes.string_at(0)")),
    "exits_in_test": dict(
        edit=_with(squares__square="def square(x):\n    import os\n    os._exit(3)")
    ),
    "memory": dict(edit=_with(squares__square="hog = bytearray(6 * 2**30)")),
    "corrupt": dict(edit=solve, raw={"squares": '{"cells": [ {"cell_type": "code", '}),
    "edited": dict(edit=_with(squares__test_square="pass  # no tests here")),
    "deleted": dict(edit=_deleted),
    "partial": dict(edit=solve, omit=("squares",)),
    "huge": dict(
        edit=_with(
            doubles__double="print('x' * 3_000_000)\nfor i in range(20_000):\n    print(i)\n"
            "def double(x):\n    return 2 * x"
        )
    ),
}

EXPECTED = {  # student: (status, {notebook: status})
    "good": ("graded", {"squares": "graded", "doubles": "graded"}),
    "blank": ("graded", {"squares": "graded", "doubles": "graded"}),
    "hidden_fail": ("graded", {"squares": "graded", "doubles": "graded"}),
    "loop": ("failed: timeout (squares)", {"squares": "failed: timeout", "doubles": "graded"}),
    "slow_once": ("graded", {"squares": "graded", "doubles": "graded"}),
    "kill": (
        "flagged: kernel died (squares); code reaches into the kernel or the grader (squares)",
        {
            "squares": "flagged: kernel died (the kernel died while running cell 'square'); "
            "code reaches into the kernel or the grader (cell 'square', line 2: signals to "
            "processes (`os.kill(os.getpid(), 9)`))"
        },
    ),
    "segfault": (
        "flagged: kernel died (squares); code reaches into the kernel or the grader (squares)",
        {
            "squares": "flagged: kernel died (the kernel died while running cell 'square'); "
            "code reaches into the kernel or the grader (cell 'square', line 1: raw memory "
            "access (ctypes) (`import ctypes`))"
        },
    ),
    "exits_in_test": (
        "flagged: kernel died (squares); code reaches into the kernel or the grader (squares)",
        {
            "squares": "flagged: kernel died (the kernel died while the tests ran the student's "
            "code); code reaches into the kernel or the grader (cell 'square', line 3: exiting "
            "the interpreter (`os._exit(3)`))"
        },
    ),
    "memory": ("failed: memory limit (squares)", {"squares": "failed: memory limit"}),
    "corrupt": (
        "failed: corrupt notebook JSON (squares)",
        {"squares": "failed: corrupt notebook JSON", "doubles": "graded"},
    ),
    "edited": (
        "graded: locked cells restored (squares: edited test_square)",
        {"squares": "graded: locked cells restored (edited test_square)"},
    ),
    "deleted": (
        "graded: locked cells restored (squares: deleted test_square)",
        {"squares": "graded: locked cells restored (deleted test_square)"},
    ),
    "huge": ("graded", {"doubles": "graded"}),
    "partial": ("graded", {"squares": "not submitted", "doubles": "graded"}),
}
NOT_GRADED = {"corrupt"}  # nbgrader produced no autograded notebook for this one


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    course = make_course(tmp_path_factory.mktemp("batch") / "course")
    for student, how in SUBMISSIONS.items():
        submit(course, student, how.get("edit"), how.get("raw"), omit=how.get("omit", ()))
    stream = io.StringIO()
    options = BatchOptions(
        "tiny", course.root, workers=2, timeout_per_submission=240, memory_limit_mb=1536
    )
    result = run_batch(options, stream=stream)
    return course, result, stream.getvalue()


def test_each_submission_gets_the_status_it_earned(graded):
    _, result, _ = graded
    outcomes = {o.student: o for o in result.outcomes}
    assert sorted(outcomes) == sorted(SUBMISSIONS)
    for student, (status, notebooks) in EXPECTED.items():
        assert outcomes[student].status == status, outcomes[student].to_dict()
        by_name = {nb.name: nb.status for nb in outcomes[student].notebooks}
        for name, nb_status in notebooks.items():
            assert by_name[name] == nb_status, (student, name, outcomes[student].to_dict())
    assert {o.worker for o in result.outcomes} == {1, 2}  # both workers took students


def test_a_notebook_that_hit_a_time_limit_is_graded_once_more(graded):
    """The second run's grade is the grade: full marks for code that was slow once, a timeout
    for code that runs away every time; the record says why it ran twice."""
    _, result, _ = graded
    outcomes = {o.student: o for o in result.outcomes}
    slow = next(nb for nb in outcomes["slow_once"].notebooks if nb.name == "squares")
    assert slow.retried.startswith("timeout"), slow.to_dict()
    rows = {row.outcome.student: row for row in result.rows}
    assert rows["slow_once"].total == rows["good"].total == 4
    loop = next(nb for nb in outcomes["loop"].notebooks if nb.name == "squares")
    assert loop.retried.startswith("timeout") and loop.reason == "timeout", loop.to_dict()
    good = next(nb for nb in outcomes["good"].notebooks if nb.name == "squares")
    assert good.retried == ""


def test_real_zero_is_a_grade_and_a_failure_is_not(graded):
    _, result, _ = graded
    rows = {row.outcome.student: row for row in result.rows}
    assert rows["blank"].total == 0 and rows["good"].total == rows["good"].max_score == 4
    assert rows["hidden_fail"].total == 2  # visible test passed, hidden one failed: 1 + 1 of 4
    assert rows["partial"].total == 1  # the notebook not handed in counts as a real zero
    assert rows["kill"].total == 1  # the tests after the kernel died earned nothing
    for student in ("loop", "memory", "corrupt"):
        assert rows[student].total is None
    with result.summary_csv.open() as handle:
        lines = {(r["student"], r["notebook"]): r for r in csv.DictReader(handle)}
    blank = lines[("blank", "squares")]
    assert blank["score"] == "0" and blank["status"] == "graded"
    assert lines[("kill", "squares")]["score"] == "0"
    assert lines[("kill", "squares")]["status"].startswith("flagged: kernel died")
    assert lines[("memory", "squares")]["score"] == ""


def test_the_terminal_summary_and_progress(graded):
    _, result, printed = graded
    progress = [line for line in printed.splitlines() if line.startswith("[")]
    assert len(progress) == len(SUBMISSIONS)
    assert all(" s elapsed)" in line for line in progress)
    assert "FAILED" in printed and "failed: corrupt notebook JSON" in printed
    assert result.summary_txt.read_text() in printed
    table = result.summary_txt.read_text().splitlines()
    assert max(len(line) for line in table[:20]) <= 120  # fits a terminal


def test_submissions_that_could_not_be_graded_leave_no_autograded_folder(graded):
    course, result, _ = graded
    for student in SUBMISSIONS:
        folder = course.root / "autograded" / student / "tiny"
        if student in NOT_GRADED:
            assert not folder.exists(), student
        else:
            expected = (
                ["doubles.ipynb"] if student == "partial" else ["doubles.ipynb", "squares.ipynb"]
            )
            assert sorted(p.name for p in folder.glob("*.ipynb")) == expected
    assert not list(result.out_dir.glob("logs/.grading-workers-*"))  # worker copies cleaned


def test_restored_test_cells_grade_with_the_instructors_tests(graded):
    course, result, _ = graded
    rows = {row.outcome.student: row for row in result.rows}
    for student in ("edited", "deleted"):
        assert rows[student].total == 4
        nb = nbformat.read(course.root / "autograded" / student / "tiny" / "squares.ipynb", 4)
        sources = "\n".join(cell.source for cell in nb.cells)
        assert 'assert square(3) == 9, "square(3) should be 9"' in sources
        assert HIDDEN_MARKER in sources  # the hidden test ran too
    deleted = (course.root / "autograded" / "deleted" / "tiny" / "squares.ipynb").read_text()
    assert "was missing from the submission" in deleted  # add_missing_cells at work


def test_feedback_exists_for_graded_students_without_hidden_tests(graded):
    course, _, _ = graded
    autograded = (course.root / "autograded/hidden_fail/tiny/squares.ipynb").read_text()
    assert HIDDEN_MARKER in autograded  # nbgrader's own output does carry the hidden test
    for student in SUBMISSIONS:
        pages = sorted((course.root / "feedback" / student / "tiny").glob("*.html"))
        if student in NOT_GRADED:
            assert pages == []
            continue
        expected = ["doubles.html"] if student == "partial" else ["doubles.html", "squares.html"]
        assert [p.name for p in pages] == expected, student
        for page in pages:
            assert HIDDEN_MARKER not in page.read_text(), page
            assert "BEGIN HIDDEN TESTS" not in page.read_text(), page
    failing = (course.root / "feedback/hidden_fail/tiny/squares.html").read_text()
    assert "square must handle negative numbers" in failing  # the message stays


def test_grades_export_to_csv(graded):
    _, result, _ = graded
    with result.export_csv.open() as handle:
        rows = {row["student_id"]: row for row in csv.DictReader(handle)}
    assert set(rows) == set(SUBMISSIONS)
    assert float(rows["good"]["score"]) == 4.0 and float(rows["blank"]["score"]) == 0.0
    records = json.loads(result.summary_json.read_text())["students"]
    statuses = {r["student"]: r["status"] for r in records}
    assert statuses["corrupt"] == "failed: corrupt notebook JSON (squares)"


def test_failed_notebooks_are_flagged_for_review_in_the_gradebook(graded):
    course, _, _ = graded
    book = snapshot(f"sqlite:///{course.root / 'gradebook.db'}", "autograd-distributed", "tiny")
    corrupt = book["corrupt"]["notebooks"]["squares"]  # not graded at all
    assert corrupt["flagged"] and all(g["needs_manual_grade"] for g in corrupt["grades"].values())
    assert all(g["auto_score"] is None for g in corrupt["grades"].values())
    kill = book["kill"]["notebooks"]["squares"]  # graded; the tests that did not run earned 0
    assert kill["flagged"] and all(g["auto_score"] == 0 for g in kill["grades"].values())
    loop = book["loop"]["notebooks"]["squares"]  # graded, but a cell hit the time limit
    assert loop["flagged"] and loop["grades"]["test_cube"]["auto_score"] == 1
    good = book["good"]["notebooks"]["squares"]
    assert not good["flagged"] and not any(g["needs_manual_grade"] for g in good["grades"].values())


def test_huge_output_is_cut_down(graded):
    course, _, _ = graded
    path = course.root / "autograded" / "huge" / "tiny" / "doubles.ipynb"
    assert path.stat().st_size < 300_000
    assert "output truncated by the grader" in path.read_text()


def test_grading_kernels_get_a_fixed_hash_seed(graded):
    course, _, _ = graded
    nb = nbformat.read(course.root / "autograded" / "good" / "tiny" / "doubles.ipynb", 4)
    printed = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    expected = subprocess.run(
        [sys.executable, "-c", HASH_PROBE],
        env=grading_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert expected.strip() in printed


def test_a_submission_over_its_wall_clock_limit_is_killed_and_cleaned_up(graded, monkeypatch):
    course, _, _ = graded
    submit(course, "slow", _with(squares__square="import time\ntime.sleep(600)"))
    workspaces = Path(tempfile.mkdtemp(prefix="slow-", dir="/tmp"))
    monkeypatch.setattr(batch, "workspaces_folder", lambda: workspaces)
    groups = []  # this batch's control groups (other batches may run beside it)
    create = cgroup.create
    monkeypatch.setattr(
        cgroup, "create", lambda *a, **k: groups.append(create(*a, **k)) or groups[-1]
    )
    options = BatchOptions(
        "tiny",
        course.root,
        timeout_per_submission=15,
        students=["slow"],
        overrides=["--Execute.timeout=900"],  # the cell limit would not stop it
        feedback=False,
    )
    result = run_batch(options, stream=io.StringIO())
    (outcome,) = result.outcomes
    assert outcome.status.startswith("failed: timeout")
    squares = next(nb for nb in outcome.notebooks if nb.name == "squares")
    assert squares.reason == "timeout" and "15 s limit" in squares.detail
    assert 15 <= outcome.seconds < 60
    assert not (course.root / "autograded" / "slow" / "tiny").exists()
    leftovers = []
    for proc in psutil.process_iter(["cwd", "cmdline"]):
        where = str(proc.info.get("cwd") or "") + " ".join(proc.info.get("cmdline") or [])
        if str(course.root) in where or str(workspaces) in where:
            leftovers.append(proc.pid)
    assert leftovers == []  # the killed grader's sandbox and kernel are gone too
    assert not workspaces.exists()
    folders = [folder for group in groups if group is not None for folder in group.folders]
    assert not any(folder.exists() for folder in folders)  # and its control group
