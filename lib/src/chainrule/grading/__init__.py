"""The instructor's grading pipeline on top of nbgrader 0.9.

- :func:`run_batch` (``python -m chainrule.grading batch <assignment>``): autograde every
  submission in an isolated, time- and memory-limited child process (optionally with several
  workers, each on its own gradebook copy, merged back), flag what could not be graded, generate
  feedback with hidden tests stripped, export the CSV and print a summary that tells real zeros
  from failures.
- :func:`validate_notebook` (``python -m chainrule.grading validate <nb>``): nbgrader's validator
  with a non-zero exit status when a test fails.
- :class:`StripHiddenTests`: the feedback preprocessor that keeps hidden tests hidden.
"""

import importlib
from typing import TYPE_CHECKING, Any

# The names below are imported on first use (PEP 562), so that a process that needs only one
# module of the package (the sandbox's zygote, which runs ``chainrule.grading.zygote``) does not
# import nbgrader, nbconvert and SQLAlchemy with the batch: about 1.4 s of CPU per student.
_EXPORTS = {
    "BatchOptions": "chainrule.grading.batch",
    "BatchResult": "chainrule.grading.batch",
    "run_batch": "chainrule.grading.batch",
    "FEEDBACK_PREPROCESSORS": "chainrule.grading.feedback",
    "StripHiddenTests": "chainrule.grading.feedback",
    "NotebookOutcome": "chainrule.grading.outcomes",
    "StudentOutcome": "chainrule.grading.outcomes",
    "validate_notebook": "chainrule.grading.validate",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'chainrule.grading' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


if TYPE_CHECKING:
    from chainrule.grading.batch import BatchOptions, BatchResult, run_batch
    from chainrule.grading.feedback import FEEDBACK_PREPROCESSORS, StripHiddenTests
    from chainrule.grading.outcomes import NotebookOutcome, StudentOutcome
    from chainrule.grading.validate import validate_notebook

__all__ = [
    "FEEDBACK_PREPROCESSORS",
    "BatchOptions",
    "BatchResult",
    "NotebookOutcome",
    "StripHiddenTests",
    "StudentOutcome",
    "run_batch",
    "validate_notebook",
]
