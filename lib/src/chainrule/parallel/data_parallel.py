"""Data parallelism, exactly: the reductions that make P ranks compute the full-batch gradient.

Every function here is a collective step of an SPMD program (call it on every rank, in the
same order) and works on engine tensors on any :mod:`chainrule.dist` backend. Gradients are
numpy arrays or torch tensors (``param.grad`` of :class:`chainrule.Tensor` or of a torch
leaf); parameters are engine or torch leaves.

- :func:`average_gradients`: ``∇L = (1/P) Σ_p ∇L_p``, exact for equal shards.
- :func:`token_weighted_gradients`: ``∇L = Σ_p T_p ∇L_p / Σ_p T_p`` for uneven token counts.
- :func:`clip_grad_norm_global`: one clip coefficient from the norm of the whole gradient.
- :class:`DataParallel` and :func:`accumulate_gradients`: bucketed gradient all-reduce with a
  no-sync switch for gradient accumulation (one all-reduce per bucket per step, not per
  micro-batch).
- :func:`padded_epoch` and :func:`joined_epoch`: uneven numbers of batches without a hang.
- :func:`sync_batch_norm` against :func:`local_batch_norm`: the one layer whose function
  itself depends on the split. (The optimizer is :mod:`chainrule.engine.optim`'s.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any, TypeVar, cast

import numpy as np

from chainrule import dist
from chainrule.engine import interop, ops
from chainrule.engine.tensor import ArrayLike, Tensor, as_tensor
from chainrule.parallel.duality import copy_to_ranks, reduce_from_ranks

Grad = Any  # a numpy array or a torch tensor
Param = Any  # a chainrule.Tensor or a torch tensor that requires a gradient
Batch = TypeVar("Batch")

SUM, AVG, MAX = dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX


def _scalar_all_reduce(value: float, op: dist.ReduceOp = SUM) -> float:
    """One number reduced over ranks (as a float64 array, so any backend accepts it)."""
    return float(np.asarray(dist.all_reduce(np.array([value], dtype=np.float64), op=op))[0])


def _data(param: Param) -> Any:
    """The values of a parameter: ``.data`` of an engine tensor, the torch tensor itself."""
    return param.data if isinstance(param, Tensor) else param


def _zeros_like(param: Param) -> Grad:
    if isinstance(param, Tensor):
        return np.zeros_like(param.data)
    import torch

    return torch.zeros_like(param, memory_format=torch.contiguous_format).detach()


def zeros_like_gradients(params: Sequence[Param]) -> list[Grad]:
    """One zero gradient per parameter: what a rank without data contributes to a step."""
    return [_zeros_like(p) for p in params]


def gradients_of(params: Sequence[Param]) -> list[Grad]:
    """The parameters' ``.grad`` (zeros where no gradient arrived, so every rank sends one)."""
    return [_zeros_like(p) if p.grad is None else p.grad for p in params]


def flatten_gradients(grads: Sequence[Grad]) -> Grad:
    """The gradients laid end to end in one 1-D buffer (one collective instead of many)."""
    if grads and interop.is_torch(grads[0]):
        import torch

        return torch.cat([g.reshape(-1) for g in grads])
    return np.concatenate([np.ravel(g) for g in grads]) if grads else np.zeros(0)


def unflatten_gradients(flat: Grad, like: Sequence[Any]) -> list[Grad]:
    """``flat`` cut back into arrays shaped like ``like`` (inverse of :func:`flatten_gradients`)."""
    out, start = [], 0
    for item in like:
        shape = tuple(_data(item).shape)
        size = int(np.prod(shape, dtype=np.int64))
        out.append(flat[start : start + size].reshape(shape))
        start += size
    return out


# -- reductions ----------------------------------------------------------------------------


def average_gradients(grads: Sequence[Grad], group: dist.Group | None = None) -> list[Grad]:
    """``ḡ = (1/P) Σ_p g_p`` for each gradient (all-reduce AVG over ``group``), as new arrays.

    Equal to the full-batch gradient ``∇L`` when every rank's loss is a mean over the same
    number of examples, and not otherwise (lesson 3 shows it; the first exercise asks why).
    """
    return [dist.all_reduce(g, op=AVG, group=group) for g in grads]


def token_weighted_gradients(local_mean_grads: Sequence[Grad], local_tokens: float) -> list[Grad]:
    """``∇L = Σ_p T_p g_p / Σ_p T_p``: the gradient of the mean over *all* real tokens.

    ``g_p`` is this rank's gradient of its local mean over its ``T_p`` real tokens. A plain
    mean of the g_p weighs every token on rank p by ``1/(P T_p)`` instead of ``1/Σ T``; the
    fix all-reduces (sum) ``T_p g_p = G_p`` (the sum of per-token gradients) and ``T_p``, and
    divides. A rank with no tokens (``T_p = 0``, e.g. a padded step) contributes nothing; if
    no rank has any the result is zero.
    """
    total_tokens = _scalar_all_reduce(float(local_tokens), SUM)
    sums = [dist.all_reduce(g * float(local_tokens), op=SUM) for g in local_mean_grads]
    if total_tokens == 0:
        return [s * 0.0 for s in sums]
    return [s / total_tokens for s in sums]


