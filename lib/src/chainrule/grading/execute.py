"""How a notebook's cells run when it is graded, and when a student validates it.

:class:`JudgedExecute` takes the place of nbgrader's ``Execute`` in the course's grader. It
starts the student's kernel in a sandbox (:mod:`chainrule.grading.sandbox`) and gives every
code cell one of three roles, decided by the gradebook, not by the notebook:

- the student's cells (solution cells, cells the student added) run in the kernel only;
- the instructor's test cells run in the grader only, through a
  :class:`~chainrule.judging.judge.Judge` that reaches the student's code by requests the
  kernel answers with plain values (:mod:`chainrule.judging`);
- the instructor's other code cells (imports, helpers, worked examples) run in both: in the
  kernel, where the student's code may use them, and in the grader, where the tests use them.

A cell counts as the instructor's only if its ``grade_id`` is a locked cell of the gradebook
and its source is the gradebook's, character for character (nbgrader has just restored it).
Nothing the student's code does in the kernel can reach the test code, the reference values,
the comparisons or the verdicts, which become the test cell's outputs and so its points
(nbgrader's ``SaveAutoGrades`` reads them as usual). Whatever kept a test from running as
written (the kernel died, did not answer, answered with nonsense) is recorded in the report
file, and the batch grader flags the notebook with it.

:class:`ValidatingExecute` is nbgrader's ``Execute`` for Validate. Both of them report a
problem of an earlier cell on the tests it breaks: a ``SyntaxError`` in a solution cell
appears, with its line, on the first test that fails because of it (instead of the
``NameError`` that follows), and a cell that runs past its time limit is named, with the limit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from nbclient.exceptions import DeadKernelError
from nbformat import NotebookNode
from nbgrader.preprocessors import Execute
from nbgrader.utils import is_locked, is_solution

from chainrule.grading.hidden import BEGIN_HIDDEN
from chainrule.grading.sandbox import SandboxedKernelManager, StudentSandbox
from chainrule.grading.validate import RanCell, student_message
from chainrule.judging.cells import bound_names
from chainrule.judging.judge import (
    GraderCallFailed,
    Judge,
    StudentCell,
    StudentCodeError,
    StudentTimeout,
)
from chainrule.judging.source_scan import reaches_into_grader

KERNEL, JUDGE, BOTH = "kernel", "judge", "both"
#: Errors of an earlier cell that later tests fail because of.
SYNTAX_ERRORS = ("SyntaxError", "IndentationError", "TabError")
TIMEOUT_ERROR = "CellTimeoutError"


def cell_label(cell: NotebookNode, index: int) -> str:
    """How a cell is named in messages: its ``grade_id`` in quotes, else its position."""
    grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
    return f"'{grade_id}'" if grade_id else str(index + 1)


def _error_output(ename: str, evalue: str, traceback: list[str]) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=traceback)


@dataclass
class EarlierProblems:
    """Problems of non-test cells (syntax errors, time limits), to report on the tests."""

    problems: list[str] = field(default_factory=list)
    syntax: bool = False

    def note(self, cell: NotebookNode, label: str, timeout: int | None) -> None:
        """Remember the syntax error or time-out of a cell that just ran."""
        for output in cell.get("outputs", []):
            if output.get("output_type") != "error":
                continue
            if output.get("ename") in SYNTAX_ERRORS:
                lines = [line for line in output.get("traceback", []) if line.strip()]
                shown = "\n".join(lines[-4:])
                self.problems.append(f"{output['ename']} in cell {label}:\n{shown}")
                self.syntax = True
            elif output.get("ename") == TIMEOUT_ERROR:
                self.problems.append(f"cell {label} ran past its {timeout} s time limit")

    def apply(self, cell: NotebookNode) -> None:
        """Put the remembered problems on a test cell that failed after them."""
        if not self.problems:
            return
        for output in cell.get("outputs", []):
            if output.get("output_type") != "error":
                continue
            followed = f"{output.get('ename')}: {output.get('evalue')}"
            if self.syntax and output.get("ename") == "NameError":
                output["ename"], output["evalue"] = "SyntaxError", self.problems[0].splitlines()[0]
            output["traceback"] = [
                *self.problems,
                f"(This test then failed with {followed}.)",
            ]
            return


def _name_timeout(cell: NotebookNode, label: str, timeout: int | None) -> None:
    """Say which cell ran past which limit in nbgrader's time-out error."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error" and output.get("ename") == TIMEOUT_ERROR:
            text = f"cell {label} ran past its {timeout} s time limit and was interrupted"
            output["evalue"] = text
            output["traceback"] = [f"{TIMEOUT_ERROR}: {text}"]


