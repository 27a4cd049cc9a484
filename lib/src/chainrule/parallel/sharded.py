"""Sharded tensors: an engine tensor on each rank and its placement, and the ops between them.

A :class:`ShardedTensor` is what one rank holds of a global value (its ``local``
:class:`chainrule.Tensor`) together with the value's placement
(:mod:`chainrule.parallel.placement`). Code on placed tensors reads like code on one device,
``y = matmul(x, w)``, and the placements decide which collective each operation needs:

- :func:`redistribute` changes a placement with one row of the duality table, whose VJP is the
  backward collective (see :mod:`chainrule.parallel.placement`);
- :func:`matmul` plans the product from its operands' placements (:func:`plan_matmul`): local,
  all-gather first, partial sums, or invalid;
- :func:`add`, :func:`elementwise` and :func:`local_map` act on each rank's slice.

**Fan-out.** A replicated value read by a computation whose result differs per rank has P
consumers: its gradient is the sum of the ranks' contributions. Every operation here inserts
that fan-out (the identity row, ``f``) on each replicated operand of a per-rank result and marks
its result ``fanned_out``; ``redistribute(x, Replicate(), fan_out=True)`` gathers a value to be
fanned out, its backward one reduce-scatter.

The gradient of a placed leaf arrives in its own placement: a shard's gradient is the slice,
a replicated value's gradient the whole (the same on every rank), a partial value's gradient
the whole cotangent (a sum hands it to every addend). :meth:`ShardedTensor.full_grad`
assembles it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from chainrule import dist
from chainrule.dist.chunks import chunk
from chainrule.dist.collectives import ring_bytes
from chainrule.engine import ops
from chainrule.engine.tensor import ArrayLike, Tensor
from chainrule.parallel.placement import (
    Partial,
    Placement,
    Replicate,
    Shard,
    Transition,
    normalize,
    parse_placement,
    placement_label,
    transition,
)


class ShardingError(ValueError):
    """The placements of the operands do not allow the operation; the message says what would."""


class ShardedTensor:
    """This rank's part of a global tensor, and how the global tensor is placed on the ranks.

    ``local`` is the engine tensor this rank holds, ``placement`` a :class:`Replicate`,
    :class:`Shard` or :class:`Partial` (shard axes normalised), ``shape`` the global shape,
    ``world_size`` the number of ranks P and ``fanned_out`` whether this replicated value feeds
    per-rank computations (see the module docstring). Made by :func:`distribute`,
    :func:`from_local` and the operations of this module, inside an SPMD function.
    """

    __slots__ = ("local", "placement", "shape", "world_size", "fanned_out")

    def __init__(
        self,
        local: Tensor,
        placement: Placement,
        world_size: int | None = None,
        fanned_out: bool = False,
    ) -> None:
        self.local = local
        self.placement = normalize(placement, local.ndim)
        self.world_size = dist.world_size() if world_size is None else world_size
        if fanned_out and not isinstance(self.placement, Replicate):
            raise ValueError(f"only a replicated value fans out, not a {self.placement} one")
        self.fanned_out = fanned_out
        shape = list(local.shape)
        if isinstance(self.placement, Shard):
            shape[self.placement.axis] *= self.world_size
        self.shape: tuple[int, ...] = tuple(shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def per_rank(self) -> bool:
        """Whether the ranks' values feed different computations: sharded, partial, fanned out."""
        return not isinstance(self.placement, Replicate) or self.fanned_out

    @property
    def grad(self) -> np.ndarray | None:
        """This rank's part of the gradient (in the tensor's placement), after backward()."""
        return self.local.grad

    def full(self) -> Tensor:
        """The global value on every rank, counted once (differentiable; a collective unless
        replicated): a loss computed from it is the one loss of the whole model."""
        if self.fanned_out:
            raise ValueError(
                "this replicated value fans out to per-rank computations: a loss on it would be "
                "counted once per rank; compute the loss from what those computations produce"
            )
        return redistribute(self, Replicate()).local

    def full_grad(self) -> np.ndarray:
        """The global gradient, assembled from every rank's part (a collective: call it on every
        rank). Zeros where no gradient arrived."""
        grad = self.local.grad if self.local.grad is not None else np.zeros(self.local.shape)
        if isinstance(self.placement, Shard):
            return np.asarray(dist.all_gather(grad, axis=self.placement.axis))
        return np.asarray(grad)

    def __matmul__(self, other: ShardedTensor) -> ShardedTensor:
        return matmul(self, other)

    def __add__(self, other: ShardedTensor) -> ShardedTensor:
        return add(self, other)

    def __repr__(self) -> str:
        return (
            f"ShardedTensor(shape={self.shape}, "
            f"{placement_label(self.placement, self.fanned_out)}, local shape {self.local.shape})"
        )


