"""Activation memory against recomputation, measured on the engine (the recomputation lesson).

:func:`mlp_step` trains one step of a tanh MLP of ``depth`` layers cut into ``segments``
checkpointed segments (:func:`chainrule.engine.recompute.checkpoint_sequential`) and measures
it (:func:`chainrule.engine.memory.measure_step`): the activation bytes stored when the backward
starts, the peak during it, and the forward work done again. :func:`trade` does so for every
number of segments from 1 to ``depth``; :func:`plot_trade` draws the bytes and the extra work
against the number of segments, the chosen one marked; :func:`build_recompute_widget` chooses
the depth and the segments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ipywidgets  # type: ignore[import-untyped]
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from chainrule.course.widgets.live_widget import LiveWidget
from chainrule.course.widgets.tables import html_table
from chainrule.engine import ops
from chainrule.engine.layers import MLP
from chainrule.engine.memory import StepMeasurement, measure_step
from chainrule.engine.recompute import checkpoint_sequential
from chainrule.engine.tensor import Tensor

ROWS, WIDTH = 32, 16
"""The batch rows and the width of every layer of the measured MLP."""
MAX_DEPTH = 36


def mlp_step(depth: int, segments: int | None, rows: int = ROWS, width: int = WIDTH) -> tuple[
    StepMeasurement, list[np.ndarray]
]:  # fmt: skip
    """One forward and backward pass of a tanh MLP of ``depth`` layers of ``width`` on a batch
    of ``rows``, loss ``Σ y²``: plain (``segments=None``) or in ``segments`` checkpointed
    segments. The measurement and the parameters' gradients (the same seed every time)."""
    rng = np.random.default_rng(0)
    mlp = MLP([width] * (depth + 1), rng)
    x = Tensor(rng.standard_normal((rows, width)))
    layers = [lambda t, layer=layer: ops.tanh(layer(t)) for layer in mlp.layers]

    def loss() -> Tensor:
        y = x
        if segments is None:
            for layer in layers:
                y = layer(y)
        else:
            y = checkpoint_sequential(layers, segments, x)
        return (y * y).sum()

    measured = measure_step(loss)
    return measured, [p.grad for p in mlp.parameters() if p.grad is not None]


@dataclass(frozen=True)
class Trade:
    """For a depth, the measurement at every number of segments 1 … depth, and the chosen one
    (``requested``, at most ``depth``: a segment holds at least one layer)."""

    depth: int
    segments: int
    by_segments: dict[int, StepMeasurement]
    requested: int

    @property
    def chosen(self) -> StepMeasurement:
        return self.by_segments[self.segments]

    def extra_work(self, segments: int) -> float:
        """Operations evaluated again in the backward, per operation of the forward."""
        m = self.by_segments[segments]
        return m.recomputed_ops / m.forward_ops

    @property
    def lowest_peak(self) -> int:
        """The number of segments whose peak is lowest (the fewest, at a tie)."""
        return min(self.by_segments, key=lambda k: (self.by_segments[k].peak_bytes, k))


def trade(depth: int, segments: int) -> Trade:
    """Measure the MLP of ``depth`` layers at every number of segments; ``segments`` chosen
    (more segments than layers means one layer per segment)."""
    if depth < 1 or segments < 1:
        raise ValueError(f"the depth and the segments must be at least 1, not {depth}, {segments}")
    by_segments = {k: mlp_step(depth, k)[0] for k in range(1, depth + 1)}
    return Trade(depth, min(segments, depth), by_segments, segments)


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def kilobytes(nbytes: float) -> str:
    return f"{nbytes / 1e3:.1f}"


def render_table(result: Trade) -> str:
    plain = result.by_segments[1]
    m = result.chosen
    rows: list[list[object]] = [
        ["activations stored when the backward starts, kB", kilobytes(plain.saved_bytes),
         kilobytes(m.saved_bytes)],
        ["peak during the backward, kB", kilobytes(plain.peak_bytes), kilobytes(m.peak_bytes)],
        ["operations of the forward", plain.forward_ops, m.forward_ops],
        ["operations run again in the backward", plain.recomputed_ops, m.recomputed_ops],
        ["extra forward work", f"{result.extra_work(1):.0%}",
         f"{result.extra_work(result.segments):.0%}"],
    ]  # fmt: skip
    header = ["", "1 segment (nothing recomputed)", plural(result.segments, "segment")]
    capped = (
        f" (k = {result.requested} is more than the L = {result.depth} layers: one layer per "
        "segment)"
        if result.requested > result.depth
        else ""
    )
    note = (
        f"<p>Lowest peak at {plural(result.lowest_peak, 'segment')}; "
        f"√L = {math.sqrt(result.depth):.1f}{capped}.</p>"
    )
    return html_table(header, rows) + note


def plot_trade(result: Trade) -> Figure:
    """Bytes (stored and peak) against the number of segments, and the extra forward work on a
    second axis; the chosen number of segments marked."""
    ks = sorted(result.by_segments)
    stored = [result.by_segments[k].saved_bytes / 1e3 for k in ks]
    peak = [result.by_segments[k].peak_bytes / 1e3 for k in ks]
    work = [100 * result.extra_work(k) for k in ks]
    figure = Figure(figsize=(8.6, 3.5))
    ax = figure.add_subplot()
    ax.plot(ks, stored, "o-", color="#1f77b4", ms=4, lw=1.2, label="stored at the backward's start")
    ax.plot(ks, peak, "s-", color="#d62728", ms=4, lw=1.2, label="peak during the backward")
    ax.axvline(result.segments, color="#555555", ls=":", lw=1)
    ax.plot([result.segments], [result.chosen.peak_bytes / 1e3], "s", color="#d62728", ms=9,
            mfc="none", mew=1.5)  # fmt: skip
    ax.set_xlabel(f"segments k (depth L = {result.depth}, √L = {math.sqrt(result.depth):.1f})",
                  fontsize=9)  # fmt: skip
    ax.set_ylabel("activations, kB", fontsize=9)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, 1.1 * max(peak))
    ax.tick_params(labelsize=9)
    ax.grid(True, alpha=0.3)
    twin = ax.twinx()
    twin.plot(ks, work, "^--", color="#2ca02c", ms=4, lw=1.2, label="forward work done again")
    twin.set_ylabel("extra forward work, %", fontsize=9)
    twin.set_ylim(0, 110)
    twin.tick_params(labelsize=9)
    lines = ax.get_lines()[:2] + twin.get_lines()
    ax.legend(lines, [str(line.get_label()) for line in lines], fontsize=9, frameon=False,
              loc="upper left", bbox_to_anchor=(1.12, 1.0))  # fmt: skip
    ax.set_title(
        f"k = {result.segments}: stored {kilobytes(result.chosen.saved_bytes)} kB, peak "
        f"{kilobytes(result.chosen.peak_bytes)} kB, "
        f"{result.extra_work(result.segments):.0%} more forward work",
        fontsize=10,
    )
    figure.tight_layout()
    return figure


def build_recompute_widget(depth: int = 16, segments: int = 4) -> LiveWidget:
    """Sliders for the depth L and the number of checkpointed segments k (a k above L counts as
    L: one layer per segment)."""
    controls = {
        "depth": ipywidgets.IntSlider(value=depth, min=2, max=MAX_DEPTH, description="depth L"),
        "segments": ipywidgets.IntSlider(
            value=segments, min=1, max=MAX_DEPTH, description="segments k"
        ),
    }
    return LiveWidget(controls, trade, render_table, plot_trade)
