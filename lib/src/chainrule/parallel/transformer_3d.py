"""The capstone's transformer on a dp × tp × pp grid: pipeline parallelism as a third axis.

The model of :mod:`chainrule.parallel.transformer` is cut into ``pp`` **stages** of
consecutive blocks: stage 0 also holds the embeddings, the last stage the final norm and the
head. Every stage is lesson 15's ``dp × tp`` grid: Megatron's tensor-parallel blocks inside a
tensor-parallel group, data-parallel replicas across a data-parallel group. The stages pass the
residual stream forward and its gradient backward, micro-batch by micro-batch, on a 1F1B
schedule (:func:`chainrule.parallel.pipeline.run_schedule`), inside a **pipeline group**.

Rank ``r = (s·dp + d)·tp + t`` sits at stage s, data-parallel index d, tensor-parallel index t
(tensor parallelism varies fastest, the stage slowest, as Megatron-LM orders them: the ranks of
a tensor-parallel group are neighbours, on one machine's fast links). For 2 × 2 × 2::

    stage 0        stage 1         tensor groups:   (0, 1) (2, 3) (4, 5) (6, 7)
    [ 0  1 ]  →    [ 4  5 ]        data groups:     (0, 2) (1, 3) (4, 6) (5, 7)
    [ 2  3 ]  →    [ 6  7 ]        pipeline groups: (0, 4) (1, 5) (2, 6) (3, 7)

Each rank of a pipeline group is one stage of the same replica and the same shard: stage s
sends the residual stream (replicated in its tensor group, so each tensor-parallel rank sends
its own copy to its partner) to stage s + 1. The last stage's micro-batch loss is its share of
the replica's loss (divided by m), so the micro-batches' gradients add up to the replica's
gradient (lesson 6), and the data-parallel average over equal replicas is the whole batch's
gradient (lesson 3): every step equals one process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from chainrule import dist
from chainrule.dist.chunks import chunk
from chainrule.engine.optim import SGD
from chainrule.engine.tensor import Tensor
from chainrule.parallel import transformer as tf
from chainrule.parallel.data_parallel import DataParallel
from chainrule.parallel.pipeline import run_schedule

AXES = ("data", "tensor", "pipeline")
"""The grid's three axes, by the parallelism that runs along each."""


# -- the grid -----------------------------------------------------------------------------------


def grid_rank(stage: int, dp_rank: int, tp_rank: int, dp: int, tp: int) -> int:
    """The world rank at (stage, data-parallel index, tensor-parallel index):
    ``(s·dp + d)·tp + t``."""
    return (stage * dp + dp_rank) * tp + tp_rank


def coordinates(rank: int, dp: int, tp: int) -> tuple[int, int, int]:
    """``(stage, dp_rank, tp_rank)`` of a world rank (the inverse of :func:`grid_rank`)."""
    rest, t = divmod(rank, tp)
    s, d = divmod(rest, dp)
    return s, d, t


def grid_groups(dp: int, tp: int, pp: int) -> dict[str, list[tuple[int, ...]]]:
    """The ranks of every group of each axis: a data-parallel group varies d (fixed s, t), a
    tensor-parallel group t (fixed s, d), a pipeline group s (fixed d, t), in stage order."""
    return {
        "data": [
            tuple(grid_rank(s, d, t, dp, tp) for d in range(dp))
            for s in range(pp)
            for t in range(tp)
        ],
        "tensor": [
            tuple(grid_rank(s, d, t, dp, tp) for t in range(tp))
            for s in range(pp)
            for d in range(dp)
        ],
        "pipeline": [
            tuple(grid_rank(s, d, t, dp, tp) for s in range(pp))
            for d in range(dp)
            for t in range(tp)
        ],
    }


@dataclass(frozen=True)
class Grid3D:
    """This rank's place in a ``dp × tp × pp`` grid: its coordinates and its three groups."""

    dp: int
    tp: int
    pp: int
    dp_rank: int
    tp_rank: int
    stage: int
    dp_group: dist.Group
    tp_group: dist.Group
    pp_group: dist.Group


