"""A hint for the most common notebook error: a name that was defined, but in a lost kernel.

When a kernel restarts (or a student opens a notebook and runs a cell in the middle), every
variable is gone and the next cell fails with ``NameError: name 'model' is not defined``.
The error is right but unhelpful: the name *is* defined, a few cells up. This IPython
extension reads the notebook file, finds the code cell that defines the missing name (an
assignment, ``def``, ``class``, ``import``, ``for`` or ``with`` target) and prints, above
the usual traceback::

    `model` is defined in cell 4 (section 'Set-up'): model = MLP(...)
    The kernel has probably restarted (or that cell has not run yet): run the cells above
    this one (Run ▸ Run All Above Selected Cell), then this cell again.

Load it with ``%load_ext chainrule.course.restart_hint``, or for every kernel of an environment with
``c.InteractiveShellApp.extensions = ["chainrule.course.restart_hint"]`` in
``<sys.prefix>/etc/ipython/ipython_kernel_config.py``.

The notebook is the file named by ``JPY_SESSION_NAME``, which jupyter_server sets for the
kernels it starts (ipykernel also copies it to ``__session__``; VS Code sets
``__vsc_ipynb_file__``). Without a readable notebook the extension stays silent and only the
original error is shown. The failing cell is located by the cell id the front end sends
with each execution, or else by its source text, so the hint can say "above" or "below".
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chainrule.judging.cells import bound_names

SESSION_ENV_VAR = "JPY_SESSION_NAME"
_NAMESPACE_PATH_KEYS = ("__session__", "__vsc_ipynb_file__")
_NAME_ERROR_MESSAGE = re.compile(r"name '([^']+)' is not defined")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$")


@dataclass(frozen=True)
class NotebookCell:
    """One cell of a notebook file: its 0-based position, id, type and source text."""

    index: int
    cell_id: str | None
    cell_type: str
    source: str


@dataclass(frozen=True)
class Definition:
    """Where a name is defined: the cell (1-based, counting every cell from the top), the
    kind of statement, the section heading above the cell and the cell's first code line."""

    name: str
    cell_number: int
    kind: str
    section: str | None
    first_line: str


# -- reading the notebook ---------------------------------------------------------------------


def read_cells(path: str | os.PathLike[str]) -> list[NotebookCell]:
    """The cells of the ``.ipynb`` file at ``path`` (nbformat 4 JSON), in order."""
    with open(path, encoding="utf-8") as handle:
        notebook = json.load(handle)
    cells = []
    for index, cell in enumerate(notebook.get("cells", [])):
        source = cell.get("source", "")
        if isinstance(source, list):
            source = "".join(source)
        cells.append(NotebookCell(index, cell.get("id"), cell.get("cell_type", ""), source))
    return cells