def clip_grad_norm_global(
    grads: Sequence[Grad], max_norm: float, sharded: bool | Sequence[bool] = True
) -> tuple[list[Grad], float]:
    """Scale every gradient by one coefficient so that the *global* norm is at most max_norm.

    ``‖g‖² = Σ_{sharded} ‖g_i‖² summed over ranks + Σ_{replicated} ‖g_i‖²`` (counted once):
    a sharded gradient (``sharded=True``, a per-rank slice of the global gradient, as in
    tensor parallelism or a sharded optimizer) is all-reduced; a replicated one (every rank
    holds the same whole gradient, e.g. after :func:`average_gradients`) is not summed again.
    Then ``c = min(1, max_norm / (‖g‖ + 1e-6))`` (as ``torch.nn.utils.clip_grad_norm_``) is the
    same number on every rank because the all-reduce returns the same bits everywhere.
    Returns the clipped gradients and ``‖g‖``.
    """
    flags = [sharded] * len(grads) if isinstance(sharded, bool) else list(sharded)
    if len(flags) != len(grads):
        raise ValueError(f"sharded has {len(flags)} flags for {len(grads)} gradients")
    local = [float((g * g).sum()) for g in grads]
    sharded_sq = sum(s for s, flag in zip(local, flags, strict=True) if flag)
    replicated_sq = sum(s for s, flag in zip(local, flags, strict=True) if not flag)
    total_norm = float(np.sqrt(_scalar_all_reduce(sharded_sq, SUM) + replicated_sq))
    coefficient = min(1.0, max_norm / (total_norm + 1e-6))
    return [g * coefficient for g in grads], total_norm


# -- DDP-like gradient synchronisation with accumulation ------------------------------------


def _buckets(sizes: Sequence[int], bucket_cap: int | None) -> list[list[int]]:
    """Consecutive parameter indices grouped into buckets of at most ``bucket_cap`` elements
    (a parameter larger than the cap gets a bucket of its own; None: one bucket)."""
    if bucket_cap is None:
        return [list(range(len(sizes)))] if sizes else []
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for i, size in enumerate(sizes):
        if current and filled + size > bucket_cap:
            buckets.append(current)
            current, filled = [], 0
        current.append(i)
        filled += size
    if current:
        buckets.append(current)
    return buckets


class DataParallel:
    """Averages the parameters' gradients over ranks after backward, bucket by bucket.

    ``backward(loss)`` runs ``loss.backward()`` and then :meth:`sync_gradients`, unless inside
    ``with dp.no_sync():``, where the gradients only accumulate locally. Syncing averages
    each bucket (the parameters' gradients laid end to end, at most ``bucket_cap`` elements;
    default one bucket) with one all-reduce, so a step costs one all-reduce per bucket.

    Gradient accumulation over k micro-batches: scale each micro-batch loss by 1/k, run the
    first k−1 backward passes under ``no_sync()`` and the last one normally; one sync then
    averages ``Σ_j g_j`` once. Without no_sync the result is the same (averaging is linear,
    and averaging an already-replicated value changes nothing) at k times the communication.
    ``group``: the replicas that average (default: the world), e.g. a column of a dp × tp grid.
    """

    def __init__(
        self,
        params: Iterable[Param],
        bucket_cap: int | None = None,
        group: dist.Group | None = None,
    ) -> None:
        self.params, self.group = list(params), group
        sizes = [int(np.prod(tuple(_data(p).shape), dtype=np.int64)) for p in self.params]
        self.buckets = _buckets(sizes, bucket_cap)
        self._sync = True

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes in this block accumulate gradients locally without communicating."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    @property
    def will_sync(self) -> bool:
        """Whether :meth:`backward` will synchronise (False inside :meth:`no_sync`)."""
        return self._sync

    def backward(self, loss: Any) -> None:
        """``loss.backward()``, then average the gradients over ranks unless in no_sync."""
        loss.backward()
        if self._sync:
            self.sync_gradients()

    def sync_gradients(self) -> None:
        """Replace every ``.grad`` by its average over ranks: one all-reduce per bucket."""
        for bucket in self.buckets:
            params = [self.params[i] for i in bucket]
            flat = dist.all_reduce(flatten_gradients(gradients_of(params)), AVG, group=self.group)
            for param, grad in zip(params, unflatten_gradients(flat, params), strict=True):
                param.grad = grad

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None


def accumulate_gradients(
    params: Sequence[Param],
    micro_batches: Sequence[Batch],
    loss_fn: Callable[[Batch], Any],
    no_sync: bool = True,
    bucket_cap: int | None = None,
) -> float:
    """Gradient accumulation over k micro-batches, averaged over ranks: ``Σ_j ∇(L_j / k)``.

    ``loss_fn(micro_batch)`` returns this rank's scalar loss (a mean over the micro-batch).
    Each loss is divided by k *before* backward (scaling the loss, not the accumulated
    gradient). With ``no_sync=True`` gradients are averaged over ranks once, after the last
    micro-batch; with False after every micro-batch (k times the communication, same result).
    Leaves the averaged gradients in ``.grad`` (added to what was there) and returns this
    rank's accumulated loss ``Σ_j L_j / k``.
    """
    dp = DataParallel(params, bucket_cap=bucket_cap)
    k = len(micro_batches)
    total = 0.0
    for j, batch in enumerate(micro_batches):
        last = j == k - 1
        with dp.no_sync() if no_sync and not last else nullcontext():
            loss = loss_fn(batch) / k
            dp.backward(loss)
        total += float(loss.item())
    return total