def grid_3d(dp: int, tp: int, pp: int) -> Grid3D:
    """This rank's :class:`Grid3D` of a world of ``dp·tp·pp`` ranks (makes every group of every
    axis, on every rank, in the same order)."""
    size = dist.world_size()
    if min(dp, tp, pp) < 1 or dp * tp * pp != size:
        raise ValueError(
            f"a {dp} × {tp} × {pp} grid needs {dp * tp * pp} ranks, the world has {size}"
        )
    rank = dist.rank()
    mine = {}
    for axis, groups in grid_groups(dp, tp, pp).items():
        made = [dist.new_group(ranks) for ranks in groups]
        mine[axis] = next(g for g in made if rank in g.ranks)
    s, d, t = coordinates(rank, dp, tp)
    return Grid3D(dp, tp, pp, d, t, s, mine["data"], mine["tensor"], mine["pipeline"])


# -- the model cut into stages ------------------------------------------------------------------


def stage_blocks(config: tf.Config, stage: int, pp: int) -> range:
    """The blocks of stage ``stage`` of ``pp``: ``layers/pp`` consecutive ones."""
    if config.layers % pp:
        raise ValueError(f"{config.layers} blocks do not cut into {pp} equal stages")
    per = config.layers // pp
    return range(stage * per, (stage + 1) * per)


def stage_of(name: str, config: tf.Config, pp: int) -> int:
    """The stage that holds parameter ``name``: the embeddings the first, the final norm and
    the head the last, a block's parameters its block's."""
    if name in ("embed", "position"):
        return 0
    if name in ("norm", "head"):
        return pp - 1
    return int(name.split(".", 1)[0]) // (config.layers // pp)


def stage_weights(
    weights: dict[str, np.ndarray], config: tf.Config, stage: int, pp: int, tp_rank: int, tp: int
) -> dict[str, np.ndarray]:
    """The part of the model one rank holds: its stage's parameters, its tensor-parallel block
    of each cut matrix (copies)."""
    held = {n: w for n, w in weights.items() if stage_of(n, config, pp) == stage}
    return tf.shard_weights(held, tp_rank, tp)


def stage_forward(
    params: dict[str, Tensor],
    windows: np.ndarray,
    x: Tensor | None,
    config: tf.Config,
    stage: int,
    pp: int,
    tp_group: dist.Group | None = None,
) -> Tensor:
    """Stage ``stage``'s part of :func:`~chainrule.parallel.transformer.loss` on a micro-batch
    of ``windows``: stage 0 embeds the inputs (``x`` is None there), every stage runs its blocks
    on the residual stream ``x``, and the last returns the loss; the others return the stream."""
    if stage == 0:
        x = tf.embed(params, windows[:, :-1])
    assert x is not None
    for layer in stage_blocks(config, stage, pp):
        x = tf.block(params, layer, x, config, tp_group)
    if stage == pp - 1:
        return tf.head_loss(params, x, windows[:, 1:])
    return x


# -- training -----------------------------------------------------------------------------------


@dataclass
class RankRun:
    """One rank's training: the loss of every step (on the last stage, the whole batch's; the
    other stages never see it: empty), this rank's parameters after the last step, and the
    actions of its last step's schedule."""

    losses: list[float]
    weights: dict[str, np.ndarray]
    order: list[str]


