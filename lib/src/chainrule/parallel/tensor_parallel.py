"""A tensor-parallel MLP: column-parallel linear → activation → row-parallel linear.

The single-device MLP is ``y = act(x W₁ + b₁) W₂ + b₂`` with ``W₁`` of shape (d_in, h) and
``W₂`` of shape (h, d_out). On P ranks, cut the hidden dimension h into P slices:

- column-parallel: rank p holds the columns ``W₁[:, p]`` and ``b₁[p]`` and computes its slice
  of the hidden layer ``h_p = f(x) W₁[:, p] + b₁[p]``. The input x is replicated, and ``f``
  (identity forward, all-reduce backward) hands it to the P ranks' different computations:
  its gradient is the sum of the P ranks' contributions;
- the activation is elementwise, so it acts on each slice locally;
- row-parallel: rank p holds the rows ``W₂[p, :]`` and computes the partial product
  ``z_p = act(h_p) W₂[p, :]``; the output is ``y = f̄(z_p) + b₂`` where ``f̄`` (all-reduce
  forward, identity backward) adds the partial products, since
  ``act(h) W₂ = Σ_p act(h_p) W₂[p, :]``. The bias ``b₂`` is replicated and added once.

One forward therefore costs one all-reduce (in f̄) and one backward one all-reduce (in f's
VJP). The same code runs on engine tensors (any :mod:`chainrule.dist` backend) and on torch
tensors (in real processes, e.g. ``dist.run(..., backend="gloo")``); the f and f̄ to use are
parameters, so hand-written versions can be plugged in. With ``f = f̄ = identity`` and the
full weights it is the single-device MLP (:func:`single_device_mlp`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from chainrule import dist
from chainrule.dist.chunks import chunk_slice
from chainrule.engine import interop
from chainrule.engine.interop import Framework
from chainrule.parallel import duality

Activation = str | Callable[[Any], Any]


@dataclass(frozen=True)
class MLPWeights:
    """The four arrays of ``y = act(x W₁ + b₁) W₂ + b₂`` (full, one shard, or their gradients).

    ``w1`` (d_in, h), ``b1`` (h,), ``w2`` (h, d_out), ``b2`` (d_out,); in a shard h is h/P.
    """

    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray

    def as_tuple(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return (self.w1, self.b1, self.w2, self.b2)


# Which parameters are sliced across ranks (True) and which are replicated (False), in the
# order of MLPWeights; for a global gradient norm (see data_parallel.clip_grad_norm_global).
SHARDED = (True, True, True, False)


def init_mlp_weights(d_in: int, hidden: int, d_out: int, seed: int = 0) -> MLPWeights:
    """Random weights scaled by 1/√fan_in, float64, reproducible from ``seed``."""
    rng = np.random.default_rng(seed)
    return MLPWeights(
        w1=rng.standard_normal((d_in, hidden)) / np.sqrt(d_in),
        b1=0.1 * rng.standard_normal(hidden),
        w2=rng.standard_normal((hidden, d_out)) / np.sqrt(hidden),
        b2=0.1 * rng.standard_normal(d_out),
    )


def shard_mlp_weights(weights: MLPWeights, rank: int, world_size: int) -> MLPWeights:
    """Rank ``rank``'s shard: columns of W₁ and b₁, rows of W₂, all of b₂ (copies)."""
    cols = chunk_slice(weights.w1.shape[1], rank, world_size, "the hidden width")
    return MLPWeights(
        w1=weights.w1[:, cols].copy(),
        b1=weights.b1[cols].copy(),
        w2=weights.w2[cols, :].copy(),
        b2=weights.b2.copy(),
    )


def identity(x: Any) -> Any:
    """f = f̄ = identity: the model on one process."""
    return x


def _activate(h: Any, activation: Activation) -> Any:
    if callable(activation):
        return activation(h)
    if activation not in ("tanh", "relu", "sigmoid"):
        raise ValueError(
            f"activation must be 'tanh', 'relu', 'sigmoid' or a callable, not {activation!r}"
        )
    return getattr(h, activation)()


