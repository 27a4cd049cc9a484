"""Checks for functions that run across ranks: the adjoint test and the single-process reference.

A differentiable collective is a linear map J between global values, and its VJP must be Jᵀ.
Both checks run a function under :func:`chainrule.dist.run`; inner products over a replicated
value count it once, over a per-rank value they sum over ranks (:mod:`chainrule.parallel.duality`).

- :func:`distributed_adjoint_test` draws random ``u`` (input) and ``v`` (output cotangent)
  with the declared replication and returns ``⟨v, J u⟩`` and ``⟨Jᵀ v, u⟩``, which agree to
  rounding exactly when the backward collective is the adjoint of the forward one.
- :func:`compare_with_single_process` runs the same global function on one process with
  ordinary autograd and returns the largest differences of outputs and input gradients.

``framework="engine"`` runs ``fn`` on :class:`chainrule.Tensor`; ``framework="torch"`` runs it
on float64 torch tensors (for the torch autograd Functions, on the gloo or nccl backend).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from chainrule import dist
from chainrule.engine import interop
from chainrule.engine.interop import Framework
from chainrule.parallel.duality import PER_RANK, REPLICATED, Kind

Shape = tuple[int, ...]


class AdjointPair(NamedTuple):
    """``⟨v, J u⟩`` (forward) and ``⟨Jᵀ v, u⟩`` (backward); equal when the VJP is Jᵀ."""

    forward: float
    backward: float


class Discrepancy(NamedTuple):
    """Largest absolute differences between the distributed run and the single process."""

    output: float
    gradient: float


def _constant(array: np.ndarray, framework: Framework) -> Any:
    return interop.restore(array, framework, "float64")


def _check_kind(kind: str, what: str) -> None:
    if kind not in (REPLICATED, PER_RANK):
        raise ValueError(f"{what} must be {REPLICATED!r} or {PER_RANK!r}, not {kind!r}")


def _shapes(inputs_per_rank: Sequence[Any], world_size: int, kind: Kind) -> list[Shape]:
    """The input shape on each rank, from arrays or shapes (one entry per rank, or one entry)."""
    shapes = [tuple(np.shape(x)) if not _is_shape(x) else tuple(x) for x in inputs_per_rank]
    if len(shapes) == 1:
        shapes = shapes * world_size
    if len(shapes) != world_size:
        raise ValueError(f"expected 1 or {world_size} inputs (one per rank), got {len(shapes)}")
    if kind == REPLICATED and len(set(shapes)) != 1:
        raise ValueError(f"a replicated input has one shape on every rank, got {shapes}")
    return shapes


def _is_shape(x: Any) -> bool:
    return isinstance(x, tuple) and all(isinstance(n, int) for n in x)


def _draw(shape: Shape, kind: Kind, seed: int, stream: int) -> np.ndarray:
    """A standard normal draw: the same on every rank when replicated, distinct when per-rank."""
    key = [seed, stream] if kind == REPLICATED else [seed, stream, dist.rank() + 1]
    return np.random.default_rng(key).standard_normal(shape)


def _identical_on_all_ranks(array: np.ndarray) -> bool:
    """Whether every rank holds exactly this array: its elementwise max and min over ranks
    agree (the same verdict on every rank, from two all-reduces)."""
    highest = np.asarray(dist.all_reduce(array, op=dist.ReduceOp.MAX))
    lowest = -np.asarray(dist.all_reduce(-array, op=dist.ReduceOp.MAX))
    return bool(np.array_equal(highest, lowest))


def _inner(local: float, kind: Kind) -> float:
    """A global inner product: summed over ranks for per-rank values, counted once otherwise."""
    if kind == REPLICATED:
        return local
    return float(np.asarray(dist.all_reduce(np.array([local]), op=dist.ReduceOp.SUM))[0])


def _require_replicated(array: np.ndarray, what: str) -> None:
    if not _identical_on_all_ranks(array):  # same verdict on every rank: all raise together
        raise AssertionError(f"{what} is declared replicated but differs across ranks")


# -- the adjoint test ------------------------------------------------------------------------


def _adjoint_on_rank(
    fn: Callable[[Any], Any],
    shapes: list[Shape],
    input_kind: Kind,
    output_kind: Kind,
    framework: Framework,
    seed: int,
    check_replication: bool,
) -> AdjointPair:
    u = _draw(shapes[dist.rank()], input_kind, seed, stream=0)
    x = interop.leaf(u, framework)
    y = fn(x)
    ju = interop.to_numpy(y)
    if check_replication and output_kind == REPLICATED:
        _require_replicated(ju, "the output")
    v = _draw(ju.shape, output_kind, seed, stream=1)
    y.backward(_constant(v, framework))
    jtv = interop.gradient(x)
    if check_replication and input_kind == REPLICATED:
        _require_replicated(jtv, "the gradient of a replicated input")
    return AdjointPair(
        forward=_inner(float(np.vdot(v, ju)), output_kind),
        backward=_inner(float(np.vdot(jtv, u)), input_kind),
    )


def distributed_adjoint_test(
    fn: Callable[[Any], Any],
    inputs_per_rank: Sequence[Any],
    input_kind: Kind,
    output_kind: Kind,
    world_size: int,
    backend: str = "sim",
    framework: Framework = "engine",
    seed: int = 0,
    check_replication: bool = True,
) -> AdjointPair:
    """``(⟨v, J u⟩, ⟨Jᵀ v, u⟩)`` for a linear ``fn`` run on every rank of a world.

    ``inputs_per_rank`` gives the input's shape on each rank (arrays or shape tuples, one per
    rank, or a single one for all ranks); only shapes are used. ``u`` is drawn at random,
    identical on every rank when ``input_kind`` is ``"replicated"``; ``J u = fn(u)`` since fn
    is linear, and ``v`` is drawn with the output's shape, identical on every rank when
    ``output_kind`` is ``"replicated"``. ``Jᵀ v`` is the gradient of ``u`` after
    ``fn(u).backward(v)``. Each inner product is summed over ranks for a per-rank value and
    counted once for a replicated one (rank 0's value). With ``check_replication``, a
    replicated output or input gradient that differs across ranks raises AssertionError
    (re-raised by ``dist.run`` as RankError). Returns the pair as seen by rank 0.
    """
    _check_kind(input_kind, "input_kind")
    _check_kind(output_kind, "output_kind")
    shapes = _shapes(inputs_per_rank, world_size, input_kind)
    results = dist.run(
        _adjoint_on_rank,
        world_size,
        backend=backend,
        args=(fn, shapes, input_kind, output_kind, framework, seed, check_replication),
    )
    return AdjointPair(*results[0])


# -- the single-process reference ---------------------------------------------------------


def _downstream_loss(ys: Sequence[Any], weights: Sequence[np.ndarray], framework: Framework) -> Any:
    """``Σ_p Σ tanh(y_p) ⊙ w_p``: a nonlinear scalar computed from every output once."""
    total = None
    for y, w in zip(ys, weights, strict=True):
        term = (y.tanh() * _constant(w, framework)).sum()
        total = term if total is None else total + term
    return total


def _compare_on_rank(
    fn: Callable[[Any], Any],
    inputs: list[np.ndarray],
    input_kind: Kind,
    output_kind: Kind,
    framework: Framework,
    seed: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = interop.leaf(inputs[0] if input_kind == REPLICATED else inputs[dist.rank()], framework)
    y = fn(x)
    w = _draw(interop.to_numpy(y).shape, output_kind, seed, stream=2)
    _downstream_loss([y], [w], framework).backward()
    return interop.to_numpy(y).copy(), w, interop.gradient(x).copy()


def compare_with_single_process(
    fn: Callable[[Any], Any],
    global_fn: Callable[[Sequence[Any], int], list[Any]],
    inputs: Sequence[np.ndarray],
    input_kind: Kind,
    output_kind: Kind,
    world_size: int,
    backend: str = "sim",
    framework: Framework = "engine",
    seed: int = 0,
) -> Discrepancy:
    """How far ``fn`` on P ranks is from ``global_fn`` on one process, outputs and gradients.

    ``inputs`` holds the per-rank inputs (one array, shared by all ranks, for a replicated
    input). Each rank computes ``y_p = fn(x_p)`` and the loss ``Σ tanh(y_p) ⊙ w_p`` with
    downstream weights ``w_p`` (distinct per rank for a per-rank output; identical, and the
    loss counted once, for a replicated one), then backpropagates. One process computes
    ``global_fn(inputs, P)``, the same loss over its outputs (one output for a replicated
    output) and the gradients with ordinary autograd. Returns the largest absolute
    differences of the outputs and of the input gradients.
    """
    _check_kind(input_kind, "input_kind")
    _check_kind(output_kind, "output_kind")
    inputs = [np.asarray(x, dtype=np.float64) for x in inputs]
    expected = 1 if input_kind == REPLICATED else world_size
    if len(inputs) != expected:
        raise ValueError(f"a {input_kind} input needs {expected} arrays, got {len(inputs)}")
    per_rank = dist.run(
        _compare_on_rank,
        world_size,
        backend=backend,
        args=(fn, inputs, input_kind, output_kind, framework, seed),
    )

    leaves = [interop.leaf(x, framework) for x in inputs]
    outputs = global_fn(leaves, world_size)
    weights = [w for _, w, _ in per_rank][: len(outputs)]
    _downstream_loss(outputs, weights, framework).backward()

    ranks = range(world_size)
    out_ref = [interop.to_numpy(outputs[0 if output_kind == REPLICATED else p]) for p in ranks]
    grad_ref = [interop.gradient(leaves[0 if input_kind == REPLICATED else p]) for p in ranks]
    output_error = max(_max_abs(per_rank[p][0], out_ref[p]) for p in ranks)
    gradient_error = max(_max_abs(per_rank[p][2], grad_ref[p]) for p in ranks)
    return Discrepancy(output=output_error, gradient=gradient_error)


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return float("inf")
    return float(np.max(np.abs(a - b), initial=0.0))
