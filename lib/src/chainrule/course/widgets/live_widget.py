"""A thin live view: controls feed a plain function, its result is shown as a table and a plot.

Every widget of the lessons has the same shape: a few ipywidgets controls, one tested function
that turns their values into a result, and a rendering of that result as HTML (a table) and,
optionally, a matplotlib figure. :class:`LiveWidget` wires those together so that a test can
drive it without a browser::

    w = build_fp16_widget()
    w.controls["k"].value = 16           # any change recomputes
    w.last_result                        # the new result object
    w.table.value                        # the new HTML table
    w.plot.value                         # the new PNG bytes

Figures are drawn on :class:`matplotlib.figure.Figure` objects (no pyplot state) and shown as a
PNG in an :class:`ipywidgets.Image`, so the widget needs no interactive matplotlib backend.

What is shown always belongs to the controls' current values: the plot is replaced before the
table, the table ends with a hidden ``chainrule-state`` element that records the values it was
computed from (a browser test compares it with the controls), and a combination of controls
that cannot be computed hides the plot instead of leaving the last one on the page.
"""

from __future__ import annotations

import html
import io
import json
from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets  # type: ignore[import-untyped]
from matplotlib.figure import Figure
from matplotlib.text import Text

CONTROL_WIDTH = "420px"
"""Every control is this wide, its description included: a slider a mouse can use."""


def figure_png(figure: Figure, dpi: int = 100) -> bytes:
    """The figure rendered as PNG bytes."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    return buffer.getvalue()


def canvas(width: float, height: float) -> tuple[Figure, Any]:
    """A figure of ``width`` × ``height`` points whose one axes, without frame, counts points."""
    figure = Figure(figsize=(width / 72, height / 72))
    ax = figure.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set(xlim=(0, width), ylim=(0, height))
    ax.axis("off")
    return figure, ax


def smallest_text_px(figure: Figure, png: bytes | None = None, display_width: float = 940) -> float:
    """The height in pixels of the smallest text of ``figure`` as the page shows its PNG.

    The PNG (``figure_png(figure)`` unless given) is shown at its own size, or shrunk to
    ``display_width`` pixels (see :data:`chainrule.course.graph.DISPLAY_WIDTH_PX`) when it is wider.
    """
    png = figure_png(figure) if png is None else png
    width = int.from_bytes(png[16:20], "big")
    scale = min(1.0, display_width / width)
    sizes = [
        float(t.get_fontsize())
        for t in figure.findobj(Text)
        if isinstance(t, Text) and t.get_text().strip() and t.get_visible()
    ]
    return min(sizes) / 72 * 100 * scale if sizes else float("inf")


def state_marker(values: Mapping[str, Any], error: str = "") -> str:
    """The hidden element that records which control values the table shows."""
    payload = html.escape(json.dumps({k: _plain(v) for k, v in values.items()}), quote=True)
    return (
        f'<div class="chainrule-state" hidden data-values="{payload}" '
        f'data-error="{html.escape(error, quote=True)}"></div>'
    )


def _plain(value: Any) -> Any:
    """A control's value as JSON: numbers and strings stay, anything else becomes its name."""
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return getattr(value, "__name__", str(value))


def sized(control: ipywidgets.ValueWidget) -> ipywidgets.ValueWidget:
    """``control`` made :data:`CONTROL_WIDTH` wide, with its whole description readable."""
    control.layout.width = CONTROL_WIDTH
    control.style.description_width = "initial"
    return control


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
        self.controls = {name: sized(control) for name, control in controls.items()}
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
        row = ipywidgets.Box(
            list(self.controls.values()),
            layout=ipywidgets.Layout(flex_flow="row wrap", grid_gap="4px 24px"),
        )
        parts: list[ipywidgets.Widget] = [row, self.table]
        if self.plot is not None:
            parts.append(self.plot)
        super().__init__(parts)
        self.add_class("chainrule-live")  # how a browser test finds the widget on the page
        for control in self.controls.values():
            control.observe(self._changed, names="value")
        self.update()

    def values(self) -> dict[str, Any]:
        """The controls' current values, by keyword name."""
        return {name: control.value for name, control in self.controls.items()}

    def update(self) -> Any:
        """Recompute from the controls and redraw; return the new result.

        A computation that raises ``ValueError`` (an impossible combination of controls) shows
        the message instead of the table and hides the plot; ``last_result`` keeps the last
        good result.
        """
        values = self.values()
        try:
            result = self.compute(**values)
        except ValueError as exc:
            self.error = str(exc)
            if self.plot is not None:
                self.plot.layout.display = "none"
            self.table.value = (
                f"<p><b>Not possible:</b> {html.escape(str(exc))}</p>"
                + state_marker(values, self.error)
            )
            return self.last_result
        self.error = ""
        self.last_result = result
        if self.plot is not None and self.render_figure is not None:
            self.plot.value = figure_png(self.render_figure(result))
            self.plot.layout.display = None
        self.table.value = self.render_table(result) + state_marker(values)
        return result

    def _changed(self, change: dict[str, Any]) -> None:
        self.update()
