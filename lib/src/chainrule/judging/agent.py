"""The grader's agent in a student's kernel: look a name up, call it, run the grader's helper.

At grading time the test cells do not run in the student's kernel (:mod:`chainrule.judging`).
Whenever the grader needs something of the student's, it executes one line in the kernel::

    __import__("chainrule.judging.agent").judging.agent.serve("<request>")

The request is a base64 cloudpickle of ``(nonce, operation, ...)``:

- ``("describe", path)``: what ``path`` (a name of the notebook, or ``name.attribute...``) is:
  missing, a callable, a plain value (sent back), or another object;
- ``("call", path, args, kwargs)``: the result of calling it;
- ``("run", function, args, kwargs)``: the result of a grader's helper (a function marked
  :func:`chainrule.course.checks.in_student_kernel`), run here with the notebook's names in reach.

The answer is one ``display_data`` output of type :data:`REPLY_MIME`: ``{"nonce", "ok": true,
"value"}`` with the value encoded by :mod:`chainrule.judging.wire`, or ``{"nonce", "ok": false,
"error"}`` describing the exception and the frames of the notebook's cells it went through; both
with ``"world_start_seconds"``, the time the request spent starting gloo worlds (for the
grader's account of where the time goes, never for a grade).

Nothing here is trusted by the grader. The student's code can change this module, or answer
in its place; it can only ever make the kernel answer with values, and the grader alone
decides what those values are worth.
"""

from __future__ import annotations

import base64
import linecache
import re
import sys
import traceback
import types
from typing import Any

import cloudpickle

from chainrule.judging.wire import encode

REPLY_MIME = "application/vnd.chainrule.judge-reply+json"
MAX_FRAMES = 12


def _shell() -> Any:
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("the grader's agent runs inside an IPython kernel")
    return shell


def _namespace() -> dict[str, Any]:
    return _shell().user_ns


def resolve(path: str) -> Any:
    """The object ``path`` names in the notebook: a name, then attributes (``Copy.apply``)."""
    first, *attributes = path.split(".")
    namespace = _namespace()
    if first not in namespace:
        raise NameError(f"name {first!r} is not defined")
    value = namespace[first]
    for attribute in attributes:
        value = getattr(value, attribute)
    return value


def lookup(path: str) -> Any:
    """What a grader's reference to a notebook name becomes when it arrives here."""
    return resolve(path)


def _is_plain(value: Any) -> bool:
    """Whether ``value`` crosses as a value (not as an opaque object)."""
    return not _contains_opaque(encode(value))


def _contains_opaque(node: Any) -> bool:
    if isinstance(node, dict):
        if node.get("t") == "opaque":
            return True
        return any(_contains_opaque(v) for v in node.values() if isinstance(v, list | dict))
    if isinstance(node, list):
        return any(_contains_opaque(item) for item in node)
    return False


def describe(path: str) -> dict[str, Any]:
    """``{"kind": "missing" | "callable" | "value" | "object", "type": ..., "value": ...}``."""
    try:
        value = resolve(path)
    except (NameError, AttributeError):
        return {"kind": "missing"}
    type_name = type(value).__name__
    if isinstance(value, types.ModuleType):
        return {"kind": "object", "type": "module"}
    if callable(value) and not _is_plain(value):
        return {"kind": "callable", "type": type_name}
    if _is_plain(value):
        return {"kind": "value", "type": type_name, "value": value}
    return {"kind": "object", "type": type_name}


def _with_notebook_names(function: Any) -> Any:
    """``function`` whose globals also reach the notebook's names (the grader's names first).

    cloudpickle gives every function of one request the same fresh globals dict, holding the
    grader's names the functions use; the notebook's names fill in the rest.
    """
    if isinstance(function, types.FunctionType):
        for name, value in _namespace().items():
            function.__globals__.setdefault(name, value)
    return function


#: A frame of a formatted traceback: ``File "...", line N, in name`` and the code below it.
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>.+)$')


def _cell_map() -> dict[str, int]:
    """Notebook cell file names → execution counts (empty outside IPython)."""
    try:
        return dict(getattr(_shell().compile, "_filename_map", {}))
    except RuntimeError:
        return {}


def _frame(file: str, line: int | None, name: str, code: str, cells: dict[str, int]) -> dict:
    in_cell = file in cells
    if not code:
        code = linecache.getline(file, line or 0).strip()
    return {
        "execution_count": cells.get(file),
        "file": "" if in_cell else file,
        "line": line,
        "function": name,
        "code": code[:300],
    }


def _cell_frames(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The frames that ran in notebook cells, and the last frame (the one that raised)."""
    chosen = [f for i, f in enumerate(frames) if f["execution_count"] or i == len(frames) - 1]
    return chosen[-MAX_FRAMES:]


def _frames_of_text(text: str, cells: dict[str, int]) -> list[dict[str, Any]]:
    """The frames of a traceback formatted on another rank (a RankError's text)."""
    frames = []
    lines = text.splitlines()
    for index, line in enumerate(lines):
        match = _FRAME.match(line)
        if match:
            following = lines[index + 1].strip() if index + 1 < len(lines) else ""
            code = "" if _FRAME.match(following) else following
            frames.append(_frame(match["file"], int(match["line"]), match["name"], code, cells))
    return frames


def describe_exception(error: BaseException) -> dict[str, Any]:
    """The student's exception as data: type, message, rank, and the frames in their cells.

    An exception raised on a rank of ``dist.run`` arrives as a ``RankError`` carrying the
    rank's own exception type, message and traceback text: those are reported instead.
    """
    cells = _cell_map()
    rank = getattr(error, "rank", None)
    if type(error).__name__ == "RankError" and hasattr(error, "traceback_text"):
        type_name = str(getattr(error, "exc_type", "Exception"))
        message = str(getattr(error, "original_message", ""))
        frames = _frames_of_text(str(error.traceback_text), cells)
    else:
        type_name = type(error).__name__
        try:
            message = str(error)
        except Exception:
            message = "(the exception's message could not be read)"
        frames = [
            _frame(f.filename, f.lineno, f.name, f.line or "", cells)
            for f in traceback.extract_tb(error.__traceback__)
        ]
    return {
        "type": type_name[:100],
        "message": message[:4000],
        "rank": rank if isinstance(rank, int) else None,
        "frames": _cell_frames(frames),
    }


def _perform(operation: tuple[Any, ...]) -> Any:
    kind = operation[0]
    if kind == "describe":
        return describe(operation[1])
    if kind == "call":
        _, path, args, kwargs = operation
        return resolve(path)(*args, **kwargs)
    if kind == "run":
        _, function, args, kwargs = operation
        return _with_notebook_names(function)(*args, **kwargs)
    raise ValueError(f"unknown request {kind!r}")


def serve(request: str) -> None:
    """Answer one request of the grader with one display output (see the module docstring)."""
    from IPython.display import display

    nonce, operation = cloudpickle.loads(base64.b64decode(request))
    starting = _world_start_seconds()
    try:
        value = _perform(operation)
        reply = {"nonce": nonce, "ok": True, "value": encode(value)}
    except BaseException as error:  # the student's exception, reported as data
        reply = {"nonce": nonce, "ok": False, "error": describe_exception(error)}
    reply["world_start_seconds"] = _world_start_seconds() - starting
    display({REPLY_MIME: reply}, raw=True)


def _world_start_seconds() -> float:
    """Seconds this kernel has spent starting gloo worlds (0 before the first: the pools'
    module is not imported for the asking)."""
    pool = sys.modules.get("chainrule.dist.pool")
    return float(pool.start_seconds()) if pool is not None else 0.0
