"""Context parallelism: the sequence split across ranks *inside* attention.

Each rank holds a block of the sequence's queries, keys and values, shape ``(…, n/P, d)``
(leading axes, e.g. heads, are batch axes). Attention needs every query against every key, so
the blocks must meet. Two ways, both built from rows of the duality table:

**Ring attention.** Rank r keeps its queries; the key/value blocks travel around the ring, one
hop per step (:func:`ring_pass`: :func:`~chainrule.parallel.duality.send_to_rank` to r + 1,
:func:`~chainrule.parallel.duality.recv_from_rank` from r − 1). After P steps every query block
has met every key block. Each step gives a *partial* softmax over one key block: its output
``o_b`` (normalised over that block) and its log-sum-exp ``ℓ_b = log Σ_j exp(s_j)``. Two partials
merge exactly (:func:`merge_partials`)::

    ℓ = log(e^{ℓ_a} + e^{ℓ_b}),   o = e^{ℓ_a − ℓ} o_a + e^{ℓ_b − ℓ} o_b

because softmax over the union of two key sets is each set's softmax reweighted by its share of
the normaliser. Nothing here has a hand-written backward: the engine differentiates the blocks,
the merges and the rows. The backward of a send is a recv of the gradient, the backward of a
recv a send back (the table's point-to-point rows), so the gradients of K and V travel the ring
the other way, each rank adding its contribution to the block passing through.

**Ulysses** (DeepSpeed-Ulysses; :func:`ulysses_attention`). Two all-to-alls (the table's
all-to-all row, :func:`~chainrule.parallel.duality.all_to_all_ranks`): heads ↔ sequence. Before,
rank r holds all H heads of its n/P positions; after, H/P heads of all n positions; ordinary
attention per head; the inverse all-to-all puts the sequence back.

**Causal attention and load balance.** With a causal mask a query block only attends to key
blocks at or before it. Split the sequence plainly (rank r holds chunk r) and rank r has r + ½
blocks of work while the last rank has P − ½: most ranks wait. The **zig-zag** split cuts the
sequence into 2P chunks and gives rank r chunks r and 2P − 1 − r (:func:`sequence_chunks`):
every rank then has 2P half-size blocks (``P/2`` full-size), 2 at every ring step
(:func:`ring_work`).

The sends of a ring wait for their receives (on every backend), so the ring's order matters:
even ranks send, then receive; odd ranks receive, then send. The backward runs the rows' VJPs in
reverse, so it needs the reversed order: see :func:`ring_pass`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from chainrule import dist
from chainrule.engine import ops
from chainrule.engine.tensor import ArrayLike, Tensor, as_tensor
from chainrule.parallel.duality import all_to_all_ranks, recv_from_rank, send_to_rank

Layout = Literal["plain", "zigzag"]
Pair = Literal["full", "diagonal", "none"]


# -- which chunks of the sequence each rank holds, and what each pair of chunks costs ---------


def chunk_count(world_size: int, layout: Layout) -> int:
    """How many equal chunks the sequence is cut into: P (plain) or 2P (zig-zag)."""
    if layout == "plain":
        return world_size
    if layout == "zigzag":
        return 2 * world_size
    raise ValueError(f"layout must be 'plain' or 'zigzag', got {layout!r}")


def sequence_chunks(rank: int, world_size: int, layout: Layout) -> list[int]:
    """The chunks of the sequence rank r holds, in order: ``[r]`` (plain) or
    ``[r, 2P − 1 − r]`` (zig-zag: one from the front, its mirror from the back)."""
    chunk_count(world_size, layout)
    return [rank] if layout == "plain" else [rank, 2 * world_size - 1 - rank]


def shard_sequence(x: np.ndarray, rank: int, world_size: int, layout: Layout) -> np.ndarray:
    """Rank r's part of a full sequence ``x`` (sequence on axis −2): its chunks, concatenated."""
    n = x.shape[-2]
    count = chunk_count(world_size, layout)
    if n % count:
        raise ValueError(f"a sequence of {n} does not cut into {count} equal chunks")
    size = n // count
    parts = [
        x[..., c * size : (c + 1) * size, :] for c in sequence_chunks(rank, world_size, layout)
    ]
    return np.concatenate(parts, axis=-2)


