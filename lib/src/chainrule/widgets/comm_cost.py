"""What communication costs (lesson 12): measured collectives, the fitted α–β model, and the
bytes each parallelism moves per training step, read from the placements.

:func:`plot_fits` draws measured times against the fitted model, one panel per collective.
:func:`step_communication` lists the collectives of one MLP block (``X W₁``, ``tanh``,
``· W₂``) under data, tensor or sequence parallelism, from the placements of its tensors
(:func:`chainrule.sharded.plan_matmul` and :func:`chainrule.placement.transition`), with the
bytes each moves per rank; :func:`build_step_cost_widget` shows them for a model size and P,
with the time the fitted model predicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import ipywidgets  # type: ignore[import-untyped]
import numpy as np
from matplotlib.figure import Figure

from chainrule import sharded as sh
from chainrule.comm_cost import Fit, Measurement, alpha_beta_time, ring_bytes
from chainrule.placement import Partial, Placement, Replicate, Shard, transition
from chainrule.widgets.live_widget import LiveWidget
from chainrule.widgets.tables import html_table

PARALLELISMS = ("data parallel", "tensor parallel", "sequence parallel")
P_COLOURS = {2: "#1f77b4", 3: "#ff7f0e", 4: "#2ca02c", 8: "#d62728"}

# How each parallelism places the block's tensors: (input X, W₁, W₂, where the partial sums go).
PLACEMENTS: dict[str, tuple[Placement, Placement, Placement, Placement | None]] = {
    "data parallel": (Shard(0), Replicate(), Replicate(), None),
    "tensor parallel": (Replicate(), Shard(1), Shard(0), Replicate()),
    "sequence parallel": (Shard(0), Shard(1), Shard(0), Shard(0)),
}


def plot_fits(measurements: Sequence[Measurement], fits: Mapping[str, Fit]) -> Figure:
    """One log-log panel per collective: measured medians (dots) and the fitted model (lines),
    one colour per number of ranks."""
    figure = Figure(figsize=(9.2, 3.3))
    axes = figure.subplots(1, len(fits), sharey=True)
    for ax, (op, fit) in zip(np.atleast_1d(axes), fits.items(), strict=True):
        rows = [m for m in measurements if m.op == op]
        for P in sorted({m.world_size for m in rows}):
            mine = sorted((m for m in rows if m.world_size == P), key=lambda m: m.nbytes)
            sizes = np.array([m.nbytes for m in mine], dtype=float)
            colour = P_COLOURS.get(P, "#555555")
            ax.loglog(sizes, [m.seconds * 1e3 for m in mine], "o", color=colour, ms=4,
                      label=f"P = {P}")  # fmt: skip
            grid = np.geomspace(sizes.min(), sizes.max(), 50)
            ax.loglog(grid, [fit.predict(n, P) * 1e3 for n in grid], "-", color=colour, lw=1)
        name = op.replace("_", "-")
        ax.set_title(
            f"{name}: α = {fit.alpha * 1e6:.0f} µs, B = {fit.bandwidth / 1e9:.2g} GB/s", fontsize=9
        )
        ax.set_xlabel("N, bytes", fontsize=9)
        ax.tick_params(labelsize=9)
        ax.grid(True, which="major", alpha=0.3)
    first = np.atleast_1d(axes)[0]
    first.set_ylabel("milliseconds per call", fontsize=9)
    first.legend(fontsize=9, frameon=False)
    figure.tight_layout()
    return figure


# -- bytes per step, from the placements -----------------------------------------------------------


def step_communication(
    parallelism: str, tokens: int, hidden: int, ffn: int, world_size: int, itemsize: int = 2
) -> list[tuple[str, str, str, float]]:
    """``(pass, collective, tensor, bytes per rank)`` of one step of the MLP block
    ``Y = tanh(X W₁) W₂`` with X of ``tokens × hidden``, W₁ of ``hidden × ffn`` and W₂ of
    ``ffn × hidden``, placed as :data:`PLACEMENTS` says (read from the two products' plans and
    the redistribution of the partial sums)."""
    x_place, w1_place, w2_place, reduce_to = PLACEMENTS[parallelism]
    if parallelism == "sequence parallel":
        x_step = transition(x_place, Replicate(), fan_out=True)  # into the block
        first = sh.plan_matmul(Replicate(), w1_place, a_fanned=True)
    else:
        x_step = None
        first = sh.plan_matmul(x_place, w1_place)
    assert first.output is not None
    second = sh.plan_matmul(first.output, w2_place)
    P = world_size
    x_bytes, y_bytes = tokens * hidden * itemsize, tokens * hidden * itemsize
    w1_bytes, w2_bytes = hidden * ffn * itemsize, ffn * hidden * itemsize
    found = []
    if x_step is not None:  # into the block: the forward collective first
        found += [
            ("forward", op, "X", b)
            for p, op, b in x_step.communication(x_bytes, P)
            if p == "forward"
        ]
    renamed = {"A": "X", "B": "W₁"}
    found += [(p, op, renamed[on], b) for p, op, on, b in first.communication(
        {"A": x_bytes, "B": w1_bytes}, P)]  # fmt: skip
    renamed = {"A": "H", "B": "W₂"}
    found += [(p, op, renamed[on], b) for p, op, on, b in second.communication(
        {"A": tokens * ffn * itemsize, "B": w2_bytes}, P)]  # fmt: skip
    if reduce_to is not None:
        assert isinstance(second.output, Partial)
        out = transition(second.output, reduce_to)
        found += [(p, op, "Y", b) for p, op, b in out.communication(y_bytes, P)]
    if x_step is not None:  # and its backward, last
        found += [
            ("backward", op, "X", b)
            for p, op, b in x_step.communication(x_bytes, P)
            if p == "backward"
        ]
    return found


@dataclass(frozen=True)
class StepCost:
    """Bytes per rank and model time of one step, for each parallelism."""

    tokens: int
    hidden: int
    world_size: int
    rows: dict[str, list[tuple[str, str, str, float]]]
    seconds: dict[str, float]

    def total_bytes(self, parallelism: str) -> float:
        return sum(b for *_, b in self.rows[parallelism])


def step_cost(
    log2_tokens: int, hidden: int, world_size: int, alpha: float, bandwidth: float
) -> StepCost:
    """The three parallelisms for ``2**log2_tokens`` tokens, width ``hidden`` (MLP 4×), bf16."""
    tokens = 2**log2_tokens
    rows = {
        name: step_communication(name, tokens, hidden, 4 * hidden, world_size)
        for name in PARALLELISMS
    }
    seconds = {}
    for name, comm in rows.items():
        seconds[name] = sum(
            alpha_beta_time(op, b / ring_bytes(op, 1.0, world_size), world_size, alpha, bandwidth)
            for _, op, _, b in comm
        )
    return StepCost(tokens, hidden, world_size, rows, seconds)


def _mib(nbytes: float) -> str:
    return f"{nbytes / (1 << 20):,.1f}"


def step_table(cost: StepCost) -> str:
    """HTML: per parallelism, the collectives of a step, MiB per rank and the model's time."""
    rows = []
    for name, comm in cost.rows.items():
        what = "; ".join(f"{p[0]}: {op.replace('_', '-')} of {on}" for p, op, on, _ in comm)
        rows.append((name, what, _mib(cost.total_bytes(name)), f"{cost.seconds[name] * 1e3:.1f}"))
    head = (
        f"<p>One MLP block (d = {cost.hidden}, MLP width 4d, bf16), {cost.tokens:,} tokens, "
        f"P = {cost.world_size}; f: forward, b: backward.</p>"
    )
    return head + html_table(
        ["parallelism", "collectives", "MiB per rank", "ms by the fitted model"], rows
    )