def _shorten_errors(cell: NotebookNode, ran: dict[int, RanCell]) -> None:
    """A failing test's error, as the student reads it in Validate's dialog
    (:func:`chainrule.grading.validate.student_message`): the message first, wrapped, without
    the instructor's frames, cells named as the student's notebook can show them."""
    count = cell.get("execution_count")
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            output["traceback"] = student_message(output, ran, count)


class ValidatingExecute(Execute):
    """nbgrader's Execute, naming syntax errors and time-outs where the tests show them, and
    giving each failing test a message short enough to read in Validate's dialog."""

    def preprocess(self, nb: NotebookNode, resources: Any = None, km: Any = None) -> Any:
        """Run the notebook, with the earlier problems reported on the tests."""
        self._earlier = EarlierProblems()
        self._ran: dict[int, RanCell] = {}
        return super().preprocess(nb, resources, km)

    def preprocess_cell(self, cell: NotebookNode, resources: Any, index: int) -> Any:
        """Run one cell; report problems of earlier cells on a failing test."""
        cell, resources = super().preprocess_cell(cell, resources, index)
        if cell.cell_type == "code":
            label = cell_label(cell, index)
            if isinstance(cell.get("execution_count"), int):
                students = is_solution(cell) or not is_locked(cell)
                self._ran[cell.execution_count] = RanCell(f"cell {label}", students)
            _name_timeout(cell, label, self.timeout)
            nbgrader = cell.get("metadata", {}).get("nbgrader", {})
            if nbgrader.get("grade") and not nbgrader.get("solution"):
                _shorten_errors(cell, self._ran)
                self._earlier.apply(cell)
            else:
                self._earlier.note(cell, label, self.timeout)
        return cell, resources


def use_validating_execute() -> None:
    """Make nbgrader's Validator (the Validate button too) run :class:`ValidatingExecute`.

    ``Validator.preprocessors`` is not configurable, so ``nbgrader_config.py`` calls this to
    change its default: the same preprocessors, with ``ValidatingExecute`` for ``Execute``.
    """
    from nbgrader.validator import Validator

    trait = Validator.class_traits()["preprocessors"]
    (defaults,) = trait.default_args  # traitlets keeps a List's default in its arguments
    trait.default_args = ([ValidatingExecute if p is Execute else p for p in defaults],)


@dataclass(frozen=True)
class TrustedCell:
    """An instructor's locked code cell, as the gradebook holds it."""

    source: str
    is_test: bool


def trusted_cells(db_url: str, course_id: str, assignment: str, notebook: str) -> dict[str, Any]:
    """``grade_id -> TrustedCell`` for the instructor's locked code cells of a notebook."""
    from nbgrader.api import Gradebook

    with Gradebook(db_url, course_id) as gb:
        nb = gb.find_notebook(notebook, assignment)
        tests = {cell.name for cell in nb.grade_cells}
        solutions = {cell.name for cell in nb.solution_cells}
        return {
            cell.name: TrustedCell(cell.source or "", cell.name in tests)
            for cell in nb.source_cells
            if cell.locked and cell.cell_type == "code" and cell.name not in solutions
        }


@dataclass
class JudgedReport:
    """What grading one notebook found beyond its scores (read by the batch grader): why
    tests did not run as written, where the student's code reaches into the kernel or the
    grader, whether the kernel died, and where the time went (seconds by part)."""

    not_as_written: list[str] = field(default_factory=list)
    reaches_into_grader: list[str] = field(default_factory=list)
    kernel_died: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    def add_time(self, part: str, seconds: float) -> None:
        self.seconds[part] = self.seconds.get(part, 0.0) + seconds


