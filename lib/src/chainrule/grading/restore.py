"""Putting deleted test cells back, where nbgrader 0.9's own code can fail.

With ``OverwriteCells.add_missing_cells = True`` nbgrader re-inserts a deleted grade cell after
the cell that precedes it in the instructor's notebook. It only looks that cell up among the
submission's grade and solution cells, so deleting a test cell that follows a locked helper
cell (a worked example, say) stops the whole notebook with ``KeyError: '<helper id>'``; and a
cell the student marked as a grade cell with an id the gradebook does not know stops it with
``KeyError: 'grade_id'``. :class:`RestoreCells` inserts each missing grade cell after the
nearest cell before it in the instructor's notebook that the submission still has (at the top
if there is none), and ignores cells without an id. It is configured in ``nbgrader_config.py``
and used by the course's grader whatever the configuration says.
"""

from __future__ import annotations

from typing import Any

from nbformat import NotebookNode
from nbgrader.preprocessors import OverwriteCells


def _grade_id(cell: NotebookNode) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


class RestoreCells(OverwriteCells):
    """nbgrader's ``OverwriteCells`` with a missing-cell insertion that cannot fail."""

    def add_missing_grade_cells(self, nb: NotebookNode, resources: Any) -> tuple[NotebookNode, Any]:
        """Insert every grade cell the submission lacks after its nearest present predecessor."""
        source_nb = self.gradebook.find_notebook(self.notebook_id, self.assignment_id)
        source_cells = list(source_nb.source_cells)
        order = [cell.name for cell in source_cells]
        grade_cells = {cell.name: cell for cell in source_nb.grade_cells}
        solution_ids = {cell.name for cell in source_nb.solution_cells}
        for position, name in enumerate(order):
            present = [_grade_id(cell) for cell in nb.cells]
            if name not in grade_cells or name in present:
                continue
            self.log.warning("Missing grade cell %s encountered, adding to notebook", name)
            cell = self.missing_cell_transform(
                source_cells[position],
                grade_cells[name].max_score,
                is_solution=name in solution_ids,
            )
            before = [n for n in order[:position] if n in present]
            index = present.index(before[-1]) + 1 if before else 0
            nb.cells.insert(index, cell)
        return nb, resources


def with_restore_cells(preprocessors: list[Any]) -> list[Any]:
    """nbgrader's sanitize preprocessors with :class:`RestoreCells` for ``OverwriteCells``."""
    names = ("OverwriteCells", "nbgrader.preprocessors.OverwriteCells")
    result = []
    for preprocessor in preprocessors:
        is_overwrite = preprocessor is OverwriteCells or preprocessor in names
        result.append(RestoreCells if is_overwrite else preprocessor)
    return result
