"""Submissions of the course's assignments, built from their releases, and their grading.

An :class:`Assignment` is one folder of ``source/`` (see :data:`ASSIGNMENTS`): its notebooks,
its release and its fixtures. A submission is the release notebook with its solution
cells filled in: with the instructor's solutions (from ``source/``), or with a fixture variant
from ``tests/fixtures/<assignment>/<notebook>.py`` that replaces some of them. Grading always
happens in a temporary copy of the course (:meth:`Assignment.make_course`), never in the
repository's own gradebook, ``submitted/`` or ``autograded/``.
"""

from __future__ import annotations

import atexit
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
COURSE_ID = "autograd-distributed"
#: Each assignment's generated course, made once per process (:meth:`Assignment.make_course`).
_GENERATED: dict[str, Path] = {}


# -- cells ---------------------------------------------------------------------------------------


def grade_id(cell: nbformat.NotebookNode) -> str | None:
    """The nbgrader grade id of a cell (None for a cell nbgrader does not track)."""
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def _flags(cell: nbformat.NotebookNode) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def is_code_solution(cell: nbformat.NotebookNode) -> bool:
    """A code cell the student writes in."""
    return cell.cell_type == "code" and bool(_flags(cell).get("solution"))


def is_test(cell: nbformat.NotebookNode) -> bool:
    """An autograded test cell: a graded, locked code cell that is not a solution."""
    flags = _flags(cell)
    return cell.cell_type == "code" and bool(flags.get("grade")) and not flags.get("solution")


def is_written_answer(cell: nbformat.NotebookNode) -> bool:
    """A manually graded answer: a markdown cell that is both a solution and graded."""
    flags = _flags(cell)
    return cell.cell_type == "markdown" and bool(flags.get("grade")) and bool(flags.get("solution"))


