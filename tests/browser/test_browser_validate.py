"""nbgrader's Validate button: the blank exercise fails, a solved copy passes, a syntax error
shows as itself, a wrong answer shows what was expected and received.

The blank exercise is the student version shipped in ``release/``; the solved copy is the
instructor's version from ``source/`` (solutions in place); the broken copy is the solved one
with a syntax error in its solution cell; the wrong copy is the release with a wrong answer in
it. They are copied, with the rest of their assignment folder, into a student folder of the
served course, as a student would have them, and validated from the notebook toolbar; the
"Validation Results" dialog is read, and each error it shows must be the test's own message
first, whole (no line cut at the dialog's edge), without the grader's traceback frames or cell
numbers of the validating kernel (``In[4]``), which the student's notebook does not have.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from lab_page import LabPage
from lab_server import LabServer

pytestmark = [pytest.mark.browser, pytest.mark.slow]

EXERCISE = "ex1_equal_shards.ipynb"
SOLUTION_CELL = "mean_allreduce_scale"


@pytest.fixture
def lab(kept_lab: LabPage) -> LabPage:
    """One JupyterLab page for these tests, as a student keeps JupyterLab open."""
    return kept_lab


@pytest.fixture(scope="module")
def student_folders(lab_server: LabServer, assignment: str) -> dict[str, str]:
    """``blank`` and ``solved`` copies of the assignment, as paths relative to the server root."""
    folders = {}
    for kind, origin in (("blank", "release"), ("solved", "source")):
        relative = Path("student") / kind / assignment
        shutil.copytree(
            lab_server.course_root / origin / assignment,
            lab_server.root / relative,
            ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"),
        )
        folders[kind] = relative.as_posix()
    broken = lab_server.root / "student" / "broken" / assignment
    shutil.copytree(lab_server.root / folders["solved"], broken)
    nb = nbformat.read(broken / EXERCISE, 4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == SOLUTION_CELL:
            cell.source = cell.source.replace("return ", "return (", 1)
    nbformat.write(nb, broken / EXERCISE)
    folders["broken"] = (Path("student") / "broken" / assignment).as_posix()
    wrong = lab_server.root / "student" / "wrong" / assignment
    shutil.copytree(lab_server.root / folders["blank"], wrong)
    nb = nbformat.read(wrong / EXERCISE, 4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == SOLUTION_CELL:
            cell.source = cell.source.replace("raise NotImplementedError()", "return 1.0")
    nbformat.write(nb, wrong / EXERCISE)
    folders["wrong"] = (Path("student") / "wrong" / assignment).as_posix()
    return folders


VERDICTS = (
    "validation-success",
    "validation-failed",
    "validation-changed",
    "validation-type-changed",
)


def validate(lab: LabPage, notebook_path: str) -> tuple[list[str], str]:
    """Open the notebook, press Validate; the verdict classes of the dialog and its text."""
    verdicts, text, _ = validate_with_errors(lab, notebook_path)
    return verdicts, text


def validate_with_errors(
    lab: LabPage, notebook_path: str
) -> tuple[list[str], str, list[dict[str, object]]]:
    """:func:`validate`, with each error the dialog shows: its text and whether the dialog
    cuts it (wider than its box, which does not wrap)."""
    lab.open_notebook(notebook_path)
    dialog = lab.validate()
    verdicts = [name for name in VERDICTS if dialog.locator(f".{name}").count() > 0]
    text = dialog.inner_text()
    errors = dialog.evaluate(
        """dialog => [...dialog.querySelectorAll('.jp-RenderedText pre')]
            .filter((pre, i) => i % 2 === 1)  // each failed cell: its source, then its error
            .map(pre => {
                const body = dialog.querySelector('.jp-Dialog-body');
                const right = Math.min(pre.getBoundingClientRect().right,
                                       body.getBoundingClientRect().right);
                const range = document.createRange();
                range.selectNodeContents(pre);
                const widest = Math.max(...[...range.getClientRects()].map(r => r.right));
                return {text: pre.innerText, cut: pre.scrollWidth > pre.clientWidth + 1
                                                  || widest > right + 1};
            })"""
    )
    lab.record("validation_results")
    lab.close_dialog(dialog)
    return verdicts, text, errors


def assert_readable(errors: list[dict[str, object]]) -> None:
    """Every error: whole in its box, no traceback, no grader file, no kernel cell number."""
    assert errors
    for error in errors:
        text = str(error["text"])
        assert not error["cut"], f"the dialog cuts this error:\n{text}"
        for grader_only in ("Traceback", "In[", "checks.py", "File ", "----> "):
            assert grader_only not in text, f"{grader_only!r} in:\n{text}"


def test_validate_reports_failure_on_the_blank_exercise(
    lab: LabPage, student_folders: dict[str, str]
) -> None:
    verdicts, text, errors = validate_with_errors(lab, f"{student_folders['blank']}/{EXERCISE}")
    assert verdicts == ["validation-failed"], text
    assert "The following cell failed" in text
    assert "Success!" not in text
    tests = [e for e in errors if "You did not provide a response" not in str(e["text"])]
    assert_readable(tests)
    for error in tests:
        lines = str(error["text"]).splitlines()
        assert lines[0] == "ErrorInYourCode: NotImplementedError on rank 0:", lines
        flat = " ".join(line.strip() for line in lines[1:])
        assert flat.startswith(
            f"in cell '{SOLUTION_CELL}', line 4, in {SOLUTION_CELL}: raise NotImplementedError()"
            " line 2 of this test: check_scales("
        ), lines


def test_validate_shows_what_a_wrong_answer_gave_first_and_whole(
    lab: LabPage, student_folders: dict[str, str]
) -> None:
    """The check's own message leads: what the test compared, expected, received, the likely
    mistake; then the line of the test that failed."""
    verdicts, text, errors = validate_with_errors(lab, f"{student_folders['wrong']}/{EXERCISE}")
    assert verdicts == ["validation-failed"], text
    tests = [e for e in errors if "You did not provide a response" not in str(e["text"])]
    assert len(tests) == 1, text  # equal shards pass with s_p = 1; the uneven ones do not
    assert_readable(tests)
    lines = [line.strip() for line in str(tests[0]["text"]).splitlines()]
    assert lines[0].startswith("AssertionError: the mean all-reduce of your s_p ∇L_p"), lines
    expected = next(i for i, line in enumerate(lines) if line.startswith("expected ["))
    assert lines[expected + 1].startswith("received ["), lines
    assert lines[expected + 2].startswith("Likely mistake: no scaling at all"), lines
    assert "line 2 of this test: check_scales(" in " ".join(lines[expected + 3 :]), lines


def test_validate_reports_success_on_a_solved_copy(
    lab: LabPage, student_folders: dict[str, str]
) -> None:
    verdicts, text = validate(lab, f"{student_folders['solved']}/{EXERCISE}")
    assert verdicts == ["validation-success"], text
    assert "Success! Your notebook passes all the tests." in text


def test_validate_shows_a_syntax_error_as_itself(
    lab: LabPage, student_folders: dict[str, str]
) -> None:
    verdicts, text = validate(lab, f"{student_folders['broken']}/{EXERCISE}")
    assert verdicts == ["validation-failed"], text
    assert f"SyntaxError in cell '{SOLUTION_CELL}'" in text
    assert "This test then failed with NameError" in text
