"""A small transformer language model on the engine, trained on a dp × tp grid of ranks.

The model is a decoder-only transformer over characters: token and position embeddings, then
``layers`` blocks of pre-norm causal self-attention and a pre-norm MLP, each added to the
residual stream, a final RMSNorm and a linear head to the vocabulary. The loss is the mean
cross-entropy of predicting each next character.

On a grid of ``dp × tp`` ranks (:func:`chainrule.dist.grid`), each block is Megatron's
tensor-parallel block inside its tensor-parallel group, and the groups are data-parallel
replicas of each other:

- **tensor parallelism**, one row of the grid: the query, key and value projections are cut by
  heads (columns, ``Shard(1)``) and the output projection by the matching rows (``Shard(0)``),
  the MLP's first matrix by columns and its second by rows. The normed residual enters each
  half-block through ``f`` (identity forward, all-reduce backward: a replicated value read by
  the ranks' different columns) and the partial outputs leave it through ``f̄`` (all-reduce
  forward, identity backward). Embeddings, norms and the head are replicated in the row and
  act on replicated values, so each rank's gradient of them is already the whole gradient;
- **data parallelism**, one column of the grid: each row takes its own ``1/dp`` of the batch's
  sequences, and after the backward every gradient is averaged over the column (one
  all-reduce of all gradients, flattened). The rows' batches are equal, so the mean of their
  mean losses is the mean loss of the whole batch (lesson 3), and every step equals one
  process.

Per step and layer, tensor parallelism costs two all-reduces of the activations forward (the
two ``f̄``) and two backward (the two ``f``); data parallelism one all-reduce of the sharded
gradients. With ``dp = tp = 1`` and no groups, the same code is the model on one process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from chainrule import dist
from chainrule.dist.chunks import chunk
from chainrule.engine import ops
from chainrule.engine.optim import SGD
from chainrule.engine.recompute import checkpoint
from chainrule.engine.tensor import Tensor
from chainrule.parallel import duality
from chainrule.parallel.data_parallel import DataParallel
from chainrule.parallel.tensor_parallel import identity

SHARD_AXIS = {"wq": 1, "wk": 1, "wv": 1, "wo": 0, "w1": 1, "w2": 0}
"""The axis of each layer matrix cut across a tensor-parallel group (columns of the query, key,
value and first MLP matrix; rows of the output projection and second MLP matrix). Every other
parameter is replicated in the group."""


@dataclass(frozen=True)
class Config:
    """The model's sizes: ``vocab`` characters, ``context`` positions, residual ``width``,
    ``heads`` attention heads, ``layers`` blocks, MLP ``hidden`` width, ``dtype`` of every
    array."""

    vocab: int
    context: int = 16
    width: int = 32
    heads: int = 4
    layers: int = 2
    hidden: int = 64
    dtype: str = "float64"


# -- text ------------------------------------------------------------------------------------


def vocabulary(text: str) -> list[str]:
    """The distinct characters of ``text``, sorted: character ``vocabulary[i]`` is token i."""
    return sorted(set(text))


def encode(text: str, chars: Sequence[str]) -> np.ndarray:
    """``text`` as token ids (int64) of the vocabulary ``chars``."""
    index = {c: i for i, c in enumerate(chars)}
    return np.array([index[c] for c in text], dtype=np.int64)


def batches(ids: np.ndarray, steps: int, batch: int, context: int, seed: int = 0) -> np.ndarray:
    """``steps`` batches of ``batch`` windows of ``context + 1`` consecutive tokens, drawn at
    random (reproducibly from ``seed``): shape (steps, batch, context + 1). A window's first
    ``context`` tokens are the input, its last ``context`` the targets."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(ids) - context - 1, size=(steps, batch))
    return ids[starts[..., None] + np.arange(context + 1)]


# -- parameters --------------------------------------------------------------------------------


