"""Tables and numbers as the lessons print them: Markdown for a notebook, HTML for a widget.

Formatting lives here so that a lesson's code cells stay about the idea: a cell computes,
then hands its rows to :func:`markdown_table` (or :func:`show_table`) in one line.
"""

from __future__ import annotations

import html
import math
import re
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


_MATH = re.compile(r"(\$\$.+?\$\$|\$[^$]+\$)", re.DOTALL)
_ALIGNMENTS = {"left": ":---", "right": "---:", "center": ":---:", None: "---"}


def markdown_cell(value: Any) -> str:
    """``str(value)`` made safe for one cell of a Markdown table.

    A ``|`` would end the cell (``(1/|B|) Σ ∇ℓ`` would lose everything after ``(1/``), so it
    is written ``\\|`` in text. Inside ``$…$`` math, where JupyterLab hands the source to
    MathJax untouched and ``\\|`` would mean ``‖``, it is written ``\\vert`` (and ``\\|``,
    the norm bars, ``\\Vert``): no bare ``|`` is left for the table to split on.
    """
    parts = _MATH.split(str(value))
    for i, part in enumerate(parts):
        if i % 2:  # math
            part = part.replace("\\|", "\\Vert{}")
            parts[i] = re.sub(r"(?<!\\)\|", r"\\vert{}", part)
        else:
            parts[i] = re.sub(r"(?<!\\)\|", r"\\|", part)
    return "".join(parts)


def markdown_table(
    header: Sequence[str],
    rows: Sequence[Sequence[Any]],
    align: Sequence[str | None] | None = None,
) -> str:
    """A Markdown table (cells converted with ``str``), for ``IPython.display.Markdown``.

    Every cell goes through :func:`markdown_cell`, so a ``|`` in it stays in it. ``align``
    gives each column ``"left"``, ``"right"``, ``"center"`` or ``None`` (the renderer's
    default); a header and its column's cells then line up the same way.
    """
    if align is not None and len(align) != len(header):
        raise ValueError(f"{len(header)} columns but {len(align)} alignments: {list(align)}")
    rule = [_ALIGNMENTS[a] for a in (align or [None] * len(header))]
    lines = [
        "| " + " | ".join(markdown_cell(h) for h in header) + " |",
        "|" + "".join(f"{r}|" for r in rule),
    ]
    lines += ["| " + " | ".join(markdown_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def show_table(
    header: Sequence[str],
    rows: Sequence[Sequence[Any]],
    align: Sequence[str | None] | None = None,
) -> Any:
    """:func:`markdown_table` as a displayable Markdown object (the value of a cell)."""
    from IPython.display import Markdown

    return Markdown(markdown_table(header, rows, align))


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
