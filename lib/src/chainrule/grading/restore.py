"""The instructor's cells, as the instructor wrote them and where the instructor put them.

A submission may edit, delete or move any cell, locked or not. nbgrader's ``OverwriteCells``
puts back the source of the locked cells that are still there and, with ``add_missing_cells``,
re-adds deleted *grade* cells; a deleted or moved helper cell (the one that defines a test's
checks, say) stays deleted or moved, so that the student's own cells could define the checks
instead. :class:`RestoreCells` grades every submission against the instructor's notebook:

1. every cell with a ``grade_id`` of the gradebook gets the gradebook's source and metadata
   (nbgrader's per-cell overwrite, without its warning for test cells whose only difference is
   their hidden tests, which the student never had);
2. every locked, graded or task cell of the instructor's notebook that the submission lacks is
   added back, marked as re-added;
3. the cells are put in the instructor's order: each cell of the instructor's notebook where
   the instructor has it, and each cell the student added right after the cell that preceded it
   in the submission (at the top when none did).

The instructor's order is read from the instructor's notebook (``source/<assignment>/``), or
from the released one. :mod:`chainrule.grading.tamper` reports what was restored. It is
configured in ``nbgrader_config.py`` (so the formgrader's autograde uses it too) and used by the
course's grader whatever the configuration says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat
from nbformat import NotebookNode
from nbgrader.preprocessors import OverwriteCells

from chainrule.grading.hidden import split_hidden_tests

START = ""  # the anchor of the cells a student added above every known cell


def grade_id(cell: NotebookNode) -> str | None:
    """A cell's nbgrader id (``None`` for a cell nbgrader does not track)."""
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def instructor_notebook(config: Any, assignment: str, notebook: str) -> Path:
    """The instructor's notebook: ``source/<assignment>/<notebook>.ipynb``, else the release's.

    ``FileNotFoundError`` when neither exists (the submission cannot be graded against it).
    """
    from nbgrader.coursedir import CourseDirectory

    coursedir = CourseDirectory(config=config)
    for step in (coursedir.source_directory, coursedir.release_directory):
        path = Path(coursedir.format_path(step, ".", assignment)) / f"{notebook}.ipynb"
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"the instructor's notebook {notebook}.ipynb of {assignment!r} is in neither "
        f"{coursedir.source_directory}/ nor {coursedir.release_directory}/"
    )


def instructor_order(config: Any, assignment: str, notebook: str) -> list[str]:
    """The ``grade_id`` s of the instructor's notebook, in its order."""
    nb = nbformat.read(instructor_notebook(config, assignment, notebook), as_version=4)
    return [i for i in (grade_id(cell) for cell in nb.cells) if i is not None]


def anchored(cells: list[NotebookNode], known: set[str]) -> dict[str, list[NotebookNode]]:
    """The cells a student added (no known id), by the known cell that precedes each."""
    anchors: dict[str, list[NotebookNode]] = {}
    anchor = START
    for cell in cells:
        cell_id = grade_id(cell)
        if cell_id in known:
            anchor = cell_id
        else:
            anchors.setdefault(anchor, []).append(cell)
    return anchors


def in_instructor_order(
    cells: list[NotebookNode], order: list[str], missing: dict[str, NotebookNode]
) -> list[NotebookNode]:
    """``cells`` with ``missing`` added, the instructor's cells in ``order`` and each added
    cell after the cell that preceded it."""
    by_id: dict[str, NotebookNode] = {}
    for cell in cells:
        cell_id = grade_id(cell)
        if cell_id is not None and cell_id in order:
            by_id[cell_id] = cell
    by_id.update(missing)
    added = anchored(cells, set(by_id))
    result = list(added.get(START, []))
    for cell_id in order:
        if cell_id in by_id:
            result.append(by_id[cell_id])
        result += added.get(cell_id, [])
    return result


class RestoreCells(OverwriteCells):
    """Grade against the instructor's cells and order (see the module docstring)."""

    def preprocess(self, nb: NotebookNode, resources: Any) -> tuple[NotebookNode, Any]:
        """Overwrite the instructor's cells, add the missing ones, restore the order."""
        from nbgrader.api import Gradebook

        info = resources["nbgrader"]
        self.notebook_id, self.assignment_id = info["notebook"], info["assignment"]
        self.gradebook = Gradebook(info["db_url"])
        with self.gradebook:
            nb, resources = super(OverwriteCells, self).preprocess(nb, resources)
            order = instructor_order(self.config, self.assignment_id, self.notebook_id)
            missing = self.missing_cells(nb, order)
            nb.cells = in_instructor_order(nb.cells, order, missing)
        return nb, resources

    def missing_cells(self, nb: NotebookNode, order: list[str]) -> dict[str, NotebookNode]:
        """The instructor's locked, graded and task cells that ``nb`` lacks, to be added."""
        source_nb = self.gradebook.find_notebook(self.notebook_id, self.assignment_id)
        sources = {cell.name: cell for cell in source_nb.source_cells}
        grades = {cell.name: cell for cell in source_nb.grade_cells}
        tasks = {cell.name: cell for cell in source_nb.task_cells}
        solutions = {cell.name for cell in source_nb.solution_cells}
        present = {grade_id(cell) for cell in nb.cells}
        missing = {}
        for name in order:
            source = sources.get(name)
            if source is None or name in present:
                continue
            if name in grades:
                cell = self.missing_cell_transform(
                    source, grades[name].max_score, is_solution=name in solutions
                )
            elif name in tasks:
                cell = self.missing_cell_transform(source, tasks[name].max_score, is_task=True)
            elif source.locked and name not in solutions:
                cell = self.missing_cell_transform(source, 0)
                del cell["metadata"]["nbgrader"]["points"]
                cell["metadata"]["nbgrader"]["grade"] = False
            else:  # a deleted solution cell: the student's code for it is gone
                continue
            self.log.warning("Missing cell %s encountered, adding it to the notebook", name)
            missing[name] = nbformat.from_dict(cell)
        return missing

    def report_change(self, name: str, attr: str, old: Any, new: Any) -> None:
        """nbgrader's warning, except for a test cell whose only difference from the
        gradebook is its hidden tests (every honest submission has that difference)."""
        if attr == "checksum" and self._only_hidden_tests_differ(name):
            return
        super().report_change(name, attr, old, new)

    def _only_hidden_tests_differ(self, name: str) -> bool:
        cell = self._current_cell
        source = self.gradebook.find_source_cell(name, self.notebook_id, self.assignment_id)
        visible = split_hidden_tests(source.source or "").visible
        return visible != (source.source or "") and cell.source.rstrip() == visible.rstrip()

    def preprocess_cell(
        self, cell: NotebookNode, resources: Any, cell_index: int
    ) -> tuple[NotebookNode, Any]:
        """nbgrader's per-cell overwrite (remembering the cell, for :meth:`report_change`)."""
        self._current_cell = cell
        return super().preprocess_cell(cell, resources, cell_index)


def with_restore_cells(preprocessors: list[Any]) -> list[Any]:
    """nbgrader's sanitize preprocessors with :class:`RestoreCells` for ``OverwriteCells``."""
    names = ("OverwriteCells", "nbgrader.preprocessors.OverwriteCells")
    result = []
    for preprocessor in preprocessors:
        is_overwrite = preprocessor is OverwriteCells or preprocessor in names
        result.append(RestoreCells if is_overwrite else preprocessor)
    return result
