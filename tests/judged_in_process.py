"""The fixtures' verdicts at the cost of their code: the grader's judge and Validate, in-process.

The course's grader runs each notebook in a kernel forked in the student's sandbox, behind
nbgrader (``test_assignment_grading`` keeps one such batch per assignment, with every kind of
student). What a wrong or right fixture checks is narrower: the verdict of each test cell, and
what Validate says. This module gives both without a kernel, a sandbox or nbgrader's steps, by
the same code the grader runs:

- grading is :class:`chainrule.grading.execute.JudgedExecute` itself (the cells' roles, the
  judge, the verdicts, the problems of earlier cells), with the instructor's cells read from a
  real gradebook (:func:`chainrule.grading.execute.trusted_cells`);
- validating is :class:`chainrule.grading.execute.ValidatingExecute`, and a notebook fails
  Validate when one of its test cells ends with an error, as nbgrader's Validator decides;
- the kernel is an IPython shell in a worker process (:class:`ShellKernel`), reset between
  notebooks, so that torch, the course library and the gloo pools of ``chainrule.dist.run``
  are started once per worker instead of once per notebook.

Only the kernel differs from grading, so ``test_assignment_grading`` checks that the batch and
this module give the same verdicts for the batch's students.
"""

from __future__ import annotations

import gc
import os
import signal
import traceback
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from assignment_fixtures import (
    BY_NAME,
    COURSE_ID,
    end_without_teardown,
    grade_id,
    grading_env,
    is_test,
)
from chainrule.grading.config import load_config
from chainrule.grading.execute import (
    EarlierProblems,
    JudgedExecute,
    ValidatingExecute,
    trusted_cells,
)
from nbformat import NotebookNode

#: Seconds a notebook may run in a worker before its current cell is interrupted (fixtures are
#: ours and quick; this only keeps a mistake in one from hanging the suite).
NOTEBOOK_LIMIT = 120


class ShellKernel:
    """An IPython shell in this process, answering as a kernel would: each run returns the
    Jupyter outputs (streams, displays, the result, the error) and the execution count."""

    def __init__(self) -> None:
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config

        config = Config()
        config.HistoryManager.enabled = False
        self.shell = InteractiveShell.instance(config=config)
        # A verdict reads an error's name and message, and :meth:`run` formats its traceback:
        # IPython's own (printed, with every frame's source) is not read.
        self.shell.InteractiveTB.set_mode("Minimal")

    def fresh(self) -> None:
        """Forget the last notebook: its names, its counts, its cells. What outlives it (the
        modules, the gloo pools) is then frozen out of the garbage collector's reach: the next
        reset's collection walks only what the next notebook made, not torch's objects (tenths
        of a second per notebook)."""
        self.shell.reset(new_session=True)
        gc.freeze()

    def run(self, source: str, store_history: bool) -> tuple[list[dict[str, Any]], int | None]:
        from IPython.utils.capture import capture_output

        with capture_output(stdout=True, stderr=True, display=True) as captured:
            result = self.shell.run_cell(source, store_history=store_history)
        outputs: list[dict[str, Any]] = []
        for name, text in (("stdout", captured.stdout), ("stderr", captured.stderr)):
            if text:
                outputs.append({"output_type": "stream", "name": name, "text": text})
        for shown in captured.outputs:
            outputs.append(
                {"output_type": "display_data", "data": shown.data, "metadata": shown.metadata}
            )
        error = result.error_before_exec or result.error_in_exec
        if error is not None:
            outputs.append(
                {
                    "output_type": "error",
                    "ename": type(error).__name__,
                    "evalue": str(error),
                    "traceback": traceback.format_exception(error),
                }
            )
        return outputs, result.execution_count if store_history else None


class _InProcess:
    """What an nbclient-driven Execute does with its kernel, done with a :class:`ShellKernel`:
    every cell in order, each through ``preprocess_cell`` (the grader's own roles and
    verdicts), without starting anything."""

    kernel: ShellKernel

    def execute_cell(
        self, cell: Any, cell_index: int, execution_count: int | None = None, **kwargs: Any
    ) -> Any:
        outputs, count = self.kernel.run(cell.source, kwargs.get("store_history", True))
        cell.outputs = [NotebookNode(output) for output in outputs]
        cell.execution_count = count
        return cell

    def run_cells(self, nb: Any, resources: dict[str, Any]) -> None:
        self.nb, self.resources = nb, resources
        self._earlier, self._ran = EarlierProblems(), {}
        for index, cell in enumerate(nb.cells):
            self.preprocess_cell(cell, resources, index)  # type: ignore[attr-defined]


class InProcessJudgedExecute(_InProcess, JudgedExecute):
    """The grader's Execute (:meth:`JudgedExecute.prepare`, then every cell, then
    :meth:`JudgedExecute.finish`), its kernel a :class:`ShellKernel`."""

    def __init__(self, kernel: ShellKernel, notebook: str, **kwargs: Any) -> None:
        super().__init__(None, notebook, **kwargs)
        self.kernel = kernel


