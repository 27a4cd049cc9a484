"""ZeRO and fully sharded data parallelism: what each rank holds, and the collectives of a step.

Plain data parallelism (stage 0) replicates every *model state* on every rank: the parameters
θ, their gradient g and the optimizer's state. ZeRO (Rajbhandari et al., 2020) shards them
instead, one more at each stage; with Ψ parameters on P ranks:

=====  ===========================  ===============================  ==============================
stage  sharded                      collectives of one step          bytes sent per rank (ring)
=====  ===========================  ===============================  ==============================
0      nothing (data parallel)      all-reduce of g                  2(P−1)/P · Ψ
1      optimizer state              reduce-scatter of g, all-gather  2(P−1)/P · Ψ
                                    of the updated θ
2      + gradients                  reduce-scatter of each layer's   2(P−1)/P · Ψ
                                    g in the backward, all-gather
3      + parameters (FSDP)          all-gather of θ forward, again   3(P−1)/P · Ψ
                                    backward, reduce-scatter of g
=====  ===========================  ===============================  ==============================

(Ψ in bytes of the buffer.) An all-reduce *is* a reduce-scatter followed by an all-gather, so
stages 1 and 2 cost what data parallelism costs; stage 3 adds one all-gather, 1.5 times.

**The flat buffers.** The parameters of a group are laid end to end in one buffer, padded with
zeros to a multiple of P, ``n = P·c``; rank p owns chunk p, elements ``[p·c, (p+1)·c)``
(:class:`FlatLayout`). Stages 0 and 1 have one group, the whole model; stages 2 and 3 one per
layer (a *bucket* of gradients at stage 2, FSDP's *unit* at stage 3), so that the backward can
reduce each layer's gradient as soon as it is complete. In placements
(:mod:`chainrule.parallel.placement`) a replicated model state is ``Replicate()`` and a sharded one
``Shard(0)`` of its flat buffer. Each rank's gradient ``∇(L_p/P)`` of its term of the loss
``L = Σ_p L_p/P`` (L_p the mean over its equal shard of the batch) is ``Partial()``: the
gradient is the sum of the ranks' addends. Every collective of a step is a placement change:

- stage 0: g ``Partial → Replicate``, an all-reduce after the backward;
- stage 1: g ``Partial → Shard(0)``, a reduce-scatter after the backward; the updated θ
  ``Shard(0) → Replicate``, an all-gather;
- stage 2: the same two, but each layer's g is reduce-scattered inside the backward, as soon
  as the layer's VJP has made it, and the full bucket is dropped (:func:`bucketed_layer`);
- stage 3: θ ``Shard(0) → Replicate``, fanned out (each rank feeds its copy to a computation of
  its own data), just before the layer uses it. That is the all-gather row of the duality
  table, so its backward is a reduce-scatter: rule 1 sums the ranks' cotangents of the copies
  (the fan-out), rule 2 routes slice p of the sum back to shard p (the concatenation). Nothing
  here writes that reduce-scatter: :func:`gather_layer` and :func:`resharded_layer` apply the
  transition, whose VJP runs it. :func:`resharded_layer` (FSDP's ``reshard_after_forward``)
  drops the gathered θ after the forward and gathers it again in the backward, the third Ψ of
  traffic; it keeps the layer's activations, so no forward is computed twice.

The layers keep what their backward needs (the input x and the output y) and run the layer's
VJP in closed form (:meth:`Linear.backward`), so that the parameters can be handed in at
backward time: kept (stages 0–2) or gathered again (stage 3).

**The optimizer** is SGD with momentum μ (the momentum buffer v is the optimizer state),
elementwise, so each rank can update its own chunk alone:
``v ← μ v + g``, ``θ ← θ − η v`` (PyTorch's convention, v = 0 at the start).

**Memory per rank** (:func:`memory_model`), with b_θ, b_g, b_s bytes per parameter of
parameters, gradients and optimizer state: stage 0 holds ``(b_θ + b_g + b_s) Ψ``, stage 1
``(b_θ + b_g) Ψ + b_s Ψ/P``, stage 2 ``b_θ Ψ + (b_g + b_s) Ψ/P``, stage 3
``(b_θ + b_g + b_s) Ψ/P``. The ZeRO paper's mixed-precision Adam has b_θ = b_g = 2 (fp16) and
b_s = 12 (fp32 master weights, momentum and variance): 16Ψ, 4Ψ + 12Ψ/P, 2Ψ + 14Ψ/P, 16Ψ/P.
:func:`measure_memory` measures what rank 0 really allocates (Python's :mod:`tracemalloc`):
the bytes it holds after a step and the peak during it, which adds what a step needs for a
while (activations, one layer's gradient, a collective's result, a gathered layer).
"""

