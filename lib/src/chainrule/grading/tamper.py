"""Find the instructor's cells a student edited, deleted or moved, which grading restores.

:class:`chainrule.grading.restore.RestoreCells` grades every submission against the
instructor's cells, in the instructor's order. It only logs what it changes, so the pipeline
compares the submission with what was released (the gradebook's source with its hidden tests
removed, in the instructor's order) and reports the restored cells in the grading summary.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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
    nb: nbformat.NotebookNode, released: Iterable[ReleasedCell], order: Sequence[str] = ()
) -> RestoredCells:
    """Locked cells whose source differs from the release (edited), locked cells missing
    (deleted), and locked cells out of the instructor's ``order`` (moved)."""
    sources = submitted_sources(nb)
    restored = RestoredCells()
    rank = {name: i for i, name in enumerate(order)}
    released = sorted(released, key=lambda cell: rank.get(cell.grade_id, len(rank)))
    for cell in released:
        if cell.grade_id not in sources:
            restored.deleted.append(cell.grade_id)
        elif sources[cell.grade_id].rstrip() != cell.source.rstrip():
            restored.edited.append(cell.grade_id)
    locked = {cell.grade_id for cell in released}
    submitted = [i for i in sources if i in locked and i in rank]
    restored.moved = out_of_order(submitted, rank)
    return restored


def out_of_order(names: Sequence[str], rank: dict[str, int]) -> list[str]:
    """The fewest ``names`` that, left out, leave the others in the order ``rank`` gives
    (the complement of a longest increasing subsequence), in the order of ``names``."""
    best: list[list[str]] = []  # best[k]: an increasing run of length k + 1 ending lowest
    for name in names:
        low, high = 0, len(best)
        while low < high:
            middle = (low + high) // 2
            if rank[best[middle][-1]] < rank[name]:
                low = middle + 1
            else:
                high = middle
        run = (best[low - 1] if low else []) + [name]
        if low == len(best):
            best.append(run)
        else:
            best[low] = run
    kept = set(best[-1]) if best else set()
    return [name for name in names if name not in kept]
