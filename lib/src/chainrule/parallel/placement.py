"""Placements of a tensor on P ranks, and the transitions between them as rows of the duality table.

A tensor of global value ``X`` lives on P ranks in one of three ways (the names of
``torch.distributed.tensor``):

- :class:`Replicate`: every rank holds all of ``X``. One global value, counted once: its
  gradient is the same on every rank.
- :class:`Shard` ``(axis)``: rank p holds slice p of ``X`` along ``axis`` (P equal slices), and
  ``X = [X_0; …; X_{P-1}]``. Its gradient is sharded the same way.
- :class:`Partial`: rank p holds an addend ``X_p`` and ``X = Σ_p X_p``, a sum still pending (the
  output of a matrix product whose contracting dimension is sharded). The cotangent of a sum
  is handed to every addend unchanged, so the gradient of a partial value is replicated.

Changing the placement never changes the global value: every transition is the identity on
``X``, carried out by a collective. Its backward therefore changes the placement of the
*gradient* back, and that is again a collective, one row of the duality table
(:data:`chainrule.parallel.duality.DUALITY_TABLE`):

======================  ===============  =======================================
forward                 collective       duality row (whose backward is used)
======================  ===============  =======================================
Partial → Replicate     all-reduce       ``all_reduce``: identity
Shard → Replicate       all-gather       ``all_gather_replicated``: split, or, with
                                         ``fan_out=True``, ``all_gather``: reduce-scatter
Partial → Shard         reduce-scatter   ``reduce_scatter``: all-gather
Replicate → Shard       split            ``split``: all-gather
Shard(i) → Shard(j)     all-to-all       ``all_to_all``: all-to-all, axes swapped
Replicate → Replicate   nothing, or the  ``identity``: all-reduce
                        fan-out mark
======================  ===============  =======================================

**Which all-gather backward.** After ``Shard → Replicate`` every rank holds the whole value.
If every rank then computes the *same* thing from it and the loss counts that once (a
replicated downstream), the cotangent is one replicated value and each rank keeps its own
slice: a split. If each rank feeds its copy into a computation of its own (its own columns of
a weight, say) the copies are a fan-out, and the ranks' cotangents must be summed before the
split: a reduce-scatter. ``fan_out=True`` says the second. The same holds for a value that is
already replicated: :func:`fan_out` marks the point where it enters per-rank computations, the
identity forward and all-reduce backward (``f`` of tensor parallelism).

Nothing here writes a backward: :meth:`Transition.apply` calls the engine function of each
row (``row.engine_fn``), whose VJP is the row's backward collective, and the collectives of a
transition are those its rows declare (``row.forward_ops``, ``row.backward_ops``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from chainrule.dist.collectives import ring_bytes
from chainrule.engine.tensor import Tensor
from chainrule.parallel.duality import DualityRow, duality_row


@dataclass(frozen=True)
class Replicate:
    """Every rank holds the whole tensor (one global value, counted once)."""

    def __str__(self) -> str:
        return "Replicate()"


@dataclass(frozen=True)
class Shard:
    """Rank p holds slice p of P equal slices along ``axis``."""

    axis: int

    def __str__(self) -> str:
        return f"Shard({self.axis})"


@dataclass(frozen=True)
class Partial:
    """Rank p holds an addend; the tensor is the sum over the ranks (pending)."""

    def __str__(self) -> str:
        return "Partial()"


Placement = Replicate | Shard | Partial


def parse_placement(text: str | Placement) -> Placement:
    """``"replicate"``, ``"shard(1)"``, ``"partial"`` (any case, spaces ignored) as a placement."""
    if isinstance(text, Replicate | Shard | Partial):
        return text
    if not isinstance(text, str):
        raise TypeError(f"a placement is Replicate(), Shard(axis), Partial() or its name: {text!r}")
    name = text.replace(" ", "").lower()
    if name in ("replicate", "replicate()", "r"):
        return Replicate()
    if name in ("partial", "partial()", "p"):
        return Partial()
    if name.startswith("shard(") and name.endswith(")"):
        try:
            return Shard(int(name[6:-1]))
        except ValueError:
            pass
    raise ValueError(f"unknown placement {text!r}: use 'replicate', 'shard(axis)' or 'partial'")


def normalize(placement: Placement, ndim: int) -> Placement:
    """``placement`` with a negative shard axis counted from the end (``Shard(-1)`` of a
    matrix is ``Shard(1)``); IndexError for an axis the tensor does not have."""
    if isinstance(placement, Shard):
        if not -ndim <= placement.axis < ndim:
            raise IndexError(f"{placement} of a tensor with {ndim} dimensions")
        return Shard(placement.axis % ndim)
    return placement


def collective_text(ops: Sequence[str]) -> str:
    """``("reduce_scatter",)`` as ``"reduce-scatter"``; nothing as ``"none"``."""
    return ", ".join(op.replace("_", "-") for op in ops) or "none"


# -- transitions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One row of the duality table applied to a local tensor, with its axis arguments."""

    key: str
    kwargs: dict[str, int] = field(default_factory=dict)

    @property
    def row(self) -> DualityRow:
        return duality_row(self.key)

    def apply(self, local: Tensor) -> Tensor:
        """The row's engine function on this rank's tensor: its VJP is the row's backward."""
        return self.row.engine_fn(local, **self.kwargs)