def unshard_sequence(parts: Sequence[np.ndarray], layout: Layout) -> np.ndarray:
    """The full sequence from every rank's part (the inverse of :func:`shard_sequence`)."""
    world_size = len(parts)
    count = chunk_count(world_size, layout)
    size = parts[0].shape[-2] // len(sequence_chunks(0, world_size, layout))
    chunks: list[np.ndarray] = [np.empty(0)] * count
    for rank, part in enumerate(parts):
        for i, c in enumerate(sequence_chunks(rank, world_size, layout)):
            chunks[c] = part[..., i * size : (i + 1) * size, :]
    return np.concatenate(chunks, axis=-2)


def pair_kind(query_chunk: int, key_chunk: int, causal: bool) -> Pair:
    """What a (query chunk, key chunk) pair computes: all of it (``"full"``), its lower
    triangle (``"diagonal"``: the causal mask inside one chunk) or nothing (``"none"``: every
    key after every query)."""
    if not causal or query_chunk > key_chunk:
        return "full"
    return "diagonal" if query_chunk == key_chunk else "none"


def ring_source(rank: int, step: int, world_size: int) -> int:
    """Whose key/value block rank r holds at ring step t: ``(r − t) mod P``."""
    return (rank - step) % world_size


def ring_pairs(
    rank: int, step: int, world_size: int, layout: Layout, causal: bool
) -> list[tuple[int, int, Pair]]:
    """The (query chunk, key chunk, kind) pairs rank r computes at ring step t (``"none"``
    pairs left out)."""
    keys = sequence_chunks(ring_source(rank, step, world_size), world_size, layout)
    pairs: list[tuple[int, int, Pair]] = []
    for q in sequence_chunks(rank, world_size, layout):
        for k in keys:
            kind = pair_kind(q, k, causal)
            if kind != "none":
                pairs.append((q, k, kind))
    return pairs


def ring_work(world_size: int, layout: Layout, causal: bool = True) -> np.ndarray:
    """Work per rank and step, ``work[r, t]``, in full (n/P)² blocks of scores: a full pair of
    chunks counts (chunk size / (n/P))², a diagonal one half of that (the causal mask keeps
    the lower triangle; half, as the chunk grows)."""
    scale = (world_size / chunk_count(world_size, layout)) ** 2
    work = np.zeros((world_size, world_size))
    for r in range(world_size):
        for t in range(world_size):
            pairs = ring_pairs(r, t, world_size, layout, causal)
            work[r, t] = sum(scale * (1.0 if kind == "full" else 0.5) for *_, kind in pairs)
    return work


def idle_share(work: np.ndarray) -> float:
    """The share of rank-time spent waiting when each step lasts as long as its busiest rank:
    ``1 − Σ work / (P · Σ_t max_r work[r, t])``."""
    return float(1.0 - work.sum() / (work.shape[0] * work.max(axis=0).sum()))


# -- attention on one block, and the merge of two partial softmaxes --------------------------


def causal_mask(size: int) -> np.ndarray:
    """``0`` on and below the diagonal, ``−inf`` above: added to the scores of a diagonal pair."""
    return np.where(np.tri(size, dtype=bool), 0.0, -np.inf)


