"""The grader's side of a judged notebook: test cells run here, the student's code runs there.

A :class:`Judge` executes the instructor's test cells (and the instructor's helper cells) in a
namespace of its own, in the grader's process. The student's kernel is reached only through a
*transport*: a function that executes one line of code in the kernel and returns that
execution's outputs (:mod:`chainrule.grading.execute` provides it with nbclient). From the
judge's side the student's notebook looks like this:

- a name the test code uses that the judge's namespace does not define is looked up in the
  kernel (:class:`JudgeNamespace`): a plain value (number, string, array, list...) arrives as
  that value, decoded by :mod:`chainrule.judging.wire`; a function, class or other object
  arrives as a :class:`RemoteName`, a reference to it;
- calling a :class:`RemoteName` calls the student's object in the kernel, with the arguments
  pickled there; the result comes back as a value;
- a test helper marked :func:`chainrule.course.checks.in_student_kernel` is sent to the kernel by
  value and run there, next to the student's code (to run the student's function on ranks,
  say); its result comes back as a value.

Every comparison, every reference value and every verdict stays here. A student's exception
comes back as :class:`StudentCodeError`; a kernel that died or did not answer raises
:class:`GraderCallFailed`, which means the test did not run as written.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import contextvars
import io
import secrets
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from chainrule.judging import agent
from chainrule.judging.wire import WireError, decode

Outputs = list[dict[str, Any]]
Transport = Callable[[str], Outputs]

#: The judge of the notebook being graded in this process, if any.
CURRENT: contextvars.ContextVar[Judge | None] = contextvars.ContextVar("judge", default=None)


class GraderCallFailed(Exception):
    """The kernel did not answer a request of the grader: the test did not run as written."""


class StudentTimeout(Exception):
    """The student's code ran past the time limit while answering a request."""


@dataclass
class StudentCodeError(Exception):
    """The student's code raised: its exception type, message and the frames in its cells."""

    type_name: str
    message: str
    frames: list[dict[str, Any]] = field(default_factory=list)
    where: str = ""
    rank: int | None = None

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class StudentCell:
    """A cell the student wrote (a solution cell or an added one): its label and source."""

    label: str
    source: str


class RemoteName:
    """A function, class or object of the student's notebook, as the grader sees it."""

    __slots__ = ("_judge", "_path", "_type")
    __judge_remote__ = True

    def __init__(self, judge: Judge, path: str, type_name: str = "object") -> None:
        self._judge = judge
        self._path = path
        self._type = type_name

    @property
    def remote_path(self) -> str:
        """The name (and attributes) it stands for, e.g. ``Copy.apply``."""
        return self._path

    @property
    def remote_type(self) -> str:
        """The type name of the object in the kernel."""
        return self._type

    def __getattr__(self, attribute: str) -> RemoteName:
        if attribute.startswith("_"):
            raise AttributeError(attribute)
        return RemoteName(self._judge, f"{self._path}.{attribute}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._judge.request(("call", self._path, args, kwargs))

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return agent.lookup, (self._path,)

    def __repr__(self) -> str:
        return f"<{self._type} {self._path} of the student's notebook>"


class RemoteHelper:
    """A test helper that runs in the student's kernel; calling it returns its result."""

    def __init__(self, judge: Judge, function: Callable[..., Any]) -> None:
        self.judge = judge
        self.function = function
        self.__name__ = getattr(function, "__name__", "helper")
        self.__doc__ = function.__doc__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.judge.request(("run", self.function, args, kwargs))

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return _identity, (self.function,)


def _identity(value: Any) -> Any:
    return value


class TestCodeRefused(Exception):
    """A request would carry code of a test cell into the student's kernel."""


def _test_code_in(obj: Any, files: frozenset[str]) -> str | None:
    """The name of ``obj`` if it is a function, or a class with a method, compiled from one
    of ``files`` (the test cells), else ``None``."""
    functions = [obj]
    if isinstance(obj, type):
        functions = [getattr(v, "__func__", v) for v in vars(obj).values()]
    for function in functions:
        code = getattr(function, "__code__", None)
        if isinstance(function, types.FunctionType) and code is not None:
            if code.co_filename in files:
                return getattr(obj, "__qualname__", getattr(obj, "__name__", "a function"))
    return None


class _RequestPickler(cloudpickle.Pickler):
    """cloudpickle, with references to the student's objects sent as references, refusing any
    function or class of a test cell (its code would reach the student's kernel)."""

    def __init__(self, file: io.BytesIO, test_files: frozenset[str]) -> None:
        super().__init__(file, protocol=5)
        self.test_files = test_files

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, RemoteName | RemoteHelper):
            return obj.__reduce__()
        if isinstance(obj, types.FunctionType | type):
            name = _test_code_in(obj, self.test_files)
            if name is not None:
                raise TestCodeRefused(
                    f"{name} is defined in a test cell: its code cannot be sent to the "
                    "student's kernel (send data, such as arrays, shapes, seeds or names, or "
                    "define what the kernel runs in a helper cell the student can see)"
                )
        return super().reducer_override(obj)


