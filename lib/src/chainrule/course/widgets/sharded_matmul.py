"""The sharded matrix product ``C = A · B``: which collective each placement needs (lesson 9).

:func:`matmul_case` plans the product for the chosen placements of A and B
(:func:`chainrule.parallel.sharded.plan_matmul`), optionally places C again afterwards, counts the
bytes every collective moves per rank for matrices of a given size, and runs the same product on a
simulated world of P ranks with a :class:`chainrule.dist.Trace`: the collectives seen in each
pass, and the largest difference from the product and gradients on one process.

When one operand is sharded along the contracting dimension J and the other is not (case 2),
there are two remedies, and :func:`case_two_remedies` costs and runs both: gather the sharded
operand (what :func:`chainrule.parallel.sharded.matmul` does), or shard the other operand along J
too (a slice of a replicated one, an all-to-all of one sharded along its other dimension) and reduce
the partial sums of C. The first moves the gathered operand, the second the partial result:
which moves fewer bytes depends on their sizes.

:func:`plot_blocks` draws A, B and C as P × P grids of blocks coloured by the rank that holds
each block (grey: every rank holds it; striped: every rank holds an addend); for the invalid
case, C's off-diagonal blocks are computed by no rank. :func:`build_sharded_matmul_widget`
puts the placements, P and the number of rows of A and C on top.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import ipywidgets  # type: ignore[import-untyped]
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from chainrule import dist
from chainrule.costs.comm_cost import event_bytes
from chainrule.course.widgets.live_widget import LiveWidget, canvas
from chainrule.course.widgets.tables import html_table
from chainrule.engine.tensor import Tensor
from chainrule.parallel import sharded as sh
from chainrule.parallel.placement import (
    Partial,
    Placement,
    Replicate,
    Shard,
    collective_text,
    parse_placement,
    transition,
)

RANK_COLOURS = ("#9ec5ec", "#f6c08f", "#9fd8a0", "#f0a3a3")
ALL_COLOUR = "#c8c8c8"
SUM_COLOUR = "#ddd0ee"
MISSING_COLOUR = "#f2f2f2"

PLACEMENT_CHOICES = ("Replicate()", "Shard(0)", "Shard(1)", "Partial()")
THEN_CHOICES = ("as computed", "Replicate()", "Shard(0)", "Shard(1)")


def pass_bytes(communication: list[tuple[str, str, str, float]], name: str) -> float:
    """Bytes per rank of the rows ``(pass, collective, on, bytes)`` of one pass."""
    return sum(b for p, _, _, b in communication if p == name)


@dataclass(frozen=True)
class MatmulCase:
    """One choice of placements, planned, costed and run.

    ``plan`` is the :class:`chainrule.parallel.sharded.MatmulPlan`; ``output`` C's placement in the
    end (``None`` when invalid); ``communication`` the rows ``(pass, collective, on, bytes per
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
        return pass_bytes(self.communication, "forward")

    @property
    def bytes_backward(self) -> float:
        return pass_bytes(self.communication, "backward")

    remedies: tuple[Remedy, Remedy] | None = None
    """Case 2 only: the gather and the reduction, costed and run (:func:`case_two_remedies`)."""


@dataclass(frozen=True)
class Remedy:
    """One way to compute a case-2 product, delivering C as ``output``: ``name`` says what
    moves (``"gather B"``, ``"reduce C"``), ``steps`` what every rank does, in order.

    ``communication``: the rows ``(pass, collective, on, bytes per rank)`` in the order they run;
    ``traced``: the bytes per rank a traced run on the simulated world moved (the ring model of
    :func:`chainrule.costs.comm_cost.event_bytes` applied to its events, for the run's small float64
    matrices) in the forward and in the backward pass; ``error``: that run's largest
    difference of C, Ā and B̄ from one process.
    """

    name: str
    steps: str
    output: Placement
    communication: list[tuple[str, str, str, float]]
    traced: tuple[float, float]
    error: float
    checked: bool = False
    """Whether ``traced`` is what ``communication``'s model counts for the traced run's shapes."""

    @property
    def bytes_forward(self) -> float:
        return pass_bytes(self.communication, "forward")

    @property
    def bytes_backward(self) -> float:
        return pass_bytes(self.communication, "backward")

    @property
    def bytes_per_step(self) -> float:
        return self.bytes_forward + self.bytes_backward


def _addends(value: np.ndarray, parts: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``parts`` integer-valued arrays that add up to ``value``."""
    pieces = [rng.integers(-3, 4, value.shape).astype(float) for _ in range(parts - 1)]
    return [*pieces, value - sum(pieces, np.zeros_like(value))]


def _run_on_rank(
    a: Placement,
    b: Placement,
    then: Placement | None,
    A: np.ndarray,
    B: np.ndarray,
    G: np.ndarray,
    first: tuple[str, Placement] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SPMD: C = A · B on placed tensors, a barrier, backward with the cotangent G of C.

    ``first = (operand, placement)`` redistributes that operand before the product (the
    reduction remedy of case 2: ``("A", Shard(1))`` slices a replicated A along J)."""
    rng = np.random.default_rng(1)
    world = dist.world_size()
    x = sh.from_local(sh.local_part(A, a, _addends(A, world, rng)), a, requires_grad=True)
    y = sh.from_local(sh.local_part(B, b, _addends(B, world, rng)), b, requires_grad=True)
    operands = {"A": x, "B": y}
    if first is not None:
        name, placement = first
        operands[name] = sh.redistribute(operands[name], placement)
    c = sh.matmul(operands["A"], operands["B"])
    if then is not None and then != c.placement:
        c = sh.redistribute(c, then)
    dist.barrier()  # forward | backward
    if isinstance(c.placement, Partial):
        c.local.backward(G)  # a sum hands every addend the whole cotangent
    else:
        c.local.backward(sh.local_part(G, c.placement))
    dist.barrier()
    return c.full().data, x.full_grad(), y.full_grad()


Rows = list[tuple[str, str, str, float]]


def _in_order(inner: Rows, outer: Rows) -> Rows:
    """The rows of ``inner`` (what runs first in the forward pass) and ``outer`` (what runs
    after it) in the order a run performs them: the backward pass runs ``outer``'s first."""
    forward = [r for r in inner if r[0] == "forward"] + [r for r in outer if r[0] == "forward"]
    backward = [r for r in outer if r[0] == "backward"] + [r for r in inner if r[0] == "backward"]
    return forward + backward


def _on(name: str, rows: list[tuple[str, str, float]]) -> Rows:
    return [(p, op, name, b) for p, op, b in rows]


@dataclass(frozen=True)
class _Traced:
    """What a traced run of the product on small matrices did."""

    forward: list[str]
    backward: list[str]
    bytes: tuple[float, float]
    error: float


def _traced_run(
    a: Placement,
    b: Placement,
    then: Placement | None,
    world_size: int,
    first: tuple[str, Placement] | None = None,
) -> _Traced:
    """The product on ``world_size`` simulated ranks with A of 2P × 3P, B of 3P × 4P (small
    integers, so that every size differs and the sums are exact), traced, against one
    process."""
    P = world_size
    rng = np.random.default_rng(0)
    A, B, G = (rng.integers(-3, 4, s).astype(float) for s in ((2 * P, 3 * P), (3 * P, 4 * P),
                                                               (2 * P, 4 * P)))  # fmt: skip
    trace = dist.Trace()
    results = dist.run(_run_on_rank, P, args=(a, b, then, A, B, G, first), trace=trace)
    x, y = Tensor(A, requires_grad=True), Tensor(B, requires_grad=True)
    (x @ y * Tensor(G)).sum().backward()
    assert x.grad is not None and y.grad is not None
    reference = (A @ B, x.grad, y.grad)
    error = max(
        float(np.abs(r - e).max()) for res in results for r, e in zip(res, reference, strict=True)
    )
    events = list(trace)
    cuts = [i for i, event in enumerate(events) if event.op == "barrier"]
    forward, backward = events[: cuts[0]], events[cuts[0] + 1 : cuts[1]]
    return _Traced(
        [e.op for e in forward], [e.op for e in backward],
        (sum(map(event_bytes, forward)), sum(map(event_bytes, backward))), error,
    )  # fmt: skip


def _gather_rows(plan: sh.MatmulPlan, target: Placement, sizes: dict[str, int], P: int) -> Rows:
    """The gather remedy: the plan's collectives, then C's redistribution to ``target``."""
    assert plan.output is not None
    return _in_order(
        plan.communication(sizes, P),
        _on("C", transition(plan.output, target).communication(sizes["C"], P)),
    )


def _reduce_steps(plan: sh.MatmulPlan) -> tuple[str, Placement]:
    """The reduction remedy's first step: the operand that is not sharded along J, and its
    placement sharded along J (A[I, J] along axis 1, B[J, K] along axis 0)."""
    (gathered,) = plan.before
    other = "B" if gathered == "A" else "A"
    return other, Shard(1 if other == "A" else 0)


def _reduce_rows(plan: sh.MatmulPlan, target: Placement, sizes: dict[str, int], P: int) -> Rows:
    """The reduction remedy: the other operand sharded along J, partial sums, C reduced."""
    other, along_j = _reduce_steps(plan)
    placed = plan.b if other == "B" else plan.a
    return _in_order(
        _on(other, transition(placed, along_j).communication(sizes[other], P)),
        _on("C", transition(Partial(), target).communication(sizes["C"], P)),
    )


def _slices_the_other(plan: sh.MatmulPlan) -> bool:
    """Case 2 with the other operand replicated: the reduction remedy starts with a slice."""
    if plan.case != "all-gather first":
        return False
    other, _ = _reduce_steps(plan)
    return isinstance(plan.b if other == "B" else plan.a, Replicate)


def _remedy_names(plan: sh.MatmulPlan, target: Placement) -> tuple[tuple[str, str], ...]:
    """Each remedy's name and steps."""
    assert plan.output is not None
    (gathered,) = plan.before
    other, along_j = _reduce_steps(plan)
    gather = f"all-gather {gathered}, multiply"
    if target != plan.output:
        then = transition(plan.output, target).forward_text
        gather += f", {'slice' if then == 'none' else then} C to {target}"
    placed = plan.b if other == "B" else plan.a
    move = transition(placed, along_j).forward_text
    move = "slice" if move == "none" else move
    reduce = transition(Partial(), target).forward_text
    return (
        (f"gather {gathered}", gather),
        ("reduce C", f"{move} {other} to {along_j}, partial sums, {reduce} C to {target}"),
    )


def case_two_remedies(
    a: str | Placement,
    b: str | Placement,
    then: str | Placement | None = None,
    world_size: int = 2,
    sizes: tuple[int, int, int] = (1024, 1024, 1024),
    itemsize: int = 4,
) -> tuple[Remedy, Remedy]:
    """Both remedies of a case-2 product ``A · B`` (one operand sharded along J, the other not),
    with C delivered as ``then`` (``None``: as the gather leaves it), costed for A of I × J and
    B of J × K (``sizes``) and run, traced, on ``world_size`` simulated ranks.

    1. **Gather**: all-gather the operand sharded along J, multiply (case 1), and redistribute
       C if needed. It moves the gathered operand, ``(P−1)/P · |operand|`` forward.
    2. **Reduce**: shard the other operand along J too (a replicated one is sliced, without
       communication; its gradient is all-gathered in the backward pass), multiply into
       partial sums (case 3), and reduce C to the placement: ``(P−1)/P · |C|`` for a
       reduce-scatter, twice that for an all-reduce. This is Megatron's row-parallel layer.
    """
    plan = sh.plan_matmul(a, b)
    if plan.case != "all-gather first":
        raise ValueError(
            f"A {plan.a} · B {plan.b} is {plan.case}, not case 2: only a product with one "
            "operand sharded along J has the two remedies"
        )
    assert plan.output is not None
    target = plan.output if then is None or then == "as computed" else parse_placement(then)
    P = world_size

    def nbytes(I: int, J: int, K: int, itemsize: int) -> dict[str, int]:
        return {"A": I * J * itemsize, "B": J * K * itemsize, "C": I * K * itemsize}

    traced_sizes = nbytes(2 * P, 3 * P, 4 * P, 8)  # the traced run's matrices, float64
    remedies = []
    for (name, steps), rows, first in zip(
        _remedy_names(plan, target), (_gather_rows, _reduce_rows), (None, _reduce_steps(plan)),
        strict=True,
    ):  # fmt: skip
        run = _traced_run(plan.a, plan.b, target, P, first)
        counted = rows(plan, target, traced_sizes, P)
        checked = run.bytes == tuple(
            sum(b for p, _, _, b in counted if p == which) for which in ("forward", "backward")
        )
        remedies.append(
            Remedy(name, steps, target, rows(plan, target, nbytes(*sizes, itemsize), P),
                   run.bytes, run.error, checked)
        )  # fmt: skip
    return remedies[0], remedies[1]


def matmul_case(
    a: str,
    b: str,
    then: str = "as computed",
    world_size: int = 2,
    sizes: tuple[int, int, int] = (1024, 1024, 1024),
    itemsize: int = 4,
) -> MatmulCase:
    """Plan, cost and run ``C = A · B`` for the placements ``a`` of A and ``b`` of B on
    ``world_size`` ranks; ``then`` places C again afterwards (``"as computed"``: not). A
    case-2 product whose other operand is replicated also carries both of its remedies
    (:func:`case_two_remedies`); where the other operand is sharded along its free dimension,
    the reduction would start with an all-to-all, and the table only names it (counting it is
    the sharded-product exercise's work)."""
    if not 2 <= world_size <= len(RANK_COLOURS):
        raise ValueError(f"choose between 2 and {len(RANK_COLOURS)} ranks, not {world_size}")
    plan = sh.plan_matmul(a, b)
    target = None if then == "as computed" else parse_placement(then)
    I, J, K = sizes
    if not plan.valid:
        return MatmulCase(plan, target, None, world_size, sizes, itemsize, [], [], [], None)
    assert plan.output is not None
    output = plan.output if target is None else target
    nbytes = {"A": I * J * itemsize, "B": J * K * itemsize, "C": I * K * itemsize}
    communication = _gather_rows(plan, output, nbytes, world_size)
    run = _traced_run(plan.a, plan.b, target, world_size)
    remedies = (
        case_two_remedies(plan.a, plan.b, output, world_size, sizes, itemsize)
        if _slices_the_other(plan)
        else None
    )
    return MatmulCase(
        plan, target, output, world_size, sizes, itemsize, communication,
        run.forward, run.backward, run.error, remedies,
    )  # fmt: skip


def widget_case(
    a: str, b: str, then: str = "as computed", world_size: int = 2, log2_rows: int = 10
) -> MatmulCase:
    """:func:`matmul_case` for A of 2^log2_rows × 1024 and B of 1024 × 1024 (float32): the
    rows I of A and C (tokens, say) are what the widget's slider changes."""
    return matmul_case(a, b, then, world_size, sizes=(2**log2_rows, 1024, 1024))


# -- rendering ----------------------------------------------------------------------------------


def _size(nbytes: float) -> str:
    """Bytes in words, the number and its unit held together on one line (a no-break space)."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g}\u00a0{unit}"
    return f"{nbytes:.0f}\u00a0B"


def case_table(case: MatmulCase) -> str:
    """HTML: the case and why, C's placement, every collective with its bytes, what ran."""
    plan = case.plan
    I, J, K = case.sizes
    explanation = plan.explanation[:1].upper() + plan.explanation[1:]
    head = f"<p><b>A {plan.a} · B {plan.b}: {plan.case}.</b> {explanation}.<br>"
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
    return head + table + seen + remedies_table(case)


def _fewer(remedies: tuple[Remedy, Remedy], nbytes: Callable[[Remedy], float]) -> str:
    """Which remedy moves fewer bytes by ``nbytes`` (or that they move the same), in HTML."""
    first, second = (nbytes(r) for r in remedies)
    if first == second:
        return f"the two move the same ({_size(first)})"
    low, high = sorted(remedies, key=nbytes)
    return f"<b>{low.name}</b> ({_size(nbytes(low))} against {_size(nbytes(high))})"


def remedies_table(case: MatmulCase) -> str:
    """HTML: case 2's two remedies side by side, their bytes, and which moves fewer (``""``
    outside case 2; only the reduction's first step where it is an all-to-all)."""
    plan = case.plan
    if plan.case != "all-gather first":
        return ""
    if case.remedies is None:
        other, along_j = _reduce_steps(plan)
        placed = plan.b if other == "B" else plan.a
        return (
            f"<p>The other remedy of case 2, sharding {other} along J too and reducing the "
            f"partial sums of C, would start here with an all-to-all of {other} ({placed} → "
            f"{along_j}): two more rows of the duality table, whose bytes you can count "
            "against the gather's.</p>"
        )
    I, J, K = case.sizes
    gather, reduce = case.remedies

    def collectives(remedy: Remedy, which: str) -> str:
        done = [
            f"{op.replace('_', '-')} {on}: {_size(nbytes)}"
            for p, op, on, nbytes in remedy.communication
            if p == which
        ]
        return ", ".join(done) or "none"

    rows = [
        (r.name.replace(" ", "\u00a0"), r.steps, collectives(r, "forward"),
         collectives(r, "backward"),
         _size(r.bytes_per_step),
         f"{'bytes as counted' if r.checked else 'bytes DIFFER'}, error {r.error:.0e}")
        for r in (gather, reduce)
    ]  # fmt: skip
    table = html_table(
        ["remedy", "what every rank does", "forward", "backward", "per step",
         f"traced on {case.world_size} ranks"],
        rows,
    )  # fmt: skip
    return (
        f"<p><b>Case 2 has two remedies</b>, each delivering C as {gather.output}: gather the "
        "operand that is sharded along J, or shard the other one along J too and reduce the "
        f"partial sums of C. Bytes per rank for A {I}×{J}, B {J}×{K}, C {I}×{K} (float32):</p>"
        + table
        + f"<p>Fewer bytes per step: {_fewer(case.remedies, lambda r: r.bytes_per_step)}; in "
        f"the forward pass alone: {_fewer(case.remedies, lambda r: r.bytes_forward)}.</p>"
    )


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
    figure, ax = canvas(width, height)
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
    a: str = "Shard(0)", b: str = "Replicate()", world_size: int = 2, log2_rows: int = 10
) -> LiveWidget:
    """Controls: the placements of A and B, how C is placed afterwards, P (2 to 4), and the
    rows I = 2^k of A and C (B stays 1024 × 1024): case 2's cheaper remedy depends on them."""
    controls = {
        "a": ipywidgets.Dropdown(options=PLACEMENT_CHOICES, value=a, description="A placed as"),
        "b": ipywidgets.Dropdown(options=PLACEMENT_CHOICES, value=b, description="B placed as"),
        "then": ipywidgets.Dropdown(
            options=THEN_CHOICES, value="as computed", description="then place C as"
        ),
        "world_size": ipywidgets.IntSlider(value=world_size, min=2, max=4, description="ranks P"),
        "log2_rows": ipywidgets.IntSlider(
            value=log2_rows, min=6, max=14, description="log₂ rows I of A and C"
        ),
    }
    return LiveWidget(controls, widget_case, case_table, plot_blocks)