def block_attention(
    q: ArrayLike, k: ArrayLike, v: ArrayLike, mask: np.ndarray | None = None
) -> tuple[Tensor, Tensor]:
    """Softmax attention of queries ``q (…, m, d)`` over one block of keys and values
    ``k, v (…, n, d)``: the partial output ``o = softmax(s) v`` with ``s = q kᵀ/√d (+ mask)``,
    and the log-sum-exp ``ℓ = log Σ_j exp(s_j)`` of each query's scores, shape ``(…, m, 1)``.

    ``ℓ = c + log Σ_j exp(s_j − c)`` for any constant c; c = the row's largest score keeps
    every exponent ≤ 0. Its derivative in c is zero, so c is taken as a constant (no gradient).
    """
    q, k, v = as_tensor(q), as_tensor(k), as_tensor(v)
    scores = (q @ ops.transpose(k, _swap_last(k.ndim))) * (1.0 / np.sqrt(q.shape[-1]))
    if mask is not None:
        scores = scores + mask
    top = scores.data.max(axis=-1, keepdims=True)
    weights = (scores - top).exp()
    total = weights.sum(axis=-1, keepdims=True)
    return (weights @ v) / total, total.log() + top


def merge_partials(a: tuple[Tensor, Tensor], b: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """Merge two partial softmaxes ``(o_a, ℓ_a)`` and ``(o_b, ℓ_b)`` over disjoint key sets
    into the one over their union: ``ℓ = log(e^{ℓ_a} + e^{ℓ_b})``, ``o = e^{ℓ_a − ℓ} o_a +
    e^{ℓ_b − ℓ} o_b`` (computed from ``c = max(ℓ_a, ℓ_b)``, a constant, so no exponent is
    positive)."""
    (o_a, lse_a), (o_b, lse_b) = a, b
    top = np.maximum(lse_a.data, lse_b.data)
    lse = ((lse_a - top).exp() + (lse_b - top).exp()).log() + top
    return (lse_a - lse).exp() * o_a + (lse_b - lse).exp() * o_b, lse


def attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, causal: bool = False) -> Tensor:
    """One process's attention over the whole sequence, ``softmax(q kᵀ/√d + mask) v``: the
    reference every context-parallel attention is checked against."""
    q, k, v = as_tensor(q), as_tensor(k), as_tensor(v)
    scores = (q @ ops.transpose(k, _swap_last(k.ndim))) * (1.0 / np.sqrt(q.shape[-1]))
    if causal:
        scores = scores + causal_mask(q.shape[-2])
    return ops.softmax(scores, axis=-1) @ v


def _swap_last(ndim: int) -> tuple[int, ...]:
    return (*range(ndim - 2), ndim - 1, ndim - 2)


# -- the ring ----------------------------------------------------------------------------------


def _after(x: Tensor, y: Tensor) -> Tensor:
    """``x`` plus the sum of a zero-size slice of ``y`` (exactly ``x``): y becomes an ancestor of
    the result, so in the backward the result's VJPs run before y's (a control dependency)."""
    return x + y[..., :0].sum()


def ring_pass(x: ArrayLike) -> Tensor:
    """``y_r = x_{r−1 mod P}``: every rank sends its block to the next rank and receives the
    previous rank's. Backward (from the rows): ``x̄_r = ȳ_{r+1}``, the gradient goes round the
    other way.

    A send returns once its receive has met it, so if every rank sent first (or received
    first) all would wait for ever. Even ranks send, then receive; odd ranks receive, then
    send (with P odd, ranks P − 1 and 0 both send first, and rank 1 breaks the wait). The
    backward must alternate the other way round: on even ranks the recv's VJP (a send of ȳ)
    runs before the send's VJP (a recv of x̄); on odd ranks after it. The engine's backward
    visits a graph in reverse topological order:

    - odd ranks send ``_after(x, received)``, so the received value is an ancestor of the
      send: the send's VJP runs first, by data dependency;
    - even ranks return ``phony + received``; the engine visits the first argument's ancestry
      first, so the recv's VJP, visited last, runs first. (torch runs the later-created of two
      ready nodes first: the recv, created after the send.)
    """
    x = as_tensor(x)
    r, P = dist.rank(), dist.world_size()
    if P == 1:
        return x
    if r % 2 == 0:
        phony = send_to_rank(x, (r + 1) % P).sum()
        received = recv_from_rank((r - 1) % P)
    else:
        received = recv_from_rank((r - 1) % P)
        phony = send_to_rank(_after(x, received), (r + 1) % P).sum()
    return phony + received