@dataclass(frozen=True)
class Transition:
    """How a tensor moves from ``source`` to ``target``: the duality rows it goes through.

    ``steps`` is empty when nothing moves (the same placement). ``forward_ops`` and
    ``backward_ops`` are the collectives of those rows, in the order they run (the backward
    pass runs the steps in reverse).
    """

    source: Placement
    target: Placement
    fan_out: bool
    steps: tuple[Step, ...]

    @property
    def rows(self) -> tuple[DualityRow, ...]:
        return tuple(step.row for step in self.steps)

    @property
    def forward_ops(self) -> tuple[str, ...]:
        return tuple(op for step in self.steps for op in step.row.forward_ops)

    @property
    def backward_ops(self) -> tuple[str, ...]:
        return tuple(op for step in reversed(self.steps) for op in step.row.backward_ops)

    @property
    def forward_text(self) -> str:
        """The forward collective in words (``"all-gather"``; ``"none"``)."""
        return collective_text(self.forward_ops)

    @property
    def backward_text(self) -> str:
        """The backward collective in words, as the rows' VJPs run it."""
        return collective_text(self.backward_ops)

    def communication(self, nbytes: float, world_size: int) -> list[tuple[str, str, float]]:
        """``(pass, collective, bytes per rank)`` of every collective of the transition, forward
        first, for a (global) tensor of ``nbytes`` (:func:`chainrule.costs.comm_cost.ring_bytes`).

        The ring model takes N to be the whole tensor for a gather or a reduction, but one
        rank's buffer for an all-to-all: a sharded tensor's slice, ``nbytes / world_size``."""

        def sent(op: str) -> float:
            buffer = nbytes / world_size if op == "all_to_all" else nbytes
            return ring_bytes(op, buffer, world_size)

        passes = [("forward", self.forward_ops), ("backward", self.backward_ops)]
        return [(p, op, sent(op)) for p, ops in passes for op in ops]

    def apply(self, local: Tensor) -> Tensor:
        """This rank's tensor after the transition (differentiable: each step is a row)."""
        for step in self.steps:
            local = step.apply(local)
        return local

    def __str__(self) -> str:
        mark = ", fanned out" if self.fan_out else ""
        return f"{self.source} → {self.target}{mark}"


def transition(source: Placement, target: Placement, fan_out: bool = False) -> Transition:
    """The rows of the duality table that take a tensor from ``source`` to ``target``.

    Shard axes must be normalised (:func:`normalize`). ``fan_out=True`` (target
    :class:`Replicate` only) says that every rank feeds the result into a computation of its
    own, so the ranks' cotangents are summed in the backward pass. A tensor becomes
    :class:`Partial` only as the result of a computation, never by a transition, as in
    ``torch.distributed.tensor``.
    """
    if fan_out and not isinstance(target, Replicate):
        raise ValueError(
            f"fan_out applies to a Replicate target, not {target}: a sharded or partial value is "
            "per-rank already"
        )
    steps: tuple[Step, ...]
    if isinstance(target, Partial):
        if not isinstance(source, Partial):
            raise ValueError(
                f"{source} → Partial: a value becomes Partial only as the result of a "
                "computation (a matrix product over a sharded contracting dimension)"
            )
        steps = ()
    elif isinstance(target, Replicate):
        if isinstance(source, Replicate):
            steps = (Step("identity"),) if fan_out else ()
        elif isinstance(source, Partial):
            steps = (Step("all_reduce"),) + ((Step("identity"),) if fan_out else ())
        else:
            key = "all_gather" if fan_out else "all_gather_replicated"
            steps = (Step(key, {"axis": source.axis}),)
    else:  # a Shard target
        if isinstance(source, Replicate):
            steps = (Step("split", {"axis": target.axis}),)
        elif isinstance(source, Partial):
            steps = (Step("reduce_scatter", {"axis": target.axis}),)
        elif source.axis == target.axis:
            steps = ()
        else:
            kwargs = {"split_axis": target.axis, "concat_axis": source.axis}
            steps = (Step("all_to_all", kwargs),)
    return Transition(source, target, fan_out, steps)


def all_placements(ndim: int = 2) -> list[Placement]:
    """Replicate, Shard(0), …, Shard(ndim − 1) and Partial: every placement on one mesh axis."""
    return [Replicate(), *(Shard(axis) for axis in range(ndim)), Partial()]


def placement_label(placement: Placement, fanned_out: bool = False) -> str:
    """The placement's name as the lessons print it, marked when a replicated value fans out."""
    return f"{placement}, fanned out" if fanned_out else str(placement)