def read_notebook(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


# -- fixture variants ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """A submission of one notebook: solution cells replaced, and the test cells it must lose."""

    notebook: str
    name: str
    cells: Mapping[str, str]
    loses: frozenset[str]
    message: str | None = None  # a phrase the feedback of a wrong variant must contain
    hidden_only: str | None = None  # why only the hidden tests catch this wrong variant
    assignment: str = "check_yourself"

    @property
    def is_right(self) -> bool:
        return not self.loses


# -- an assignment -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Assignment:
    """One assignment of ``source/``: where its notebooks, release and fixtures are, and how a
    submission of it is built and graded."""

    name: str

    def __str__(self) -> str:
        return self.name

    @property
    def source_dir(self) -> Path:
        return REPO / "source" / self.name

    @property
    def release_dir(self) -> Path:
        return REPO / "release" / self.name

    @property
    def fixture_dir(self) -> Path:
        return REPO / "tests" / "fixtures" / self.name

    @property
    def notebooks(self) -> tuple[str, ...]:
        """The notebooks' names (without ``.ipynb``), in order."""
        return tuple(sorted(p.stem for p in self.source_dir.glob("*.ipynb")))

    def graded_test_ids(self, notebook: str) -> list[str]:
        """The grade ids of the autograded test cells of a notebook, in order."""
        nb = read_notebook(self.source_dir / f"{notebook}.ipynb")
        return [grade_id(c) for c in nb.cells if is_test(c)]

    def instructor_solutions(self, notebook: str) -> dict[str, str]:
        """The instructor's code of every solution cell of a notebook, by grade id."""
        nb = read_notebook(self.source_dir / f"{notebook}.ipynb")
        return {grade_id(c): c.source for c in nb.cells if is_code_solution(c)}

    def instructor_answers(self, notebook: str) -> dict[str, str]:
        """The instructor's text of every written (manually graded) answer cell, by grade id."""
        nb = read_notebook(self.source_dir / f"{notebook}.ipynb")
        return {grade_id(c): c.source for c in nb.cells if is_written_answer(c)}

    def load_variants(self, notebook: str) -> dict[str, Variant]:
        """The variants of ``tests/fixtures/<assignment>/<notebook>.py``, by name."""
        path = self.fixture_dir / f"{notebook}.py"
        spec = importlib.util.spec_from_file_location(f"{self.name}_fixture_{notebook}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return {
            name: Variant(
                notebook,
                name,
                dict(v["cells"]),
                frozenset(v["loses"]),
                v.get("message"),
                v.get("hidden_only"),
                self.name,
            )
            for name, v in module.VARIANTS.items()
        }

    def build_submission(
        self,
        notebook: str,
        replacements: Mapping[str, str] | None = None,
        instructor: bool = True,
        written: bool = False,
    ) -> nbformat.NotebookNode:
        """The release notebook with its solution cells filled in.

        Cells named in ``replacements`` get that code; the others get the instructor's solution
        (``instructor=True``) or keep the release's stub. A replacement for a cell that is not a
        code solution cell of the notebook is an error. With ``written=True`` the written
        answers get the instructor's text too (otherwise they keep "YOUR ANSWER HERE").
        """
        nb = read_notebook(self.release_dir / f"{notebook}.ipynb")
        replacements = dict(replacements or {})
        solutions = self.instructor_solutions(notebook) if instructor else {}
        answers = self.instructor_answers(notebook) if written else {}
        solution_ids = {grade_id(c) for c in nb.cells if is_code_solution(c)}
        unknown = set(replacements) - solution_ids
        if unknown:
            raise ValueError(f"{notebook}: no solution cells {sorted(unknown)}; has {solution_ids}")
        for cell in nb.cells:
            cell_id = grade_id(cell)
            if is_code_solution(cell):
                code = replacements.get(cell_id, solutions.get(cell_id, cell.source))
                cell.source = code.strip("\n")
            elif is_written_answer(cell) and cell_id in answers:
                cell.source = answers[cell_id]
        return nb

    def make_course(self, root: Path) -> Path:
        """A copy of the course under ``root`` (config and this assignment's source) whose
        gradebook knows the assignment (``generate_assignment`` has run there). The assignment
        is generated once per process, in a temporary folder that each call copies."""
        if self.name not in _GENERATED:
            template = Path(tempfile.mkdtemp(prefix=f"generated-{self.name}-"))
            atexit.register(shutil.rmtree, template, ignore_errors=True)
            course = template / "course"
            (course / "source").mkdir(parents=True)
            shutil.copy2(REPO / "nbgrader_config.py", course / "nbgrader_config.py")
            shutil.copytree(self.source_dir, course / "source" / self.name)
            nbgrader(course, "generate_assignment", self.name, "--force")
            _GENERATED[self.name] = course
        return Path(shutil.copytree(_GENERATED[self.name], root / "course"))

    def write_submission(
        self, course: Path, student: str, notebooks: Mapping[str, nbformat.NotebookNode]
    ) -> None:
        """Place a student's notebooks where ``nbgrader collect`` would put them."""
        folder = course / "submitted" / student / self.name
        folder.mkdir(parents=True, exist_ok=True)
        for name, nb in notebooks.items():
            nbformat.write(nb, folder / f"{name}.ipynb")

    def grade_batch(
        self, course: Path, students: Iterable[str], workers: int = 2, feedback: bool = False
    ):
        """Autograde (or regrade) the students' submissions with the course's pipeline.

        :func:`chainrule.grading.run_batch` grades each student in a time- and memory-limited
        child process, ``workers`` at a time, and returns a :class:`chainrule.grading.BatchResult`:
        one outcome per student with a status per notebook ("graded", or "failed: <reason>"
        when nbgrader could not grade it), the exports and, with ``feedback``, the feedback pages.
        """
        from chainrule.grading import BatchOptions, run_batch

        options = BatchOptions(
            assignment=self.name,
            course_root=course,
            workers=workers,
            students=list(students),
            feedback=feedback,
            out_dir=course / "grades" / self.name,
        )
        return run_batch(options, stream=io.StringIO())

    def autograde(self, course: Path, students: Iterable[str], workers: int = 2) -> list:
        """The outcomes of :meth:`grade_batch` without feedback."""
        return self.grade_batch(course, students, workers).outcomes

    def cell_scores(self, course: Path, student: str, notebook: str) -> dict[str, CellScore]:
        """The graded cells of a student's notebook with their scores and grading errors."""
        from nbgrader.api import Gradebook

        errors = self.cell_errors(course, student, notebook)
        url = f"sqlite:///{course / 'gradebook.db'}"
        with Gradebook(url, COURSE_ID) as gradebook:
            submission = gradebook.find_submission_notebook(notebook, self.name, student)
            return {
                g.name: CellScore(
                    grade_id=g.name,
                    score=g.score,
                    max_score=g.max_score,
                    autograded=g.cell_type == "code",
                    error=errors.get(g.name),
                )
                for g in submission.grades
            }

    def cell_errors(self, course: Path, student: str, notebook: str) -> dict[str, str]:
        """The error each cell of the autograded notebook raised: 'Name: message', by grade id."""
        path = course / "autograded" / student / self.name / f"{notebook}.ipynb"
        nb = json.loads(path.read_text())
        errors = {}
        for cell in nb["cells"]:
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    cell_id = grade_id(nbformat.from_dict(cell))
                    errors[cell_id] = f"{output['ename']}: {output['evalue']}"
        return errors


CHECK_YOURSELF = Assignment("check_yourself")
SHARDED = Assignment("sharded")
TRAINING = Assignment("training")
PIPELINE = Assignment("pipeline")
ASSIGNMENTS = (CHECK_YOURSELF, SHARDED, TRAINING, PIPELINE)
"""Every assignment of the course, in the order of the lessons they follow."""
BY_NAME = {a.name: a for a in ASSIGNMENTS}


# -- a temporary course --------------------------------------------------------------------------


def grading_env() -> dict[str, str]:
    """The environment for nbgrader: this interpreter's bin/ on PATH (nbgrader runs alembic),
    a fixed hash seed and one BLAS thread per process."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(PYTHONHASHSEED="0", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env.update(MKL_NUM_THREADS="1", MPLBACKEND="Agg")
    return env


def nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess:
    """Run ``nbgrader <args>`` in ``course``; raise with its log if it fails."""
    result = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=course,
        env=grading_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"nbgrader {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-6000:]}"
        )
    return result


_WARM = []  # this validating process's zygote, once started


def _warm_kernels():
    """A zygote that forks this process's kernels, warm (numpy, torch and the course library
    imported once), started on first use and stopped when the process ends."""
    if not _WARM:
        import atexit
        import tempfile

        from chainrule.grading.sandbox import StudentSandbox

        base = Path(tempfile.mkdtemp(prefix="validate-"))
        (base / "files").mkdir()
        sandbox = StudentSandbox(base / "zygote", base / "files", None, isolate=False)
        sandbox.start(log=None)
        atexit.register(shutil.rmtree, base, ignore_errors=True)
        atexit.register(sandbox.stop)  # registered last, run first
        _WARM.append(sandbox)
    return _WARM[0]


def _validate_one(course_root: str, path: str) -> tuple[str, int, str]:
    from chainrule.grading import validate_notebook

    report = io.StringIO()
    code = validate_notebook(path, course_root=course_root, stream=report, sandbox=_warm_kernels())
    return path, code, report.getvalue()


def end_without_teardown() -> None:
    """A pool worker's initializer: once its pool shuts it down and its other exit handlers
    have run (registered later, they run first), the worker ends with ``os._exit``, skipping
    the interpreter's teardown of torch and nbgrader (about a second of CPU)."""
    atexit.register(os._exit, 0)


def validate_many(course: Path, paths: Iterable[Path], workers: int = 2) -> dict[Path, tuple]:
    """What Validate says of each notebook (``(exit code, report)`` by path), ``workers`` at a
    time in processes that import nbgrader once, each notebook in a kernel of its own, forked
    by the process's zygote (``test_grading_validate`` checks that such kernels give the
    verdicts of fresh ones)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    paths = list(paths)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=end_without_teardown) as pool:
        results = pool.map(_validate_one, [str(course)] * len(paths), [str(p) for p in paths])
        return {Path(path): (code, report) for path, code, report in results}


# -- results -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CellScore:
    """One graded cell of one autograded notebook."""

    grade_id: str
    score: float | None
    max_score: float
    autograded: bool
    error: str | None  # the error the cell raised while grading, if any
