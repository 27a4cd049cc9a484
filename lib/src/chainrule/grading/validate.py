"""Validate a notebook from the command line, with an exit status that says whether it passed.

``nbgrader validate`` prints "VALIDATION FAILED" and still exits 0 (nbgrader #1908), which makes
it useless in a script or a CI job. :func:`validate_notebook` runs nbgrader's own ``Validator``
with the course's configuration, prints nbgrader's report, and returns 0 when every test passed
and 1 when a test failed, a locked cell was changed or a cell changed type.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from traitlets.config import Config

from chainrule.grading.config import CONFIG_FILENAME, load_config

if TYPE_CHECKING:
    from chainrule.grading.sandbox import StudentSandbox

PROBLEM_KEYS = ("type_changed", "changed", "failed")
_VALIDATED = itertools.count()  # notebooks validated in a sandbox by this process


def find_course_root(notebook: Path, start: Path | None = None) -> Path:
    """The folder whose ``nbgrader_config.py`` applies: the working folder's, else the nearest
    one above the notebook, else the working folder."""
    cwd = (start or Path.cwd()).resolve()
    if (cwd / CONFIG_FILENAME).exists():
        return cwd
    for folder in notebook.resolve().parents:
        if (folder / CONFIG_FILENAME).exists():
            return folder
    return cwd


def validation_results(
    notebook: Path, config: Config, stream: TextIO
) -> tuple[dict[str, Any], bool]:
    """nbgrader's ``Validator.validate_and_print`` for one notebook: its results, and whether
    the validator was inverted (complaining about passing cells)."""
    from nbgrader.validator import Validator

    from chainrule.grading.execute import use_validating_execute

    use_validating_execute()

    class RecordingValidator(Validator):
        """The stock validator, keeping the results it prints."""

        results: dict[str, Any] = {}

        def validate(self, filename: str) -> dict[str, Any]:
            self.results = super().validate(filename)
            return self.results

    validator = RecordingValidator(config=config)
    validator.stream = stream
    validator.validate_and_print(str(notebook))
    return validator.results, bool(validator.invert)


def passed(results: dict[str, Any], invert: bool = False) -> bool:
    """Whether results mean success (with ``invert``, success means no test passed)."""
    if results.get("type_changed") or results.get("changed"):
        return False
    if invert:
        return not results.get("passed")
    return not results.get("failed")


def validate_notebook(
    notebook: str | Path,
    course_root: str | Path | None = None,
    overrides: list[str] | None = None,
    stream: TextIO | None = None,
    sandbox: StudentSandbox | None = None,
) -> int:
    """Validate ``notebook``, print nbgrader's report; 0 if it passed, 1 if not, 2 if missing.

    ``sandbox``: a started :class:`~chainrule.grading.sandbox.StudentSandbox` whose zygote forks
    the kernel (warm: numpy, torch and the course library already imported), instead of a new
    kernel process; for validating many notebooks in a row. It is reset afterwards.
    """
    stream = stream or sys.stdout
    path = Path(notebook)
    if not path.is_file():
        print(f"no such notebook: {path}", file=stream)
        return 2
    root = Path(course_root) if course_root else find_course_root(path)
    config = load_config(root, overrides=overrides or [])
    if sandbox is not None:
        from chainrule.grading.sandbox import SandboxedKernelManager

        # a short home name, whatever the notebook's: the kernel's sockets are under it
        forked = SandboxedKernelManager.forking_in(sandbox, f"validate-{next(_VALIDATED)}")
        config.ValidatingExecute.kernel_manager_class = forked
    try:
        results, invert = validation_results(path, config, stream)
    finally:
        if sandbox is not None:
            sandbox.reset()
    ok = passed(results, invert)
    stream.flush()
    return 0 if ok else 1
