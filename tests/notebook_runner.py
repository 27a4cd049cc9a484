"""Run a lesson notebook headless, the way a student's "Run All" would, and read values back.

``execute(path, fetch=["table", "weights"])`` executes every cell in a fresh kernel whose home
is a fresh copy of the notebook's folder, fails on the first error output, then evaluates each
name in ``fetch`` in that kernel and returns the values (anything JSON can carry; numpy arrays
become lists).

The kernel is an ipykernel forked by a zygote of this process (the grader's
:class:`chainrule.grading.sandbox.StudentSandbox`, without the sandbox), which imported numpy,
torch and the course library once, and the launchers of the worker pools a lesson starts are
forked there too: each lesson then costs its own code, not an interpreter's start and an
import of torch for its kernel and another for its pool (``test_grading_validate`` checks that
such kernels give the verdicts of fresh ones, and the browser tests run every lesson in a
fresh kernel of JupyterLab's). When the notebook has run, every process the zygote forked for
it is ended, the kernel and its pools included; the zygote ends with this process.
"""

from __future__ import annotations

import atexit
import itertools
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import nbformat
from chainrule.grading.sandbox import SandboxedKernelManager, StudentSandbox
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
COURSE = REPO / "course"


def lesson_notebooks() -> list[Path]:
    """The start page and the lessons, in order: ``course/NN_name.ipynb``."""
    return sorted(COURSE.glob("[0-9][0-9]_*.ipynb"))


def lesson(number: int) -> Path:
    """The lesson numbered ``number`` (0 is the start page)."""
    (path,) = COURSE.glob(f"{number:02d}_*.ipynb")
    return path


_FETCH_PREFIX = "__chainrule_fetch__="

_FETCH_CODE = """
import json as _json
def _to_jsonable(value):
    import numpy as _np
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): _to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_jsonable(v) for v in value]
    if isinstance(value, (_np.floating, _np.integer)):
        return value.item()
    return value
print(%r + _json.dumps({name: _to_jsonable(eval(name)) for name in %r}))
"""


def error_outputs(nb: nbformat.NotebookNode) -> list[str]:
    """Every error output of an executed notebook, as 'cell N: Name: message'."""
    errors = []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                errors.append(f"cell {index}: {output['ename']}: {output['evalue']}")
    return errors


_ZYGOTE: list[StudentSandbox] = []  # this process's, once started
_RUNS = itertools.count()


def warm_kernels() -> StudentSandbox:
    """The zygote that forks this process's lesson kernels, started on first use (unconfined:
    no sandbox, no limits) and stopped when the process ends. Python's hash seed is fixed, as
    in every kernel of these tests."""
    if not _ZYGOTE:
        base = Path(tempfile.mkdtemp(prefix="lessons-"))
        (base / "files").mkdir()
        seed = {"PYTHONHASHSEED": "0"}
        zygote = StudentSandbox(base / "zygote", base / "files", None, False, environment=seed)
        zygote.start(log=None)
        atexit.register(shutil.rmtree, base, ignore_errors=True)
        atexit.register(zygote.stop)  # registered last, run first
        _ZYGOTE.append(zygote)
    return _ZYGOTE[0]


def execute(
    path: str | Path, fetch: list[str] | tuple[str, ...] = (), timeout: int = 120
) -> tuple[nbformat.NotebookNode, dict[str, Any]]:
    """Execute the notebook at ``path``; return it with outputs and the fetched values."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    if fetch:
        code = _FETCH_CODE % (_FETCH_PREFIX, list(fetch))
        nb.cells.append(nbformat.v4.new_code_cell(code))
    zygote = warm_kernels()
    zygote.files = path.parent  # the kernel's home: a fresh copy of the notebook's folder
    name = f"run-{next(_RUNS)}"
    forked = SandboxedKernelManager.forking_in(zygote, name)
    client = NotebookClient(nb, km=forked(kernel_name="python3"), timeout=timeout)
    try:
        client.execute(cleanup_kc=True)
    finally:  # the kernel, the pools it started, anything its code left running; its files
        zygote.reset()
        for folder in (zygote.homes / name, zygote.sockets / name):
            shutil.rmtree(folder, ignore_errors=True)
    values: dict[str, Any] = {}
    if fetch:
        for output in nb.cells[-1].get("outputs", []):
            text = output.get("text", "")
            if output.get("output_type") == "stream" and _FETCH_PREFIX in text:
                line = next(x for x in text.splitlines() if x.startswith(_FETCH_PREFIX))
                values = json.loads(line[len(_FETCH_PREFIX) :])
        nb.cells.pop()
    return nb, values


def run_lesson(
    path: str | Path, fetch: list[str] | tuple[str, ...] = ()
) -> tuple[nbformat.NotebookNode, dict[str, Any]]:
    """Execute a lesson like a student's Run All and require that no cell ends in an error."""
    nb, values = execute(path, fetch=fetch)
    errors = error_outputs(nb)
    assert errors == [], f"{Path(path).name} has error outputs: {errors}"
    return nb, values


def output_texts(nb: nbformat.NotebookNode, mime: str) -> list[str]:
    """Every output of an executed notebook with this MIME type (``text/plain`` includes
    printed streams), in cell order."""
    texts = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if mime in data:
                texts.append(data[mime])
            elif mime == "text/plain" and output.get("output_type") == "stream":
                texts.append(output["text"])
    return texts


def markdown_text(path: str | Path) -> str:
    """The prose of a notebook: its markdown cells joined."""
    nb = nbformat.read(path, as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def readability_fetch(drawing_names: list[str]) -> list[str]:
    """Fetch expressions for graph drawings of a lesson (:class:`chainrule.graph.GraphDrawing`):
    the smallest text on the page, in pixels, and the edges that pass through a box."""
    return [
        f"[{name}.smallest_text_px(), {name}.layout.edges_through_boxes()]"
        for name in drawing_names
    ]


def assert_readable(values: dict[str, Any], drawing_names: list[str], min_px: float = 9.0) -> None:
    """Every drawing's text is at least ``min_px`` on the page and no edge crosses a box."""
    for name, expression in zip(drawing_names, readability_fetch(drawing_names), strict=True):
        smallest, crossings = values[expression]
        assert smallest >= min_px, f"{name}: text of {smallest:.1f} px on the page"
        assert crossings == [], f"{name}: edges through boxes {crossings}"
