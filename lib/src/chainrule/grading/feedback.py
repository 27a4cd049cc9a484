"""Feedback for students without the hidden tests.

nbgrader puts hidden tests back into every test cell when it autogrades, and its feedback HTML
shows those cells as they ran: the hidden asserts, and tracebacks that quote them (nbgrader
#917, #1363). :class:`StripHiddenTests` runs first in ``GenerateFeedback`` and removes, from each
test cell, the hidden region of its source and every traceback line that quotes a hidden line.
The exception's name and message stay: that is where the test's teaching text is.

To make nbgrader's own ``generate_feedback`` (and the formgrader's button) strip them too, set in
``nbgrader_config.py`` (the list :data:`FEEDBACK_PREPROCESSORS`)::

    c.GenerateFeedback.preprocessors = [
        "chainrule.grading.feedback.StripHiddenTests",
        "nbgrader.preprocessors.GetGrades",
        "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
    ]
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nbconvert.exporters.exporter import ResourcesDict
from nbformat import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import List, Unicode
from traitlets.config import Config

from chainrule.grading.hidden import BEGIN_HIDDEN, END_HIDDEN, split_hidden_tests

#: ``GenerateFeedback.preprocessors`` with hidden tests stripped before anything else runs.
FEEDBACK_PREPROCESSORS = [
    "chainrule.grading.feedback.StripHiddenTests",
    "nbgrader.preprocessors.GetGrades",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]

#: nbgrader's default order of output types (``NbGraderPreprocessor.display_data_priority``).
DISPLAY_DATA_PRIORITY = (
    "text/html",
    "application/pdf",
    "text/latex",
    "image/svg+xml",
    "image/png",
    "image/jpeg",
    "text/plain",
)

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: A quoted source line in an IPython traceback: optional arrow, line number, code.
_SOURCE_LINE = re.compile(r"^\s*(?:-*>\s*)?\d+\s(?P<code>.*)$")


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour codes."""
    return _ANSI.sub("", text)


def quotes_hidden(line: str, hidden_code: set[str]) -> bool:
    """Whether a traceback line quotes one of the hidden source lines."""
    match = _SOURCE_LINE.match(strip_ansi(line))
    return match is not None and match.group("code").strip() in hidden_code


def scrub_traceback(traceback: Sequence[str], hidden_code: set[str]) -> list[str]:
    """The traceback without the lines that quote hidden code (the last entry, the
    ``Name: message`` line, always stays)."""
    if not traceback:
        return []
    scrubbed = []
    for entry in traceback[:-1]:
        lines = [line for line in entry.split("\n") if not quotes_hidden(line, hidden_code)]
        scrubbed.append("\n".join(lines))
    scrubbed.append(traceback[-1])
    return scrubbed


class StripHiddenTests(NbGraderPreprocessor):
    """Remove hidden test regions, and the traceback lines quoting them, from test cells."""

    # nbconvert's HTML exporter configures ``NbConvertBase.display_data_priority`` for every
    # preprocessor it runs; NbGraderPreprocessor redeclares the trait without ``config=True``, so
    # traitlets would warn "Config option `display_data_priority` not recognized" on every
    # feedback run. Declared configurable here, as nbgrader's own GetGrades does.
    display_data_priority = List(list(DISPLAY_DATA_PRIORITY)).tag(config=True)

    begin_test_delimeter = Unicode(BEGIN_HIDDEN, help="Start of a hidden test region").tag(
        config=True
    )
    end_test_delimeter = Unicode(END_HIDDEN, help="End of a hidden test region").tag(config=True)

    def preprocess_cell(
        self, cell: NotebookNode, resources: ResourcesDict, index: int
    ) -> tuple[NotebookNode, ResourcesDict]:
        """Strip one cell (cells without a hidden region are left as they are)."""
        if cell.cell_type != "code":
            return cell, resources
        split = split_hidden_tests(cell.source, self.begin_test_delimeter, self.end_test_delimeter)
        if not split.has_hidden:
            return cell, resources
        cell.source = split.visible
        hidden_code = {line.strip() for line in split.hidden_lines if line.strip()}
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                output.traceback = scrub_traceback(output.get("traceback", []), hidden_code)
        return cell, resources


def feedback_config(config: Config) -> Config:
    """``config`` with the hidden-test stripper first and ClearHiddenTests' delimiters."""
    extra = Config()
    extra.GenerateFeedback.preprocessors = list(FEEDBACK_PREPROCESSORS)
    for name in ("begin_test_delimeter", "end_test_delimeter"):
        if name in config.ClearHiddenTests:
            extra.StripHiddenTests[name] = config.ClearHiddenTests[name]
    merged = Config(config)
    merged.merge(extra)
    return merged


def generate_feedback(config: Config, assignment: str, student: str) -> dict[str, object]:
    """nbgrader's ``generate_feedback`` for one student, hidden tests stripped.

    Returns nbgrader's API result: ``{"success": bool, "log": str, "error": str}``.
    """
    from nbgrader.converters import GenerateFeedback
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.utils import capture_log

    config = feedback_config(config)
    coursedir = CourseDirectory(config=config)
    coursedir.assignment_id = assignment
    coursedir.student_id = student
    app = GenerateFeedback(coursedir=coursedir, config=config)
    app.force = True
    return capture_log(app)
