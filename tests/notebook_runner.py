"""Run a lesson notebook headless, the way a student's "Run All" would, and read values back.

``execute(path, fetch=["table", "weights"])`` executes every cell in a fresh kernel started in
the notebook's folder, fails on the first error output, then evaluates each name in ``fetch``
in that kernel and returns the values (anything JSON can carry; numpy arrays become lists).
The kernel is stopped before it returns (at once: an orderly exit would spend about a second
of CPU tearing down what the lesson imported), and the worker pools it started end with it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import nbformat
from jupyter_client.manager import AsyncKernelManager
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


def execute(
    path: str | Path, fetch: list[str] | tuple[str, ...] = (), timeout: int = 120
) -> tuple[nbformat.NotebookNode, dict[str, Any]]:
    """Execute the notebook at ``path``; return it with outputs and the fetched values."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    if fetch:
        code = _FETCH_CODE % (_FETCH_PREFIX, list(fetch))
        nb.cells.append(nbformat.v4.new_code_cell(code))
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONHASHSEED="0")
    # The kernel talks over Unix sockets: a TCP port that jupyter_client found free can be
    # taken by another process (a gloo store, another kernel) before the kernel binds it.
    with tempfile.TemporaryDirectory(prefix="kernel-") as sockets:
        manager = AsyncKernelManager(
            kernel_name="python3",
            transport="ipc",
            connection_file=str(Path(sockets) / "kernel.json"),
            ip=str(Path(sockets) / "kernel"),
        )
        client = NotebookClient(
            nb,
            km=manager,
            timeout=timeout,
            resources={"metadata": {"path": str(path.parent)}},
            shutdown_kernel="immediate",
        )
        # nbclient shuts down only kernels it started itself, not one given as ``km``.
        client.execute(env=env, cleanup_kc=True)
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