from __future__ import annotations

import contextvars
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chainrule import dist
from chainrule.dist import world as _world
from chainrule.dist.calls import Call
from chainrule.dist.chunks import chunk
from chainrule.dist.collectives import ring_bytes
from chainrule.engine import ops
from chainrule.engine.optim import SGD, update
from chainrule.engine.tensor import Tensor, no_grad
from chainrule.parallel.placement import (
    Partial,
    Placement,
    Replicate,
    Shard,
    Transition,
    transition,
)

STAGES = (0, 1, 2, 3)
ADAM_MIXED_PRECISION = (2, 2, 12)
"""Bytes per parameter of the ZeRO paper's model: fp16 θ, fp16 g, fp32 copy of θ, m and v."""

Params = list[list[np.ndarray]]  # the arrays of each layer


def _check_stage(stage: int) -> None:
    if stage not in STAGES:
        raise ValueError(f"ZeRO has stages 0, 1, 2 and 3, not {stage!r}")


# -- the model: layers that take their parameters as arguments --------------------------------

_DERIVATIVES: dict[str | None, Callable[[np.ndarray], np.ndarray | float]] = {
    None: lambda y: 1.0,
    "tanh": lambda y: 1.0 - y * y,
    "sigmoid": lambda y: y * (1.0 - y),
    "relu": lambda y: (y > 0).astype(y.dtype),
}
"""act′ written with the layer's output y = act(z), so the backward needs y, not z."""


