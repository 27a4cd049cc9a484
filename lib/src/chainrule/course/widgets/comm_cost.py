"""What communication costs (lesson 12): measured collectives, the fitted α–β model, and the
bytes each parallelism moves per training step, read from the placements.

:func:`plot_fits` draws measured times against the fitted model, one panel per collective (or,
for a collective that gets no fit, against another collective's times).
:func:`step_communication` lists the collectives of one MLP block (``X W₁``, ``tanh``,
``· W₂``) under data, tensor or sequence parallelism, from the placements of its tensors
(:func:`chainrule.parallel.sharded.plan_matmul` and
:func:`chainrule.parallel.placement.transition`), with the bytes each moves per rank;
:func:`build_step_cost_widget` shows them for a model size and P, with the time the fitted model
predicts.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import ipywidgets  # type: ignore[import-untyped]
import numpy as np
from matplotlib.figure import Figure

from chainrule.costs import compute_cost as kc
from chainrule.costs.comm_cost import Fit, Measurement, alpha_beta_time, ring_bytes
from chainrule.course.widgets.live_widget import LiveWidget
from chainrule.parallel import sharded as sh
from chainrule.parallel.placement import Partial, Placement, Replicate, Shard, transition

PARALLELISMS = ("data parallel", "tensor parallel", "sequence parallel")
P_COLOURS = {2: "#1f77b4", 3: "#ff7f0e", 4: "#2ca02c", 8: "#d62728"}

# How each parallelism places the block's tensors: (input X, W₁, W₂, where the partial sums go).
PLACEMENTS: dict[str, tuple[Placement, Placement, Placement, Placement | None]] = {
    "data parallel": (Shard(0), Replicate(), Replicate(), None),
    "tensor parallel": (Replicate(), Shard(1), Shard(0), Replicate()),
    "sequence parallel": (Shard(0), Shard(1), Shard(0), Shard(0)),
}


def plot_fits(
    measurements: Sequence[Measurement],
    fits: Mapping[str, Fit],
    against: Mapping[str, str] | None = None,
) -> Figure:
    """One log-log panel per measured collective: its medians (dots), one colour per number of
    ranks, and the fitted model (lines, the fit's errors in the title) where ``fits`` has one;
    one that is not a fit (:attr:`~chainrule.costs.comm_cost.Fit.is_a_fit`) is titled so, with
    no α and B in its title.

    A collective without a fit is drawn against another one's measurements (``against``: op →
    op, open circles joined by dotted lines), e.g. gloo's reduce-scatter against its all-reduce.
    """
    against = dict(against or {})
    ops = list(dict.fromkeys(m.op for m in measurements))
    figure = Figure(figsize=(3.1 * len(ops), 3.5))
    axes = np.atleast_1d(figure.subplots(1, len(ops), sharey=True))
    for ax, op in zip(axes, ops, strict=True):
        fit, other = fits.get(op), against.get(op)
        for P in sorted({m.world_size for m in measurements if m.op == op}):
            colour = P_COLOURS.get(P, "#555555")
            mine = _series(measurements, op, P)
            sizes = np.array([m.nbytes for m in mine], dtype=float)
            ax.loglog(sizes, [m.seconds * 1e3 for m in mine], "o", color=colour, ms=4,
                      label=f"P = {P}")  # fmt: skip
            if fit is not None:
                grid = np.geomspace(sizes.min(), sizes.max(), 50)
                ax.loglog(grid, [fit.predict(n, P) * 1e3 for n in grid], "-", color=colour, lw=1)
            elif other is not None:
                theirs = _series(measurements, other, P)
                ax.loglog([m.nbytes for m in theirs], [m.seconds * 1e3 for m in theirs], "o:",
                          color=colour, ms=5, mfc="none", lw=1)  # fmt: skip
        name = op.replace("_", "-")
        if fit is not None:
            errors = (
                f"off by {fit.median_relative_error:.0%} (median), "
                f"{fit.max_relative_error:.0%} (max)"
            )
            title = (
                f"{name}: α = {fit.alpha * 1e6:.0f} µs, B = {fit.bandwidth / 1e9:.2g} GB/s\n"
                f"fit {errors}"
                if fit.is_a_fit
                else f"{name}: least squares, not a fit\n{errors}"
            )
        elif other is not None:
            title = f"{name}: no fit\nopen, dotted: {other.replace('_', '-')}"
        else:
            title = f"{name}: no fit"
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("N, bytes", fontsize=9)
        ax.tick_params(labelsize=9)
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_ylabel("milliseconds per call", fontsize=9)
    axes[0].legend(fontsize=9, frameon=False)
    figure.tight_layout()
    return figure


def _series(measurements: Sequence[Measurement], op: str, world_size: int) -> list[Measurement]:
    """The measurements of ``op`` on ``world_size`` ranks, by size."""
    mine = [m for m in measurements if m.op == op and m.world_size == world_size]
    return sorted(mine, key=lambda m: m.nbytes)


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
    """Bytes per rank and model time of one step, for each parallelism; with a processor's
    FLOP/s, also each rank's arithmetic and the step (:class:`~chainrule.costs.compute_cost.
    StepTime`)."""

    tokens: int
    hidden: int
    world_size: int
    rows: dict[str, list[tuple[str, str, str, float]]]
    seconds: dict[str, float]
    steps: dict[str, kc.StepTime] | None = None

    def total_bytes(self, parallelism: str) -> float:
        return sum(b for *_, b in self.rows[parallelism])


def step_cost(
    log2_tokens: int,
    hidden: int,
    world_size: int,
    alpha: float,
    bandwidth: float,
    flops: float | None = None,
) -> StepCost:
    """The three parallelisms for ``2**log2_tokens`` tokens, width ``hidden`` (MLP 4×), bf16;
    with ``flops`` (peak FLOP/s per rank), each step's arithmetic against its collectives by
    :func:`chainrule.costs.compute_cost.step_time`."""
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
    steps = None
    if flops is not None:
        machine = kc.Machine("", flops, float("inf"), link_bandwidth=bandwidth, latency=alpha)
        steps = {
            name: kc.step_time(name, tokens, hidden, 4 * hidden, world_size, machine)
            for name in PARALLELISMS
        }
    return StepCost(tokens, hidden, world_size, rows, seconds, steps)


def _mib(nbytes: float) -> str:
    return f"{nbytes / (1 << 20):,.1f}"


def step_table(cost: StepCost) -> str:
    """HTML: per parallelism, the collectives of a step (forward, backward), MiB per rank and the
    model's time; single-spaced, and no header wraps."""
    rows = []
    for name, comm in cost.rows.items():
        passes = [
            ", ".join(f"{op.replace('_', '-')} of {on}" for p, op, on, _ in comm if p == when)
            or "none"
            for when in ("forward", "backward")
        ]  # fmt: skip
        row = [name, *passes, _mib(cost.total_bytes(name)), f"{cost.seconds[name] * 1e3:.3g}"]
        if cost.steps is not None:
            step = cost.steps[name]
            row += [
                f"{step.math * 1e3:.3g}",
                f"{step.overlapped * 1e3:.3g}",
                "yes" if step.hidden else "no",
            ]
        rows.append(row)
    head = (
        f"<p style='margin: 0 0 4px 0; line-height: 1.4'>One MLP block (d = {cost.hidden}, "
        f"MLP width 4d, bf16), {cost.tokens:,} tokens, P = {cost.world_size}.</p>"
    )
    header = ["parallelism", "forward", "backward", "MiB per rank", "T_comm, ms"]
    if cost.steps is not None:
        header += ["T_math, ms", "step, ms", "hidden"]
    return head + compact_table(header, rows)


def compact_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """An HTML table at the text's own line height (a widget's HTML sets a taller one, which
    double-spaces a plain table), its headers on one line each."""
    line = "padding: 1px 10px; text-align: left; line-height: 1.35"
    head = "".join(
        f'<th style="{line}; white-space: nowrap">{html.escape(str(h))}</th>' for h in header
    )
    body = "".join(
        "<tr>" + "".join(f'<td style="{line}">{html.escape(str(c))}</td>' for c in row) + "</tr>"
        for row in rows
    )
    return (
        f'<table style="border-collapse: collapse; line-height: 1.35">'
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
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


def build_step_cost_widget(
    alpha: float, bandwidth: float, flops: float | None = None
) -> LiveWidget:
    """Sliders for the tokens per step (2^8 to 2^16), the width and P; the network's α and B,
    and with ``flops`` the processor's peak, for the step's arithmetic."""

    def compute(log2_tokens: int, hidden: int, world_size: int) -> StepCost:
        return step_cost(log2_tokens, hidden, world_size, alpha, bandwidth, flops)

    controls = {
        "log2_tokens": ipywidgets.IntSlider(value=12, min=8, max=16, description="log₂ tokens"),
        "hidden": ipywidgets.Dropdown(
            options=[512, 1024, 2048, 4096, 8192], value=2048, description="width d"
        ),  # fmt: skip
        "world_size": ipywidgets.IntSlider(value=4, min=2, max=16, description="ranks P"),
    }
    return LiveWidget(controls, compute, step_table, plot_step_cost)