# -- uneven numbers of batches -------------------------------------------------------------


def padded_epoch(batches: Sequence[Batch]) -> Iterator[Batch | None]:
    """This rank's batches, then ``None`` until every rank has finished: no rank leaves early.

    One all-reduce (MAX) of the batch count fixes the epoch length S on every rank up front;
    a rank with fewer batches yields ``None`` for its padded steps, where it must still take
    part in the step's collectives with zero weight (zero gradients and zero tokens, see
    :func:`token_weighted_gradients`), so that the step's gradient is the mean over the real
    examples only.
    """
    steps = int(_scalar_all_reduce(float(len(batches)), MAX))
    for step in range(steps):
        yield batches[step] if step < len(batches) else None


_FINISHED = object()


def joined_epoch(batches: Iterable[Batch]) -> Iterator[Batch | None]:
    """A join-style epoch: each step all-reduces an "active" flag; stop when nobody is active.

    Works for iterables of unknown length. While at least one rank still has data, a rank
    whose data ran out yields ``None`` and shadows the step's collectives with zeros (zero
    gradients, zero tokens); when the all-reduced count of active ranks is 0, every rank stops
    at the same step. Costs one small all-reduce per step (plus one at the end). Iterate to the
    end on every rank: breaking out on one rank alone desynchronises the collectives.
    """
    iterator = iter(batches)
    active = True
    while True:
        batch = next(iterator, _FINISHED) if active else _FINISHED
        active = batch is not _FINISHED
        if _scalar_all_reduce(1.0 if active else 0.0, SUM) == 0:
            return
        yield cast(Batch, batch) if active else None


# -- batch normalisation: local or synchronised statistics ----------------------------------


def local_batch_norm(
    x: ArrayLike, weight: ArrayLike | None = None, bias: ArrayLike | None = None, eps: float = 1e-5
) -> Tensor:
    """Batch norm with this rank's statistics only (:func:`chainrule.engine.ops.batch_norm`).

    Each rank normalises with the mean and variance of its own shard, so the function of the
    global batch depends on how it was split: the gradient is genuinely different from the
    full-batch one, not just rearranged, and no reduction of gradients can repair that.
    """
    return ops.batch_norm(x, weight, bias, eps)


def sync_batch_norm(
    x: ArrayLike, weight: ArrayLike | None = None, bias: ArrayLike | None = None, eps: float = 1e-5
) -> Tensor:
    """Batch norm with the statistics of the *global* batch, differentiable across ranks.

    Statistics over axis 0, biased variance (training mode, as :func:`local_batch_norm`). Each
    rank computes partial sums ``s_p = Σ_{i∈B_p} x_i``, ``q_p = Σ_{i∈B_p} x_i²`` and its count
    ``n_p``; one all-reduce gives ``S = Σ_p s_p``, ``Q = Σ_p q_p``, ``N = Σ_p n_p``; then
    ``μ = S/N``, ``σ² = Q/N − μ²`` and ``y = (x − μ)/√(σ² + ε) · w + b``, exactly the
    full-batch batch norm on this rank's rows.

    Why the backward of that all-reduce is again an all-reduce: S is consumed by *every*
    rank's own normalisation, and those downstream computations differ (each normalises its
    own rows). So the global map is ``(s_1, …, s_P) ↦ (S, …, S)``, one copy of the sum per
    rank — a sum followed by a fan-out, ``f ∘ f̄``. By rule 1 each ``s_p`` receives the sum of
    the P ranks' cotangents, ``s̄_p = Σ_q S̄_q``: an all-reduce. (``f̄`` alone, identity
    backward, would be right only if the downstream were replicated and counted once.)

    The statistics use ``E[x²] − μ²``, fine for normalised activations; ``weight`` and
    ``bias`` are replicated parameters whose gradients here are this rank's partial sums (the
    data-parallel gradient reduction adds them up).
    """
    x = as_tensor(x)
    stats_shape = x.shape[1:]
    size = int(np.prod(stats_shape, dtype=np.int64))
    count = Tensor(np.full(1, x.shape[0], dtype=x.dtype))  # no gradient: rides along
    partial = ops.concat([x.sum(axis=0).reshape(size), (x * x).sum(axis=0).reshape(size), count])
    total = copy_to_ranks(reduce_from_ranks(partial))  # all-reduce forward and backward
    n = float(total.data[2 * size])
    mean = total[:size].reshape(stats_shape) / n
    var = total[size : 2 * size].reshape(stats_shape) / n - mean * mean
    y = (x - mean) / (var + eps) ** 0.5
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