# -- making placed tensors ------------------------------------------------------------------------


def distribute(
    value: ArrayLike, placement: Placement | str, requires_grad: bool = False
) -> ShardedTensor:
    """Place the global ``value`` (every rank passes the same) as ``placement``: a replicated
    copy or this rank's slice. The local tensor is a leaf (``requires_grad`` as given)."""
    array = np.asarray(value.data if isinstance(value, Tensor) else value, dtype=float)
    placement = normalize(parse_placement(placement), array.ndim)
    if isinstance(placement, Partial):
        raise ValueError(
            "a global value is not distributed as Partial: make the addends with from_local"
        )
    return from_local(local_part(array, placement), placement, requires_grad)


def local_part(
    value: np.ndarray, placement: Placement, addends: Sequence[np.ndarray] = ()
) -> np.ndarray:
    """This rank's part of the global ``value`` placed as ``placement``: the whole value
    (Replicate), this rank's slice (Shard), or this rank's addend ``addends[rank]`` (Partial,
    where ``Σ_p addends[p] = value``)."""
    if isinstance(placement, Partial):
        return addends[dist.rank()]
    if isinstance(placement, Shard):
        return chunk(value, dist.rank(), dist.world_size(), placement.axis).copy()
    return value


def from_local(
    local: ArrayLike, placement: Placement | str, requires_grad: bool = False
) -> ShardedTensor:
    """This rank's part ``local`` of a tensor placed as ``placement`` (an engine tensor is
    used as it is; an array becomes a leaf with ``requires_grad``)."""
    if not isinstance(local, Tensor):
        local = Tensor(np.array(local, dtype=float), requires_grad=requires_grad)
    return ShardedTensor(local, parse_placement(placement))


# -- redistribution -------------------------------------------------------------------------------


def redistribute(
    x: ShardedTensor, placement: Placement | str, fan_out: bool = False
) -> ShardedTensor:
    """``x`` placed as ``placement``: the same global value, moved by the collective of one row of
    the duality table (:func:`chainrule.parallel.placement.transition`), whose VJP is that row's
    backward. ``fan_out=True`` (to :class:`Replicate`): the result feeds per-rank computations, so
    the backward sums the ranks' cotangents (an all-gather's backward is then a reduce-scatter
    instead of a split)."""
    target = normalize(parse_placement(placement), x.ndim)
    if x.fanned_out:
        if isinstance(target, Replicate) and fan_out:
            return x
        raise ShardingError(
            "this value already fans out to per-rank computations; redistribute it before the "
            "fan-out, not after"
        )
    step = transition(x.placement, target, fan_out)
    return ShardedTensor(step.apply(x.local), target, x.world_size, fanned_out=fan_out)


def fan_out(x: ShardedTensor) -> ShardedTensor:
    """Mark a replicated ``x`` entering per-rank computations: identity forward, all-reduce of
    the ranks' gradients backward (the duality table's identity row, ``f``)."""
    if not isinstance(x.placement, Replicate):
        raise ShardingError(f"only a replicated value fans out; this one is {x.placement}")
    return redistribute(x, Replicate(), fan_out=True)


def _fanned_for(operands: Sequence[ShardedTensor]) -> list[ShardedTensor]:
    """The operands of a per-rank result: every replicated one fanned out (once)."""
    return [
        fan_out(x) if isinstance(x.placement, Replicate) and not x.fanned_out else x
        for x in operands
    ]


# -- the matrix product --------------------------------------------------------------------------

MatmulCase = Literal["local", "all-gather first", "partial sums", "invalid"]

