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

import sys

# nbformat validates notebooks with jsonschema, which imports the optional IRI format checker
# ``rfc3987_syntax`` when it is installed (jupyter-events installs it). That module builds a Lark
# grammar on import: about 2 s of CPU here, paid by the batch process, its fork server and
# every ``validate``. Notebook schemas use no IRI formats, so grading goes without it.
if "jsonschema" not in sys.modules:
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]

from chainrule.grading.batch import BatchOptions, BatchResult, run_batch  # noqa: E402
from chainrule.grading.feedback import FEEDBACK_PREPROCESSORS, StripHiddenTests  # noqa: E402
from chainrule.grading.outcomes import NotebookOutcome, StudentOutcome  # noqa: E402
from chainrule.grading.validate import validate_notebook  # noqa: E402

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
