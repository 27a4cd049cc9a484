"""The grader's agent in a student's kernel: look a name up, call it, run the grader's helper.

At grading time the test cells do not run in the student's kernel (:mod:`chainrule.judging`).
Whenever the grader needs something of the student's, it executes one line in the kernel::

    __import__("chainrule.judging.agent").judging.agent.serve("<request>")

The request is a base64 cloudpickle of ``(nonce, operation, ...)``:

- ``("describe", path)``: what ``path`` (a name of the notebook, or ``name.attribute...``) is:
  missing, a callable, a plain value (sent back), or another object;
- ``("call", path, args, kwargs)``: the result of calling it;
- ``("run", function, args, kwargs)``: the result of a grader's helper (a function marked
  :func:`chainrule.checks.in_student_kernel`), run here with the notebook's names in reach.

The answer is one ``display_data`` output of type :data:`REPLY_MIME`: ``{"nonce", "ok": true,
"value"}`` with the value encoded by :mod:`chainrule.judging.wire`, or ``{"nonce", "ok": false,
"error"}`` describing the exception and the frames of the notebook's cells it went through.

Nothing here is trusted by the grader. The student's code can change this module, or answer
in its place; it can only ever make the kernel answer with values, and the grader alone
decides what those values are worth.
"""

from __future__ import annotations

import base64
import linecache
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


def _cell_frames(error: BaseException) -> list[dict[str, Any]]:
    """The frames of the exception that ran in notebook cells, and the frame that raised."""
    cells = getattr(_shell().compile, "_filename_map", {})
    frames = traceback.extract_tb(error.__traceback__)
    chosen = []
    for index, frame in enumerate(frames):
        in_cell = frame.filename in cells
        if in_cell or index == len(frames) - 1:
            line = frame.line or linecache.getline(frame.filename, frame.lineno or 0).strip()
            chosen.append(
                {
                    "execution_count": cells.get(frame.filename),
                    "file": "" if in_cell else frame.filename,
                    "line": frame.lineno,
                    "function": frame.name,
                    "code": (line or "")[:300],
                }
            )
    return chosen[-MAX_FRAMES:]


def _error(error: BaseException) -> dict[str, Any]:
    try:
        message = str(error)
    except Exception:
        message = "(the exception's message could not be read)"
    return {
        "type": type(error).__name__,
        "message": message[:4000],
        "frames": _cell_frames(error),
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
    try:
        value = _perform(operation)
        reply = {"nonce": nonce, "ok": True, "value": encode(value)}
    except BaseException as error:  # the student's exception, reported as data
        reply = {"nonce": nonce, "ok": False, "error": _error(error)}
    display({REPLY_MIME: reply}, raw=True)
