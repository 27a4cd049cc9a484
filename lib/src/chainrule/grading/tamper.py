"""Find the test cells a student edited or deleted, which nbgrader restores when it autogrades.

nbgrader overwrites every locked cell with the instructor's version from the gradebook and, with
``OverwriteCells.add_missing_cells = True``, adds deleted grade cells back. It only logs this, so
the pipeline compares the submission with what was released (the gradebook's source with its
hidden tests removed) and reports the restored cells in the grading summary.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import nbformat

from chainrule.grading.hidden import BEGIN_HIDDEN, END_HIDDEN, split_hidden_tests
from chainrule.grading.outcomes import RestoredCells


@dataclass(frozen=True)
class ReleasedCell:
    """A locked cell as the student received it."""

    grade_id: str
    source: str
    is_grade: bool


def released_cells(
    gradebook: object,
    notebook: str,
    assignment: str,
    begin: str = BEGIN_HIDDEN,
    end: str = END_HIDDEN,
) -> list[ReleasedCell]:
    """The locked cells of ``notebook`` (an nbgrader ``Gradebook``), hidden tests removed."""
    nb = gradebook.find_notebook(notebook, assignment)  # type: ignore[attr-defined]
    grade_ids = {cell.name for cell in nb.grade_cells}
    solution_ids = {cell.name for cell in nb.solution_cells}
    cells = []
    for cell in nb.source_cells:
        if cell.locked and cell.name not in solution_ids:
            visible = split_hidden_tests(cell.source or "", begin, end).visible
            cells.append(ReleasedCell(cell.name, visible, cell.name in grade_ids))
    return cells


def submitted_sources(nb: nbformat.NotebookNode) -> dict[str, str]:
    """``grade_id -> source`` for the nbgrader cells of a submitted notebook."""
    sources = {}
    for cell in nb.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id is not None:
            sources[grade_id] = cell.get("source", "")
    return sources


def find_restored_cells(
    nb: nbformat.NotebookNode, released: Iterable[ReleasedCell]
) -> RestoredCells:
    """Locked cells whose source differs from the release (edited) and grade cells missing."""
    sources = submitted_sources(nb)
    restored = RestoredCells()
    for cell in released:
        if cell.grade_id not in sources:
            if cell.is_grade:
                restored.deleted.append(cell.grade_id)
        elif sources[cell.grade_id].rstrip() != cell.source.rstrip():
            restored.edited.append(cell.grade_id)
    return restored