class MLP:
    """``y = f̄(act(f(x) W₁ + b₁) W₂) + b₂`` on engine or torch tensors.

    Built by :func:`tensor_parallel_mlp` (a shard of the weights, f and f̄ the conjugate pair)
    or :func:`single_device_mlp` (the full weights, f = f̄ = identity). ``w1``, ``b1``, ``w2``,
    ``b2`` are leaf tensors that require gradients.
    """

    def __init__(
        self,
        weights: MLPWeights,
        f: Callable[[Any], Any] = identity,
        f_bar: Callable[[Any], Any] = identity,
        activation: Activation = "tanh",
        framework: Framework = "engine",
    ) -> None:
        if framework not in ("engine", "torch"):
            raise ValueError(f"framework must be 'engine' or 'torch', not {framework!r}")
        self.framework = framework
        self.f, self.f_bar, self.activation = f, f_bar, activation
        leaves = (interop.leaf(a, framework) for a in weights.as_tuple())
        self.w1, self.b1, self.w2, self.b2 = leaves

    def __call__(self, x: Any) -> Any:
        hidden = self.f(x) @ self.w1 + self.b1
        partial = _activate(hidden, self.activation) @ self.w2
        return self.f_bar(partial) + self.b2

    def parameters(self) -> list[Any]:
        return [self.w1, self.b1, self.w2, self.b2]

    def weights(self) -> MLPWeights:
        """The current parameter values as numpy arrays."""
        return MLPWeights(*(interop.to_numpy(p).copy() for p in self.parameters()))

    def gradients(self) -> MLPWeights:
        """The parameters' ``.grad`` as numpy arrays (zeros where none arrived)."""
        return MLPWeights(*(interop.gradient(p).copy() for p in self.parameters()))


def single_device_mlp(
    weights: MLPWeights, activation: Activation = "tanh", framework: Framework = "engine"
) -> MLP:
    """The reference MLP on one device, from the full weights (f and f̄ are the identity)."""
    return MLP(weights, activation=activation, framework=framework)


def tensor_parallel_mlp(
    weights: MLPWeights,
    rank: int | None = None,
    world_size: int | None = None,
    f: Callable[[Any], Any] | None = None,
    f_bar: Callable[[Any], Any] | None = None,
    activation: Activation = "tanh",
    framework: Framework = "engine",
) -> MLP:
    """This rank's part of the tensor-parallel MLP, from the *full* weights.

    ``rank`` and ``world_size`` default to the current rank and world. ``f`` and ``f_bar``
    default to :func:`chainrule.parallel.duality.copy_to_ranks` and
    :func:`chainrule.parallel.duality.reduce_from_ranks` for engine tensors, and to their
    :mod:`chainrule.parallel.duality_torch` counterparts for torch.
    """
    rank = dist.rank() if rank is None else rank
    world_size = dist.world_size() if world_size is None else world_size
    default_f: Callable[[Any], Any]
    default_f_bar: Callable[[Any], Any]
    if framework == "torch":
        from chainrule.parallel import duality_torch

        default_f, default_f_bar = duality_torch.copy_to_ranks, duality_torch.reduce_from_ranks
    else:
        default_f, default_f_bar = duality.copy_to_ranks, duality.reduce_from_ranks
    return MLP(
        shard_mlp_weights(weights, rank, world_size),
        f=f or default_f,
        f_bar=f_bar or default_f_bar,
        activation=activation,
        framework=framework,
    )


def gather_mlp_gradients(mlp: MLP) -> MLPWeights:
    """The full gradients from every rank's shard (a collective: call it on every rank).

    W₁ and b₁ are gathered along the hidden axis (columns), W₂ along its rows; b₂ is
    replicated and already whole on every rank.
    """
    g = mlp.gradients()
    return MLPWeights(
        w1=np.asarray(dist.all_gather(g.w1, axis=1)),
        b1=np.asarray(dist.all_gather(g.b1, axis=0)),
        w2=np.asarray(dist.all_gather(g.w2, axis=0)),
        b2=g.b2,
    )