CASE_TEXT: dict[str, str] = {
    "local": "no operand is sharded along the contracting dimension J: each rank multiplies "
    "what it holds",
    "all-gather first": "one operand is sharded along J and the other is not: gather it and "
    "multiply locally, or slice the other along J too and reduce the partial sums",
    "partial sums": "both operands are sharded along J: each rank's product is one addend of "
    "the sum over J, a Partial result",
    "invalid": "the result would be sharded along two dimensions over the same ranks (or is "
    "a product of pending sums): gather or reduce one operand first",
}


PENDING_TIMES_SHARD = (
    "each rank's addend of the pending sum meets only that rank's slice of the other operand: "
    "the products of the other ranks' addends with this slice are computed by no rank"
)


@dataclass(frozen=True)
class MatmulPlan:
    """How ``C = A · B`` is computed from the placements of A (n-D, ``A[…, I, J]``) and B
    (``B[J, K]``).

    ``case`` is one of :data:`CASE_TEXT`. ``before`` maps ``"A"``/``"B"`` to the transition
    applied first (the all-gather of case 2); ``fan_outs`` names the replicated operands that
    fan out into the per-rank product (all-reduce of their gradients); ``output`` is C's
    placement (``None`` when invalid) and ``output_fanned`` whether C fans out. For an invalid
    product ``reason`` says why and ``remedy`` what makes it valid.
    """

    a: Placement
    b: Placement
    a_fanned: bool
    b_fanned: bool
    case: MatmulCase
    before: dict[str, Transition] = field(default_factory=dict)
    fan_outs: tuple[str, ...] = ()
    output: Placement | None = None
    output_fanned: bool = False
    remedy: str = ""
    reason: str = ""

    @property
    def valid(self) -> bool:
        return self.case != "invalid"

    @property
    def explanation(self) -> str:
        """Why this case: the invalid product's own reason, or the case's text."""
        return self.reason or CASE_TEXT[self.case]

    def communication(
        self, sizes: dict[str, int], world_size: int
    ) -> list[tuple[str, str, str, float]]:
        """``(pass, collective, operand, bytes per rank)`` of every collective the product runs,
        forward first; ``sizes`` are the global sizes in bytes of ``"A"`` and ``"B"``."""
        found: list[tuple[str, str, str, float]] = []
        for name, step in self.before.items():
            found += [(p, op, name, b) for p, op, b in step.communication(sizes[name], world_size)]
        found.sort(key=lambda row: row[0] != "forward")  # the forward pass first
        for name in self.fan_outs:
            found.append(
                ("backward", "all_reduce", name, ring_bytes("all_reduce", sizes[name], world_size))
            )
        return found


def _role_a(placement: Placement, ndim: int) -> str:
    if isinstance(placement, Shard):
        if placement.axis == ndim - 1:
            return "contract"
        return "free" if placement.axis == ndim - 2 else "batch"
    return "partial" if isinstance(placement, Partial) else "replicate"


def _role_b(placement: Placement) -> str:
    if isinstance(placement, Shard):
        return "contract" if placement.axis == 0 else "free"
    return "partial" if isinstance(placement, Partial) else "replicate"


