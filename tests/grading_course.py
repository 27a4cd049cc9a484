"""A tiny throwaway nbgrader course for the grading pipeline's tests.

``make_course(tmp_path)`` copies the course's real ``nbgrader_config.py`` into ``tmp_path`` (with
a short per-cell timeout appended), writes a two-notebook assignment ``tiny`` with solution cells,
visible tests and one hidden test, and runs ``nbgrader generate_assignment`` on it. Submissions
are made from the released notebooks with :func:`submit`, either as they are or changed by the
helpers below (answers written in, test cells edited or deleted, files corrupted).
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
ASSIGNMENT = "tiny"
#: A string that appears only inside the hidden test, on the line that fails for a wrong answer.
HIDDEN_MARKER = "hidden_marker_q7x"

SOLUTIONS = {
    "square": "def square(x):\n    return x * x",
    "cube": "def cube(x):\n    return x * x * x",
    "double": "def double(x):\n    return 2 * x",
}


def _meta(grade_id: str, *, solution: bool = False, grade: bool = False, points: float = 0) -> dict:
    meta = {
        "grade": grade,
        "grade_id": grade_id,
        "locked": not solution,
        "schema_version": 3,
        "solution": solution,
        "task": False,
    }
    if grade:
        meta["points"] = points
    return {"nbgrader": meta}


def _solution_cell(grade_id: str, signature: str, body: str) -> nbformat.NotebookNode:
    source = f"{signature}\n    ### BEGIN SOLUTION\n    {body}\n    ### END SOLUTION"
    return nbformat.v4.new_code_cell(source, metadata=_meta(grade_id, solution=True))


def _test_cell(grade_id: str, source: str, points: float) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(source, metadata=_meta(grade_id, grade=True, points=points))


def _notebook(cells: list[nbformat.NotebookNode]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return nb


def source_notebooks() -> dict[str, nbformat.NotebookNode]:
    """The instructor's version of assignment ``tiny``: ``squares`` (3 points) and ``doubles``."""
    squares = _notebook(
        [
            nbformat.v4.new_markdown_cell("# Squares\nWrite `square` and `cube`."),
            _solution_cell("square", "def square(x):", "return x * x"),
            _test_cell(
                "test_square",
                'assert square(3) == 9, "square(3) should be 9"\n'
                "### BEGIN HIDDEN TESTS\n"
                f"{HIDDEN_MARKER} = square(-4)\n"
                f'assert {HIDDEN_MARKER} == 16, "square must handle negative numbers"\n'
                "### END HIDDEN TESTS",
                points=2,
            ),
            _solution_cell("cube", "def cube(x):", "return x * x * x"),
            _test_cell("test_cube", 'assert cube(2) == 8, "cube(2) should be 8"', points=1),
        ]
    )
    doubles = _notebook(
        [
            _solution_cell("double", "def double(x):", "return 2 * x"),
            _test_cell("test_double", 'assert double(5) == 10, "double(5) should be 10"', points=1),
        ]
    )
    return {"squares": squares, "doubles": doubles}


def grading_env() -> dict[str, str]:
    """The environment nbgrader needs: the virtual environment's ``bin/`` first on PATH."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def nbgrader(course: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Run ``nbgrader <args>`` in ``course``; fail with its output if it exits non-zero."""
    proc = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=course,
        env=env or grading_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


@dataclass
class TinyCourse:
    """A generated course in a temporary folder."""

    root: Path
    assignment: str = ASSIGNMENT

    def release(self, notebook: str) -> nbformat.NotebookNode:
        """A fresh copy of the student version of ``notebook``."""
        return nbformat.read(self.root / "release" / self.assignment / f"{notebook}.ipynb", 4)

    def submission_dir(self, student: str) -> Path:
        """``submitted/<student>/tiny``."""
        return self.root / "submitted" / student / self.assignment


_GENERATED: dict[tuple[int, str, str], Path] = {}
Notebooks = Callable[[], dict[str, nbformat.NotebookNode]]


