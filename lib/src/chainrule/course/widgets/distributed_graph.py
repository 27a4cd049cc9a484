"""The global graph of a distributed step, built whole on one process (lessons 3 and 8).

No framework builds this graph (each rank builds only its own slice) but it is the graph
whose chain rule the ranks compute together. Two of them:

- **replicated parameter** (data parallelism, :func:`data_parallel_graph`)::

      θ ──copy──► θ_1 ──► L_1(θ_1; B_1) ─┐
        ├─copy──► θ_2 ──► L_2(θ_2; B_2) ─┼──► L = (1/P) Σ_p L_p
        └─copy──► θ_P ──► L_P(θ_P; B_P) ─┘

  θ is read by P copies, a fan-out of width P, so backward sums the copies' gradients
  (rule 1): ``θ̄ = Σ_p θ̄_p = (1/P) Σ_p ∇L_p``, the all-reduce.

- **sharded parameter** (a feature-sharded linear model, :func:`sharded_parameter_graph`):
  rank p holds only its slice θ_p and the matching columns X_p of the input, computes the
  partial prediction ``z_p = X_p θ_p``, and the partial predictions meet in one sum
  ``ŷ = Σ_p z_p``: the all-reduce of the forward pass. The loss of ŷ is computed once.
  Backward, the sum hands every addend the same gradient ``ȳ`` and each shard gets
  ``θ̄_p = X_pᵀ ȳ`` where it lives: no collective at all for the parameter's gradient.

The copy and the sum are drawn as one node each (:func:`copy_to_rank`, :func:`sum_over_ranks`):
the one-process stand-ins of :func:`chainrule.parallel.duality.copy_to_ranks` and
:func:`chainrule.parallel.duality.reduce_from_ranks`, with the same VJPs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from chainrule.course import graph
from chainrule.engine import ops
from chainrule.engine.tensor import Tensor

LocalLoss = Callable[[Tensor, Tensor, Tensor], Tensor]


def copy_to_rank(x: Tensor, rank: int) -> Tensor:
    """The copy of ``x`` that rank ``rank`` reads: identity forward, gradient passed back.

    ``x`` read by P such copies is a fan-out of width P, whose backward sums the copies'
    gradients (rule 1): on real ranks that sum is the all-reduce of ``copy_to_ranks``.
    """
    out = Tensor.from_op(np.array(x.data), (x,), lambda g: (g,), "copy")
    out.name = f"{x.name or 'x'} on rank {rank}"
    return out


def sum_over_ranks(parts: Sequence[Tensor], name: str = "Σ over ranks") -> Tensor:
    """One value from the P ranks' addends: ``Σ_p x_p`` forward, ``x̄_p = ȳ`` for every p.

    Each addend receives the incoming gradient unchanged: on real ranks this sum is the
    all-reduce of ``reduce_from_ranks``, and its backward the identity.
    """
    total = np.sum([p.data for p in parts], axis=0)
    out = Tensor.from_op(total, tuple(parts), lambda g: tuple(g for _ in parts), "all-reduce")
    out.name = name
    return out


def half_squared_error(theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
    """``L_p(θ) = (1/|B_p|) Σ_i ½(θ x_i − y_i)²``, whose gradient is ``mean_i (θx_i − y_i) x_i``."""
    return ops.mse_loss(theta * x, y) / 2


@dataclass(frozen=True)
class GlobalGraph:
    """The tensors of the data-parallel graph: the parameter, its P copies, the local losses,
    L."""

    theta: Tensor
    copies: list[Tensor]
    local_losses: list[Tensor]
    loss: Tensor

    @property
    def world_size(self) -> int:
        return len(self.copies)


def data_parallel_graph(
    theta: float | np.ndarray,
    shards: Sequence[tuple[np.ndarray, np.ndarray]],
    local_loss: LocalLoss = half_squared_error,
) -> GlobalGraph:
    """One process builds the whole data-parallel step as one graph.

    ``shards[p] = (x_p, y_p)`` is rank p's data. θ is copied once per rank (:func:`copy_to_rank`,
    so the copy is a node of its own that keeps its gradient), rank p's loss is
    ``local_loss(θ_p, x_p, y_p)``, and the local losses meet in one mean
    ``L = (1/P) Σ_p L_p`` (the full-batch mean loss when the shards are equal).
    """
    if not shards:
        raise ValueError("a data-parallel step needs at least one shard")
    parameter = Tensor(theta, requires_grad=True, name="θ")
    copies, losses = [], []
    for p, (x, y) in enumerate(shards):
        copy = copy_to_rank(parameter, p).retain_grad()
        loss = local_loss(copy, Tensor(x, name=f"x on rank {p}"), Tensor(y, name=f"y on rank {p}"))
        loss.name = f"L_{p}"
        copies.append(copy)
        losses.append(loss.retain_grad())
    total = ops.stack(losses).mean()
    total.name = "L"
    return GlobalGraph(parameter, copies, losses, total)


@dataclass(frozen=True)
class ShardedGraph:
    """The tensors of the sharded-parameter graph: the shards θ_p, the partial predictions
    ``z_p = X_p θ_p``, their sum ŷ and the loss."""

    shards: list[Tensor]
    partials: list[Tensor]
    prediction: Tensor
    loss: Tensor

    @property
    def world_size(self) -> int:
        return len(self.shards)


def sharded_parameter_graph(
    theta: np.ndarray, x: np.ndarray, y: np.ndarray, world_size: int
) -> ShardedGraph:
    """One process builds the step of a linear model ``ŷ = X θ`` whose parameter is sharded.

    θ (length d) is cut into ``world_size`` equal slices θ_p, and X into the matching column
    blocks X_p; rank p computes ``z_p = X_p θ_p``; :func:`sum_over_ranks` adds them into ŷ,
    and the loss ``L = mean ½(ŷ − y)²`` is computed once. ``θ_p.grad`` after backward is
    ``X_pᵀ ȳ``: slice p of the full gradient.
    """
    theta = np.asarray(theta, dtype=float)
    if theta.ndim != 1 or len(theta) % world_size:
        raise ValueError(f"θ of shape {theta.shape} does not cut into {world_size} equal slices")
    shards, partials = [], []
    for p, (theta_p, x_p) in enumerate(
        zip(
            np.split(theta, world_size),
            np.split(np.asarray(x, float), world_size, axis=1),
            strict=True,
        )
    ):
        shard = Tensor(theta_p, requires_grad=True, name=f"θ_{p} on rank {p}")
        partial = Tensor(x_p, name=f"X_{p} on rank {p}") @ shard
        partial.name = f"z_{p}"
        shards.append(shard)
        partials.append(partial.retain_grad())
    prediction = sum_over_ranks(partials, name="ŷ").retain_grad()
    loss = ops.mse_loss(prediction, Tensor(np.asarray(y, float), name="y")) / 2
    loss.name = "L"
    return ShardedGraph(shards, partials, prediction, loss)


def draw_global_graph(g: GlobalGraph | ShardedGraph) -> graph.GraphDrawing:
    """:func:`chainrule.course.graph.draw` of a global graph, with a title saying what it is."""
    if isinstance(g, GlobalGraph):
        title = f"One data-parallel step on P = {g.world_size} ranks, as one graph"
    else:
        title = f"A parameter sharded over P = {g.world_size} ranks, as one graph"
    return graph.draw(g.loss, title=title)