def init_weights(config: Config, seed: int = 0) -> dict[str, np.ndarray]:
    """The whole model's weights, reproducible from ``seed`` (matrices scaled by 1/√fan-in,
    norm gains 1), as arrays of ``config.dtype``, in a fixed order."""
    rng = np.random.default_rng(seed)
    d, h = config.width, config.hidden

    def matrix(rows: int, cols: int) -> np.ndarray:
        return rng.standard_normal((rows, cols)) / np.sqrt(rows)

    weights = {
        "embed": 0.5 * rng.standard_normal((config.vocab, d)),
        "position": 0.1 * rng.standard_normal((config.context, d)),
    }
    for layer in range(config.layers):
        weights[f"{layer}.norm1"] = np.ones(d)
        for name in ("wq", "wk", "wv", "wo"):
            weights[f"{layer}.{name}"] = matrix(d, d)
        weights[f"{layer}.norm2"] = np.ones(d)
        weights[f"{layer}.w1"] = matrix(d, h)
        weights[f"{layer}.w2"] = matrix(h, d)
    weights["norm"] = np.ones(d)
    weights["head"] = matrix(d, config.vocab)
    return {name: w.astype(config.dtype) for name, w in weights.items()}


def shard_axis(name: str) -> int | None:
    """The axis along which parameter ``name`` is cut across a tensor-parallel group (None:
    replicated)."""
    return SHARD_AXIS.get(name.rsplit(".", 1)[-1])


def shard_weights(weights: dict[str, np.ndarray], tp_rank: int, tp: int) -> dict[str, np.ndarray]:
    """Tensor-parallel rank ``tp_rank``'s part of every weight (copies): its block of each cut
    matrix, all of each replicated one."""
    local = {}
    for name, w in weights.items():
        axis = shard_axis(name)
        local[name] = (w if axis is None else chunk(w, tp_rank, tp, axis)).copy()
    return local


# -- the model ---------------------------------------------------------------------------------


def causal_attention(q: Tensor, k: Tensor, v: Tensor, heads: int) -> Tensor:
    """Softmax attention of every position to itself and the positions before it.

    ``q``, ``k``, ``v``: (batch, tokens, heads·d_h). Per head, ``softmax(q kᵀ/√d_h + M) v``
    with ``M`` = −10⁹ above the diagonal (a future position gets weight 0).
    """
    batch, tokens, width = q.shape
    d_head = width // heads

    def by_head(t: Tensor) -> Tensor:  # (batch, tokens, heads·d_h) → (batch, heads, tokens, d_h)
        return t.reshape(batch, tokens, heads, d_head).transpose(0, 2, 1, 3)

    future = np.triu(np.full((tokens, tokens), -1e9, dtype=q.dtype), k=1)
    scores = by_head(q) @ by_head(k).transpose(0, 1, 3, 2) / np.sqrt(d_head) + future
    out = ops.softmax(scores, axis=-1) @ by_head(v)
    return out.transpose(0, 2, 1, 3).reshape(batch, tokens, width)


RECOMPUTE = ("none", "full", "selective")
"""What :func:`loss` recomputes in the backward instead of storing: nothing; every block
(only the residual stream between blocks is stored); or the attention core of every block
(scores, softmax and its product with the values), whose (tokens × tokens) arrays per head
are the largest activations of a block and cost no parameter to recompute."""


def loss(
    params: dict[str, Tensor],
    windows: np.ndarray,
    config: Config,
    tp_group: dist.Group | None = None,
    recompute: str = "none",
) -> Tensor:
    """The mean next-token cross-entropy of ``windows`` (batch, context + 1).

    ``params``: this rank's parameters (whole, or its tensor-parallel part); ``tp_group``: the
    ranks that share the cut matrices (None: one process, f and f̄ are the identity);
    ``recompute``: one of :data:`RECOMPUTE`, the same loss and gradients with less stored
    (:func:`chainrule.engine.recompute.checkpoint`).
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"loss: recompute must be one of {RECOMPUTE}, not {recompute!r}")
    inputs, targets = windows[:, :-1], windows[:, 1:]
    x = embed(params, inputs)
    selective = recompute == "selective"
    for layer in range(config.layers):
        if recompute == "full":
            # A checkpoint's function may read parameters from its closure, as torch's may.
            whole_block = partial(block, params, layer, config=config, tp_group=tp_group)
            x = checkpoint(whole_block, x)
        else:
            x = block(params, layer, x, config, tp_group, recompute_attention=selective)
    return head_loss(params, x, targets)


def embed(params: dict[str, Tensor], inputs: np.ndarray) -> Tensor:
    """The residual stream's start: each token's embedding plus its position's."""
    return params["embed"][inputs] + params["position"]


