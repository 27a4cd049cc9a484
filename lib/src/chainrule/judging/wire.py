"""What a student's kernel may send back to the grader: plain values, nothing that runs.

The grader asks the kernel for the value of a name or for the result of a call
(:mod:`chainrule.judging.agent`); the kernel answers with :func:`encode`'s output, a tree of
JSON objects, and the grader rebuilds the value with :func:`decode`. Decoding builds only

- ``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, and the exact numbers of the
  standard library, :class:`fractions.Fraction` and :class:`decimal.Decimal`;
- ``list``, ``tuple`` and ``dict`` of those (dict keys: ``str``, ``int`` or ``float``, numpy's
  numbers as the Python numbers they equal; a dict with another key arrives as an
  :class:`Opaque` that names it);
- numpy arrays of a numeric or boolean dtype (torch tensors and :class:`chainrule.Tensor`
  arrive as numpy arrays: the grader compares values, not types; an extended-precision
  ``longdouble`` array arrives as float64, its complex counterpart as complex128);
- :class:`Opaque` for anything else: its type's name and a short ``repr``, so that a check
  can say "your function returned a Foo". A value the limits below would refuse (an int of
  more than :data:`MAX_DIGITS` digits, an array of more than :data:`MAX_BYTES` bytes) is
  encoded as an :class:`Opaque` that says so, so that a check reports it to the student as it
  would any other value it cannot judge, in Validate as in grading.

No pickle and no code cross in this direction, and :func:`decode` enforces limits on depth,
length and total size, so a reply can neither run anything in the grader nor exhaust it.

:func:`as_sent` is a value as the grader receives it (encoded, then decoded). The checks of
:mod:`chainrule.course.checks` judge that, in a student's own notebook (Validate) as in grading, so
that the two give the same verdict for the same answer.
"""

from __future__ import annotations

