"""Tables and numbers as the lessons print them: Markdown for a notebook, HTML for a widget.

Formatting lives here so that a lesson's code cells stay about the idea: a cell computes,
then hands its rows to :func:`markdown_table` (or :func:`show_table`) in one line.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any


def html_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain HTML table (cells converted with ``str`` and escaped)."""
    cell = 'style="padding: 2px 12px; text-align: left"'
    head = "".join(f"<th {cell}>{html.escape(str(h))}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td {cell}>{html.escape(str(c))}</td>" for c in row) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (cells converted with ``str``), for ``IPython.display.Markdown``."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def show_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> Any:
    """:func:`markdown_table` as a displayable Markdown object (the value of a cell)."""
    from IPython.display import Markdown

    return Markdown(markdown_table(header, rows))


def power_of_two(value: float) -> str:
    """``2^21`` for a power of two, else the number in plain digits: ``65504``, ``0.5``."""
    if value > 0 and math.isfinite(value):
        exponent = math.log2(value)
        if exponent == int(exponent) and abs(exponent) >= 4:
            return f"2^{int(exponent)}"
    return number(value)


def number(value: float, digits: int = 6) -> str:
    """A number without an exponent where that stays short: ``65504``, ``0.0123``, ``1.2e-07``."""
    if not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value)}"
    if 1e-3 <= abs(value) < 10**digits:
        return f"{value:.{digits}g}"
    return f"{value:.2e}"


def vector(values: Sequence[float] | Any, digits: int = 4) -> str:
    """``[0.1235, -1.2]``: every entry with ``digits`` significant digits."""
    return "[" + ", ".join(f"{float(v):.{digits}g}" for v in values) + "]"
