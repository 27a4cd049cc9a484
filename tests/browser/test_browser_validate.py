"""nbgrader's Validate button: the blank exercise fails, a solved copy passes.

The blank exercise is the student version shipped in ``release/``; the solved copy is the
instructor's version from ``source/`` (solutions in place). Both are copied, with the rest of
their assignment folder, into a student folder of the served course, as a student would have
them, and validated from the notebook toolbar; the "Validation Results" dialog is read.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from lab_page import LabPage
from lab_server import LabServer

pytestmark = [pytest.mark.browser, pytest.mark.slow]

EXERCISE = "ex1_equal_shards.ipynb"


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