class InProcessValidatingExecute(_InProcess, ValidatingExecute):
    """Validate's Execute, its kernel a :class:`ShellKernel`."""

    def __init__(self, kernel: ShellKernel, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kernel = kernel


# -- a worker ------------------------------------------------------------------------------------

_KERNEL: list[ShellKernel] = []
_TRUSTED: dict[tuple[str, str, str], dict] = {}  # read from a course's gradebook once
_CONFIG: dict[str, Any] = {}  # a course's nbgrader configuration, loaded once


def _start_worker() -> None:
    end_without_teardown()
    os.environ.update(grading_env())
    os.environ["MPLBACKEND"] = "Agg"
    _KERNEL.append(ShellKernel())


def _interrupt(*_: Any) -> None:
    raise TimeoutError(f"the notebook ran past {NOTEBOOK_LIMIT} s in the in-process judge")


@dataclass(frozen=True)
class Verdict:
    """What one notebook got: the error of each test cell (``None`` where it passed), what
    kept tests from running as written, and, for Validate, whether it failed."""

    errors: dict[str, str | None]
    not_as_written: list[str]
    failed: bool


def _errors(nb: Any) -> dict[str, str | None]:
    errors: dict[str, str | None] = {}
    for cell in nb.cells:
        if is_test(cell):
            found = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            errors[grade_id(cell)] = f"{found[0]['ename']}: {found[0]['evalue']}" if found else None
    return errors


def judge_one(course: str, assignment: str, notebook: str, cells: dict | None, mode: str):
    """One notebook of ``assignment`` graded (``mode="grade"``) or validated
    (``mode="validate"``): the instructor's solutions with ``cells`` in place of some, or the
    release as handed out (``cells=None``)."""
    kernel = _KERNEL[0]
    kernel.fresh()
    spec = BY_NAME[assignment]
    nb = spec.build_submission(notebook, cells or {}, instructor=cells is not None, written=True)
    if course not in _CONFIG:
        _CONFIG[course] = load_config(Path(course))
    config = _CONFIG[course]
    signal.signal(signal.SIGALRM, _interrupt)
    signal.alarm(NOTEBOOK_LIMIT)
    try:
        if mode == "grade":
            key = (course, assignment, notebook)
            if key not in _TRUSTED:
                db_url = f"sqlite:///{Path(course) / 'gradebook.db'}"
                _TRUSTED[key] = trusted_cells(db_url, COURSE_ID, assignment, notebook)
            executor = InProcessJudgedExecute(kernel, notebook, config=config)
            executor.prepare(nb, _TRUSTED[key])
            try:
                executor.run_cells(nb, {})
            finally:
                executor.finish()
            report = executor.report
            return Verdict(_errors(nb), report.not_as_written, False)
        executor = InProcessValidatingExecute(kernel, config=config)
        executor.run_cells(nb, {})
        errors = _errors(nb)
        return Verdict(errors, [], any(e is not None for e in errors.values()))
    finally:
        signal.alarm(0)


def judge_many(jobs: Iterable[tuple[Path, tuple[str, str, dict | None, str]]], workers: int = 2):
    """:func:`judge_one` of every ``(course, (assignment, notebook, cells, mode))``,
    ``workers`` at a time, in processes that start torch, the library and their gloo pools once:
    a list of :class:`Verdict`, in the order of ``jobs``."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker) as pool:
        futures = [pool.submit(judge_one, str(course), *job) for course, job in jobs]
        return [future.result() for future in futures]


class Verdicts:
    """Every variant of every notebook (and the instructor's solutions, and the release),
    graded and validated by :func:`judge_many` against the gradebook of a course copy where
    the assignment was generated: ``verdicts[(assignment, notebook, name, mode)]`` is a
    :class:`Verdict`, ``name`` a variant's, ``"instructor"`` or ``"blank"``, ``mode``
    ``"grade"`` or ``"validate"``. An assignment's verdicts are all made at its first look-up,
    so that each test waits for its own assignment only (one run for all four is longer than a
    test may take). ``test_exercise_fixtures`` reads every fixture's verdicts here, and
    ``test_assignment_grading`` those of the students it grades end to end (each of them hands
    in fixtures), so that each notebook is judged once in a session."""

    def __init__(self, folders: Any) -> None:  # pytest's tmp_path_factory
        self.folders = folders
        self.made: dict[str, dict] = {}

    def of(self, name: str) -> dict:
        """The verdicts of one assignment, by key."""
        # Here, not at the top: the judging workers import this module and need no variants.
        from assignment_students import VARIANTS

        if name not in self.made:
            assignment = BY_NAME[name]
            course = assignment.make_course(self.folders.mktemp(f"judged-{name}"))
            keys, jobs = [], []
            for notebook in assignment.notebooks:
                cases = {"instructor": {}, "blank": None}
                cases.update({v.name: v.cells for v in VARIANTS[(name, notebook)].values()})
                for case, cells in cases.items():
                    for mode in ("grade", "validate"):
                        keys.append((name, notebook, case, mode))
                        jobs.append((course, (name, notebook, cells, mode)))
            self.made[name] = dict(zip(keys, judge_many(jobs), strict=True))
        return self.made[name]

    def __getitem__(self, key: tuple[str, str, str, str]) -> Verdict:
        return self.of(key[0])[key]
