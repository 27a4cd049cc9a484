"""Compute against communication, drawn (lesson 12): the roofline of a processor and its memory,
and, for one MLP block, the time of each parallelism's collectives against the arithmetic they
are set against (:mod:`chainrule.costs.compute_cost`).

:func:`plot_compute_against_communication` draws three log-log panels: attained FLOP/s against
arithmetic intensity, ``min(F, I·B)``, with products of square matrices and an elementwise sum on
it; data parallelism's ``T_comm / T_backward`` against the tokens per rank; tensor parallelism's
``T_comm / T_math`` against the model's width. Below the line at 1 a collective hides (data
parallel) or costs less than the arithmetic (tensor parallel).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from chainrule.costs import compute_cost as kc

LINK_STYLES = ("-", "--", ":")
P_COLOURS = {2: "#1f77b4", 4: "#ff7f0e", 8: "#2ca02c", 16: "#d62728"}


def data_parallel_ratio(
    tokens_per_rank: float, hidden: int, world_size: int, machine: kc.Machine
) -> float:
    """``T_comm / T_backward`` of data parallelism's step, for ``tokens_per_rank`` tokens on each
    of ``world_size`` ranks (MLP width ``4·hidden``, bf16)."""
    P = world_size
    step = kc.step_time("data parallel", int(tokens_per_rank * P), hidden, 4 * hidden, P, machine)
    return step.comm / step.backward


def tensor_parallel_ratio(tokens: int, hidden: int, world_size: int, machine: kc.Machine) -> float:
    """``T_comm / T_math`` of tensor parallelism's step on ``tokens`` tokens (MLP width
    ``4·hidden``, bf16)."""
    step = kc.step_time("tensor parallel", tokens, hidden, 4 * hidden, world_size, machine)
    return step.comm / step.math


def plot_compute_against_communication(
    chip: kc.Machine,
    links: Mapping[str, kc.Machine],
    products: Sequence[int] = (64, 256, 1024, 16384),
    data_parallel_size: int = 8,
    tensor_parallel_sizes: Sequence[int] = (2, 4, 8),
    hidden: int = 4096,
    tokens: int = 8192,
) -> Figure:
    """The three panels (see the module docstring). ``chip`` gives F and the memory bandwidth;
    ``links`` names machines that differ in their network (α, B). Data parallelism is drawn for
    ``data_parallel_size`` ranks and width ``hidden`` on every link; tensor parallelism for
    ``tensor_parallel_sizes`` and ``tokens`` tokens, one line style per link."""
    figure = Figure(figsize=(13.0, 4.0))
    roof, data, tensor = figure.subplots(1, 3)

    # 1. the roofline
    grid = np.geomspace(0.05, 1e5, 200)
    roof.loglog(grid, [kc.attainable(i, chip.flops, chip.memory_bandwidth) / 1e12 for i in grid],
                color="#333333", lw=1.5)  # fmt: skip
    roof.axvline(chip.ridge, color="#999999", ls=":", lw=1)
    roof.text(chip.ridge * 1.2, 0.02, f"ridge F/B = {chip.ridge:.0f}", fontsize=9, color="#555555")
    sum_intensity = 1 / (3 * 2)  # one FLOP per two bf16 read and one written
    points = [("x + y", sum_intensity)] + [
        (f"{n}³", kc.intensity(kc.matmul_flops(n, n, n), kc.matmul_bytes(n, n, n)))
        for n in products
    ]
    for label, i in points:
        attained = kc.attainable(i, chip.flops, chip.memory_bandwidth) / 1e12
        roof.loglog([i], [attained], "o", color="#c44e52", ms=5)
        on_roof = attained >= chip.flops / 1e12
        roof.annotate(label, (i, attained), textcoords="offset points",
                      xytext=(-12, 7) if on_roof else (4, -12), fontsize=9)  # fmt: skip
    roof.set_ylim(0.01, 3 * chip.flops / 1e12)
    roof.set_xlabel("arithmetic intensity, FLOPs per byte", fontsize=9)
    roof.set_ylabel("attained TFLOP/s (bf16)", fontsize=9)
    roof.set_title(f"{chip.name}: min(F, I·B), products n×n·n×n", fontsize=9)

    # 2. data parallelism: the all-reduces against the backward
    per_rank = np.geomspace(64, 1 << 17, 60)
    for style, (name, machine) in zip(LINK_STYLES, links.items(), strict=False):
        data.loglog(per_rank, [data_parallel_ratio(t, hidden, data_parallel_size, machine)
                               for t in per_rank], style, color="#1f77b4", label=name)  # fmt: skip
        threshold = kc.data_parallel_tokens_to_hide(data_parallel_size, machine)
        data.loglog([threshold], [1.0], "o", color="#1f77b4", ms=5)
    data.axhline(1.0, color="#999999", lw=1)
    data.set_xlabel("tokens per rank", fontsize=9)
    data.set_ylabel("T_comm / T_backward", fontsize=9)
    data.set_title(f"data parallel, P = {data_parallel_size}, d = {hidden}: hidden below 1",
                   fontsize=9)  # fmt: skip
    data.legend(fontsize=9, frameon=False)

    # 3. tensor parallelism: the all-reduces against the arithmetic
    widths = np.geomspace(256, 65536, 60)
    for style, (name, machine) in zip(LINK_STYLES, links.items(), strict=False):
        for P in tensor_parallel_sizes:
            tensor.loglog(widths, [tensor_parallel_ratio(tokens, int(d), P, machine)
                                   for d in widths], style, color=P_COLOURS.get(P, "#555555"),
                          label=f"P = {P}, {name}")  # fmt: skip
    tensor.axhline(1.0, color="#999999", lw=1)
    tensor.set_xlabel("width d (MLP 4d)", fontsize=9)
    tensor.set_ylabel("T_comm / T_math", fontsize=9)
    tensor.set_title(f"tensor parallel, {tokens} tokens: cheaper below 1", fontsize=9)
    tensor.legend(fontsize=9, frameon=False, ncol=2)
    for ax in (roof, data, tensor):
        ax.tick_params(labelsize=9)
        ax.grid(True, which="major", alpha=0.3)
    figure.tight_layout()
    return figure
