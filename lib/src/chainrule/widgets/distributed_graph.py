"""The global graph of one data-parallel step, built explicitly on the engine (lesson 7).

No framework builds this graph — each rank builds only its own slice — but it is the graph
whose chain rule data parallelism computes:

    θ ──copy──► θ_1 ──► L_1(θ_1; B_1) ─┐
      ├─copy──► θ_2 ──► L_2(θ_2; B_2) ─┼──► L = (1/P) Σ_p L_p
      └─copy──► θ_P ──► L_P(θ_P; B_P) ─┘

θ is read by P copies, a fan-out of width P, so backward sums the copies' gradients (rule 1):
``θ̄ = Σ_p θ̄_p = (1/P) Σ_p ∇L_p`` — the all-reduce. :func:`data_parallel_graph` builds it
with an identity op per copy (named ``θ on rank p``) so that each copy is its own node, and
:func:`draw_global_graph` draws it with :func:`chainrule.graph.draw`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure

from chainrule import graph, ops
from chainrule.tensor import Tensor

LocalLoss = Callable[[Tensor, Tensor, Tensor], Tensor]


def half_squared_error(theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
    """``L_p(θ) = (1/|B_p|) Σ_i ½(θ x_i − y_i)²``, whose gradient is ``mean_i (θx_i − y_i) x_i``."""
    return ops.mse_loss(theta * x, y) / 2


@dataclass(frozen=True)
class GlobalGraph:
    """The tensors of the global graph: the parameter, its P copies, the local losses, L."""

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

    ``shards[p] = (x_p, y_p)`` is rank p's data. θ is copied once per rank (an identity op, so
    the copy is a node of its own that keeps its gradient), rank p's loss is
    ``local_loss(θ_p, x_p, y_p)``, and the local losses meet in one mean
    ``L = (1/P) Σ_p L_p`` (exact for equal shards).
    """
    if not shards:
        raise ValueError("a data-parallel step needs at least one shard")
    parameter = Tensor(theta, requires_grad=True, name="θ")
    copies, losses = [], []
    for p, (x, y) in enumerate(shards):
        copy = ops.reshape(parameter, parameter.shape)  # identity: the copy sent to rank p
        copy.name = f"θ on rank {p}"
        copy.retain_grad()
        loss = local_loss(copy, Tensor(x, name=f"x on rank {p}"), Tensor(y, name=f"y on rank {p}"))
        loss.name = f"L_{p}"
        loss.retain_grad()
        copies.append(copy)
        losses.append(loss)
    total = ops.stack(losses).mean()
    total.name = "L (mean over ranks)"
    return GlobalGraph(parameter, copies, losses, total)


def draw_global_graph(g: GlobalGraph) -> Figure:
    """:func:`chainrule.graph.draw` of the global graph, without the scalar constants."""
    figure = graph.draw(g.loss, scalar_constants=False)
    figure.suptitle(f"One data-parallel step on P = {g.world_size} ranks, as one graph")
    return figure