import base64
import decimal
import fractions
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Array dtypes a reply may carry (numpy's ``dtype.str`` without the byte-order character).
ARRAY_DTYPES = frozenset(
    ["b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16"]
)
MAX_DEPTH = 32
MAX_ITEMS = 1_000_000
MAX_BYTES = 64 * 1024 * 1024
MAX_TEXT = 200_000
MAX_DIGITS = 4000
REPR_CHARS = 300


class WireError(ValueError):
    """A reply that is not a well-formed value within the limits."""


@dataclass(frozen=True)
class Opaque:
    """A value of a type that does not cross: its type and the start of its ``repr``."""

    type_name: str
    text: str

    def __repr__(self) -> str:
        return f"<{self.type_name}: {self.text}>"


# -- encoding (in the kernel) -------------------------------------------------------------------


def _array_of(value: Any) -> np.ndarray | None:
    """``value`` as a numpy array if it is an array, a torch tensor or a chainrule Tensor."""
    if isinstance(value, np.ndarray):
        return value
    module = type(value).__module__ or ""
    if module.startswith("torch") and hasattr(value, "detach"):
        return np.asarray(value.detach().cpu().numpy())
    data = getattr(value, "data", None)
    if module.startswith("chainrule") and isinstance(data, np.ndarray):
        return data
    return None


def _encode_float(value: float) -> dict[str, Any]:
    return {"t": "float", "v": repr(float(value))}


def encode(value: Any, depth: int = 0) -> dict[str, Any]:
    """``value`` as JSON-ready tagged objects (see the module docstring for what survives)."""
    if depth > MAX_DEPTH:
        return {"t": "opaque", "type": type(value).__name__, "repr": "nested too deeply"}
    if value is None:
        return {"t": "none"}
    if isinstance(value, bool | np.bool_):
        return {"t": "bool", "v": bool(value)}
    if isinstance(value, int | np.integer):
        return _encode_int(int(value))
    if isinstance(value, float | np.floating):
        return _encode_float(float(value))
    if isinstance(value, fractions.Fraction):
        return {"t": "fraction", "num": str(value.numerator), "den": str(value.denominator)}
    if isinstance(value, decimal.Decimal):
        return {"t": "decimal", "v": str(value)}
    if isinstance(value, Opaque):
        return {"t": "opaque", "type": value.type_name, "repr": value.text}
    if isinstance(value, complex | np.complexfloating):
        return {"t": "complex", "re": repr(value.real), "im": repr(value.imag)}
    if isinstance(value, str):
        return {"t": "str", "v": value[:MAX_TEXT]}
    array = _array_of(value)
    if array is not None:
        return _encode_array(array, type(value).__name__)
    if isinstance(value, list | tuple):
        kind = "list" if isinstance(value, list) else "tuple"
        return {"t": kind, "v": [encode(item, depth + 1) for item in value[:MAX_ITEMS]]}
    if isinstance(value, dict):
        return _encode_dict(value, depth)
    return {"t": "opaque", "type": type(value).__name__, "repr": _short_repr(value)}


def _encode_dict(value: dict[Any, Any], depth: int) -> dict[str, Any]:
    """A dict whose keys are strings or numbers (numpy's included, as the Python numbers they
    equal); a dict with any other key is an object the grader cannot judge, said so."""
    items = []
    for key, item in list(value.items())[:MAX_ITEMS]:
        if isinstance(key, np.integer | np.floating) and not isinstance(key, np.bool_):
            key = key.item()
        if not isinstance(key, str | int | float) or isinstance(key, bool):
            text = f"a dict with the key {_short_repr(key)[:60]} of type {type(key).__name__}"
            return {
                "t": "opaque",
                "type": "dict",
                "repr": f"{text}: keys must be str, int or float",
            }
        items.append([encode(key, depth + 1), encode(item, depth + 1)])
    return {"t": "dict", "v": items}


def _encode_int(value: int) -> dict[str, Any]:
    if value.bit_length() > MAX_DIGITS * 3.33:  # surely longer (and str() has its own limit)
        return _too_large("int", f"an int of about {int(value.bit_length() * 0.30103)} digits")
    text = str(value)
    if len(text.lstrip("-")) > MAX_DIGITS:
        return _too_large("int", f"an int of {len(text.lstrip('-'))} digits")
    return {"t": "int", "v": text}


def _too_large(type_name: str, what: str) -> dict[str, Any]:
    return {"t": "opaque", "type": type_name, "repr": f"{what}, more than the grader accepts"}


def _short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as error:  # a repr that raises still names the type
        text = f"(repr failed: {type(error).__name__})"
    return text[:REPR_CHARS]


def _encode_array(array: np.ndarray, type_name: str) -> dict[str, Any]:
    if array.dtype.kind not in "biufc":
        return {"t": "opaque", "type": type_name, "repr": f"array of dtype {array.dtype}"}
    if array.dtype.kind in "fc" and array.dtype.itemsize > (8 if array.dtype.kind == "f" else 16):
        array = array.astype(np.float64 if array.dtype.kind == "f" else np.complex128)
    if array.nbytes > MAX_BYTES:
        return _too_large(type_name, f"an array of {array.nbytes} bytes (shape {array.shape})")
    little = np.array(array, dtype=array.dtype.newbyteorder("<"), order="C", copy=True)
    return {
        "t": "ndarray",
        "dtype": little.dtype.str.lstrip("<|"),
        "shape": list(little.shape),
        "b64": base64.b64encode(little.tobytes()).decode("ascii"),
        "from": type_name,
    }


# -- decoding (in the grader) ------------------------------------------------------------------


class _Budget:
    """Counts what a reply costs, so that decoding stops at the limits."""

    def __init__(self) -> None:
        self.items = 0
        self.bytes = 0

    def spend(self, items: int = 1, size: int = 0) -> None:
        self.items += items
        self.bytes += size
        if self.items > MAX_ITEMS or self.bytes > MAX_BYTES:
            raise WireError("the reply is larger than the grader accepts")


def _text(node: dict[str, Any], key: str, budget: _Budget, limit: int = MAX_TEXT) -> str:
    value = node.get(key)
    if not isinstance(value, str) or len(value) > limit:
        raise WireError(f"field {key!r} must be a string of at most {limit} characters")
    budget.spend(size=len(value))
    return value


def _integer(node: dict[str, Any], key: str, budget: _Budget) -> int:
    text = _text(node, key, budget)
    if len(text) > MAX_DIGITS + 1 or not text.lstrip("-").isdigit():
        raise WireError("an int must be decimal digits")
    return int(text)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise WireError(f"not a number: {text[:40]!r}") from None


def decode(node: Any, depth: int = 0, budget: _Budget | None = None) -> Any:
    """The value :func:`encode` encoded; :class:`WireError` for anything malformed."""
    budget = budget or _Budget()
    if depth > MAX_DEPTH + 1:
        raise WireError("the reply is nested too deeply")
    if not isinstance(node, dict) or not isinstance(node.get("t"), str):
        raise WireError("every encoded value is an object with a type tag 't'")
    budget.spend()
    tag = node["t"]
    if tag == "none":
        return None
    if tag == "bool":
        if not isinstance(node.get("v"), bool):
            raise WireError("a bool must carry true or false")
        return node["v"]
    if tag == "int":
        return _integer(node, "v", budget)
    if tag == "float":
        return _number(_text(node, "v", budget))
    if tag == "fraction":
        numerator, denominator = _integer(node, "num", budget), _integer(node, "den", budget)
        if denominator <= 0:
            raise WireError("a fraction's denominator must be positive")
        return fractions.Fraction(numerator, denominator)
    if tag == "decimal":
        text = _text(node, "v", budget, limit=4000)
        try:
            return decimal.Decimal(text)
        except decimal.InvalidOperation:
            raise WireError(f"not a decimal number: {text[:40]!r}") from None
    if tag == "complex":
        return complex(_number(_text(node, "re", budget)), _number(_text(node, "im", budget)))
    if tag == "str":
        return _text(node, "v", budget)
    if tag in ("list", "tuple"):
        items = node.get("v")
        if not isinstance(items, list):
            raise WireError(f"a {tag} must carry a list")
        values = [decode(item, depth + 1, budget) for item in items]
        return values if tag == "list" else tuple(values)
    if tag == "dict":
        return _decode_dict(node, depth, budget)
    if tag == "ndarray":
        return _decode_array(node, budget)
    if tag == "opaque":
        return Opaque(_text(node, "type", budget)[:100], _text(node, "repr", budget)[:REPR_CHARS])
    raise WireError(f"unknown type tag {tag[:20]!r}")


def _decode_dict(node: dict[str, Any], depth: int, budget: _Budget) -> dict[Any, Any]:
    pairs = node.get("v")
    if not isinstance(pairs, list):
        raise WireError("a dict must carry a list of [key, value] pairs")
    result: dict[Any, Any] = {}
    for pair in pairs:
        if not isinstance(pair, list) or len(pair) != 2:
            raise WireError("a dict entry must be a [key, value] pair")
        key = decode(pair[0], depth + 1, budget)
        if not isinstance(key, str | int | float) or isinstance(key, bool):
            raise WireError("dict keys must be strings or numbers")
        result[key] = decode(pair[1], depth + 1, budget)
    return result


def _decode_array(node: dict[str, Any], budget: _Budget) -> np.ndarray:
    dtype = _text(node, "dtype", budget)
    if dtype not in ARRAY_DTYPES:
        raise WireError(f"arrays of dtype {dtype[:20]!r} do not cross")
    shape = node.get("shape")
    if not isinstance(shape, list) or len(shape) > 32:
        raise WireError("an array's shape must be a list of at most 32 sizes")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise WireError("an array's shape must hold non-negative integers")
    raw = base64.b64decode(_text(node, "b64", budget, limit=MAX_BYTES * 4 // 3 + 4), validate=True)
    kind = np.dtype(dtype)
    kind = kind.newbyteorder("<") if kind.itemsize > 1 else kind
    if math.prod(shape) * kind.itemsize != len(raw):
        raise WireError("an array's data does not match its shape and dtype")
    return np.frombuffer(raw, dtype=kind).reshape(shape).copy()


def as_sent(value: Any) -> Any:
    """``value`` as the grader receives it from a student's kernel: encoded, then decoded
    (arrays stay arrays, tensors become arrays, other objects :class:`Opaque`)."""
    return decode(encode(value))
