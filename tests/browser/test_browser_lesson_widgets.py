"""A lesson with a widget runs from top to bottom in the browser, and its slider drives it.

Run ▸ Run All Cells must finish with every non-empty code cell executed and no error output
(warnings on stderr are allowed), both as the browser renders it and in the notebook it saves;
then moving the lesson's first slider by one step must change what the widget shows (a plot
image or a table's text), not only the slider's own readout.
"""

from __future__ import annotations

import re

import nbformat
import pytest
from lab_page import LabPage
from lab_server import LabServer

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LESSONS_WITH_SLIDERS = ["01_reverse_mode.ipynb", "03_averaging_is_exact.ipynb"]


def saved_errors(notebook: nbformat.NotebookNode) -> list[str]:
    """Error outputs in a saved notebook, as 'cell N: Name: message'."""
    return [
        f"cell {index}: {output.get('ename')}: {output.get('evalue')}"
        for index, cell in enumerate(notebook.cells)
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]


def unexecuted_cells(notebook: nbformat.NotebookNode) -> list[int]:
    """Indices of non-empty code cells of a saved notebook that have no execution count."""
    return [
        index
        for index, cell in enumerate(notebook.cells)
        if cell.cell_type == "code" and cell.source.strip() and cell.execution_count is None
    ]


@pytest.mark.parametrize("lesson", LESSONS_WITH_SLIDERS)
def test_lesson_runs_clean_and_slider_changes_its_output(
    lab: LabPage, lab_server: LabServer, lesson: str
) -> None:
    path = f"course/{lesson}"
    lab.open_notebook(path)

    prompts = lab.run_all(lesson)
    assert lab.error_outputs() == [], "Run All rendered error outputs"
    not_run = [prompt for prompt in prompts if not re.fullmatch(r"\[\d+\]:", prompt)]
    assert prompts and not not_run, f"cells that did not run: {not_run} of {prompts}"
    lab.save(lesson)
    saved = nbformat.read(lab_server.root / path, as_version=4)
    assert saved_errors(saved) == []
    assert unexecuted_cells(saved) == []
    lab.record("ran_all")

    slider = lab.page.locator(".jp-Notebook .widget-slider").first
    assert slider.count() == 1, f"{lesson} shows no slider after Run All"
    slider.scroll_into_view_if_needed()
    before = lab.outputs_signature()
    old_value, new_value = lab.nudge_slider(slider)
    assert new_value != old_value
    after = lab.wait_for_outputs_to_change(before, lesson)
    assert after != before
    assert lab.error_outputs() == [], "moving the slider rendered an error"
    slider.scroll_into_view_if_needed()
    lab.record("slider_moved")
