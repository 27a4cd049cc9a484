"""Assertions for exercise test cells whose failure messages teach.

A failing check raises :class:`AssertionError` with what was expected, what was received and,
where the received value stands in a recognisable relation to the expected one, the mistake
that most likely produced it. With ``e`` the expected value, ``r`` the received one, ``P`` the
number of ranks and ``T_p`` the real-token count of rank p:

- ``r = P·e``: something summed over the ranks that should have been averaged, or counted once;
- ``r = e/P``: something averaged over the ranks (or divided by P) that should have been summed;
- ``r = -e``: a wrong sign;
- ``r = c·e`` for another constant c: a wrong normalisation;
- ``r = (1/P) Σ_p m_p`` while ``e = Σ_p T_p m_p / Σ_p T_p``: local means averaged instead of
  weighted by their token counts;
- ``r = Σ_p T_p m_p`` or ``r = (ΣT)·e``: the division by the global token count was forgotten;
- ``r.shape`` reversed from ``e.shape``: a transposed result;
- ``r`` P times longer (or shorter) than ``e`` along one axis: the whole tensor where this
  rank's slice was expected (or the reverse);
- all zeros, ``None``, NaN: nothing reached the value (for a gradient: none flowed), a missing
  ``return``, a division by 0;
- any further mistake a test cell names: ``mistakes={"what the mistake is": value it gives}``.

Every check judges a value as the grader receives it from the student's kernel
(:func:`chainrule.judging.wire.as_sent`: arrays, numbers, strings, lists...; any other object
only by its type), so that Validate and grading give the same verdict; a helper marked
:func:`in_student_kernel` hands its result over the same way in a notebook as in grading. A
value the grader cannot judge (a string, an object, an int too large for a float) fails with
what it was and what was expected instead.

The ``expect_own_*`` checks make sure that the code graded is the student's own, written in the
notebook, and not a library function under a new name.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import linecache
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from chainrule.judging.source_scan import Finding, definitions, library_uses
from chainrule.judging.wire import Opaque, as_sent

__all__ = [
    "ErrorInYourCode",
    "as_array",
    "as_sent",
    "describe_student_error",
    "diagnose",
    "expect_array",
    "expect_choice",
    "expect_close",
    "expect_equal",
    "expect_number",
    "expect_own_autograd_function",
    "expect_own_class",
    "expect_own_function",
    "expect_own_vjp",
    "graph_vjp_modules",
    "in_student_kernel",
    "library_references",
    "show",
]

NOTEBOOK_MODULE = "__main__"
"""The ``__module__`` of a function or class defined in a notebook cell."""

_DIAGNOSIS_RTOL = 1e-6


# -- values -------------------------------------------------------------------------------------


def as_array(value: Any) -> np.ndarray:
    """``value`` as a float numpy array: engine tensors, torch tensors, numbers and sequences.

    Raises :class:`TypeError` for what is not numeric (a string included: "0.5" is text, not
    a number) and :class:`ValueError` for a number too large for a float.
    """
    if isinstance(value, str | bytes | Opaque):
        raise TypeError(f"{type(value).__name__} is not a number")
    if isinstance(value, list | tuple) and any(isinstance(v, str | bytes | Opaque) for v in value):
        raise TypeError("a sequence holding text or objects is not an array of numbers")
    try:
        return _as_float_array(value)
    except OverflowError:
        raise ValueError("a number too large for a float") from None


def _as_float_array(value: Any) -> np.ndarray:
    data = getattr(value, "data", None)
    if isinstance(data, np.ndarray):  # a chainrule.Tensor
        return np.asarray(data, dtype=float)
    if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        return value.detach().cpu().double().numpy()
    if isinstance(value, list | tuple) and any(_is_array_like(v) for v in value):
        return np.stack([as_array(v) for v in value])
    if np.asarray(value).dtype.kind in "USV":  # text (or raw bytes), not numbers
        raise TypeError("text is not a number")
    return np.asarray(value, dtype=float)


def describe(value: Any) -> str:
    """What a received value is, for a message: ``a str '0.5'``, ``a set {1, 2}``, ``an int of
    5000 digits, more than the grader accepts``."""
    if isinstance(value, Opaque):
        return f"{_article(value.type_name)} {value.type_name} ({value.text})"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1000:
        return f"an int of about {int(value.bit_length() * 0.30103)} digits"
    name = type(value).__name__
    return f"{_article(name)} {name} {value!r}"[:300]


def _article(name: str) -> str:
    return "an" if name[:1].lower() in "aeiou" else "a"


def _is_array_like(value: Any) -> bool:
    return isinstance(value, np.ndarray) or hasattr(value, "data") or hasattr(value, "detach")


def show(value: Any) -> str:
    """A short printable form of an array: its values (abbreviated), and its shape if not 0-d."""
    array = np.asarray(value)
    text = np.array2string(array, precision=6, threshold=12, edgeitems=3, separator=", ")
    return text if array.ndim == 0 else f"{text} (shape {array.shape})"


def _close(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> bool:
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=rtol, atol=atol))


def _scale(array: np.ndarray) -> float:
    return float(np.max(np.abs(array), initial=0.0))


# -- diagnoses ----------------------------------------------------------------------------------


def diagnose(
    received: Any,
    expected: Any,
    *,
    ranks: int | None = None,
    tokens: Sequence[float] | None = None,
    local_means: Sequence[Any] | None = None,
    mistakes: Mapping[str, Any] | None = None,
    gradient: bool = False,
) -> list[str]:
    """The likely mistakes that turn ``expected`` into ``received`` (empty if none is known).

    ``ranks`` is the number of ranks P, ``tokens`` the per-rank token (or example) counts T_p,
    ``local_means`` the per-rank local means m_p that the expected value was reduced from,
    ``mistakes`` maps the description of a mistake to the value that mistake produces, and
    ``gradient`` says that the value is a gradient (so that zeros may be said not to flow).

    The mistakes a test names come first; the general diagnoses say what relation the received
    value stands in to the expected one (P times, 1/P, the sign, a constant factor) and which
    kind of step makes it, without naming a fix: the same relation has several causes.
    """
    if received is None:
        return ["received None: did the function end without `return`?"]
    r, e = as_array(received), as_array(expected)
    if r.shape != e.shape:
        return _shape_diagnoses(r.shape, e.shape, ranks)
    if not np.all(np.isfinite(r)):
        return [
            "received NaN or infinity: a division by zero (a count of 0?), an overflow, or a NaN "
            "that came in with the inputs and was carried along"
        ]
    found = _named_diagnoses(r, e, mistakes)
    found += _token_diagnoses(r, e, tokens, local_means)
    if found:
        return found
    return _ratio_diagnoses(r, e, ranks, tokens, gradient)


def _shape_diagnoses(r: tuple[int, ...], e: tuple[int, ...], ranks: int | None) -> list[str]:
    if len(r) == len(e) >= 2 and r == e[::-1]:
        return [f"received shape {r} is expected shape {e} transposed: a missing or extra .T?"]
    if len(r) == len(e):
        differing = [axis for axis in range(len(r)) if r[axis] != e[axis]]
        if len(differing) == 1 and ranks:
            axis = differing[0]
            if r[axis] == ranks * e[axis]:
                return [
                    f"received shape {r} is P = {ranks} times expected shape {e} along axis "
                    f"{axis}: the whole tensor where only this rank's slice was expected"
                ]
            if ranks * r[axis] == e[axis]:
                return [
                    f"received shape {r} is 1/P of expected shape {e} along axis {axis}: one "
                    "rank's slice where the whole tensor was expected"
                ]
    if r == () and e != ():
        return [f"received a single number where shape {e} was expected: summed over everything?"]
    return [f"received shape {r}, expected shape {e}"]


def _named_diagnoses(r: np.ndarray, e: np.ndarray, mistakes: Mapping[str, Any] | None) -> list[str]:
    found = []
    for description, value in (mistakes or {}).items():
        candidate = as_array(value)
        if _matches(r, candidate) and not _matches(candidate, e):
            found.append(f"{description}: that gives exactly what was received")
    return found


def _token_diagnoses(
    r: np.ndarray,
    e: np.ndarray,
    tokens: Sequence[float] | None,
    local_means: Sequence[Any] | None,
) -> list[str]:
    if tokens is None or local_means is None:
        return []
    counts = np.asarray(tokens, dtype=float)
    means = np.stack([as_array(m) for m in local_means])
    plain = means.mean(axis=0)
    weighted_sum = np.tensordot(counts, means, axes=1)
    if plain.shape == r.shape and _matches(r, plain) and not _matches(plain, e):
        total = counts.sum()
        per_rank = ", ".join(
            f"rank {p}: 1/{len(counts) * c:g} instead of 1/{total:g}" for p, c in enumerate(counts)
        )
        return [
            "received the plain mean of the local means. It weighs every rank equally, so each "
            f"of rank p's T_p tokens (or examples) gets 1/(P·T_p) ({per_rank})"
        ]
    if weighted_sum.shape == r.shape and _matches(r, weighted_sum) and not _matches(r, e):
        return [
            "received Σ_p T_p·m_p, the count-weighted sum: a sum over all the tokens, "
            f"ΣT = {counts.sum():g} times their mean"
        ]
    return []


def _ratio_diagnoses(
    r: np.ndarray,
    e: np.ndarray,
    ranks: int | None,
    tokens: Sequence[float] | None,
    gradient: bool = False,
) -> list[str]:
    if _scale(e) == 0.0:
        return []
    if _scale(r) == 0.0:
        if gradient:
            return [
                "received all zeros: no gradient reached it (computed under no_grad(), a "
                "detached tensor, or a backward that returns zeros?)"
            ]
        return ["received all zeros where the expected value is not"]
    if ranks and ranks > 1:
        if _matches(r, ranks * e):
            return [
                f"received P = {ranks} times the expected value: a factor of P too many, so "
                "something was summed over the ranks that should have been averaged or counted "
                "once"
            ]
        if _matches(r, e / ranks):
            return [
                f"received 1/P = 1/{ranks} of the expected value: a factor of P too few, so "
                "something was averaged over the ranks (or divided by P) that should have been "
                "summed"
            ]
    if tokens is not None:
        total = float(np.sum(tokens))
        if total > 1 and _matches(r, total * e):
            return [
                f"received ΣT = {total:g} times the expected value: the division by the global "
                "count was left out"
            ]
    if _matches(r, -e):
        return ["received the negative of the expected value: a wrong sign"]
    ratio = _constant_ratio(r, e) if e.size > 1 else None
    if ratio is not None:
        return [
            f"received {ratio:.6g} times the expected value everywhere: the direction is right "
            "but a normalisation factor is wrong"
        ]
    return []


def _matches(a: np.ndarray, b: np.ndarray) -> bool:
    atol = 1e-12 * max(_scale(a), _scale(b), 1.0)
    return _close(a, b, _DIAGNOSIS_RTOL, atol)


def _constant_ratio(r: np.ndarray, e: np.ndarray) -> float | None:
    """c if ``r = c·e`` (c ≠ 1) up to rounding, else None."""
    mask = np.abs(e) > 1e-12 * _scale(e)
    if not mask.any() or np.any(np.abs(r[~mask]) > 1e-9 * _scale(r)):
        return None
    ratios = r[mask] / e[mask]
    c = float(np.median(ratios))
    if np.isclose(c, 1.0, rtol=_DIAGNOSIS_RTOL) or not np.allclose(ratios, c, rtol=_DIAGNOSIS_RTOL):
        return None
    return c


# -- assertions on values -----------------------------------------------------------------------


def expect_close(
    received: Any,
    expected: Any,
    what: str,
    *,
    ranks: int | None = None,
    tokens: Sequence[float] | None = None,
    local_means: Sequence[Any] | None = None,
    mistakes: Mapping[str, Any] | None = None,
    rtol: float = 1e-7,
    atol: float = 1e-10,
    gradient: bool | None = None,
) -> None:
    """Assert ``received ≈ expected`` (same shape, ``|r - e| ≤ atol + rtol·|e|`` elementwise).

    On failure the AssertionError names ``what`` was checked, shows both values (and, where
    they print alike, the largest difference against the tolerance) and adds the likely
    mistakes found by :func:`diagnose` (same keyword arguments; ``gradient`` defaults to
    whether ``what`` names a gradient: ``.grad``, "gradient" or a barred symbol such as x̄).
    """
    received = as_sent(received)
    e = as_array(expected)
    if gradient is None:
        gradient = _names_a_gradient(what)
    r = None
    if received is not None:
        try:
            r = as_array(received)
        except (TypeError, ValueError):
            raise AssertionError(
                f"{what}: expected {show(e)}, received {describe(received)}, which is not a "
                "number or an array of numbers"
            ) from None
        if _close(r, e, rtol, atol):
            return
    hints = diagnose(
        received,
        expected,
        ranks=ranks,
        tokens=tokens,
        local_means=local_means,
        mistakes=mistakes,
        gradient=gradient,
    )
    message = f"{what}: expected {show(e)}, received "
    message += "None" if r is None else show(r)
    if r is not None and r.shape == e.shape and show(r) == show(e):
        message += _difference(r, e, rtol, atol, received)
    raise AssertionError(message + "".join(f"\nLikely mistake: {h}." for h in hints))


def _names_a_gradient(what: str) -> bool:
    return "grad" in what.lower() or "\u0304" in what


def _difference(r: np.ndarray, e: np.ndarray, rtol: float, atol: float, received: Any) -> str:
    """How far ``r`` is from ``e`` where the two print alike, and what precision explains it."""
    gap = np.abs(r - e)
    worst = int(np.argmax(gap - (atol + rtol * np.abs(e))))
    text = (
        f"; they differ by up to {float(gap.flat[worst]):.3g} where at most "
        f"{atol:.3g} + {rtol:.3g}·|expected| = {atol + rtol * abs(float(e.flat[worst])):.3g} "
        "is allowed"
    )
    dtype = getattr(received, "dtype", None)
    if dtype is not None and np.dtype(dtype).kind == "f" and np.dtype(dtype).itemsize < 8:
        digits = {2: 3, 4: 7}.get(np.dtype(dtype).itemsize, 7)
        text += (
            f" (your values are {np.dtype(dtype)}, about {digits} significant digits: compute in "
            "the dtype of the inputs, or float64)"
        )
    return text


def expect_array(received: Any, shape: tuple[int, ...], what: str) -> np.ndarray:
    """Assert that ``received`` is an array of numbers of ``shape``; return it as floats."""
    received = as_sent(received)
    try:
        array = as_array(received)
    except (TypeError, ValueError):
        raise AssertionError(
            f"{what}: expected an array of numbers of shape {tuple(shape)}, received "
            f"{describe(received)}"[:400]
        ) from None
    if array.shape != tuple(shape):
        raise AssertionError(
            f"{what}: expected an array of shape {tuple(shape)}, received one of shape "
            f"{array.shape}: {show(array)}"
        )
    return array


def expect_number(received: Any, what: str) -> float:
    """Assert that ``received`` is one real number (an int, a float, a 0-d array); return it."""
    received = as_sent(received)
    if isinstance(received, bool) or received is None:
        raise AssertionError(f"{what}: expected a number, received {received!r}.")
    try:
        array = as_array(received)
    except (TypeError, ValueError):
        array = None
    if array is None or array.shape != () or not np.isrealobj(array):
        shape = "" if array is None else f" of shape {array.shape}"
        message = f"{what}: expected one number, received {describe(received)}{shape}."
        raise AssertionError(message[:400])
    return float(array)


def expect_equal(received: Any, expected: Any, what: str, hint: str | None = None) -> None:
    """Assert ``received == expected`` exactly (booleans, strings, integers)."""
    received = as_sent(received)
    if received == expected:
        return
    message = f"{what}: expected {expected!r}, received {received!r}."
    raise AssertionError(message if hint is None else f"{message}\n{hint}")


def expect_choice(value: Any, options: Mapping[str, Any], what: str) -> None:
    """Assert that ``value`` is one of the keys of ``options`` (a multiple-choice answer)."""
    value = as_sent(value)
    if isinstance(value, str) and value in options:
        return
    listed = ", ".join(repr(key) for key in options)
    raise AssertionError(f"{what} must be one of {listed}; received {value!r}.")


# -- helpers that run next to the student's code -------------------------------------------------


class ErrorInYourCode(Exception):
    """The student's code raised while a test ran it: what, on which rank, and where."""


