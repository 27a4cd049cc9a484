"""A thin live view: controls feed a plain function, its result is shown as a table and a plot.

Every widget of lessons 4–7 has the same shape: a few ipywidgets controls, one tested function
that turns their values into a result, and a rendering of that result as HTML (a table) and,
optionally, a matplotlib figure. :class:`LiveWidget` wires those together so that a test can
drive it without a browser::

    w = build_token_weight_widget()
    w.controls["T_1"].value = 600        # any change recomputes
    w.last_result                        # the new result object
    w.table.value                        # the new HTML table
    w.plot.value                         # the new PNG bytes (b"" when there is no plot)

Figures are drawn on :class:`matplotlib.figure.Figure` objects (no pyplot state) and shown as a
PNG in an :class:`ipywidgets.Image`, so the widget needs no interactive matplotlib backend.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets
from matplotlib.figure import Figure


def figure_png(figure: Figure, dpi: int = 100) -> bytes:
    """The figure rendered as PNG bytes."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    return buffer.getvalue()


class LiveWidget(ipywidgets.VBox):
    """Controls on top, then the HTML table, then the plot; recomputed on every change.

    ``controls`` maps keyword names of ``compute`` to value widgets (sliders, dropdowns...);
    ``compute(**values)`` returns a result, ``render_table(result)`` an HTML string and
    ``render_figure(result)`` (optional) a matplotlib Figure. Attributes a test reads:
    ``controls``, ``last_result``, ``table`` (:class:`ipywidgets.HTML`), ``plot``
    (:class:`ipywidgets.Image`, or ``None`` without a figure) and ``error`` (the message of
    the last failed computation, ``""`` when it succeeded).
    """

    def __init__(
        self,
        controls: Mapping[str, ipywidgets.ValueWidget],
        compute: Callable[..., Any],
        render_table: Callable[[Any], str],
        render_figure: Callable[[Any], Figure] | None = None,
    ) -> None:
        self.controls = dict(controls)
        self.compute = compute
        self.render_table = render_table
        self.render_figure = render_figure
        self.table = ipywidgets.HTML()
        self.plot = (
            # flex-start: keep the PNG at its own size instead of stretching it to the row
            ipywidgets.Image(format="png", layout=ipywidgets.Layout(align_self="flex-start"))
            if render_figure is not None
            else None
        )
        self.last_result: Any = None
        self.error = ""
        parts: list[ipywidgets.Widget] = [ipywidgets.HBox(list(self.controls.values())), self.table]
        if self.plot is not None:
            parts.append(self.plot)
        super().__init__(parts)
        for control in self.controls.values():
            control.observe(self._changed, names="value")
        self.update()

    def values(self) -> dict[str, Any]:
        """The controls' current values, by keyword name."""
        return {name: control.value for name, control in self.controls.items()}

    def update(self) -> Any:
        """Recompute from the controls and redraw; return the new result.

        A computation that raises ``ValueError`` (an impossible combination of controls) keeps
        the last good result and shows the message instead of the table.
        """
        try:
            result = self.compute(**self.values())
        except ValueError as exc:
            self.error = str(exc)
            self.table.value = f"<p><b>Not possible:</b> {exc}</p>"
            return self.last_result
        self.error = ""
        self.last_result = result
        self.table.value = self.render_table(result)
        if self.plot is not None and self.render_figure is not None:
            figure = self.render_figure(result)
            self.plot.value = figure_png(figure)
        return result

    def _changed(self, change: dict[str, Any]) -> None:
        self.update()


def html_table(header: list[str], rows: list[list[Any]]) -> str:
    """A plain HTML table (cells converted with ``str``)."""
    cell = 'style="padding: 2px 12px; text-align: left"'
    head = "".join(f"<th {cell}>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td {cell}>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table (cells converted with ``str``), for ``IPython.display.Markdown``."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
