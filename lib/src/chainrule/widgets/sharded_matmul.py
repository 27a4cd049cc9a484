"""The sharded matrix product ``C = A · B``: which collective each placement needs (lesson 9).

:func:`matmul_case` plans the product for the chosen placements of A and B
(:func:`chainrule.sharded.plan_matmul`), optionally places C again afterwards, counts the bytes
every collective moves per rank for matrices of a given size, and runs the same product on a
simulated world of P ranks with a :class:`chainrule.dist.Trace`: the collectives seen in each
pass, and the largest difference from the product and gradients on one process.

:func:`plot_blocks` draws A, B and C as P × P grids of blocks coloured by the rank that holds
each block (grey: every rank holds it; striped: every rank holds an addend); for the invalid
case, C's off-diagonal blocks are computed by no rank. :func:`build_sharded_matmul_widget`
puts the placements and P on top.
"""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets  # type: ignore[import-untyped]
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from chainrule import dist
from chainrule import sharded as sh
from chainrule.placement import (
    Partial,
    Placement,
    Replicate,
    Shard,
    collective_text,
    parse_placement,
    transition,
)
from chainrule.tensor import Tensor
from chainrule.widgets.live_widget import LiveWidget
from chainrule.widgets.tables import html_table

RANK_COLOURS = ("#9ec5ec", "#f6c08f", "#9fd8a0", "#f0a3a3")
ALL_COLOUR = "#c8c8c8"
SUM_COLOUR = "#ddd0ee"
MISSING_COLOUR = "#f2f2f2"

PLACEMENT_CHOICES = ("Replicate()", "Shard(0)", "Shard(1)", "Partial()")
THEN_CHOICES = ("as computed", "Replicate()", "Shard(0)", "Shard(1)")


@dataclass(frozen=True)
class MatmulCase:
    """One choice of placements, planned, costed and run.

    ``plan`` is the :class:`chainrule.sharded.MatmulPlan`; ``output`` C's placement in the end
    (``None`` when invalid); ``communication`` the rows ``(pass, collective, on, bytes per
    rank)`` for matrices of ``sizes`` = (I, J, K) elements of ``itemsize`` bytes;
    ``seen_forward`` / ``seen_backward`` the collectives a run on ``world_size`` simulated
    ranks performed; ``error`` the largest difference of C, Ā and B̄ from one process.
    """

    plan: sh.MatmulPlan
    then: Placement | None
    output: Placement | None
    world_size: int
    sizes: tuple[int, int, int]
    itemsize: int
    communication: list[tuple[str, str, str, float]]
    seen_forward: list[str]
    seen_backward: list[str]
    error: float | None

    @property
    def bytes_forward(self) -> float:
        return sum(b for p, _, _, b in self.communication if p == "forward")

    @property
    def bytes_backward(self) -> float:
        return sum(b for p, _, _, b in self.communication if p == "backward")