def describe_student_error(error: BaseException) -> str:
    """``Type on rank p: message`` and the lines of the notebook's cells it went through."""
    from chainrule.judging.agent import describe_exception

    info = describe_exception(error)
    on_rank = f" on rank {info['rank']}" if info["rank"] is not None else ""
    lines = [f"{info['type']}{on_rank}: {info['message']}"]
    for frame in info["frames"]:
        count = frame["execution_count"]
        place = f"cell In[{count}]" if count else frame["file"][-60:]
        lines.append(f"  in {place}, line {frame['line']}, in {frame['function']}: {frame['code']}")
    return "\n".join(lines)


def in_student_kernel(function: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a test helper that runs the student's code and returns plain values.

    When the course's grader grades, test cells run in the grader's own process
    (:mod:`chainrule.judging`) and a helper marked so is sent to the student's kernel each time
    it is called, to run next to the student's code (on ranks, say); only its return value
    comes back, as numbers, strings, arrays, lists, tuples and dicts. Keep every comparison
    outside such a helper. In a notebook (Validate, or plain nbgrader) the helper runs right
    there, on copies of its arguments, and its result is handed over as the grader would
    receive it (:func:`chainrule.judging.wire.as_sent`), so that a check sees the same value
    in both; an exception of the student's code then surfaces as :class:`ErrorInYourCode`,
    naming the rank and the lines of the student's cells, instead of the library's frames.
    """
    from chainrule.judging.judge import CURRENT

    judge = CURRENT.get()
    if judge is not None:
        return judge.in_student_kernel(function)

    @functools.wraps(function)
    def reporting_errors(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # IPython leaves this frame out of the traceback
        args, kwargs = copy.deepcopy((args, kwargs))  # the grader sends copies too
        try:
            result = function(*args, **kwargs)
        except Exception as error:
            raise ErrorInYourCode(describe_student_error(error)) from None
        return as_sent(result)

    return reporting_errors


# -- assertions on where code comes from ---------------------------------------------------------


def _is_remote(obj: Any) -> bool:
    """Whether ``obj`` is a grader's reference to an object of the student's notebook."""
    return bool(getattr(type(obj), "__judge_remote__", False))


def _student_cells() -> list[tuple[str, str]]:
    """``(label, source)`` of every cell the student wrote, in the notebook being judged."""
    from chainrule.judging.judge import CURRENT

    judge = CURRENT.get()
    return [] if judge is None else [(c.label, c.source) for c in judge.student_cells]


def _own_source(obj: Any) -> list[tuple[str, str]]:
    """The whole cell that defines ``obj`` (a function or class of the notebook), labelled.

    The cell, not just the definition, so that Validate judges what grading judges: grading
    reads the student's cells.
    """
    code = getattr(inspect.unwrap(obj), "__code__", None)
    lines = linecache.getlines(code.co_filename) if code is not None else []
    label = "defining " + getattr(obj, "__name__", "it")
    if lines:
        return [(label, "".join(lines))]
    try:
        return [(label, inspect.getsource(obj))]
    except (OSError, TypeError):
        return []


def _raise_library_use(what: str, findings: Sequence[Finding], advice: str) -> None:
    if findings:
        places = "; ".join(f.describe() for f in findings[:3])
        raise AssertionError(f"{what} must be your own code, but your notebook {places}. {advice}")


def _module_name(obj: Any) -> str:
    """The module ``obj`` belongs to (a module's own name for a module)."""
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    return getattr(obj, "__module__", None) or ""


def _in_library(module: str, library: Sequence[str]) -> bool:
    """Whether ``module`` is one of the ``library`` modules or a submodule of one."""
    return any(module == prefix or module.startswith(prefix + ".") for prefix in library)


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def library_references(function: Callable[..., Any], library: Sequence[str]) -> list[str]:
    """The global names (and attributes of them) used by ``function`` that lead to ``library``.

    Looks through the function's code and every function nested in it: ``gather_from_ranks``
    imported from ``chainrule.parallel.duality``, or ``duality.gather_from_ranks``, both count.
    """
    function = inspect.unwrap(function)
    code = getattr(function, "__code__", None)
    if code is None:
        return []
    namespace = getattr(function, "__globals__", {})
    found = []
    for inner in _code_objects(code):
        for name in inner.co_names:
            if name not in namespace:
                continue
            value = namespace[name]
            if not isinstance(value, types.ModuleType):
                if _in_library(_module_name(value), library):
                    found.append(f"{name} (from {_module_name(value)})")
                continue
            for attribute in inner.co_names:
                if attribute == name or not hasattr(value, attribute):
                    continue
                origin = _module_name(getattr(value, attribute))
                if _in_library(origin, library) or _in_library(value.__name__, library):
                    found.append(f"{name}.{attribute} (from {origin or value.__name__})")
    return sorted(set(found))


def _expect_defined_in_cells(
    name: str, what: str, kind: type[ast.AST], shape: str
) -> tuple[str, ast.AST]:
    """The last top-level binding of ``name`` in the student's cells (which must be ``kind``)
    and the label of its cell."""
    found = definitions(_student_cells(), name)
    if not found:
        raise AssertionError(f"{what}: no cell of yours defines {name}; {shape}.")
    label, node = found[-1]
    if not isinstance(node, kind):
        raise AssertionError(
            f"{what}: your cell {label} binds {name} without writing it ({shape} instead)."
        )
    return label, node


def _library_uses_of(label: str, library: Sequence[str]) -> list[Finding]:
    """Library uses in the cell ``label``, with the names the other cells import in reach."""
    cells = _student_cells()
    defining = [cell for cell in cells if cell[0] == label]
    return library_uses(defining, library, context=cells)


def expect_own_function(
    function: Any, what: str, library: Sequence[str], module: str = NOTEBOOK_MODULE
) -> None:
    """Assert that ``function`` is a function written in the notebook, not one of ``library``.

    It must be a plain Python function defined with ``def`` in a notebook cell, and no cell of
    the student's may use the ``library`` modules (the library's own solution): not at the top
    of a cell, not inside the function, under no alias.
    """
    advice = "Write it yourself from the collectives of chainrule.dist."
    if _is_remote(function):
        name = function.remote_path.split(".")[-1]
        label, _ = _expect_defined_in_cells(name, what, ast.FunctionDef, "define it with `def`")
        _raise_library_use(what, _library_uses_of(label, library), advice)
        return
    if not isinstance(function, types.FunctionType):
        raise AssertionError(
            f"{what} must be a function defined with `def` in the solution cell; received "
            f"{type(function).__name__} {function!r}."
        )
    if function.__module__ != module:
        raise AssertionError(
            f"{what} is {function.__module__}.{function.__qualname__}: write your own in the "
            "solution cell instead of importing it."
        )
    references = library_references(function, library)
    if references:
        raise AssertionError(
            f"{what} calls the library's solution ({', '.join(references)}): write it yourself "
            "from the collectives of chainrule.dist."
        )
    _raise_library_use(what, library_uses(_own_source(function), library), advice)


def expect_own_class(
    cls: Any, what: str, library: Sequence[str], module: str = NOTEBOOK_MODULE
) -> None:
    """Assert that ``cls`` is a class written in the notebook, none of it from ``library``.

    It must be defined with ``class`` in a notebook cell (not imported, not a library class
    under a new name, not a subclass of one), none of its methods may call into ``library``,
    and no cell of the student's may use the ``library`` modules: not at the top of a cell, not
    in a method, under no alias (``torch.optim.Adam`` inside a method counts, with ``torch``
    imported by the notebook's own cells).
    """
    advice = "Write it yourself from torch's tensor operations and collectives."
    if _is_remote(cls):
        name = cls.remote_path.split(".")[-1]
        label, _ = _expect_defined_in_cells(name, what, ast.ClassDef, f"write `class {name}`")
        _raise_library_use(what, _library_uses_of(label, library), advice)
        return
    if not isinstance(cls, type):
        raise AssertionError(
            f"{what} must be a class defined with `class` in the solution cell; received "
            f"{type(cls).__name__} {cls!r}."[:400]
        )
    if cls.__module__ != module:
        raise AssertionError(
            f"{what} is {cls.__module__}.{cls.__qualname__}: define the class yourself in the "
            "solution cell instead of importing it."
        )
    borrowed = [b for b in cls.__mro__[1:] if _in_library(_module_name(b), library)]
    if borrowed:
        raise AssertionError(
            f"{what} must be your own code, but it subclasses {borrowed[0].__module__}."
            f"{borrowed[0].__qualname__}, the library's solution. {advice}"
        )
    methods = [getattr(v, "__func__", v) for v in vars(cls).values()]
    methods = [m for m in methods if isinstance(m, types.FunctionType)]
    if not methods:
        raise AssertionError(f"{what} has no methods of its own: write them in the class.")
    for method in methods:
        references = library_references(method, library)
        if references:
            raise AssertionError(
                f"{what} must be your own code, but {what}.{method.__name__} calls the "
                f"library's solution ({', '.join(references)}). {advice}"
            )
    source = [(f"defining {cls.__name__}", text) for _, text in _own_source(methods[0])]
    _raise_library_use(what, library_uses(source, library), advice)


def graph_vjp_modules(output: Any, stop: Any = None) -> list[str]:
    """The modules of the VJP functions on the graph from ``output`` back to the leaves.

    ``output`` is a :class:`chainrule.Tensor`; the walk does not go past ``stop``.
    """
    modules, seen, todo = [], set(), [output]
    while todo:
        node = todo.pop()
        if id(node) in seen or node is stop:
            continue
        seen.add(id(node))
        vjp = getattr(node, "_vjp", None)
        if vjp is not None:
            modules.append(getattr(vjp, "__module__", "") or "")
        todo.extend(getattr(node, "parents", ()))
    return modules


def expect_own_vjp(
    output: Any, what: str, library: Sequence[str], module: str = NOTEBOOK_MODULE
) -> None:
    """Assert that ``output`` was made by a VJP written in the notebook, none from ``library``.

    Some operation on the graph of ``output`` (a :class:`chainrule.Tensor`) must carry a VJP
    defined in ``module`` (built with ``Tensor.from_op`` in the notebook), and none may come from
    the ``library`` modules.
    """
    modules = graph_vjp_modules(output)
    borrowed = sorted({m for m in modules if _in_library(m, library)})
    if borrowed:
        raise AssertionError(
            f"{what} is built from the library's differentiable collectives "
            f"({', '.join(borrowed)}): build it yourself with Tensor.from_op."
        )
    if module not in modules:
        raise AssertionError(
            f"{what} has no backward of your own: build the output with "
            "Tensor.from_op(out_data, (x,), vjp, name) and a vjp defined in your cell."
        )


def expect_own_autograd_function(
    cls: Any, what: str, library: Sequence[str], module: str = NOTEBOOK_MODULE
) -> None:
    """Assert that ``cls`` is the student's own ``torch.autograd.Function``.

    It must be a class defined in ``module`` (a notebook cell) whose only base is
    ``torch.autograd.Function`` (so not a subclass of the library's), with its own ``forward``
    and ``backward`` written in the notebook, neither of which calls into ``library``.
    """
    advice = "Use torch.distributed yourself."
    if _is_remote(cls):
        name = cls.remote_path.split(".")[-1]
        label, node = _expect_defined_in_cells(
            name, what, ast.ClassDef, f"write `class {name}(...)`"
        )
        assert isinstance(node, ast.ClassDef)
        _expect_autograd_class_shape(node, what)
        _raise_library_use(what, _library_uses_of(label, library), advice)
        return

    import torch

    if not isinstance(cls, type):
        raise AssertionError(
            f"{what} must be a class (class {what}(torch.autograd.Function): ...); received "
            f"{type(cls).__name__} {cls!r}."
        )
    if cls.__module__ != module:
        raise AssertionError(
            f"{what} is {cls.__module__}.{cls.__qualname__}: define the class yourself in the "
            "solution cell instead of importing it."
        )
    if cls.__bases__ != (torch.autograd.Function,):
        bases = ", ".join(f"{b.__module__}.{b.__qualname__}" for b in cls.__bases__)
        raise AssertionError(
            f"{what} must subclass torch.autograd.Function directly; its bases are {bases}."
        )
    for method in ("forward", "backward"):
        attribute = cls.__dict__.get(method)
        function = getattr(attribute, "__func__", attribute)
        if not isinstance(function, types.FunctionType) or function.__module__ != module:
            raise AssertionError(
                f"{what}.{method} must be written in {what} itself as a @staticmethod."
            )
        try:
            inspect.getsource(function)
        except (OSError, TypeError):
            raise AssertionError(
                f"{what}.{method}: its source cannot be found; define it in a notebook cell."
            ) from None
        references = library_references(function, library)
        if references:
            raise AssertionError(
                f"{what}.{method} calls the library's solution ({', '.join(references)}): "
                "use torch.distributed yourself."
            )
        _raise_library_use(f"{what}.{method}", library_uses(_own_source(function), library), advice)


def _expect_autograd_class_shape(node: ast.ClassDef, what: str) -> None:
    """The syntax of ``class X(torch.autograd.Function)`` with static forward and backward."""
    bases = [ast.unparse(base) for base in node.bases]
    if len(bases) != 1 or not (bases[0].endswith("autograd.Function") or bases[0] == "Function"):
        raise AssertionError(
            f"{what} must subclass torch.autograd.Function directly; its bases are "
            f"{', '.join(bases) or 'none'}."
        )
    methods = {item.name: item for item in node.body if isinstance(item, ast.FunctionDef)}
    for method in ("forward", "backward"):
        item = methods.get(method)
        static = item is not None and any(
            ast.unparse(d).endswith("staticmethod") for d in item.decorator_list
        )
        if not static:
            raise AssertionError(
                f"{what}.{method} must be written in {what} itself as a @staticmethod."
            )