def plot_step_cost(cost: StepCost) -> Figure:
    """Bars: MiB per rank per step of each parallelism."""
    figure = Figure(figsize=(6.0, 2.6))
    ax = figure.add_subplot()
    values = [cost.total_bytes(name) / (1 << 20) for name in PARALLELISMS]
    bars = ax.barh(list(PARALLELISMS), values, color=["#7a9cc6", "#e39b54", "#76b37a"])
    ax.bar_label(bars, fmt="%.1f MiB", fontsize=9, padding=3)
    ax.set_xlabel("MiB sent per rank per step (one block)", fontsize=9)
    ax.tick_params(labelsize=9)
    ax.set_xlim(0, 1.3 * max(values))
    ax.invert_yaxis()
    figure.tight_layout()
    return figure


def build_step_cost_widget(alpha: float, bandwidth: float) -> LiveWidget:
    """Sliders for the tokens per step (2^8 to 2^16), the width and P; α and B from a fit."""

    def compute(log2_tokens: int, hidden: int, world_size: int) -> StepCost:
        return step_cost(log2_tokens, hidden, world_size, alpha, bandwidth)

    controls = {
        "log2_tokens": ipywidgets.IntSlider(value=12, min=8, max=16, description="log₂ tokens"),
        "hidden": ipywidgets.Dropdown(
            options=[512, 1024, 2048, 4096, 8192], value=2048, description="width d"
        ),  # fmt: skip
        "world_size": ipywidgets.IntSlider(value=4, min=2, max=16, description="ranks P"),
    }
    return LiveWidget(controls, compute, step_table, plot_step_cost)