def make_course(
    root: Path,
    cell_timeout: int = 4,
    extra_config: str = "",
    notebooks: Notebooks | None = None,
) -> TinyCourse:
    """Write the course into ``root`` with its release and gradebook generated.

    ``notebooks`` returns the instructor's notebooks of assignment ``tiny`` (by default
    :func:`source_notebooks`). The first call with given settings runs
    ``generate_assignment``; later calls copy that result (the copy's ``nbgrader_config.py``
    finds its own folder, so it is a course of its own).
    """
    notebooks = notebooks or source_notebooks
    key = (cell_timeout, extra_config, notebooks.__qualname__)
    if key not in _GENERATED or not _GENERATED[key].exists():
        template = Path(tempfile.mkdtemp(prefix="tiny-course-")) / "course"
        atexit.register(shutil.rmtree, template.parent, ignore_errors=True)
        _write_course(template, cell_timeout, extra_config, notebooks())
        generate(template, ASSIGNMENT)
        _GENERATED[key] = template
    shutil.copytree(_GENERATED[key], root, dirs_exist_ok=True)
    return TinyCourse(root)


def _write_course(
    root: Path, cell_timeout: int, extra_config: str, notebooks: dict[str, nbformat.NotebookNode]
) -> None:
    root.mkdir(parents=True, exist_ok=True)
    config = (REPO / "nbgrader_config.py").read_text()
    config += f"\n# tests: short limits\nc.Execute.timeout = {cell_timeout}\n{extra_config}\n"
    (root / "nbgrader_config.py").write_text(config)
    source = root / "source" / ASSIGNMENT
    source.mkdir(parents=True)
    for name, nb in notebooks.items():
        nbformat.write(nb, source / f"{name}.ipynb")


def generate(root: Path, assignment: str) -> None:
    """``nbgrader generate_assignment`` through nbgrader's Python API (no interpreter start-up)."""
    from chainrule.grading.config import load_config
    from nbgrader.apps import NbGraderAPI

    api = NbGraderAPI(config=load_config(root))
    result = api.generate_assignment(assignment, force=True)
    assert result["success"], result.get("log", "") + result.get("error", "")


Edit = Callable[[dict[str, nbformat.NotebookNode]], None]


def answer(nb: nbformat.NotebookNode, grade_id: str, source: str) -> None:
    """Replace the source of the cell ``grade_id``."""
    cell_of(nb, grade_id).source = source


def cell_of(nb: nbformat.NotebookNode, grade_id: str) -> nbformat.NotebookNode:
    """The cell with nbgrader id ``grade_id``."""
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            return cell
    raise KeyError(grade_id)


def delete_cell(nb: nbformat.NotebookNode, grade_id: str) -> None:
    """Remove the cell ``grade_id`` from the notebook."""
    nb.cells.remove(cell_of(nb, grade_id))


def solve(notebooks: dict[str, nbformat.NotebookNode]) -> None:
    """Write the correct answer into every solution cell."""
    for nb in notebooks.values():
        for cell in nb.cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            if grade_id in SOLUTIONS:
                cell.source = SOLUTIONS[grade_id]


def submit(
    course: TinyCourse,
    student: str,
    edit: Edit | None = None,
    raw: dict[str, str] | None = None,
    timestamp: str = "2026-01-15 10:00:00.000000 UTC",
    omit: tuple[str, ...] = (),
) -> Path:
    """Put a submission into ``submitted/<student>/tiny``.

    The released notebooks are changed by ``edit`` (a function of ``{name: notebook}``);
    ``raw`` then overwrites whole files with the given text (for corrupt JSON); notebooks named
    in ``omit`` are left out.
    """
    names = sorted(p.stem for p in (course.root / "release" / course.assignment).glob("*.ipynb"))
    notebooks = {name: course.release(name) for name in names}
    if edit is not None:
        edit(notebooks)
    folder = course.submission_dir(student)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for name, nb in notebooks.items():
        if name not in omit:
            nbformat.write(nb, folder / f"{name}.ipynb")
    for name, text in (raw or {}).items():
        (folder / f"{name}.ipynb").write_text(text)
    (folder / "timestamp.txt").write_text(timestamp)
    return folder
