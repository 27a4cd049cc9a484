"""The duality table: a tensor's forward placement decides its backward collective.

Once a value lives on P ranks, every collective in the forward pass is a linear map between
*global* values, and its VJP is the transposed map — which is again a collective. The table
below is that statement row by row, derived from the two rules of split graphs:

1. fan-out becomes a sum (a value read by k consumers receives the sum of k gradients);
2. concatenation becomes a split (each input of a concat receives its slice of the gradient).

Conventions (used by the docstrings and by :mod:`chainrule.parallel.dist_adjoint`):

- a **replicated** tensor is *one* global value held identically by every rank. The loss
  counts it once: inner products over it are taken once, and its cotangent (gradient) is the
  same on every rank;
- a **per-rank** tensor is a distinct value on each rank (a shard, or one rank's own copy
  that feeds that rank's own downstream computation). The global value is the list of the P
  local values: inner products over it are summed over ranks.

Each differentiable collective below is one row, built with :meth:`Tensor.from_op` so that
its VJP calls the backward collective. ``f = copy_to_ranks`` and ``f_bar =
reduce_from_ranks`` are the conjugate pair of tensor parallelism.

Every rank must run the same program: the backward collectives run inside ``backward()``, in
the engine's topological order, which depends only on the graph. Shards along an axis have
equal sizes (an uneven all-to-all sends the sizes it is given). Every row takes ``group=``: the
ranks among which it moves the value (default: the world).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from chainrule import dist
from chainrule.dist.chunks import chunk
from chainrule.engine import ops
from chainrule.engine.tensor import ArrayLike, Tensor, as_tensor

Kind = Literal["replicated", "per_rank"]
REPLICATED: Kind = "replicated"
PER_RANK: Kind = "per_rank"


# -- the rows, on engine tensors -----------------------------------------------------------


def copy_to_ranks(x: ArrayLike, group: dist.Group | None = None) -> Tensor:
    """``f``: identity forward on a replicated value, all-reduce (sum) backward.

    Global map: the replicated ``x`` is handed to the P ranks' own downstream computations,
    ``x ↦ (y_1, …, y_P) = (x, …, x)``. Jacobian: a column of P identities ``[I; …; I]``.
    VJP: ``x̄ = Σ_p ȳ_p`` — replication is a fan-out of width P, and rule 1 sums the P
    incoming gradients. Input replicated, output per-rank; the gradient is replicated.
    ``group``: the ranks among which x is replicated (default: the world).
    """
    x = as_tensor(x)

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        return (np.asarray(dist.all_reduce(g, op=dist.ReduceOp.SUM, group=group)),)

    return Tensor.from_op(x.data, (x,), vjp, "copy_to_ranks")


def reduce_from_ranks(x: ArrayLike, group: dist.Group | None = None) -> Tensor:
    """``f̄``: all-reduce (sum) forward, identity backward.

    Global map: ``(x_1, …, x_P) ↦ y = Σ_p x_p``, one replicated value (the sum of per-rank
    partial results). Jacobian: a row of P identities ``[I, …, I]``. VJP: ``x̄_p = ȳ`` on every
    rank — each rank contributed one addend, so each receives the (replicated) incoming
    gradient unchanged. Input per-rank, output replicated. ``group``: the ranks whose partial
    results are added (default: the world).
    """
    x = as_tensor(x)
    out = np.asarray(dist.all_reduce(x.data, op=dist.ReduceOp.SUM, group=group))

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        return (g,)

    return Tensor.from_op(out, (x,), vjp, "reduce_from_ranks")


def gather_from_ranks(x: ArrayLike, axis: int = 0, group: dist.Group | None = None) -> Tensor:
    """All-gather forward (downstream differs per rank), reduce-scatter backward.

    Global map: the shards ``x_1, …, x_P`` are assembled into ``c = [x_1; …; x_P]`` along
    ``axis`` and every rank feeds *its own* copy ``y_p = c`` to its own downstream computation:
    ``(x_1, …, x_P) ↦ (c, …, c)``, output per-rank. Jacobian: P copies of the concatenation
    matrix ``C``. VJP, from the two rules: the copies are a fan-out, so ``c̄ = Σ_p ȳ_p``
    (rule 1), and the concatenation routes slice q of that sum back to shard q (rule 2):
    ``x̄_q = (Σ_p ȳ_p)[q]`` — exactly a reduce-scatter. The summation over replicas rides
    along with the routing. Use this row when the computation after the gather differs per
    rank (different weights, data or loss terms); see :func:`gather_replicated` otherwise.
    """
    x = as_tensor(x)
    out = np.asarray(dist.all_gather(x.data, axis=axis, group=group))

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        return (np.asarray(dist.reduce_scatter(g, dist.ReduceOp.SUM, axis, group=group)),)

    return Tensor.from_op(out, (x,), vjp, "gather_from_ranks")


def gather_replicated(x: ArrayLike, axis: int = 0, group: dist.Group | None = None) -> Tensor:
    """All-gather forward (downstream replicated), split backward: keep your own slice.

    Global map: ``(x_1, …, x_P) ↦ y = [x_1; …; x_P]``, one *replicated* value: every rank
    computes the same thing from it and the loss counts it once. Jacobian: the concatenation
    matrix ``C``. VJP: ``x̄_q = ȳ[q]`` — rule 2 alone. There is no fan-out to sum: the P
    identical downstream copies are one computation counted once, so their common cotangent
    ``ȳ`` (the same on every rank) is simply split, and rank q keeps slice q. No communication.

    Why both all-gather rows exist: rule 2 always gives "split" for the concatenation; rule 1
    adds "sum over replicas" only when the replicas are distinct consumers. If each rank's
    downstream differs (its own weights or data, loss terms added over ranks), the P copies
    are a genuine fan-out and the backward is a reduce-scatter (:func:`gather_from_ranks`). If
    the downstream is identical and counted once, reduce-scatter would add P equal cotangents
    and return P times the gradient; the split is right.
    """
    x = as_tensor(x)
    out = np.asarray(dist.all_gather(x.data, axis=axis, group=group))
    rank, world = dist.rank(group), dist.world_size(group)

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        return (chunk(g, rank, world, axis).copy(),)

    return Tensor.from_op(out, (x,), vjp, "gather_replicated")


def reduce_scatter_to_ranks(x: ArrayLike, axis: int = 0, group: dist.Group | None = None) -> Tensor:
    """Reduce-scatter forward, all-gather backward.

    Global map: ``(x_1, …, x_P) ↦ (y_1, …, y_P)`` with ``y_q = Σ_p x_p[q]``, slice q of the sum
    along ``axis``. Input per-rank (full size), output per-rank (one slice each). Jacobian:
    ``∂y_q/∂x_p = S_q``, the selection of slice q, for every p. VJP: ``x̄_p = Σ_q S_qᵀ ȳ_q =
    [ȳ_1; …; ȳ_P]`` on every rank — an all-gather: the all-gather row with forward and
    backward swapped (the adjoint of a map, not its inverse: ``S_q`` has no inverse).
    """
    x = as_tensor(x)
    out = np.asarray(dist.reduce_scatter(x.data, dist.ReduceOp.SUM, axis, group=group))

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        return (np.asarray(dist.all_gather(g, axis=axis, group=group)),)

    return Tensor.from_op(out, (x,), vjp, "reduce_scatter_to_ranks")


def all_to_all_ranks(
    x: ArrayLike,
    split_axis: int = 0,
    concat_axis: int = 0,
    send_counts: Sequence[int] | None = None,
    recv_counts: Sequence[int] | None = None,
    group: dist.Group | None = None,
) -> Tensor:
    """All-to-all forward, all-to-all with the axes swapped (and the counts transposed) backward.

    Global map: rank p cuts ``x_p`` into P chunks along ``split_axis`` and sends chunk q to
    rank q, which concatenates what it receives along ``concat_axis`` in source-rank order:
    ``y_q = [x_1[q]; …; x_P[q]]``. Every entry moves, none is added: the Jacobian is a
    permutation matrix Π. VJP: ``Πᵀ = Π⁻¹``, the inverse permutation — rank q cuts ``ȳ_q`` along
    ``concat_axis``, sends piece p back to rank p, which reassembles along ``split_axis``:
    ``all_to_all(ȳ, split_axis=concat_axis, concat_axis=split_axis)``. Per-rank in and out.
    Uneven (``send_counts``, see :func:`chainrule.dist.all_to_all`): what rank q received from
    p goes back, so the backward sends ``recv_counts`` and receives ``send_counts``; without
    ``recv_counts`` the ranks learn them first, from an all-to-all of the counts.
    """
    x = as_tensor(x)
    if send_counts is not None and recv_counts is None:
        recv_counts = np.asarray(dist.all_to_all(np.array(send_counts), group=group)).tolist()
    out = dist.all_to_all(x.data, split_axis, concat_axis, send_counts, recv_counts, group)

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        back = dist.all_to_all(g, concat_axis, split_axis, recv_counts, send_counts, group)
        return (np.asarray(back),)

    return Tensor.from_op(np.asarray(out), (x,), vjp, "all_to_all_ranks")


def split_to_ranks(x: ArrayLike, axis: int = 0, group: dist.Group | None = None) -> Tensor:
    """Split (scatter) forward: each rank keeps its own chunk of a replicated value; all-gather
    backward.

    Global map: the replicated ``x`` ↦ ``(y_1, …, y_P)`` with ``y_p = x[p]``, chunk p along
    ``axis`` (no communication: every rank already holds ``x``). Jacobian: the selections
    ``S_p`` stacked, i.e. the inverse of a concatenation. VJP: ``x̄ = Σ_p S_pᵀ ȳ_p = [ȳ_1; …;
    ȳ_P]`` — slicing forward, concatenating backward (rule 2 read backwards, with rule 1
    summing the P slices' disjoint contributions). An all-gather, so ``x̄`` is replicated.
    """
    x = as_tensor(x)
    out = chunk(x.data, dist.rank(group), dist.world_size(group), axis).copy()

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        return (np.asarray(dist.all_gather(g, axis=axis, group=group)),)

    return Tensor.from_op(out, (x,), vjp, "split_to_ranks")


f = copy_to_ranks
f_bar = reduce_from_ranks


# -- point to point: a value moved from one rank to another ---------------------------------


def send_to_rank(
    x: ArrayLike,
    dst: int | None = None,
    group: dist.Group | None = None,
    group_dst: int | None = None,
) -> Tensor:
    """Send forward, recv of the gradient backward.

    Global map: this rank s hands its value to rank d, where it becomes the output of
    :func:`recv_from_rank`: ``y_d = x_s``, the identity from rank s's space to rank d's. VJP:
    ``x̄_s = ȳ_d``. The value has one consumer (rule 1 with one term: nothing to add) and is a
    piece of the global value routed to rank d (rule 2 routes its gradient back to where it came
    from): rank d sends ``ȳ_d`` and this rank receives it. A send has no output on its own rank:
    it returns a zero-size tensor, a *phony* (as torchgpipe calls it), whose only job is to hold
    the VJP in the graph. Backpropagate through it (``phony.backward(np.zeros(0))``, or add
    ``phony.sum()`` to what is backpropagated) and its VJP receives x's gradient from ``dst``.
    ``group``, ``group_dst``: as :func:`chainrule.dist.send`'s (``dst`` a rank of the world,
    ``group_dst`` a rank of ``group``); the gradient comes back in the same group.
    """
    x = as_tensor(x)
    dist.send(x.data, dst, group=group, group_dst=group_dst)
    shape, dtype = x.data.shape, x.data.dtype

    def vjp(g: np.ndarray) -> tuple[np.ndarray]:
        received = dist.recv(dst, shape=shape, dtype=dtype, group=group, group_src=group_dst)
        return (np.asarray(received),)

    return Tensor.from_op(np.zeros(0, dtype), (x,), vjp, "send_to_rank")


def recv_from_rank(
    src: int | None = None, group: dist.Group | None = None, group_src: int | None = None
) -> Tensor:
    """Recv forward, send of the gradient back to the source backward.

    Global map: ``y_d = x_s``, the value rank ``src`` sends with :func:`send_to_rank`. VJP:
    ``x̄_s = ȳ_d``: this rank's gradient of what it received is the source's gradient of what it
    sent, so it goes back, a send to ``src`` (the sender's VJP receives it). The received value
    has no parent on this rank; it hangs from a zero-size leaf that requires a gradient, so
    that the engine's backward reaches its VJP. ``group``, ``group_src``: as
    :func:`chainrule.dist.recv`'s.
    """
    data = np.asarray(dist.recv(src, group=group, group_src=group_src))
    anchor = Tensor(np.zeros(0, data.dtype), requires_grad=True)

    def vjp(g: np.ndarray) -> tuple[None]:
        dist.send(g, src, group=group, group_dst=group_src)
        return (None,)

    return Tensor.from_op(data, (anchor,), vjp, "recv_from_rank")


def pass_to_next(x: ArrayLike, group: dist.Group | None = None) -> Tensor:
    """Every rank hands its value to the next one, as pipeline stages do: ``y_r = x_{r−1}``
    (rank 0 receives nothing: ``y_0 = 0``), the last rank's value goes nowhere. Rank r sends with
    :func:`send_to_rank` and receives with :func:`recv_from_rank` (first, so the chain never
    waits in a circle); the phony rides on the output. Its backward is the two rows' VJPs: each
    rank sends the gradient of what it received back and receives its own value's gradient,
    ``x̄_r = ȳ_{r+1}`` (``x̄_{P−1} = 0``). ``group``: the chain is the group's ranks, in its
    order (r counts in the group)."""
    x = as_tensor(x)
    r, P = dist.rank(group), dist.world_size(group)
    y = recv_from_rank(group=group, group_src=r - 1) if r > 0 else ops.mul(x, 0.0)
    if r < P - 1:
        y = y + send_to_rank(x, group=group, group_dst=r + 1).sum()
    return y


# -- the same global maps on one process (the references the rows are checked against) ------


def _concat(parts: Sequence[Any], axis: int) -> Any:
    """Concatenate engine tensors (:func:`~chainrule.engine.ops.concat`), torch ones (``cat``)."""
    if isinstance(parts[0], Tensor):
        return ops.concat(parts, axis=axis)
    import torch

    return torch.cat(list(parts), dim=axis)


def global_copy(xs: Sequence[Any], world_size: int) -> list[Any]:
    """One process: the replicated ``[x]`` fanned out to P consumers, ``[x, …, x]``."""
    (x,) = xs
    return [x] * world_size


def global_reduce(xs: Sequence[Any], world_size: int) -> list[Any]:
    """One process: the P partial results summed into one value, ``[Σ_p x_p]``."""
    return [sum(xs[1:], xs[0])]


def global_gather(xs: Sequence[Any], world_size: int, axis: int = 0) -> list[Any]:
    """One process: the concatenation of the shards, fanned out to P consumers."""
    return [_concat(xs, axis)] * world_size


def global_gather_replicated(xs: Sequence[Any], world_size: int, axis: int = 0) -> list[Any]:
    """One process: the concatenation of the shards, one value consumed once."""
    return [_concat(xs, axis)]


def global_reduce_scatter(xs: Sequence[Any], world_size: int, axis: int = 0) -> list[Any]:
    """One process: the sum of the P inputs, cut into P slices, slice q for consumer q."""
    total = sum(xs[1:], xs[0])
    return [chunk(total, q, world_size, axis) for q in range(world_size)]


def global_all_to_all(
    xs: Sequence[Any], world_size: int, split_axis: int = 0, concat_axis: int = 0
) -> list[Any]:
    """One process: output q is chunk q of every input, concatenated in input order."""
    return [
        _concat([chunk(x, q, world_size, split_axis) for x in xs], concat_axis)
        for q in range(world_size)
    ]


def global_pass_to_next(xs: Sequence[Any], world_size: int) -> list[Any]:
    """One process: output r is input r − 1, output 0 is zero."""
    return [xs[0] * 0.0, *xs[: world_size - 1]]


def global_split(xs: Sequence[Any], world_size: int, axis: int = 0) -> list[Any]:
    """One process: the one input cut into P slices, slice p for consumer p."""
    (x,) = xs
    return [chunk(x, p, world_size, axis) for p in range(world_size)]


# -- the table as data -------------------------------------------------------------------------


@dataclass(frozen=True)
class DualityRow:
    """One row of the duality table, with the code that implements and checks it.

    ``forward``, ``backward`` and ``reasoning`` are the table's text: the reasoning is this
    library's, one sentence of the derivation in each function's docstring.
    ``syllabus_reasoning`` is the syllabus's own reasoning for its rows, word for word: a
    quotation, kept to be shown as one, not a claim of this library (the reduce-scatter row's,
    "the exact inverse", says more than is true: the row is the all-gather row's transpose, and
    an all-gather followed by a reduce-scatter multiplies by P). ``forward_ops`` and
    ``backward_ops`` are the collectives each pass runs, as a :class:`chainrule.dist.Trace`
    names them (the tests run every row and compare). ``engine_fn`` is the differentiable
    collective on engine tensors, :attr:`torch_fn` the same on torch tensors
    (:mod:`chainrule.parallel.duality_torch`, imported on first use), both callable as ``fn(x)``
    with default axes. ``input_kind`` and ``output_kind`` say whether the input and output are
    replicated or per-rank (see the module docstring), and ``global_fn(xs, world_size)`` is the
    same global map on one process: it takes the list of per-rank inputs (one element when the
    input is replicated) and returns the list of per-rank outputs (one element when the output
    is replicated). ``in_syllabus`` is False for the row added to the syllabus's table.
    ``splits_input`` is True when the forward cuts each rank's input into P slices along its
    axis (reduce-scatter, all-to-all, split), so an example input must hold P slices there.
    """

    key: str
    forward: str
    backward: str
    reasoning: str
    engine_fn: Callable[..., Tensor]
    input_kind: Kind
    output_kind: Kind
    global_fn: Callable[..., list[Any]]
    forward_ops: tuple[str, ...]
    backward_ops: tuple[str, ...]
    splits_input: bool = False
    in_syllabus: bool = True
    syllabus_reasoning: str | None = None

    @property
    def torch_fn(self) -> Callable[..., Any]:
        """The same row on torch tensors (imports torch on first use)."""
        from chainrule.parallel import duality_torch

        if self.key in duality_torch.POINT_TO_POINT_ROWS:
            return duality_torch.POINT_TO_POINT_ROWS[self.key]
        return duality_torch.ROWS[self.key]


DUALITY_TABLE: tuple[DualityRow, ...] = (
    DualityRow(
        key="identity",
        forward="identity (value already replicated)",
        backward="all-reduce (sum)",
        reasoning=(
            "Handing one value to P ranks' own computations is a fan-out of width P: "
            "rule 1 sums their P gradients."
        ),
        syllabus_reasoning="Replication is a fan-out; rule 1 says sum the incoming gradients.",
        engine_fn=copy_to_ranks,
        input_kind=REPLICATED,
        output_kind=PER_RANK,
        global_fn=global_copy,
        forward_ops=(),
        backward_ops=("all_reduce",),
    ),
    DualityRow(
        key="all_reduce",
        forward="all-reduce (sum of partial results)",
        backward="identity",
        reasoning=(
            "A sum's derivative in each addend is the identity: every rank's partial result "
            "receives the sum's gradient unchanged."
        ),
        syllabus_reasoning=(
            "Each rank contributed one addend, so each receives the incoming gradient unchanged."
        ),
        engine_fn=reduce_from_ranks,
        input_kind=PER_RANK,
        output_kind=REPLICATED,
        global_fn=global_reduce,
        forward_ops=("all_reduce",),
        backward_ops=(),
    ),
    DualityRow(
        key="all_gather",
        forward="all-gather (assemble shards)",
        backward="reduce-scatter",
        reasoning=(
            "Every rank feeds its own copy of the concatenation to its own computation: rule 1 "
            "sums the P copies' gradients, rule 2 hands shard q slice q of that sum."
        ),
        syllabus_reasoning=(
            "Concatenation forward routes gradients backward, "
            "and the summation over replicas rides along."
        ),
        engine_fn=gather_from_ranks,
        input_kind=PER_RANK,
        output_kind=PER_RANK,
        global_fn=global_gather,
        forward_ops=("all_gather",),
        backward_ops=("reduce_scatter",),
    ),
    DualityRow(
        key="reduce_scatter",
        forward="reduce-scatter",
        backward="all-gather",
        reasoning=(
            "The transpose (adjoint) of the all-gather row, not its inverse: every input reaches "
            "every slice, so each rank's gradient is all P slices' gradients, concatenated."
        ),
        syllabus_reasoning="The exact inverse of the row above.",
        engine_fn=reduce_scatter_to_ranks,
        input_kind=PER_RANK,
        output_kind=PER_RANK,
        global_fn=global_reduce_scatter,
        forward_ops=("reduce_scatter",),
        backward_ops=("all_gather",),
        splits_input=True,
    ),
    DualityRow(
        key="all_to_all",
        forward="all-to-all",
        backward="all-to-all (transposed)",
        reasoning=(
            "Every entry moves and none is added, a permutation: its transpose is the inverse "
            "permutation, an all-to-all with the split and concatenation axes swapped."
        ),
        syllabus_reasoning="A permutation of data; its adjoint is the inverse permutation.",
        engine_fn=all_to_all_ranks,
        input_kind=PER_RANK,
        output_kind=PER_RANK,
        global_fn=global_all_to_all,
        forward_ops=("all_to_all",),
        backward_ops=("all_to_all",),
        splits_input=True,
    ),
    DualityRow(
        key="split",
        forward="split / scatter",
        backward="all-gather",
        reasoning=(
            "Each rank keeps one slice of a replicated value; the slices' gradients, "
            "concatenated (rule 2 read backwards), are the value's gradient on every rank."
        ),
        syllabus_reasoning="Slicing forward, concatenating backward.",
        engine_fn=split_to_ranks,
        input_kind=REPLICATED,
        output_kind=PER_RANK,
        global_fn=global_split,
        forward_ops=(),
        backward_ops=("all_gather",),
        splits_input=True,
    ),
    DualityRow(
        key="all_gather_replicated",
        forward="all-gather (downstream replicated, counted once)",
        backward="split (each rank keeps its own slice)",
        reasoning=(
            "Concatenation forward becomes a split backward; the replicas compute the same "
            "thing and the loss counts it once, so there is nothing to sum."
        ),
        engine_fn=gather_replicated,
        input_kind=PER_RANK,
        output_kind=REPLICATED,
        global_fn=global_gather_replicated,
        forward_ops=("all_gather",),
        backward_ops=(),
        in_syllabus=False,
    ),
)


POINT_TO_POINT_TABLE: tuple[DualityRow, ...] = (
    DualityRow(
        key="send",
        forward="send (to another rank)",
        backward="recv (of the gradient, from that rank)",
        reasoning=(
            "The value has one consumer, on the destination: its gradient is that consumer's, "
            "routed back to where the value came from (rule 2), so the sender receives it."
        ),
        engine_fn=pass_to_next,
        input_kind=PER_RANK,
        output_kind=PER_RANK,
        global_fn=global_pass_to_next,
        forward_ops=("send",),
        backward_ops=("send",),
        in_syllabus=False,
    ),
    DualityRow(
        key="recv",
        forward="recv (from another rank)",
        backward="send (of the gradient, back to that rank)",
        reasoning=(
            "What arrived is the source's value: the gradient of what arrived is the gradient "
            "of what was sent, and it goes back, a send to the source."
        ),
        engine_fn=pass_to_next,
        input_kind=PER_RANK,
        output_kind=PER_RANK,
        global_fn=global_pass_to_next,
        forward_ops=("send",),
        backward_ops=("send",),
        in_syllabus=False,
    ),
)
"""The point-to-point rows of pipeline parallelism: a send and its recv are the two halves of
one move (a trace counts the pair as one ``send``), and both run in :func:`pass_to_next`,
where each rank's send meets the next rank's recv. They are kept out of :data:`DUALITY_TABLE`,
whose rows each run alone on any number of ranks (one included), and shown where pipelines
are taught."""


def duality_row(key: str) -> DualityRow:
    """The row of :data:`DUALITY_TABLE` with this ``key``."""
    for row in DUALITY_TABLE:
        if row.key == key:
            return row
    keys = ", ".join(row.key for row in DUALITY_TABLE)
    raise KeyError(f"no duality row {key!r}; the rows are {keys}")


def duality_table_markdown(include_additions: bool = True) -> str:
    """The table as Markdown (forward | backward | reasoning, the library's reasoning), the
    syllabus's rows first; ``include_additions=False`` leaves out the rows it does not have."""
    rows = [r for r in DUALITY_TABLE if r.in_syllabus or include_additions]
    lines = [
        "| Forward operation | Backward operation | Reasoning |",
        "|---|---|---|",
        *(f"| {r.forward} | {r.backward} | {r.reasoning} |" for r in rows),
    ]
    return "\n".join(lines)