def block(
    params: dict[str, Tensor],
    layer: int,
    x: Tensor,
    config: Config,
    tp_group: dist.Group | None = None,
    recompute_attention: bool = False,
) -> Tensor:
    """Block ``layer`` on the residual stream ``x`` (batch, tokens, width): attention, then the
    MLP, each normed first and added to the stream; Megatron's block in ``tp_group``.
    ``recompute_attention``: the attention core is a checkpoint (recomputed in the backward)."""
    f: Callable[[Tensor], Tensor] = identity
    f_bar: Callable[[Tensor], Tensor] = identity
    heads = config.heads
    if tp_group is not None:
        f = lambda x: duality.copy_to_ranks(x, tp_group)  # noqa: E731
        f_bar = lambda x: duality.reduce_from_ranks(x, tp_group)  # noqa: E731
        heads //= len(tp_group)
    p = {name: params[f"{layer}.{name}"] for name in ("norm1", *SHARD_AXIS, "norm2")}
    a = f(ops.rms_norm(x, p["norm1"]))  # f: the replicated activations enter the heads
    qkv = (a @ p["wq"], a @ p["wk"], a @ p["wv"])
    if recompute_attention:
        heads_out = checkpoint(partial(causal_attention, heads=heads), *qkv)
    else:
        heads_out = causal_attention(*qkv, heads)
    x = x + f_bar(heads_out @ p["wo"])  # f̄: the heads' partial outputs are added
    m = f(ops.rms_norm(x, p["norm2"]))
    return x + f_bar((m @ p["w1"]).tanh() @ p["w2"])


def head_loss(params: dict[str, Tensor], x: Tensor, targets: np.ndarray) -> Tensor:
    """The final norm, the head's logits and their mean cross-entropy against ``targets``."""
    logits = ops.rms_norm(x, params["norm"]) @ params["head"]
    return ops.cross_entropy(logits, targets)


# -- training ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Training:
    """What to train: ``steps`` batches (see :func:`batches`), SGD with learning rate ``lr``
    and momentum ``momentum``."""

    config: Config
    weights: dict[str, np.ndarray]
    windows: np.ndarray
    lr: float = 0.3
    momentum: float = 0.9


def train_one_process(t: Training) -> list[float]:
    """The loss of every step, training the whole model on whole batches in this process."""
    return trained_one_process(t)[0]


def trained_one_process(t: Training) -> tuple[list[float], dict[str, np.ndarray]]:
    """:func:`train_one_process`'s losses, and the weights it ends with."""
    params = {n: Tensor(w.copy(), requires_grad=True) for n, w in t.weights.items()}
    optimizer = SGD(params.values(), t.lr, t.momentum)
    losses = []
    for windows in t.windows:
        step_loss = loss(params, windows, t.config)
        step_loss.backward()
        losses.append(float(step_loss.data))
        optimizer.step()
        optimizer.zero_grad()
    return losses, {n: p.data for n, p in params.items()}


def train_on_grid(t: Training, dp: int, tp: int, steps: int | None = None) -> list[float]:
    """On every rank of a world of ``dp·tp`` ranks (inside ``dist.run``): train this rank's
    part of the model on its row's share of each batch; the loss of every step (the mean
    over the data-parallel column: the whole batch's loss), the same on every rank.

    Per step: the forward and backward with f / f̄ in the row; one all-reduce (mean) of all
    this rank's gradients, flattened, over the column; one all-reduce of the loss for the
    curve; then the same SGD step as one process on this rank's part.
    """
    g = dist.grid(dp, tp)
    params = {
        n: Tensor(w, requires_grad=True) for n, w in shard_weights(t.weights, g.tp_rank, tp).items()
    }
    replicas = DataParallel(params.values(), group=g.dp_group)  # the column averages
    optimizer = SGD(params.values(), t.lr, t.momentum)
    losses = []
    for windows in t.windows[:steps]:
        rows = chunk(windows, g.dp_rank, dp)  # this row's sequences
        step_loss = loss(params, rows, t.config, g.tp_group)
        replicas.backward(step_loss)  # the backward, then one all-reduce of the gradients
        mean = dist.all_reduce(step_loss.data, op=dist.ReduceOp.AVG, group=g.dp_group)
        losses.append(float(mean))
        optimizer.step()
        optimizer.zero_grad()
    return losses