def train_on_3d_grid(
    t: tf.Training,
    dp: int,
    tp: int,
    pp: int,
    micro_batches: int,
    schedule: str = "1f1b",
    steps: int | None = None,
) -> RankRun:
    """On every rank of a world of ``dp·tp·pp`` ranks (inside ``dist.run``): train this rank's
    part of the model on its replica's share of each batch, cut into ``micro_batches``.

    Per step: the stage's schedule over the micro-batches in the pipeline group (forwards and
    backwards with f / f̄ in the tensor group, the micro-batch losses divided by m); one
    all-reduce (mean) of the gradients over the data group; on the last stage one all-reduce of
    the loss for the curve; then the same SGD step as one process on this rank's part.
    """
    g = grid_3d(dp, tp, pp)
    last, m = g.stage == pp - 1, micro_batches
    local = stage_weights(t.weights, t.config, g.stage, pp, g.tp_rank, tp)
    params = {n: Tensor(w, requires_grad=True) for n, w in local.items()}
    replicas = DataParallel(params.values(), group=g.dp_group)
    optimizer = SGD(params.values(), t.lr, t.momentum)
    losses, order = [], []
    for windows in t.windows[:steps]:
        rows = chunk(windows, g.dp_rank, dp)  # this replica's sequences

        def forward(i: int, x: Tensor | None, rows: np.ndarray = rows) -> Tensor:
            micro = chunk(rows, i, m)
            out = stage_forward(params, micro, x, t.config, g.stage, pp, g.tp_group)
            return out * (1.0 / m) if last else out

        run = run_schedule(forward, m, schedule, g.pp_group)
        replicas.sync_gradients()  # the data group's mean
        if last:
            mean = dist.all_reduce(np.array(run.loss), op=dist.ReduceOp.AVG, group=g.dp_group)
            losses.append(float(mean))
        optimizer.step()
        optimizer.zero_grad()
        order = run.order
    return RankRun(losses, {n: p.data for n, p in params.items()}, order)


# -- reading the ranks back ---------------------------------------------------------------------


def whole_model(
    weights: Sequence[dict[str, np.ndarray]], dp: int, tp: int, pp: int
) -> dict[str, np.ndarray]:
    """The whole model from every rank's parameters (``weights[r]``: rank r's): each stage's
    from its first replica's tensor-parallel ranks, cut matrices joined."""
    whole = {}
    for s in range(pp):
        parts = [weights[grid_rank(s, 0, t, dp, tp)] for t in range(tp)]
        for name, part in parts[0].items():
            axis = tf.shard_axis(name)
            if axis is None:
                whole[name] = part
            else:
                whole[name] = np.concatenate([p[name] for p in parts], axis=axis)
    return whole


def replicas_agree(weights: Sequence[dict[str, np.ndarray]], dp: int, tp: int) -> bool:
    """Every rank holds bit for bit the parameters of its counterpart in the first replica
    (same stage, same tensor-parallel index)."""
    for rank, parts in enumerate(weights):
        s, _, t = coordinates(rank, dp, tp)
        first = weights[grid_rank(s, 0, t, dp, tp)]
        if parts.keys() != first.keys():
            return False
        if not all(np.array_equal(parts[n], first[n]) for n in parts):
            return False
    return True


def parameter_shapes(config: tf.Config) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape, without making the arrays (a model too large to hold here)."""
    d, h, v = config.width, config.hidden, config.vocab
    shapes: dict[str, tuple[int, ...]] = {"embed": (v, d), "position": (config.context, d)}
    for layer in range(config.layers):
        shapes[f"{layer}.norm1"] = (d,)
        shapes.update({f"{layer}.{name}": (d, d) for name in ("wq", "wk", "wv", "wo")})
        shapes.update({f"{layer}.norm2": (d,), f"{layer}.w1": (d, h), f"{layer}.w2": (h, d)})
    shapes.update({"norm": (d,), "head": (d, v)})
    return shapes


def parameters_per_rank(config: tf.Config, tp: int, pp: int) -> list[int]:
    """How many parameters a rank of each stage holds on a grid of ``tp`` and ``pp`` (data
    parallelism copies them): its stage's, cut matrices divided by tp."""
    counts = [0] * pp
    for name, shape in parameter_shapes(config).items():
        size = int(np.prod(shape))
        counts[stage_of(name, config, pp)] += size if tf.shard_axis(name) is None else size // tp
    return counts