class JudgedExecute(ValidatingExecute):
    """Execute for grading: the student's cells in a kernel of the student's sandbox, the
    tests in a judge. It is made for one notebook with the sandbox of its student
    (:class:`~chainrule.grading.sandbox.StudentSandbox`) and keeps its :attr:`report`."""

    def __init__(self, sandbox: StudentSandbox, notebook: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sandbox = sandbox
        self.notebook_name = notebook
        self.report = JudgedReport()

    def preprocess(self, nb: NotebookNode, resources: Any = None, km: Any = None) -> Any:
        """Grade one notebook: a fresh home, a kernel forked in the sandbox, the judge."""
        info = (resources or {}).get("nbgrader", {})
        self.prepare(
            nb,
            trusted_cells(info["db_url"], self._course_id(), info["assignment"], info["notebook"]),
        )
        self.sandbox.fresh_home(self.notebook_name)
        try:
            return super().preprocess(nb, resources, km)
        finally:
            self.finish()

    def prepare(self, nb: NotebookNode, trusted: dict[str, Any]) -> None:
        """Before the first cell: the instructor's cells (``trusted``, as
        :func:`trusted_cells` gives them), the student's cells and where they reach into the
        grader, and the judge."""
        self._trusted = trusted
        roles = [self._role(cell) for cell in nb.cells]
        student = [
            StudentCell(cell_label(cell, i), cell.source)
            for i, (cell, role) in enumerate(zip(nb.cells, roles, strict=True))
            if cell.cell_type == "code" and role == KERNEL
        ]
        helpers = [c.source for c in self._trusted.values() if not c.is_test]
        protected = set().union(*(bound_names(source) for source in helpers))
        self.report.reaches_into_grader = [
            f.describe()
            for f in reaches_into_grader([(c.label, c.source) for c in student], protected)
        ]
        self._kernel_dead: str | None = None
        self.judge = Judge(self._request, student)

    def finish(self) -> None:
        """After the last cell: what kept tests from running as written goes to the report."""
        self.report.not_as_written += self.judge.failures
        self.report.kernel_died = self._kernel_dead

    def start_new_kernel(self, **kwargs: Any) -> None:
        """Start the kernel (timed)."""
        started = time.monotonic()
        super().start_new_kernel(**kwargs)
        self.report.add_time("kernel start", time.monotonic() - started)

    def start_new_kernel_client(self) -> Any:
        """Connect to the kernel and wait until it answers (timed with the start)."""
        started = time.monotonic()
        client = super().start_new_kernel_client()
        self.report.add_time("kernel start", time.monotonic() - started)
        return client

    def _course_id(self) -> str:
        from nbgrader.coursedir import CourseDirectory

        return CourseDirectory(config=self.config).course_id

    def create_kernel_manager(self) -> Any:
        """The kernel manager of this notebook: its kernel is forked in the student's sandbox."""
        kernel_name = self.kernel_name or self.nb.metadata.get("kernelspec", {}).get("name")
        self.km = SandboxedKernelManager(
            self.sandbox,
            self.notebook_name,
            kernel_name=kernel_name or "python3",
            config=self.config,
        )
        return self.km

    def _trusted_source(self, cell: NotebookNode) -> str | None:
        """The gradebook's source of an instructor's cell (``None`` for the student's cells).

        A cell with the ``grade_id`` of a locked cell always runs as the gradebook has it,
        whatever the notebook says (nbgrader has restored it, or added a deleted one back with
        a comment on top).
        """
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        trusted = self._trusted.get(grade_id) if grade_id else None
        return None if trusted is None else trusted.source

    def _role(self, cell: NotebookNode) -> str:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        trusted = self._trusted.get(grade_id) if grade_id else None
        if cell.cell_type != "code" or trusted is None:
            return KERNEL
        if trusted.is_test or BEGIN_HIDDEN in trusted.source:
            return JUDGE
        return BOTH

    def preprocess_cell(self, cell: NotebookNode, resources: Any, index: int) -> Any:
        """Run one cell where its role says; a test cell's outputs are the judge's verdict."""
        if cell.cell_type != "code":
            return cell, resources
        role, label = self._role(cell), cell_label(cell, index)
        source = self._trusted_source(cell)
        self._current_index = index
        if role in (KERNEL, BOTH):
            started = time.monotonic()
            self._run_in_kernel(cell, index, label, source)
            self.report.add_time("student cells", time.monotonic() - started)
        if role in (JUDGE, BOTH):
            started, before = time.monotonic(), self.report.seconds.get("kernel requests", 0.0)
            starts = self.judge.world_start_seconds
            printed, error = self.judge.run_cell(source or "", label, test=role == JUDGE)
            spent = time.monotonic() - started
            self.report.add_time(
                "judge", spent - (self.report.seconds.get("kernel requests", 0.0) - before)
            )
            # the kernel's requests, less the gloo worlds they started
            starts = self.judge.world_start_seconds - starts
            self.report.add_time("gloo world starts", starts)
            self.report.add_time("kernel requests", -starts)
            if role == JUDGE:
                cell.outputs = self._verdict(printed, error, label)
                cell.execution_count = None
                self._earlier.apply(cell)
            elif error is not None:
                reason = (
                    f"the grader's copy of cell {label} failed: {type(error).__name__}: {error}"
                )
                self.judge.failures.append(reason[:500])
        if role == KERNEL:
            _name_timeout(cell, label, self.timeout)
            self._earlier.note(cell, label, self.timeout)
        return cell, self.resources

    def _run_in_kernel(
        self, cell: NotebookNode, index: int, label: str, source: str | None
    ) -> None:
        """Run a cell in the kernel (an instructor's cell as the gradebook has it)."""
        if self._kernel_dead:
            cell.outputs = [self._dead_kernel_output()]
            return
        shown = cell.source
        if source is not None:
            cell.source = source
        try:
            self.execute_cell(cell, index, store_history=True)
        except DeadKernelError:
            self._kernel_dead = f"the kernel died while running cell {label}"
            cell.outputs = [self._dead_kernel_output()]
            return
        finally:
            cell.source = shown
        if isinstance(cell.get("execution_count"), int):
            self.judge.cell_labels[cell.execution_count] = label

    def _dead_kernel_output(self) -> NotebookNode:
        text = self._kernel_dead or "the kernel died"
        return _error_output("DeadKernelError", text, [f"DeadKernelError: {text}"])

    def _request(self, code: str) -> list[dict[str, Any]]:
        """The judge's transport: run one line in the kernel, return its outputs."""
        if self._kernel_dead:
            raise GraderCallFailed(self._kernel_dead)
        request = NotebookNode(cell_type="code", source=code, metadata={}, outputs=[])
        request.execution_count = None
        index = self._current_index
        cell = self.nb.cells[index]
        started = time.monotonic()
        try:
            self.execute_cell(request, index, store_history=False)
        except DeadKernelError:
            self._kernel_dead = "the kernel died while the tests ran the student's code"
            raise GraderCallFailed(self._kernel_dead) from None
        finally:
            self.nb.cells[index] = cell  # nbclient stores the cell it ran at that index
            self.report.add_time("kernel requests", time.monotonic() - started)
        return [dict(output) for output in request.outputs]

    def _verdict(self, printed: str, error: BaseException | None, label: str) -> list[NotebookNode]:
        """A test cell's outputs: what the judge printed, and its error if the test failed."""
        outputs = []
        if printed:
            outputs.append(NotebookNode(output_type="stream", name="stdout", text=printed))
        if error is None:
            return outputs
        if isinstance(error, StudentCodeError):
            on_rank = f" on rank {error.rank}" if error.rank is not None else ""
            lines = [f"{error.type_name}: {error.message}"]
            if error.where:
                lines += [f"raised by your code{on_rank}:", error.where]
            outputs.append(_error_output(error.type_name, error.message, lines))
        elif isinstance(error, StudentTimeout):
            text = f"your code ran past its {self.timeout} s time limit in test cell {label}"
            outputs.append(_error_output(TIMEOUT_ERROR, text, [f"{TIMEOUT_ERROR}: {text}"]))
        elif isinstance(error, GraderCallFailed):
            text = f"this test did not run as written: {error}"
            outputs.append(_error_output("GraderError", text, [f"GraderError: {text}"]))
        elif isinstance(error, AssertionError | NameError):
            name = type(error).__name__
            outputs.append(_error_output(name, str(error), [f"{name}: {error}"]))
        else:
            name = type(error).__name__
            text = f"the test could not use what your code gave it: {error}"
            outputs.append(_error_output(name, text, [f"{name}: {text}"]))
        return outputs
