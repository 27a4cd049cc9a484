"""Validate a notebook from the command line, with an exit status that says whether it passed.

``nbgrader validate`` prints "VALIDATION FAILED" and still exits 0 (nbgrader #1908), which makes
it useless in a script or a CI job. :func:`validate_notebook` runs nbgrader's own ``Validator``
with the course's configuration, prints nbgrader's report, and returns 0 when every test passed
and 1 when a test failed, a locked cell was changed or a cell changed type.

:func:`student_message` writes what a failing test says in Validate's dialog (JupyterLab's
Validate button and this command alike): the test's own message first, each line wrapped to
fit the dialog, then the lines of the student's own cells that raised it and the line of the
test that failed. IPython's traceback would put the message last, after frames of the course's
helper cells and library files the student never wrote, and name cells ``In[7]`` after the
validating kernel's run, which the student's notebook does not show; here a cell is named by
its nbgrader id (``'mean_allreduce_scale'``) or its position (``cell 9``).
"""

from __future__ import annotations

import itertools
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from traitlets.config import Config

from chainrule.grading.config import CONFIG_FILENAME, load_config

if TYPE_CHECKING:
    from chainrule.grading.sandbox import StudentSandbox

_VALIDATED = itertools.count()  # notebooks validated in a sandbox by this process

#: Characters per line of a message a student reads: nbgrader's printed report (this command)
#: indents it by 4 and cuts every line past 87 characters, and JupyterLab's Validate dialog,
#: whose ``<pre>`` does not wrap, cuts lines a little longer than that at 1400 px wide.
MESSAGE_WIDTH = 80

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: The head of a traceback frame: a cell's (``Cell In[4], line 2``) or a file's.
_FRAME = re.compile(
    r"^(?:Cell In\[(?P<count>\d+)\], line (?P<line>\d+)|File (?P<file>.+?):(?P<fline>\d+))"
    r"(?:, in (?P<function>[^\n(]+))?"
)
#: The line a frame stopped at: ``----> 2 code`` (or ``--> 375 code``).
_ARROW = re.compile(r"^\s*-+>\s*\d+\s?(?P<code>.*)$")
#: A place in the message of ``chainrule.course.checks.ErrorInYourCode``:
#: ``  in cell In[2], line 4, in f: code`` or ``  in <file>, line 9, in g: code``.
_PLACE = re.compile(
    r"^\s*in (?:cell In\[(?P<count>\d+)\]|(?P<file>.+?)), line (?P<line>\d+), (?P<rest>in .*)$"
)
_IN_CELL = re.compile(r"\b(?:cell )?In\[(\d+)\]")