@dataclass(frozen=True)
class Linear:
    """``y = act(x Wᵀ + b)`` with W of ``(d_out, d_in)`` and b of ``(d_out,)``; no activation
    when ``activation`` is None. Its parameters are passed in, so they can come from a
    gathered buffer."""

    d_in: int
    d_out: int
    activation: str | None = "tanh"

    def __post_init__(self) -> None:
        if self.activation not in _DERIVATIVES:
            raise ValueError(
                f"activation must be one of {list(_DERIVATIVES)}, not {self.activation!r}"
            )

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        return ((self.d_out, self.d_in), (self.d_out,))

    def __call__(self, params: Sequence[Tensor], x: Tensor) -> Tensor:
        weight, bias = params
        y = ops.add(ops.matmul(x, ops.transpose(weight)), bias)
        return y if self.activation is None else getattr(ops, self.activation)(y)

    def backward(
        self,
        params: Sequence[np.ndarray],
        x: np.ndarray,
        y: np.ndarray,
        g: np.ndarray,
        out: np.ndarray | None = None,
        need_x: bool = True,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The layer's VJP from what the forward kept (its input x and output y) and the
        parameters, handed in now: the flat gradient ``[W̄; b̄]`` and ``x̄`` for the cotangent
        ``g`` of y, with ``z̄ = g ⊙ act′``, ``W̄ = z̄ᵀ x``, ``b̄ = Σ_rows z̄``, ``x̄ = z̄ W``.

        ``out``: a 1-D buffer of at least the layer's size that receives ``[W̄; b̄]`` (and
        zeros after it), so the gradient is made where it will be reduced, with no copy.
        """
        weight, _ = params
        n_w, n_b = weight.size, self.d_out
        if out is None:
            out = np.empty(n_w + n_b, dtype=np.result_type(g, x))
        gz = g * _DERIVATIVES[self.activation](y)
        np.matmul(gz.T, x, out=out[:n_w].reshape(weight.shape))
        np.sum(gz, axis=0, out=out[n_w : n_w + n_b])
        out[n_w + n_b :] = 0
        return out, (gz @ weight if need_x else None)


def mlp(widths: Sequence[int], activation: str = "tanh") -> list[Linear]:
    """The layers of an MLP ``d_0 → d_1 → … → d_n``, ``activation`` after all but the last."""
    pairs = list(zip(widths[:-1], widths[1:], strict=True))
    return [
        Linear(a, b, activation if i < len(pairs) - 1 else None) for i, (a, b) in enumerate(pairs)
    ]


def init_params(
    layers: Sequence[Linear], rng: np.random.Generator, dtype: type = np.float64
) -> Params:
    """Each layer's parameters, uniform in ``±1/√d_in`` (as the engine's ``layers.Linear``)."""
    return [
        [(rng.uniform(-1, 1, shape) / np.sqrt(layer.d_in)).astype(dtype) for shape in layer.shapes]
        for layer in layers
    ]


def num_parameters(layers: Sequence[Linear]) -> int:
    """Ψ, the number of scalar parameters."""
    return sum(int(np.prod(s)) for layer in layers for s in layer.shapes)


# -- the flat buffer ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FlatLayout:
    """Parameters of ``shapes`` end to end in one buffer of ``padded = P·chunk`` elements.

    ``numel`` = Σ sizes (Ψ of the group); the last ``padded − numel`` elements are zeros, so
    that the buffer splits into P equal chunks and rank p owns ``[p·chunk, (p+1)·chunk)``.
    """

    shapes: tuple[tuple[int, ...], ...]
    world_size: int

    @property
    def sizes(self) -> list[int]:
        return [int(np.prod(s)) for s in self.shapes]

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    @property
    def chunk(self) -> int:
        return -(-self.numel // self.world_size)  # ⌈Ψ/P⌉

    @property
    def padded(self) -> int:
        return self.chunk * self.world_size

    def owned(self, rank: int) -> slice:
        """The elements rank ``rank`` owns."""
        return slice(rank * self.chunk, (rank + 1) * self.chunk)

    def flatten(self, arrays: Sequence[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        """The arrays laid end to end, zero-padded to ``padded`` elements: one new buffer, or
        written into ``out`` (a buffer of ``padded`` elements)."""
        if out is None:
            out = np.empty(self.padded, dtype=np.result_type(*arrays))
        start = 0
        for a, size in zip(arrays, self.sizes, strict=True):
            out[start : start + size] = np.ravel(a)
            start += size
        out[start:] = 0
        return out

    def views(self, flat: np.ndarray) -> list[np.ndarray]:
        """Views of the full buffer shaped like the parameters (no copy)."""
        out, start = [], 0
        for shape, size in zip(self.shapes, self.sizes, strict=True):
            out.append(flat[start : start + size].reshape(shape))
            start += size
        return out

    def unflatten(self, flat: Tensor) -> list[Tensor]:
        """The full buffer cut into the parameters, differentiably (slices and reshapes)."""
        out, start = [], 0
        for shape, size in zip(self.shapes, self.sizes, strict=True):
            out.append(ops.reshape(flat[start : start + size], shape))
            start += size
        return out


def groups(layers: Sequence[Linear], stage: int) -> list[list[int]]:
    """Which layers share a flat buffer: all of them for stages 0 and 1, one each for stages 2
    (a bucket of gradients) and 3 (an FSDP unit)."""
    _check_stage(stage)
    return [[i] for i in range(len(layers))] if stage >= 2 else [list(range(len(layers)))]


def layouts(layers: Sequence[Linear], stage: int, world_size: int) -> list[FlatLayout]:
    """The :class:`FlatLayout` of each group of :func:`groups`."""
    return [
        FlatLayout(tuple(s for i in group for s in layers[i].shapes), world_size)
        for group in groups(layers, stage)
    ]


# -- the layers of each stage: what the forward keeps, and where the parameters' gradient goes --


def _forward(layer: Linear, params: Sequence[np.ndarray], x: Tensor) -> np.ndarray:
    """The layer's output y, computed outside the graph (the op that calls it is the graph)."""
    with no_grad():
        return layer([Tensor(p) for p in params], x).data