def _addends(value: np.ndarray, parts: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``parts`` integer-valued arrays that add up to ``value``."""
    pieces = [rng.integers(-3, 4, value.shape).astype(float) for _ in range(parts - 1)]
    return [*pieces, value - sum(pieces, np.zeros_like(value))]


def _run_on_rank(
    a: Placement, b: Placement, then: Placement | None, A: np.ndarray, B: np.ndarray, G: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SPMD: C = A · B on placed tensors, a barrier, backward with the cotangent G of C."""
    rng = np.random.default_rng(1)
    world = dist.world_size()
    x = sh.from_local(sh.local_part(A, a, _addends(A, world, rng)), a, requires_grad=True)
    y = sh.from_local(sh.local_part(B, b, _addends(B, world, rng)), b, requires_grad=True)
    c = sh.matmul(x, y)
    if then is not None:
        c = sh.redistribute(c, then)
    dist.barrier()  # forward | backward
    if isinstance(c.placement, Partial):
        c.local.backward(G)  # a sum hands every addend the whole cotangent
    else:
        c.local.backward(sh.local_part(G, c.placement))
    dist.barrier()
    return c.full().data, x.full_grad(), y.full_grad()


def matmul_case(
    a: str,
    b: str,
    then: str = "as computed",
    world_size: int = 2,
    sizes: tuple[int, int, int] = (1024, 1024, 1024),
    itemsize: int = 4,
) -> MatmulCase:
    """Plan, cost and run ``C = A · B`` for the placements ``a`` of A and ``b`` of B on
    ``world_size`` ranks; ``then`` places C again afterwards (``"as computed"``: not)."""
    if not 2 <= world_size <= len(RANK_COLOURS):
        raise ValueError(f"choose between 2 and {len(RANK_COLOURS)} ranks, not {world_size}")
    plan = sh.plan_matmul(a, b)
    target = None if then == "as computed" else parse_placement(then)
    I, J, K = sizes
    communication = plan.communication({"A": I * J * itemsize, "B": J * K * itemsize}, world_size)
    if not plan.valid:
        return MatmulCase(plan, target, None, world_size, sizes, itemsize, [], [], [], None)
    assert plan.output is not None
    output = plan.output
    if target is not None and target != output:
        step = transition(output, target)
        communication += [
            (p, op, "C", b) for p, op, b in step.communication(I * K * itemsize, world_size)
        ]
        output = target
    # The same product on small integer matrices, traced.
    n = 2 * world_size
    rng = np.random.default_rng(0)
    A, B, G = (rng.integers(-3, 4, (n, n)).astype(float) for _ in range(3))
    trace = dist.Trace()
    results = dist.run(
        _run_on_rank, world_size, args=(plan.a, plan.b, target, A, B, G), trace=trace
    )
    x, y = Tensor(A, requires_grad=True), Tensor(B, requires_grad=True)
    (x @ y * Tensor(G)).sum().backward()
    assert x.grad is not None and y.grad is not None
    reference = (A @ B, x.grad, y.grad)
    error = max(
        float(np.abs(r - e).max()) for res in results for r, e in zip(res, reference, strict=True)
    )
    ops = trace.ops()
    first = ops.index("barrier")
    second = ops.index("barrier", first + 1)
    return MatmulCase(
        plan, target, output, world_size, sizes, itemsize, communication,
        ops[:first], ops[first + 1 : second], error,
    )  # fmt: skip


# -- rendering ----------------------------------------------------------------------------------


def _size(nbytes: float) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def case_table(case: MatmulCase) -> str:
    """HTML: the case and why, C's placement, every collective with its bytes, what ran."""
    plan = case.plan
    I, J, K = case.sizes
    head = f"<p><b>A {plan.a} · B {plan.b}: {plan.case}.</b> {plan.explanation}.<br>"
    if not plan.valid:
        return head + f"<b>Remedy:</b> {plan.remedy}.</p>"
    fans = ", ".join(plan.fan_outs)
    head += f"C is {case.output}." + (
        f" {fans} fans out into the per-rank product: its gradient is summed (all-reduce)."
        if fans
        else ""
    )
    head += "</p>"
    rows = [
        (p, op.replace("_", "-"), on, _size(nbytes)) for p, op, on, nbytes in case.communication
    ]
    table = html_table(
        ["pass", "collective", "on", f"bytes per rank (A {I}×{J}, B {J}×{K}, float32)"],
        rows or [("both", "none", "", "0")],
    )
    seen = (
        f"<p>On {case.world_size} simulated ranks the trace saw: forward "
        f"<b>{collective_text(case.seen_forward)}</b>, backward "
        f"<b>{collective_text(case.seen_backward)}</b>; largest difference of C, Ā, B̄ from one "
        f"process: {case.error:.1e}.</p>"
    )
    return head + table + seen


# Sizes of the block picture, in points (1/72 inch; the PNG has 100 pixels per inch).
CELL, GAP, LABEL_PT, TEXT_PT = 26.0, 34.0, 9.0, 8.0


def _holders(placement: Placement | None, block: tuple[int, int]) -> str | int | None:
    """Who holds block (i, j) of a P × P grid: a rank, "all", "sum" (addends), or None."""
    i, j = block
    if placement is None:
        return None
    if isinstance(placement, Replicate):
        return "all"
    if isinstance(placement, Partial):
        return "sum"
    return i if placement.axis == 0 else j


def _look(who: str | int | None) -> tuple[str, str]:
    """A block's colour and label: its rank's, every rank's, the addends', or nobody's."""
    if isinstance(who, int):
        return RANK_COLOURS[who], f"r{who}"
    if who == "all":
        return ALL_COLOUR, "all"
    if who == "sum":
        return SUM_COLOUR, "Σ"
    return MISSING_COLOUR, "✕"


def plot_blocks(case: MatmulCase) -> Figure:
    """A, B and C as P × P grids of blocks, coloured by the rank holding each block."""
    plan, P = case.plan, case.world_size
    invalid_free = not plan.valid and plan.case == "invalid" and isinstance(plan.a, Shard)
    invalid_free = invalid_free and isinstance(plan.b, Shard)
    grids = [("A[I, J]", plan.a), ("B[J, K]", plan.b), ("C[I, K]", case.output)]
    missing = "only the diagonal blocks" if invalid_free else "not computed"
    side = P * CELL
    width = 3 * side + 2 * GAP + 20
    legend_h = 20.0
    height = side + 34 + LABEL_PT * 1.4 + legend_h  # two lines of title above each grid
    figure = Figure(figsize=(width / 72, height / 72))
    ax = figure.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    for k, (title, placement) in enumerate(grids):
        x0 = 10 + k * (side + GAP)
        y0 = legend_h + 4
        ax.text(x0 + side / 2, y0 + side + 6, f"{title}\n{placement or missing}",
                ha="center", va="bottom", fontsize=LABEL_PT)  # fmt: skip
        for i in range(P):
            for j in range(P):
                who = _holders(placement, (i, j))
                if k == 2 and invalid_free:
                    who = i if i == j else None  # only the diagonal blocks are computed
                colour, label = _look(who)
                ax.add_patch(
                    Rectangle(
                        (x0 + j * CELL, y0 + (P - 1 - i) * CELL), CELL, CELL,
                        facecolor=colour, edgecolor="black", linewidth=0.6,
                    )
                )  # fmt: skip
                ax.text(x0 + (j + 0.5) * CELL, y0 + (P - 0.5 - i) * CELL, label,
                        ha="center", va="center", fontsize=TEXT_PT)  # fmt: skip
        if k < 2:
            ax.text(x0 + side + GAP / 2, y0 + side / 2, "·" if k == 0 else "=",
                    ha="center", va="center", fontsize=LABEL_PT + 5)  # fmt: skip
    ax.text(10, legend_h / 2,
            "rK: held by rank K   all: every rank   Σ: every rank holds an addend   "
            "✕: computed by no rank",
            ha="left", va="center", fontsize=LABEL_PT)  # fmt: skip
    return figure


def build_sharded_matmul_widget(
    a: str = "Shard(0)", b: str = "Replicate()", world_size: int = 2
) -> LiveWidget:
    """Controls: the placements of A and B, how C is placed afterwards, and P (2 to 4)."""
    controls = {
        "a": ipywidgets.Dropdown(options=PLACEMENT_CHOICES, value=a, description="A placed as"),
        "b": ipywidgets.Dropdown(options=PLACEMENT_CHOICES, value=b, description="B placed as"),
        "then": ipywidgets.Dropdown(
            options=THEN_CHOICES, value="as computed", description="then place C as"
        ),
        "world_size": ipywidgets.IntSlider(value=world_size, min=2, max=4, description="ranks P"),
    }
    return LiveWidget(controls, matmul_case, case_table, plot_blocks)