def notebook_path(
    environ: Mapping[str, str] | None = None,
    user_ns: Mapping[str, Any] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Path | None:
    """The notebook file this kernel belongs to, or ``None`` if it cannot be found.

    Tried in order: ``$JPY_SESSION_NAME`` (an absolute path from jupyter_server, or a path
    relative to the server root), then ``__session__`` / ``__vsc_ipynb_file__`` in the user
    namespace. A relative path is looked up as given and by its file name in ``cwd`` (the
    kernel starts in the notebook's folder).
    """
    environ = os.environ if environ is None else environ
    user_ns = {} if user_ns is None else user_ns
    here = Path.cwd() if cwd is None else Path(cwd)
    candidates = [environ.get(SESSION_ENV_VAR)]
    candidates += [user_ns.get(key) for key in _NAMESPACE_PATH_KEYS]
    for candidate in candidates:
        if not isinstance(candidate, str) or not candidate.endswith(".ipynb"):
            continue
        path = Path(candidate)
        options = [path] if path.is_absolute() else [here / path, here / path.name]
        for option in options:
            if option.is_file():
                return option
    return None


# -- which names a cell defines ---------------------------------------------------------------


def names_defined(source: str) -> dict[str, str]:
    """The names a code cell binds at top level, each with its kind of statement (read as
    IPython runs the cell: :func:`chainrule.judging.cells.bound_names`)."""
    return bound_names(source)


# -- locating the definition ------------------------------------------------------------------


def section_of(cells: list[NotebookCell], index: int) -> str | None:
    """The last markdown heading above cell ``index`` (without the ``#`` marks)."""
    for cell in reversed(cells[:index]):
        if cell.cell_type != "markdown":
            continue
        headings = [m.group(1) for m in map(_HEADING.match, cell.source.splitlines()) if m]
        if headings:
            return headings[-1]
    return None


def locate_cell(
    cells: list[NotebookCell], cell_id: str | None = None, source: str | None = None
) -> int | None:
    """The position of the cell being run: by its id, else by identical (stripped) source."""
    if cell_id:
        for cell in cells:
            if cell.cell_id == cell_id:
                return cell.index
    if source is not None and source.strip():
        matches = [
            c.index for c in cells if c.cell_type == "code" and c.source.strip() == source.strip()
        ]
        if len(matches) == 1:
            return matches[0]
    return None


def _first_code_line(source: str) -> str:
    for line in source.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith(("#", "%", "!")):
            return stripped if len(stripped) <= 60 else stripped[:57] + "..."
    return ""


def find_definitions(cells: list[NotebookCell], name: str) -> list[Definition]:
    """Every code cell that binds ``name`` at top level, in notebook order."""
    found = []
    for cell in cells:
        if cell.cell_type != "code":
            continue
        kind = names_defined(cell.source).get(name)
        if kind is not None:
            found.append(
                Definition(
                    name=name,
                    cell_number=cell.index + 1,
                    kind=kind,
                    section=section_of(cells, cell.index),
                    first_line=_first_code_line(cell.source),
                )
            )
    return found


def _describe(definition: Definition) -> str:
    where = f"cell {definition.cell_number}"
    if definition.section:
        where += f" (section '{definition.section}')"
    if definition.first_line:
        where += f": {definition.first_line}"
    return where


def restart_hint(
    cells: list[NotebookCell],
    name: str,
    cell_id: str | None = None,
    source: str | None = None,
) -> str | None:
    """The message for a ``NameError`` on ``name`` raised by the cell ``cell_id``/``source``.

    - defined in a cell above the failing one (the nearest such cell is named): the kernel
      has probably restarted, so run the cells above;
    - defined only below it: run that cell first;
    - failing cell not found in the file (edited since the last save): name the first
      definition and say to run the cells from the top;
    - defined nowhere, or only in the failing cell itself: ``None`` (a plain typo).
    """
    definitions = find_definitions(cells, name)
    current = locate_cell(cells, cell_id=cell_id, source=source)
    if current is not None:
        definitions = [d for d in definitions if d.cell_number != current + 1]
    if not definitions:
        return None
    if current is None:
        return (
            f"`{name}` is defined in {_describe(definitions[0])}.\n"
            "If the kernel has restarted, run the cells from the top down to this one "
            "(Run ▸ Run All Above Selected Cell), then this cell again."
        )
    above = [d for d in definitions if d.cell_number <= current]
    if above:
        return (
            f"`{name}` is defined in {_describe(above[-1])}.\n"
            "The kernel has probably restarted (or that cell has not run yet): run the cells "
            "above this one (Run ▸ Run All Above Selected Cell), then this cell again."
        )
    return (
        f"`{name}` is defined further down, in {_describe(definitions[0])}.\n"
        "Run that cell first (or move this cell below it), then this cell again."
    )


def missing_name(error: BaseException) -> str | None:
    """The undefined name of a ``NameError`` (not of an ``UnboundLocalError``)."""
    if not isinstance(error, NameError) or isinstance(error, UnboundLocalError):
        return None
    name = getattr(error, "name", None)
    if name:
        return name
    match = _NAME_ERROR_MESSAGE.search(str(error))
    return match.group(1) if match else None


# -- the IPython extension --------------------------------------------------------------------


class _RestartHint:
    """Remembers the cell being run (``pre_run_cell``) and prints the hint on a NameError."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.cell_id: str | None = None
        self.raw_cell: str | None = None

    def pre_run_cell(self, info: Any) -> None:
        self.cell_id = getattr(info, "cell_id", None)
        self.raw_cell = getattr(info, "raw_cell", None)

    def message(self, error: BaseException) -> str | None:
        name = missing_name(error)
        path = notebook_path(user_ns=self.shell.user_ns)
        if name is None or path is None:
            return None
        cells = read_cells(path)
        return restart_hint(cells, name, cell_id=self.cell_id, source=self.raw_cell)

    def handle(
        self, shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: Any = None
    ) -> None:
        try:
            hint = self.message(value)
        except Exception:  # never let the hint hide the real error
            hint = None
        if hint:
            print(hint, file=sys.stdout, flush=True)
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset, running_compiled_code=True)


_ACTIVE: dict[int, _RestartHint] = {}


def load_ipython_extension(ipython: Any) -> None:
    """Register the NameError hint on this IPython shell
    (``%load_ext chainrule.course.restart_hint``)."""
    unload_ipython_extension(ipython)
    hint = _RestartHint(ipython)
    _ACTIVE[id(ipython)] = hint
    ipython.events.register("pre_run_cell", hint.pre_run_cell)
    ipython.set_custom_exc((NameError,), hint.handle)


def unload_ipython_extension(ipython: Any) -> None:
    """Remove the hint and restore IPython's usual NameError display."""
    hint = _ACTIVE.pop(id(ipython), None)
    if hint is None:
        return
    ipython.events.unregister("pre_run_cell", hint.pre_run_cell)
    ipython.set_custom_exc((), None)
