"""Context parallelism on torch tensors in real processes (e.g. inside ``dist.run(fn, P,
backend="gloo")``): ring attention and Ulysses attention of :mod:`chainrule.parallel.context`
(its docstrings give the math and the ring's order), built from the torch rows of
:mod:`chainrule.parallel.duality_torch`. torch's autograd differentiates the blocks, the merges
and the rows' Functions; there is no hand-written backward.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as td

from chainrule.parallel.context import (
    Layout,
    pair_kind,
    ring_source,
    sequence_chunks,
)
from chainrule.parallel.duality_torch import all_to_all_ranks, recv_from_rank, send_to_rank

Partial = tuple[torch.Tensor, torch.Tensor]


def causal_mask(size: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``0`` on and below the diagonal, ``−inf`` above."""
    upper = torch.ones(size, size, dtype=torch.bool).triu(1)
    return torch.zeros(size, size, dtype=dtype).masked_fill(upper, -math.inf)


def block_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> Partial:
    """The partial softmax of q over one key/value block: ``(softmax(s) v, logsumexp(s))``."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores + mask
    top = scores.detach().amax(dim=-1, keepdim=True)
    weights = (scores - top).exp()
    total = weights.sum(dim=-1, keepdim=True)
    return (weights @ v) / total, total.log() + top


def merge_partials(a: Partial, b: Partial) -> Partial:
    """``ℓ = log(e^{ℓ_a} + e^{ℓ_b})``, ``o = e^{ℓ_a − ℓ} o_a + e^{ℓ_b − ℓ} o_b``."""
    (o_a, lse_a), (o_b, lse_b) = a, b
    top = torch.maximum(lse_a, lse_b).detach()
    lse = ((lse_a - top).exp() + (lse_b - top).exp()).log() + top
    return (lse_a - lse).exp() * o_a + (lse_b - lse).exp() * o_b, lse


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False
) -> torch.Tensor:
    """One process's attention over the whole sequence."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores + causal_mask(q.shape[-2], q.dtype)
    return scores.softmax(dim=-1) @ v


def _after(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Exactly x, with y an ancestor: x's backward runs before y's."""
    return x + y[..., :0].sum()


def ring_pass(x: torch.Tensor) -> torch.Tensor:
    """``y_r = x_{r−1 mod P}``: even ranks send, then receive; odd ranks receive, then send
    ``_after(x, received)`` (see :func:`chainrule.parallel.context.ring_pass`)."""
    r, P = td.get_rank(), td.get_world_size()
    if P == 1:
        return x
    if r % 2 == 0:
        phony = send_to_rank(x, (r + 1) % P).sum()
        received = recv_from_rank((r - 1) % P, x.shape, x.dtype)
    else:
        received = recv_from_rank((r - 1) % P, x.shape, x.dtype)
        phony = send_to_rank(_after(x, received), (r + 1) % P).sum()
    return phony + received


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    layout: Layout = "plain",
) -> torch.Tensor:
    """This rank's queries against every rank's keys and values, the blocks passed around the
    ring (see :func:`chainrule.parallel.context.ring_attention`)."""
    r, P = td.get_rank(), td.get_world_size()
    mine = sequence_chunks(r, P, layout)
    size = q.shape[-2] // len(mine)
    block = torch.stack([k, v])
    results: dict[int, Partial] = {}
    for t in range(P):
        theirs = sequence_chunks(ring_source(r, t, P), P, layout)
        for i, qc in enumerate(mine):
            for j, kc in enumerate(theirs):
                kind = pair_kind(qc, kc, causal)
                if kind == "none":
                    continue
                rows, cols = slice(i * size, (i + 1) * size), slice(j * size, (j + 1) * size)
                mask = causal_mask(size, q.dtype) if kind == "diagonal" else None
                part = block_attention(
                    q[..., rows, :], block[0][..., cols, :], block[1][..., cols, :], mask
                )
                results[qc] = merge_partials(results[qc], part) if qc in results else part
        if t < P - 1:
            block = ring_pass(block)
    out = torch.cat([results[qc][0] for qc in mine], dim=-2)
    return _after(out, block) if P > 1 else out


def ulysses_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False
) -> torch.Tensor:
    """All-to-all heads ↔ sequence, attention per head, the inverse all-to-all."""
    if q.shape[0] % td.get_world_size():
        raise ValueError(f"{q.shape[0]} heads do not split over {td.get_world_size()} ranks")
    q, k, v = (all_to_all_ranks(x, split_axis=0, concat_axis=1) for x in (q, k, v))
    return all_to_all_ranks(attention(q, k, v, causal), split_axis=1, concat_axis=0)