def _pickle(value: Any, test_files: frozenset[str] = frozenset()) -> bytes:
    buffer = io.BytesIO()
    _RequestPickler(buffer, test_files).dump(value)
    return buffer.getvalue()


class JudgeNamespace(dict[str, Any]):
    """The test cells' globals: the judge's own names, then the student's, looked up lazily."""

    def __init__(self, judge: Judge) -> None:
        super().__init__(__name__="__main__", __builtins__=builtins)
        self.judge = judge

    def __missing__(self, name: str) -> Any:
        if name.startswith("__") or hasattr(builtins, name):
            raise KeyError(name)
        return self.judge.student_name(name)


class Judge:
    """Runs trusted cells here and reaches the student's kernel through ``transport``."""

    def __init__(self, transport: Transport, student_cells: Sequence[StudentCell] = ()) -> None:
        self.transport = transport
        self.student_cells = list(student_cells)
        self.namespace = JudgeNamespace(self)
        self.failures: list[str] = []
        self.world_start_seconds = 0.0
        """Seconds the kernel said its requests spent starting gloo worlds."""
        self.cell_labels: dict[int, str] = {}
        self._names: dict[str, Any] = {}
        self._test_files: frozenset[str] = frozenset()

    # -- the kernel, through the transport ------------------------------------------------------

    def request(self, operation: tuple[Any, ...]) -> Any:
        """Send one request to the kernel and return the value it answered with."""
        nonce = secrets.token_hex(8)
        try:
            pickled = _pickle((nonce, operation), self._test_files)
        except TestCodeRefused as error:
            raise self._failed(str(error)) from None
        payload = base64.b64encode(pickled).decode("ascii")
        code = f'__import__("chainrule.judging.agent").judging.agent.serve("{payload}")'
        outputs = self.transport(code)
        for output in outputs:
            if output.get("output_type") == "error" and output.get("ename") == "CellTimeoutError":
                raise StudentTimeout("your code ran past the time limit")
        reply = _find_reply(outputs, nonce)
        if reply is not None:
            self._note_world_starts(reply.get("world_start_seconds"))
        if reply is None:
            detail = _error_text(outputs)
            raise self._failed(
                "the kernel did not answer the grader's request"
                + (f" (it printed: {detail})" if detail else "")
            )
        if reply.get("ok") is True:
            try:
                return decode(reply.get("value"))
            except WireError as error:
                raise self._failed(f"the kernel answered with a malformed value: {error}") from None
        raised = reply.get("error")
        if reply.get("ok") is False and isinstance(raised, dict):
            raise self._student_error(raised)
        raise self._failed("the kernel answered the grader's request with something else")

    def _note_world_starts(self, seconds: Any) -> None:
        """Add what the kernel says it spent starting gloo worlds (a timing, not a grade:
        anything but a plausible number is ignored)."""
        if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
            if 0 <= seconds < 3600:
                self.world_start_seconds += float(seconds)

    def _failed(self, reason: str) -> GraderCallFailed:
        self.failures.append(reason)
        return GraderCallFailed(reason)

    def _student_error(self, error: Mapping[str, Any]) -> StudentCodeError:
        frames = [f for f in error.get("frames", []) if isinstance(f, dict)][: agent.MAX_FRAMES]
        rank = error.get("rank")
        return StudentCodeError(
            type_name=str(error.get("type", "Exception"))[:100],
            message=str(error.get("message", ""))[:4000],
            frames=frames,
            where=self.describe_frames(frames),
            rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
        )

    def describe_frames(self, frames: Sequence[Mapping[str, Any]]) -> str:
        """The frames of a student's exception as lines naming the student's cells."""
        lines = []
        for frame in frames:
            count = frame.get("execution_count")
            code = str(frame.get("code", ""))[:300]
            line = frame.get("line")
            if isinstance(count, int) and count in self.cell_labels:
                place = f"in your cell {self.cell_labels[count]}, line {line}"
            elif isinstance(count, int):
                place = f"in the cell run as [{count}], line {line}"
            else:
                place = f"in {str(frame.get('file', ''))[-80:]}, line {line}"
            function = str(frame.get("function", ""))[:80]
            lines.append(f"  {place}, in {function}: {code}")
        return "\n".join(lines)

    def student_name(self, name: str) -> Any:
        """A name of the student's notebook: its value, or a :class:`RemoteName`."""
        if name in self._names:
            return self._names[name]
        info = self.request(("describe", name))
        if not isinstance(info, dict) or info.get("kind") == "missing":
            raise KeyError(name)
        if info.get("kind") == "value":
            value = info.get("value")
        else:
            value = RemoteName(self, name, str(info.get("type", "object"))[:100])
        self._names[name] = value
        return value

    def in_student_kernel(self, function: Callable[..., Any]) -> RemoteHelper:
        """``function``, to be run in the student's kernel whenever it is called."""
        return RemoteHelper(self, function)

    # -- trusted cells ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def active(self) -> Iterator[Judge]:
        """Make this the judge that :func:`chainrule.course.checks.in_student_kernel` reports to."""
        token = CURRENT.set(self)
        try:
            yield self
        finally:
            CURRENT.reset(token)

    def run_cell(
        self, source: str, label: str, test: bool = True
    ) -> tuple[str, BaseException | None]:
        """Execute a trusted cell here: its printed text and the exception it ended with.

        The functions and classes a ``test`` cell defines never reach the student's kernel
        (a request that would carry one fails, and the test did not run as written): test
        cells hold hidden tests. Those of the other trusted cells (helpers the student sees)
        may run there.
        """
        self._names = {}  # the student's names are looked up afresh for every cell
        printed = io.StringIO()
        filename = f"<{label}>"
        if test:
            self._test_files = self._test_files | {filename}
        code = compile(source, filename, "exec")
        with self.active(), contextlib.redirect_stdout(printed):
            try:
                exec(code, self.namespace)
            except Exception as error:  # the verdict of a test cell is its exception
                return printed.getvalue(), error
        return printed.getvalue(), None


def _find_reply(outputs: Outputs, nonce: str) -> dict[str, Any] | None:
    for output in reversed(outputs):
        data = output.get("data") if output.get("output_type") == "display_data" else None
        reply = data.get(agent.REPLY_MIME) if isinstance(data, dict) else None
        if isinstance(reply, dict) and reply.get("nonce") == nonce:
            return reply
    return None


def _error_text(outputs: Outputs) -> str:
    for output in outputs:
        if output.get("output_type") == "error":
            return f"{output.get('ename', '')}: {str(output.get('evalue', ''))[:200]}"
    return ""