@dataclass(frozen=True)
class RanCell:
    """A cell the validating kernel ran, as messages name it."""

    label: str  # 'grade_id' in quotes, else "cell <position>"
    students: bool  # a solution cell or one the student added, not the instructor's


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour codes."""
    return _ANSI.sub("", text)


def _wrap(line: str, width: int) -> list[str]:
    """One message line as lines of at most ``width`` characters (continuations indented; an
    ``expected ..., received ...`` line is split before each of the two)."""
    if len(line) <= width:
        return [line]
    parts = [line]
    if ": expected " in line and ", received " in line:
        head, _, rest = line.partition(": expected ")
        expected, _, received = rest.partition(", received ")
        parts = [f"{head}:", f"  expected {expected},", f"  received {received}"]
    lines: list[str] = []
    for part in parts:
        indent = " " * (len(part) - len(part.lstrip()) + 4)
        lines += textwrap.wrap(part, width, subsequent_indent=indent, break_on_hyphens=False) or [
            part
        ]
    return lines


def _frames(traceback: list[str]) -> list[dict[str, str]]:
    """The frames of an IPython traceback, first to last: where (cell count or file), line,
    function and the code it stopped at."""
    frames = []
    for entry in traceback:
        text = strip_ansi(entry)
        head = _FRAME.match(text)
        if head is None:
            continue
        code = next((m.group("code") for m in map(_ARROW.match, text.split("\n")) if m), "")
        frames.append(
            {
                "count": head.group("count") or "",
                "file": head.group("file") or "",
                "line": head.group("line") or head.group("fline") or "",
                "function": (head.group("function") or "").strip(),
                "code": code.strip(),
            }
        )
    return frames


def _own_file(path: str) -> bool:
    """Whether a file is the student's: under the notebook's folder (the working folder while
    nbgrader validates), not a package of the environment."""
    try:
        resolved = Path(path).resolve()
    except (OSError, ValueError):
        return False
    here = Path.cwd().resolve()
    return resolved.is_relative_to(here) and "site-packages" not in resolved.parts


def student_message(
    output: dict[str, Any],
    cells: dict[int, RanCell],
    test_count: int | None,
    width: int = MESSAGE_WIDTH,
) -> list[str]:
    """The lines a student reads for a failing test cell's ``error`` output.

    ``cells`` maps the validating kernel's execution counts to the cells they ran;
    ``test_count`` is the failing test cell's own count. The message comes first (places in
    the instructor's cells and the library left out, the student's cells named by
    :class:`RanCell`), then each frame of the student's own code, then the test's line.
    """

    def name(count: str) -> str | None:
        cell = cells.get(int(count))
        return None if cell is None else cell.label

    message_lines = []
    text = f"{output.get('ename', 'Error')}: {strip_ansi(str(output.get('evalue', '')))}"
    for line in text.rstrip().split("\n"):
        place = _PLACE.match(line)
        if place is not None:
            count, file = place.group("count"), place.group("file")
            cell = cells.get(int(count)) if count else None
            if cell is not None and cell.students:
                where = cell.label
            elif file is not None and _own_file(file):
                where = file
            else:
                continue  # the instructor's helper cell or the library: not the student's code
            line = f"  in {where}, line {place.group('line')}, {place.group('rest')}"
        else:
            line = _IN_CELL.sub(lambda m: name(m.group(1)) or "a cell", line)
        message_lines += _wrap(line.rstrip(), width)
    raised: list[str] = []
    test_line = ""
    for frame in _frames(list(output.get("traceback", []))):
        count = int(frame["count"]) if frame["count"] else None
        if count is not None and count == test_count:
            test_line = f"line {frame['line']} of this test: {frame['code']}"
            continue
        cell = cells.get(count) if count is not None else None
        if cell is not None and cell.students:
            where = cell.label
        elif count is None and _own_file(frame["file"]):
            where = frame["file"]
        else:
            continue
        function = f", in {frame['function']}" if frame["function"] else ""
        raised += _wrap(f"  {where}, line {frame['line']}{function}: {frame['code']}", width)
    lines = message_lines
    if raised:
        lines += ["raised by your code in", *raised]
    if test_line:
        lines += _wrap(test_line, width)
    return lines


def find_course_root(notebook: Path, start: Path | None = None) -> Path:
    """The folder whose ``nbgrader_config.py`` applies: the working folder's, else the nearest
    one above the notebook, else the working folder."""
    cwd = (start or Path.cwd()).resolve()
    if (cwd / CONFIG_FILENAME).exists():
        return cwd
    for folder in notebook.resolve().parents:
        if (folder / CONFIG_FILENAME).exists():
            return folder
    return cwd


def validation_results(
    notebook: Path, config: Config, stream: TextIO
) -> tuple[dict[str, Any], bool]:
    """nbgrader's ``Validator.validate_and_print`` for one notebook: its results, and whether
    the validator was inverted (complaining about passing cells)."""
    from nbgrader.validator import Validator

    from chainrule.grading.execute import use_validating_execute

    use_validating_execute()

    class RecordingValidator(Validator):
        """The stock validator, keeping the results it prints."""

        results: dict[str, Any] = {}

        def validate(self, filename: str) -> dict[str, Any]:
            self.results = super().validate(filename)
            return self.results

    validator = RecordingValidator(config=config)
    validator.stream = stream
    validator.validate_and_print(str(notebook))
    return validator.results, bool(validator.invert)


def passed(results: dict[str, Any], invert: bool = False) -> bool:
    """Whether results mean success (with ``invert``, success means no test passed)."""
    if results.get("type_changed") or results.get("changed"):
        return False
    if invert:
        return not results.get("passed")
    return not results.get("failed")


def validate_notebook(
    notebook: str | Path,
    course_root: str | Path | None = None,
    overrides: list[str] | None = None,
    stream: TextIO | None = None,
    sandbox: StudentSandbox | None = None,
) -> int:
    """Validate ``notebook``, print nbgrader's report; 0 if it passed, 1 if not, 2 if missing.

    ``sandbox``: a started :class:`~chainrule.grading.sandbox.StudentSandbox` whose zygote forks
    the kernel (warm: numpy, torch and the course library already imported), instead of a new
    kernel process; for validating many notebooks in a row. It is reset afterwards.
    """
    stream = stream or sys.stdout
    path = Path(notebook)
    if not path.is_file():
        print(f"no such notebook: {path}", file=stream)
        return 2
    root = Path(course_root) if course_root else find_course_root(path)
    config = load_config(root, overrides=overrides or [])
    if sandbox is not None:
        from chainrule.grading.sandbox import SandboxedKernelManager

        # a short home name, whatever the notebook's: the kernel's sockets are under it
        forked = SandboxedKernelManager.forking_in(sandbox, f"validate-{next(_VALIDATED)}")
        config.ValidatingExecute.kernel_manager_class = forked
    try:
        results, invert = validation_results(path, config, stream)
    finally:
        if sandbox is not None:
            sandbox.reset()
    ok = passed(results, invert)
    stream.flush()
    return 0 if ok else 1
