"""nbgrader's Validate button: the blank exercise fails, a solved copy passes, a syntax error
shows as itself.

The blank exercise is the student version shipped in ``release/``; the solved copy is the
instructor's version from ``source/`` (solutions in place); the broken copy is the solved one
with a syntax error in its solution cell. They are copied, with the rest of their assignment
folder, into a student folder of the served course, as a student would have them, and
validated from the notebook toolbar; the "Validation Results" dialog is read.
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
    return folders


VERDICTS = (
    "validation-success",
    "validation-failed",
    "validation-changed",
    "validation-type-changed",
)


def validate(lab: LabPage, notebook_path: str) -> tuple[list[str], str]:
    """Open the notebook, press Validate; the verdict classes of the dialog and its text."""
    lab.open_notebook(notebook_path)
    dialog = lab.validate()
    verdicts = [name for name in VERDICTS if dialog.locator(f".{name}").count() > 0]
    text = dialog.inner_text()
    lab.record("validation_results")
    lab.close_dialog(dialog)
    return verdicts, text


def test_validate_reports_failure_on_the_blank_exercise(
    lab: LabPage, student_folders: dict[str, str]
) -> None:
    verdicts, text = validate(lab, f"{student_folders['blank']}/{EXERCISE}")
    assert verdicts == ["validation-failed"], text
    assert "The following cell failed" in text
    assert "Success!" not in text


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
