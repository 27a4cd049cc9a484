"""Memory per rank and communication per step of the ZeRO stages (lesson 13).

:func:`zero_memory` computes, for Ψ parameters on P ranks, the bytes each rank holds at every
stage (split into parameters, gradients and optimizer state, by
:func:`chainrule.parallel.zero.memory_model`) and the bytes it sends per step (by
:func:`chainrule.parallel.zero.communication`, the placements priced by the ring model);
:func:`plot_zero_memory` draws them as stacked bars against one device's memory, and
:func:`build_zero_memory_widget` puts Ψ, P and the optimizer on controls.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

import ipywidgets  # type: ignore[import-untyped]
import numpy as np
from matplotlib.figure import Figure

from chainrule.course.widgets.live_widget import LiveWidget
from chainrule.parallel import zero

GB = 1e9
OPTIMIZERS: dict[str, tuple[int, int, int]] = {
    "mixed-precision Adam (2 + 2 + 12 bytes)": zero.ADAM_MIXED_PRECISION,
    "SGD with momentum, fp32 (4 + 4 + 4 bytes)": (4, 4, 4),
}
"""Bytes per parameter of (parameters, gradients, optimizer state)."""
PARTS = ("parameters", "gradients", "optimizer state")
COLOURS = ("#7a9cc6", "#e39b54", "#76b37a")
SHARDED = {0: "nothing", 1: "optimizer state", 2: "+ gradients", 3: "+ parameters"}
STAGE_LABELS = {s: f"stage {s}: {SHARDED[s]} sharded" for s in zero.STAGES}
DEVICE_GB = 80.0
"""The memory of one accelerator the picture compares with (an 80 GB GPU)."""
RANK_CHOICES = tuple(2**k for k in range(11))
"""The numbers of ranks the widget offers: the powers of two from 1 to 1024."""


@dataclass(frozen=True)
class ZeroMemory:
    """Per stage: (parameters, gradients, optimizer state) bytes per rank, and the collectives
    of one step as ``(pass, collective, tensor, bytes sent per rank)``."""

    psi: float
    world_size: int
    optimizer: str
    held: dict[int, tuple[float, float, float]]
    sent: dict[int, list[tuple[str, str, str, float]]]

    def total(self, stage: int) -> float:
        return sum(self.held[stage])

    def sent_bytes(self, stage: int) -> float:
        return sum(b for *_, b in self.sent[stage])


def zero_memory(psi: float, world_size: int, optimizer: str) -> ZeroMemory:
    """Every stage for ``psi`` parameters on ``world_size`` ranks. Gradients and gathered
    parameters travel at the width of the parameters (b_θ bytes each)."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {list(OPTIMIZERS)}")
    widths = OPTIMIZERS[optimizer]
    held = {s: zero.memory_model(psi, world_size, s, widths) for s in zero.STAGES}
    sent = {s: zero.communication(s, psi * widths[0], world_size) for s in zero.STAGES}
    return ZeroMemory(psi, world_size, optimizer, held, sent)


def gigabytes(nbytes: float) -> str:
    """GB with three significant figures, whole GB from 100 on: ``12.3``, ``2,800``."""
    value = nbytes / GB
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def compact_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """An HTML table with one line per row: no wrapping, little padding, tight lines (the
    notebook's own table style spaces rows far apart)."""
    cell = "padding: 1px 8px; line-height: 1.3; white-space: nowrap; text-align: left"
    head = "".join(f'<th style="{cell}">{html.escape(str(h))}</th>' for h in header)
    body = "".join(
        "<tr>" + "".join(f'<td style="{cell}">{html.escape(str(c))}</td>' for c in row) + "</tr>"
        for row in rows
    )
    table = '<table style="border-collapse: collapse">'
    return f"{table}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def zero_table(result: ZeroMemory) -> str:
    """HTML: per stage, what is sharded, GB per rank by part and in all, and the traffic (at
    P = 1 there is none: no collective runs)."""
    base = result.sent_bytes(0)
    alone = result.world_size == 1
    rows = []
    for s in zero.STAGES:
        collectives = ", ".join(f"{op.replace('_', '-')} {t}" for _, op, t, _ in result.sent[s])
        ratio = f"{result.sent_bytes(s) / base:.2g}×" if base else "–"
        rows.append(
            (s, SHARDED[s], *(gigabytes(b) for b in result.held[s]), gigabytes(result.total(s)),
             "yes" if result.total(s) <= DEVICE_GB * GB else "no",
             "none" if alone else collectives, gigabytes(result.sent_bytes(s)), ratio)
        )  # fmt: skip
    sent = (
        "One rank: nothing is communicated, 0 bytes sent."
        if alone
        else "Stage 3 gathers θ in the forward and again in the backward."
    )
    head = (
        '<p style="margin: 0 0 4px 0; line-height: 1.4">'
        f"Ψ = {result.psi / 1e9:g} billion parameters on "
        f"P = {result.world_size} rank{'' if alone else 's'}, {result.optimizer}. GB per rank "
        f"(10⁹ bytes) held, and sent per step. {sent}</p>"
    )
    return head + compact_table(
        ["stage", "sharded", "θ", "g", "opt. state", "total", f"≤ {DEVICE_GB:g} GB",
         "collectives per step", "GB sent", "× stage 0"],
        rows,
    )  # fmt: skip