def plan_matmul(
    a: Placement | str,
    b: Placement | str,
    a_ndim: int = 2,
    a_fanned: bool = False,
    b_fanned: bool = False,
) -> MatmulPlan:
    """The plan of ``A · B`` for these placements (see :class:`MatmulPlan`).

    With J the contracting dimension, I the last free dimension of A and K that of B:

    1. **local**: neither operand is sharded along J. C is sharded where an operand was
       (along I, a batch axis of A, or K), or replicated; a replicated operand of a sharded
       C fans out. A Partial operand times a replicated one stays Partial.
    2. **all-gather first**: exactly one operand is sharded along J: all-gather it, then case 1.
    3. **partial sums**: both are sharded along J: C is Partial (reduce it next: all-reduce to
       Replicate or reduce-scatter to a Shard).
    4. **invalid**: A sharded along I (or a batch axis) and B along K over the same ranks; or a
       Partial operand with a sharded one, or two Partial operands.
    """
    pa, pb = normalize(parse_placement(a), a_ndim), normalize(parse_placement(b), 2)
    ra, rb = _role_a(pa, a_ndim), _role_b(pb)

    def make(case: MatmulCase, **kwargs: Any) -> MatmulPlan:
        return MatmulPlan(pa, pb, a_fanned, b_fanned, case, **kwargs)

    def local(a_now: str, b_now: str, a_fan: bool, b_fan: bool, **kwargs: Any) -> MatmulPlan:
        output: Placement
        if a_now in ("free", "batch"):
            assert isinstance(pa, Shard)
            output = Shard(pa.axis)
        elif b_now == "free":
            output = Shard(a_ndim - 1)
        elif "partial" in (a_now, b_now):
            output = Partial()
        else:
            output = Replicate()
        per_rank = not isinstance(output, Replicate) or a_fan or b_fan
        fans = tuple(
            name
            for name, now, fanned in (("A", a_now, a_fan), ("B", b_now, b_fan))
            if per_rank and now == "replicate" and not fanned
        )
        fanned = isinstance(output, Replicate) and per_rank
        return make(
            kwargs.pop("case", "local"), fan_outs=fans, output=output, output_fanned=fanned,
            **kwargs,
        )  # fmt: skip

    if ra == "partial" or rb == "partial":
        if ra == rb == "partial":
            return make(
                "invalid",
                reason="a product of two pending sums is not the sum of the ranks' products: "
                "(Σ_p A_p)(Σ_q B_q) also has the cross terms A_p B_q, which no rank holds",
                remedy="reduce A first (an all-reduce to Replicate)",
            )
        if ra == "partial" and rb != "replicate":
            fix = (
                f"reduce-scatter A to Shard({a_ndim - 1}) first (then partial sums)"
                if rb == "contract"
                else "all-reduce A to Replicate first"
            )
            return make("invalid", reason=PENDING_TIMES_SHARD, remedy=fix)
        if rb == "partial" and ra != "replicate":
            fix = (
                "reduce-scatter B to Shard(0) first (then partial sums)"
                if ra == "contract"
                else "all-reduce B to Replicate first"
            )
            return make("invalid", reason=PENDING_TIMES_SHARD, remedy=fix)
        return local(ra, rb, a_fanned, b_fanned)
    if ra == "contract" and rb == "contract":
        return make("partial sums", output=Partial())
    if ra == "contract":
        fan = rb == "free" or b_fanned
        step = transition(pa, Replicate(), fan_out=fan)
        return local("replicate", rb, fan, b_fanned, case="all-gather first", before={"A": step})
    if rb == "contract":
        fan = ra in ("free", "batch") or a_fanned
        step = transition(pb, Replicate(), fan_out=fan)
        return local(ra, "replicate", a_fanned, fan, case="all-gather first", before={"B": step})
    if ra in ("free", "batch") and rb == "free":
        return make(
            "invalid",
            reason="A is sharded along I and B along K over the same ranks: rank p holds A[I_p, J] "
            "and B[J, K_p] and can compute only the block C[I_p, K_p]",
            remedy="all-gather one operand first, A along I or B along K, so that every rank "
            "holds all it needs for its block of C; which one to move is a matter of bytes",
        )
    return local(ra, rb, a_fanned, b_fanned)


def matmul(a: ShardedTensor, b: ShardedTensor) -> ShardedTensor:
    """``A · B`` on placed tensors, planned by :func:`plan_matmul` and carried out on every
    rank: the all-gather of case 2, the fan-out of replicated operands into a per-rank result,
    then the local product. An invalid case raises :class:`ShardingError` with the remedy."""
    if b.ndim != 2 or a.ndim < 2:
        raise ValueError(
            f"matmul: A must have at least 2 dimensions and B exactly 2, got {a!r} {b!r}"
        )
    plan = plan_matmul(a.placement, b.placement, a.ndim, a.fanned_out, b.fanned_out)
    if not plan.valid:
        raise ShardingError(
            f"matmul of A {placement_label(a.placement, a.fanned_out)} and B "
            f"{placement_label(b.placement, b.fanned_out)}: {plan.explanation}. "
            f"Remedy: {plan.remedy}."
        )
    operands = {"A": a, "B": b}
    for name, step in plan.before.items():
        x = operands[name]
        operands[name] = ShardedTensor(
            step.apply(x.local), Replicate(), x.world_size, fanned_out=step.fan_out
        )
    for name in plan.fan_outs:
        operands[name] = fan_out(operands[name])
    assert plan.output is not None
    product = ops.matmul(operands["A"].local, operands["B"].local)
    return ShardedTensor(product, plan.output, a.world_size, fanned_out=plan.output_fanned)