def ring_attention(
    q: ArrayLike, k: ArrayLike, v: ArrayLike, causal: bool = False, layout: Layout = "plain"
) -> Tensor:
    """Attention of this rank's queries over every rank's keys and values, the key/value blocks
    passed around the ring (:func:`ring_pass`); q, k, v ``(…, n/P, d)``, this rank's chunks of
    the sequence in ``layout`` (:func:`shard_sequence`). Equal to this rank's rows of
    :func:`attention` over the whole sequence.

    Step t: the block of rank ``(r − t) mod P`` is here; every (query chunk, key chunk) pair
    the mask does not empty is a partial softmax (:func:`block_attention`), merged into that
    query chunk's running result (:func:`merge_partials`); then the block moves on. The last
    block received enters the output through a zero-size slice: a rank whose mask left it
    unused still sends its (zero) gradient back, for the sender's backward waits for it.
    """
    q, k, v = as_tensor(q), as_tensor(k), as_tensor(v)
    r, P = dist.rank(), dist.world_size()
    mine = sequence_chunks(r, P, layout)
    size = q.shape[-2] // len(mine)
    block = ops.stack([k, v])  # one message per step
    results: dict[int, tuple[Tensor, Tensor]] = {}
    for t in range(P):
        theirs = sequence_chunks(ring_source(r, t, P), P, layout)
        for i, qc in enumerate(mine):
            for j, kc in enumerate(theirs):
                kind = pair_kind(qc, kc, causal)
                if kind == "none":
                    continue
                rows, cols = slice(i * size, (i + 1) * size), slice(j * size, (j + 1) * size)
                part = block_attention(
                    q[..., rows, :],
                    block[0][..., cols, :],
                    block[1][..., cols, :],
                    causal_mask(size) if kind == "diagonal" else None,
                )
                results[qc] = merge_partials(results[qc], part) if qc in results else part
        if t < P - 1:
            block = ring_pass(block)
    out = ops.concat([results[qc][0] for qc in mine], axis=-2)
    return _after(out, block) if P > 1 else out


# -- Ulysses: heads ↔ sequence, two all-to-alls ------------------------------------------------


def ulysses_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, causal: bool = False) -> Tensor:
    """Attention with the sequence split plainly, q, k, v ``(H, n/P, d)`` with H divisible by
    P: an all-to-all (split heads, concatenate sequence) gives each rank H/P heads of the whole
    sequence, ``(H/P, n, d)``; attention per head as on one process; the inverse all-to-all
    (split sequence, concatenate heads) gives back ``(H, n/P, d)``. Both are the table's
    all-to-all row, whose backward is the all-to-all with the axes swapped."""
    heads = as_tensor(q).shape[0]
    if heads % dist.world_size():
        raise ValueError(f"{heads} heads do not split over {dist.world_size()} ranks")
    q, k, v = (all_to_all_ranks(x, split_axis=0, concat_axis=1) for x in (q, k, v))
    out = attention(q, k, v, causal)
    return all_to_all_ranks(out, split_axis=1, concat_axis=0)


def ring_bytes(shape: Sequence[int], world_size: int, itemsize: int = 8) -> int:
    """Bytes one rank sends in ring attention's forward: P − 1 key/value blocks of ``shape``
    (its local ``(H, n/P, d)``), two arrays each."""
    return (world_size - 1) * 2 * int(np.prod(shape)) * itemsize


def ulysses_bytes(shape: Sequence[int], world_size: int, itemsize: int = 8) -> int:
    """Bytes one rank sends in Ulysses attention's forward: four all-to-alls (q, k, v and the
    output), each sending (P − 1)/P of a local ``(H, n/P, d)`` array to the other ranks."""
    return 4 * (world_size - 1) * int(np.prod(shape)) * itemsize // world_size