def replicated_layer(
    layer: Linear, params: Sequence[np.ndarray], bucket: Tensor, x: Tensor, grad: np.ndarray
) -> Tensor:
    """Stages 0 and 1: the layer on the rank's whole copy of its parameters ``params`` (views
    of ``bucket``, the layer's part of the flat θ). The forward keeps x and y; the backward
    writes the layer's gradient straight into ``grad``, its part of the rank's flat gradient
    buffer (as PyTorch's DDP makes each ``.grad`` a view into its bucket), and hands that view
    to ``bucket`` as its gradient. The buffer is reduced after the backward."""
    y = _forward(layer, params, x)

    def vjp(g: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        gx = layer.backward(params, x.data, y, g, out=grad, need_x=x.requires_grad)[1]
        return grad, gx

    return Tensor.from_op(y, (bucket, x), vjp, "replicated_layer")


def bucketed_layer(
    layer: Linear, layout: FlatLayout, theta: np.ndarray, shard: Tensor, x: Tensor
) -> Tensor:
    """Stage 2: the layer on the rank's whole copy ``theta`` of its flat parameters (this
    rank's ``shard`` of them is a leaf). The forward keeps x and y. The backward makes the
    layer's gradient as one flat bucket (``Partial``: this rank's addend), reduce-scatters it
    at once (``Partial → Shard(0)``: chunk p of the sum over ranks goes to ``shard.grad``) and
    drops the bucket, so that only one layer's full gradient exists at any moment."""
    params = layout.views(theta)
    y = _forward(layer, params, x)

    def vjp(g: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        bucket = np.empty(layout.padded, dtype=theta.dtype)  # this layer's g, Partial
        gx = layer.backward(params, x.data, y, g, out=bucket, need_x=x.requires_grad)[1]
        return np.asarray(dist.reduce_scatter(bucket)), gx  # the bucket is freed on return

    return Tensor.from_op(y, (shard, x), vjp, "bucketed_layer")


# -- stage 3: a layer whose parameters are gathered just before use ----------------------------

GATHER: Transition = transition(Shard(0), Replicate(), fan_out=True)
"""θ's placement change before a layer at stage 3: the all-gather row (reduce-scatter backward)."""


def gather_layer(
    layer: Linear, layout: FlatLayout, shard: Tensor, x: Tensor, seen: list[int] | None = None
) -> Tensor:
    """The layer on the parameters gathered from every rank's shard (differentiable in both).

    ``GATHER.apply(shard)`` all-gathers the flat buffer; the backward of that transition is a
    reduce-scatter, so ``shard.grad`` receives chunk p of ``Σ_q ∇_θ(L_q/P)``: this rank's
    chunk of the gradient, already summed over ranks. The gathered buffer stays in the graph
    until the backward has used it. ``seen`` receives its bytes.
    """
    full = GATHER.apply(shard)
    if seen is not None:
        seen.append(full.data.nbytes)
    return layer(layout.unflatten(full), x)


def resharded_layer(
    layer: Linear, layout: FlatLayout, shard: Tensor, x: Tensor, seen: list[int]
) -> Tensor:
    """:func:`gather_layer` that drops the gathered parameters after the forward and gathers
    them again in the backward (FSDP's ``reshard_after_forward``). The forward keeps the
    layer's activations, its input x and output y, as FSDP does; the backward all-gathers θ
    a second time (the layer's padded buffer, ``(P−1)/P`` of it sent per rank), runs the
    layer's VJP with it (no forward is computed again) and backpropagates the flat gradient
    through that second gather, whose VJP is the reduce-scatter.

    ``seen`` receives the bytes of each gathered buffer (the memory it holds for a while).
    """
    with no_grad():
        full = GATHER.apply(shard).data
    seen.append(full.nbytes)
    y = _forward(layer, layout.views(full), x)
    del full  # resharded: only x and y are kept for the backward

    def vjp(g: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        again = Tensor(shard.data, requires_grad=True)
        gathered = GATHER.apply(again)  # θ, all-gathered again
        bucket, gx = layer.backward(
            layout.views(gathered.data),
            x.data,
            y,
            g,
            out=np.empty_like(gathered.data),
            need_x=x.requires_grad,
        )
        gathered.backward(bucket)  # the gather's VJP: a reduce-scatter
        return again.grad, gx

    return Tensor.from_op(y, (shard, x), vjp, "resharded_layer")


# -- the sharded optimizer -----------------------------------------------------------------------


def memory_model(
    psi: float, world_size: int, stage: int, bytes_per_param: Sequence[float] = ADAM_MIXED_PRECISION
) -> tuple[float, float, float]:
    """(parameters, gradients, optimizer state) bytes per rank by the ZeRO paper's model.

    ``bytes_per_param`` = (b_θ, b_g, b_s); the default is mixed-precision Adam, (2, 2, 12).
    A sharded state takes 1/P of its bytes: stage 1 shards the state, stage 2 also g, stage 3
    also θ.
    """
    _check_stage(stage)
    b_param, b_grad, b_state = bytes_per_param
    P = world_size
    return (
        b_param * psi / (P if stage >= 3 else 1),
        b_grad * psi / (P if stage >= 2 else 1),
        b_state * psi / (P if stage >= 1 else 1),
    )


def _layer_slices(layers: Sequence[Linear]) -> list[slice]:
    """Where each layer's parameters lie in the flat buffer of the whole model."""
    out, start = [], 0
    for layer in layers:
        size = sum(int(np.prod(s)) for s in layer.shapes)
        out.append(slice(start, start + size))
        start += size
    return out


@dataclass
class Zero:
    """One rank's model states at ZeRO stage ``stage`` (build it inside an SPMD function).

    ``flat[k]`` is group k's parameter buffer (the full one for stages 0–2, this rank's chunk
    for stage 3), ``grad[k]`` its gradient as held after the step's reduction (the full flat
    buffer for stages 0–1, which the backward writes into; the chunk for 2–3, which the
    backward hands over), ``velocity[k]`` its momentum buffer v, the optimizer state (full for
    stage 0, the chunk otherwise); ``gathered`` the bytes of each layer's parameters gathered
    in the last step (stage 3). ``reshard``: at stage 3, gather each layer's θ again in the
    backward instead of keeping it from the forward.
    """

    layers: list[Linear]
    stage: int
    lr: float
    momentum: float = 0.9
    reshard: bool = True
    flat: list[np.ndarray] = field(default_factory=list)
    grad: list[np.ndarray] = field(default_factory=list)
    velocity: list[np.ndarray] = field(default_factory=list)
    gathered: list[int] = field(default_factory=list)

    @classmethod
    def create(
        cls,
        layers: Sequence[Linear],
        params: Params,
        stage: int,
        lr: float,
        momentum: float = 0.9,
        reshard: bool = True,
    ) -> Zero:
        """Lay the (replicated) initial ``params`` out flat and keep what this rank holds."""
        _check_stage(stage)
        zero = cls(list(layers), stage, lr, momentum, reshard)
        rank = dist.rank()
        for layout, group in zip(zero.layouts, groups(layers, stage), strict=True):
            flat = layout.flatten([a for i in group for a in params[i]])
            mine = flat[layout.owned(rank)].copy()
            zero.flat.append(mine if stage == 3 else flat)
            zero.velocity.append(np.zeros_like(flat if stage == 0 else mine))
            if stage <= 1:
                zero.grad.append(np.zeros_like(flat))  # the buffer the backward writes into
        return zero

    @property
    def layouts(self) -> list[FlatLayout]:
        return layouts(self.layers, self.stage, dist.world_size())

    def forward(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        """The model on ``x`` and the leaves whose gradients the step needs: each layer's part
        of the flat θ (stages 0–1), this rank's chunk of each layer's θ (stages 2–3)."""
        self.gathered = []
        leaves = []
        if self.stage <= 1:
            for layer, part in zip(self.layers, _layer_slices(self.layers), strict=True):
                bucket = Tensor(self.flat[0][part], requires_grad=True)
                params = FlatLayout(layer.shapes, 1).views(bucket.data)
                x = replicated_layer(layer, params, bucket, x, self.grad[0][part])
                leaves.append(bucket)
            return x, leaves
        for k, (layer, layout) in enumerate(zip(self.layers, self.layouts, strict=True)):
            if self.stage == 2:
                shard = Tensor(self.flat[k][layout.owned(dist.rank())], requires_grad=True)
                x = bucketed_layer(layer, layout, self.flat[k], shard, x)
            else:
                shard = Tensor(self.flat[k], requires_grad=True)
                if self.reshard:
                    x = resharded_layer(layer, layout, shard, x, self.gathered)
                else:
                    x = gather_layer(layer, layout, shard, x, self.gathered)
            leaves.append(shard)
        return x, leaves

    def reduce_gradients(self, leaves: Sequence[Tensor]) -> list[np.ndarray]:
        """Each group's gradient as the optimizer needs it: the full sum (stage 0, all-reduce
        of the flat buffer), this rank's chunk of it (stage 1, reduce-scatter; stages 2 and 3:
        the backward did it, layer by layer)."""
        if self.stage >= 2:
            self.grad = [np.asarray(leaf.grad) for leaf in leaves]
            return self.grad
        (local,) = self.grad  # Partial: this rank's addend, written by the backward
        if self.stage == 0:
            dist.all_reduce(local, out=local)  # Partial → Replicate
            return [local]
        return [np.asarray(dist.reduce_scatter(local))]  # Partial → Shard(0); g stays full

    def update(self, grads: Sequence[np.ndarray]) -> None:
        """``v ← μ v + g``, ``θ ← θ − η v`` on what this rank owns; then stages 1–2 all-gather
        the updated θ (``Shard(0) → Replicate``) into a new buffer, the old one dropped first
        (the other ranks' chunks of it come back with the gather)."""
        rank = dist.rank()
        for k, (layout, g) in enumerate(zip(self.layouts, grads, strict=True)):
            v, lr, mu = self.velocity[k], self.lr, self.momentum
            if self.stage in (0, 3):
                update(self.flat[k], g, lr, v, mu, out=self.flat[k])
            else:
                mine = update(self.flat[k][layout.owned(rank)], g, lr, v, mu)
                del self.flat[k]  # the whole θ of this group is not needed until the gather
                self.flat.insert(k, np.asarray(dist.all_gather(mine)))

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        """One training step on this rank's shard (x, y) of the batch; returns its loss L_p.

        The rank backpropagates L_p/P, its term of ``L = Σ_p L_p/P``, so every reduction
        of the gradients is a sum. The graph (with its activations) is dropped before the
        update.
        """
        if self.stage >= 2:
            self.grad = []  # the last step's chunks: the backward makes new ones
        out, leaves = self.forward(Tensor(x))
        loss = ops.mse_loss(out, y)
        (loss / dist.world_size()).backward()
        value = float(loss.item())
        del out, loss
        grads = self.reduce_gradients(leaves)
        del leaves
        self.update(grads)
        return value


# -- measuring what one rank allocates -----------------------------------------------------------


@dataclass(frozen=True)
class MeasuredMemory:
    """Bytes rank 0 allocated in one step, by :mod:`tracemalloc`, counted from before it laid
    out its model states: ``held`` after the step (what it keeps from step to step), ``peak``
    the most at any moment of the step."""

    held: int
    peak: int


class _Tape:
    """Rank 0's world, twice. Recording (``inner`` given): ``inner`` answers each collective and
    a copy of its result is kept in ``received``. Replaying (``received`` given): a world of one
    rank that answers each collective with the recorded result, in a new buffer (as the network
    delivers it), after checking that the call is the one that was made then."""

    native, device = "numpy", None

    def __init__(self, world_size: int, inner: Any = None, received: Any = None) -> None:
        self.inner, self.rank, self.world_size, self.backend = inner, 0, world_size, "replay"
        self.received: list[tuple[Call, np.ndarray]] = [] if received is None else received
        self.replay = iter(self.received)

    def collective(self, call: Call, data: Any, into: Any = None) -> tuple[Any, Call]:
        if self.inner is None:
            recorded, result = next(self.replay)
            if recorded != call:
                raise RuntimeError(f"the replay calls {call}, the run called {recorded}")
            return result.copy(), call
        result, lead = self.inner.collective(call, data, into)
        self.received.append((call, np.array(result, copy=True)))
        return result, lead

    def point_to_point(self, call: Call, data: Any) -> tuple[Any, Call]:
        raise TypeError("the memory measurement answers collectives only, not send or recv")

    def subgroup(self, group: Any) -> _world.World:
        raise TypeError("the memory measurement answers the whole world's collectives only")

    def register_group(self, group: Any) -> None:
        self.subgroup(group)


def _recorded_step(
    layers: list[Linear], params: Params, batch: tuple, stage: int, reshard: bool
) -> tuple[list[np.ndarray], list[tuple[Call, np.ndarray]] | None]:
    """SPMD: one step of every rank; rank 0 records what its collectives hand it."""
    rank, P = dist.rank(), dist.world_size()
    recorder = None
    if rank == 0:
        recorder = _Tape(P, inner=_world.current_world())
        _world.set_rank_world(recorder)
    zero = Zero.create(layers, params, stage, 0.1, reshard=reshard)
    zero.step(*(chunk(a, rank, P) for a in batch))
    return zero.flat, (recorder.received if recorder is not None else None)


def measure_memory(
    layers: Sequence[Linear],
    params: Params,
    batch: tuple[np.ndarray, np.ndarray],
    stage: int,
    world_size: int,
    reshard: bool = True,
) -> MeasuredMemory:
    """What rank 0 of ``world_size`` simulated ranks allocates in one step at ``stage``.

    The simulated ranks share one process, so :mod:`tracemalloc` cannot tell their allocations
    apart. So the step runs twice: on all ranks, rank 0 recording what each collective hands
    it; then rank 0's step alone, every collective answered by its recorded result in a new
    buffer, with tracemalloc counting every byte allocated from before the model states are
    laid out. The replayed rank must end with the run's parameters, or this raises.
    """
    _check_stage(stage)
    chunk(batch[0], 0, world_size)
    args = (list(layers), params, batch, stage, reshard)
    flats, received = dist.run(_recorded_step, world_size, args=args)[0]

    def replay() -> tuple[MeasuredMemory, list[np.ndarray]]:
        _world.set_rank_world(_Tape(world_size, received=received))
        tracemalloc.start()
        try:
            zero = Zero.create(layers, params, stage, 0.1, reshard=reshard)
            tracemalloc.reset_peak()  # laying out the states copies the whole model once
            zero.step(*(chunk(a, 0, world_size) for a in batch))
            held, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        return MeasuredMemory(held, peak), zero.flat

    measured, replayed = contextvars.copy_context().run(replay)
    if not all(np.array_equal(a, b) for a, b in zip(replayed, flats, strict=True)):
        raise RuntimeError("the replayed step did not end with rank 0's parameters")
    return measured


# -- training, and the one process it must equal -------------------------------------------------


@dataclass(frozen=True)
class Result:
    """Losses per step (the mean of the ranks' L_p, = the full-batch loss) and the final
    parameters of each layer (assembled from the ranks' chunks at stage 3)."""

    losses: list[float]
    params: Params


def _train_rank(
    layers: list[Linear],
    params: Params,
    batches: list[tuple[np.ndarray, np.ndarray]],
    stage: int,
    lr: float,
    momentum: float,
    reshard: bool,
) -> tuple[list[float], list[np.ndarray]]:
    """SPMD: train on this rank's shard of every batch; return losses and flat buffers."""
    zero = Zero.create(layers, params, stage, lr, momentum=momentum, reshard=reshard)
    rank, P = dist.rank(), dist.world_size()
    losses = [zero.step(chunk(x, rank, P), chunk(y, rank, P)) for x, y in batches]
    return losses, zero.flat


def train(
    layers: Sequence[Linear],
    params: Params,
    batches: Sequence[tuple[np.ndarray, np.ndarray]],
    stage: int,
    world_size: int,
    lr: float = 0.1,
    momentum: float = 0.9,
    backend: str = "sim",
    reshard: bool = True,
    trace: dist.Trace | None = None,
) -> Result:
    """Train ``layers`` from ``params`` on ``batches`` (each split by rows into P equal shards)
    at ZeRO ``stage`` on ``world_size`` ranks of ``backend``."""
    _check_stage(stage)
    for x, _ in batches:
        chunk(x, 0, world_size)  # equal shards, checked before any rank starts
    args = (list(layers), params, list(batches), stage, lr, momentum, reshard)
    results = dist.run(_train_rank, world_size, backend=backend, args=args, trace=trace)
    losses = [float(np.mean(step)) for step in zip(*(r[0] for r in results), strict=True)]
    if stage == 3:
        flats = [np.concatenate([r[1][k] for r in results]) for k in range(len(results[0][1]))]
    else:
        flats = results[0][1]
    final: Params = []
    for layout, flat, group in zip(
        layouts(layers, stage, world_size), flats, groups(layers, stage), strict=True
    ):
        views = iter(layout.views(np.asarray(flat)))
        final += [[next(views).copy() for _ in layers[i].shapes] for i in group]
    return Result(losses, final)


def train_one_process(
    layers: Sequence[Linear],
    params: Params,
    batches: Sequence[tuple[np.ndarray, np.ndarray]],
    lr: float = 0.1,
    momentum: float = 0.9,
) -> tuple[list[float], Params]:
    """The reference: the same SGD with momentum on the whole batch, in one process."""
    leaves = [[Tensor(a.copy(), requires_grad=True) for a in layer] for layer in params]
    optimizer = SGD([leaf for layer in leaves for leaf in layer], lr, momentum)
    losses = []
    for x, y in batches:
        out = Tensor(x)
        for layer, p in zip(layers, leaves, strict=True):
            out = layer(p, out)
        loss = ops.mse_loss(out, y)
        loss.backward()
        losses.append(float(loss.item()))
        optimizer.step()
        optimizer.zero_grad()
    return losses, [[leaf.data for leaf in layer] for layer in leaves]


# -- communication per step, from the placements --------------------------------------------------


def step_transitions(stage: int) -> list[tuple[str, str, Placement, Placement, bool]]:
    """``(when, tensor, from, to, fanned out)``: the placement changes of one step."""
    _check_stage(stage)
    if stage == 0:
        return [("backward", "g", Partial(), Replicate(), False)]
    if stage in (1, 2):  # stage 2 reduce-scatters each layer's g inside the backward
        return [
            ("step" if stage == 1 else "backward", "g", Partial(), Shard(0), False),
            ("step", "θ", Shard(0), Replicate(), False),
        ]
    return [("forward", "θ", Shard(0), Replicate(), True)]


def communication(
    stage: int, nbytes: float, world_size: int, reshard: bool = True
) -> list[tuple[str, str, str, float]]:
    """``(pass, collective, tensor, bytes sent per rank)`` of one step on a flat buffer of
    ``nbytes``, read off the transitions of :func:`step_transitions` and priced by the ring
    model. The gradient and optimizer transitions run outside the graph (their collectives
    only); stage 3's gather runs in the forward, so its backward collective comes with it, and
    with ``reshard`` the forward's all-gather runs again in the backward."""
    found = []
    for when, tensor, source, target, fanned in step_transitions(stage):
        move = transition(source, target, fan_out=fanned)
        found += [(when, op, tensor, ring_bytes(op, nbytes, world_size)) for op in move.forward_ops]
        if when != "forward":
            continue
        if reshard:
            found += [("backward", op, tensor, ring_bytes(op, nbytes, world_size))
                      for op in move.forward_ops]  # fmt: skip
        found += [("backward", op, "g", ring_bytes(op, nbytes, world_size))
                  for op in move.backward_ops]  # fmt: skip
    return found


def communication_factor(stage: int, world_size: int, reshard: bool = True) -> float:
    """Bytes sent per rank per step, per byte of the flat buffer: ``2(P−1)/P`` for stages 0–2,
    ``3(P−1)/P`` for stage 3 (``2(P−1)/P`` without resharding)."""
    return sum(b for *_, b in communication(stage, 1.0, world_size, reshard))
