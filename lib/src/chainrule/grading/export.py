"""nbgrader's CSV export of the gradebook (what ``nbgrader export`` writes).

It shows a submission that could not be graded as 0, like a real zero; the batch grader writes
its own summary with statuses next to it (:mod:`chainrule.grading.summary`).
"""

from __future__ import annotations

from pathlib import Path

from nbgrader.api import Gradebook
from nbgrader.plugins import CsvExportPlugin
from traitlets.config import Config

from chainrule.grading.config import CourseLayout


def export_grades(config: Config, assignment: str | None, destination: Path) -> Path:
    """Write nbgrader's CSV export (one assignment, or all when ``None``) to ``destination``."""
    layout = CourseLayout.from_config(config)
    destination.parent.mkdir(parents=True, exist_ok=True)
    plugin = CsvExportPlugin(config=config)
    plugin.to = str(destination)
    if assignment is not None:
        plugin.assignment = [assignment]
    with Gradebook(layout.db_url, layout.course_id) as gb:
        plugin.export(gb)
    return destination