def smallest_fitting_ranks(
    psi: float, stage: int, optimizer: str, choices: Sequence[int] = RANK_CHOICES
) -> int | None:
    """The smallest P of ``choices`` at which ``psi`` parameters fit one device at ``stage``
    (by :func:`chainrule.parallel.zero.memory_model`), or None if none does."""
    widths = OPTIMIZERS[optimizer]
    for P in choices:
        if sum(zero.memory_model(psi, P, stage, widths)) <= DEVICE_GB * GB:
            return P
    return None


def plot_zero_memory(result: ZeroMemory) -> Figure:
    """Stacked bars: GB per rank of each stage, by part, with a line at one device's memory."""
    figure = Figure(figsize=(8.8, 3.4))
    ax = figure.add_subplot()
    stages = np.array(zero.STAGES)
    bottom = np.zeros(len(stages))
    for i, (part, colour) in enumerate(zip(PARTS, COLOURS, strict=True)):
        values = np.array([result.held[s][i] / GB for s in stages])
        ax.bar(stages, values, bottom=bottom, color=colour, label=part, width=0.6)
        bottom += values
    top = float(bottom.max())
    for s, total in zip(stages, bottom, strict=True):
        ax.text(s, total + 0.02 * top, f"{gigabytes(total * GB)} GB", ha="center", va="bottom",
                fontsize=9)  # fmt: skip
    if DEVICE_GB < 1.25 * top:
        ax.axhline(DEVICE_GB, color="#b22222", ls="--", lw=1, label=f"one {DEVICE_GB:g} GB device")
    ax.set_xticks(stages, [f"stage {s}\n{SHARDED[s]}" for s in stages], fontsize=9)
    ax.set_ylabel("GB per rank", fontsize=9)
    ax.set_ylim(0, 1.18 * top)
    ax.tick_params(labelsize=9)
    ax.legend(fontsize=9, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"Ψ = {result.psi / 1e9:g} B parameters, P = {result.world_size}", fontsize=10)
    figure.tight_layout()
    return figure


def build_zero_memory_widget(
    sizes: Sequence[float] = (1.5, 7.5, 13.0, 70.0, 175.0),
) -> LiveWidget:
    """Controls: Ψ (billions), P (the powers of two from 1 to 1024) and the optimizer's bytes
    per parameter."""

    def compute(billions: float, ranks: int, optimizer: str) -> ZeroMemory:
        return zero_memory(billions * 1e9, ranks, optimizer)

    controls = {
        "billions": ipywidgets.Dropdown(
            options=[(f"{s:g} billion", s) for s in sizes], value=7.5, description="Ψ"
        ),
        "ranks": ipywidgets.SelectionSlider(
            options=list(RANK_CHOICES), value=64, description="ranks P"
        ),
        "optimizer": ipywidgets.Dropdown(
            options=list(OPTIMIZERS), value=next(iter(OPTIMIZERS)), description="optimizer"
        ),
    }
    return LiveWidget(controls, compute, zero_table, plot_zero_memory)


def plot_memory_against_p(
    measured: dict[int, dict[int, zero.MeasuredMemory]], psi: int, itemsize: int = 8
) -> Figure:
    """Bytes per rank against P, one colour per stage: the model of the model states (lines,
    Ψ unpadded, ``itemsize`` bytes for parameters, gradients and the momentum), and what rank
    0 allocated, measured: held after a step (crosses) and the peak during it (dots)."""
    figure = Figure(figsize=(8.4, 3.6))
    ax = figure.add_subplot()
    colours = ("#555555", "#1f77b4", "#ff7f0e", "#2ca02c")
    for stage, colour in zip(zero.STAGES, colours, strict=True):
        ranks = sorted(measured[stage])
        grid = np.arange(1, max(ranks) + 1)
        model = [sum(zero.memory_model(psi, int(P), stage, (itemsize,) * 3)) / 1e6 for P in grid]
        ax.plot(grid, model, "-", color=colour, lw=1, label=f"{STAGE_LABELS[stage]} (model)")
        ax.plot(ranks, [measured[stage][P].held / 1e6 for P in ranks], "x", color=colour, ms=6)
        ax.plot(ranks, [measured[stage][P].peak / 1e6 for P in ranks], "o", color=colour, ms=5)
    ax.plot([], [], "kx", ms=6, label="measured: held after the step")
    ax.plot([], [], "ko", ms=5, label="measured: peak during the step")
    ax.set_xlabel("ranks P", fontsize=9)
    ax.set_ylabel("MB per rank (10⁶ bytes)", fontsize=9)
    ax.set_ylim(0, None)
    ax.tick_params(labelsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    return figure