# -- elementwise and local operations --------------------------------------------------------------


def add(a: ShardedTensor, b: ShardedTensor) -> ShardedTensor:
    """``a + b`` rank by rank, where the placements line up (numpy broadcasting).

    Equal placements add locally; a 1-D ``b`` sharded along its axis 0 lines up with an ``a``
    sharded along its last axis (a sharded bias). A replicated operand broadcast over a
    sharded one (a bias, the same on every rank) fans out: its gradient is the sum of the
    ranks' slices' contributions. A replicated value added to a Partial one would be added
    P times, so that raises :class:`ShardingError`.
    """
    if isinstance(a.placement, Shard) and isinstance(b.placement, Replicate):
        pass
    elif isinstance(b.placement, Shard) and isinstance(a.placement, Replicate):
        a, b = b, a  # the sharded operand first (addition commutes)
    pa, pb = a.placement, b.placement
    if isinstance(pa, Partial) != isinstance(pb, Partial):
        raise ShardingError(
            f"adding {pa} and {pb}: a value added to every addend of a pending sum is added P "
            "times; reduce the Partial one first"
        )
    if isinstance(pa, Shard) and isinstance(pb, Shard):
        if pb.axis + a.ndim - b.ndim != pa.axis:
            raise ShardingError(f"adding {pa} and {pb}: the ranks' slices do not line up")
    elif isinstance(pa, Shard):  # b replicated, broadcast over a
        offset = pa.axis - (a.ndim - b.ndim)
        if offset >= 0 and b.shape[offset] != 1:
            raise ShardingError(
                f"adding a {pa} tensor of shape {a.shape} and a replicated one of shape "
                f"{b.shape}: the replicated one spans the sharded axis; shard it the same way"
            )
    per_rank = a.per_rank or b.per_rank
    left, right = _fanned_for([a, b]) if per_rank else (a, b)
    return ShardedTensor(
        ops.add(left.local, right.local),
        pa,
        a.world_size,
        fanned_out=isinstance(pa, Replicate) and per_rank,
    )


def elementwise(fn: Callable[[Tensor], Tensor], x: ShardedTensor) -> ShardedTensor:
    """``fn`` (elementwise, e.g. ``Tensor.tanh``) on each rank's slice; same placement.

    A nonlinear function of a pending sum is not the sum of the function: Partial raises.
    """
    if isinstance(x.placement, Partial):
        raise ShardingError(
            "an elementwise function of a Partial value: f(Σ x_p) ≠ Σ f(x_p); reduce it first"
        )
    return ShardedTensor(fn(x.local), x.placement, x.world_size, fanned_out=x.fanned_out)


def local_map(
    fn: Callable[..., Tensor], *xs: ShardedTensor, placement: Placement | str
) -> ShardedTensor:
    """``fn`` on the ranks' local tensors, whose result is placed as ``placement``.

    The caller vouches that ``fn`` acts on each slice alone (heads, tokens or rows that stay on
    their rank). A result that differs per rank fans its replicated inputs out; a replicated
    result of fanned-out inputs is fanned out too.
    """
    out = parse_placement(placement)
    per_rank_in = any(x.per_rank for x in xs)
    if isinstance(out, Replicate) and any(not isinstance(x.placement, Replicate) for x in xs):
        raise ShardingError(
            "a computation on sharded or partial slices gives a per-rank result: place it as a "
            "Shard or Partial"
        )
    per_rank_out = not isinstance(out, Replicate) or per_rank_in
    inputs = _fanned_for(xs) if per_rank_out else list(xs)
    result = fn(*(x.local for x in inputs))
    fanned = isinstance(out, Replicate) and per_rank_out
    return ShardedTensor(result, out, xs[0].world_size, fanned_out=fanned)
