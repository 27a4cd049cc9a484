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
2      + gradients                  the same                         2(P−1)/P · Ψ
3      + parameters (FSDP)          all-gather of θ forward, again   3(P−1)/P · Ψ
                                    backward, reduce-scatter of g
=====  ===========================  ===============================  ==============================

(Ψ in bytes of the buffer.) An all-reduce *is* a reduce-scatter followed by an all-gather, so
stages 1 and 2 cost what data parallelism costs; stage 3 adds one all-gather, 1.5 times.

**The flat buffer.** The parameters of a group (all of them for stages 0–2, one layer for
stage 3, FSDP's "unit") are laid end to end in one buffer, padded with zeros to a multiple of
P, ``n = P·c``; rank p owns chunk p, elements ``[p·c, (p+1)·c)`` (:class:`FlatLayout`). In
placements (:mod:`chainrule.placement`) a replicated model state is ``Replicate()`` and a
sharded one ``Shard(0)`` of the flat buffer. Each rank's gradient ``∇(L_p/P)`` of its term of
the loss ``L = Σ_p L_p/P`` (L_p the mean over its equal shard of the batch) is ``Partial()``:
the gradient is the sum of the ranks' addends. Every collective of a step is a placement change:

- stage 0: g ``Partial → Replicate``, an all-reduce;
- stages 1, 2: g ``Partial → Shard(0)``, a reduce-scatter; the updated θ ``Shard(0) →
  Replicate``, an all-gather;
- stage 3: θ ``Shard(0) → Replicate``, fanned out (each rank feeds its copy to a computation of
  its own data), just before the layer uses it. That is the all-gather row of the duality
  table, so its backward is a reduce-scatter: rule 1 sums the ranks' cotangents of the copies
  (the fan-out), rule 2 routes slice p of the sum back to shard p (the concatenation). Nothing
  here writes that reduce-scatter: :func:`gather_layer` applies the transition, whose VJP runs
  it. With ``reshard=True`` (FSDP's default) the gathered θ is dropped after the forward and
  gathered again in the backward, the third Ψ of traffic.

**The optimizer** is SGD with momentum μ (the momentum buffer v is the optimizer state),
elementwise, so each rank can update its own chunk alone:
``v ← μ v + g``, ``θ ← θ − η v`` (PyTorch's convention, v = 0 at the start).

**Memory per rank** (:func:`memory_model`), with b_θ, b_g, b_s bytes per parameter of
parameters, gradients and optimizer state: stage 0 holds ``(b_θ + b_g + b_s) Ψ``, stage 1
``(b_θ + b_g) Ψ + b_s Ψ/P``, stage 2 ``b_θ Ψ + (b_g + b_s) Ψ/P``, stage 3
``(b_θ + b_g + b_s) Ψ/P``. The ZeRO paper's mixed-precision Adam has b_θ = b_g = 2 (fp16) and
b_s = 12 (fp32 master weights, momentum and variance): 16Ψ, 4Ψ + 12Ψ/P, 2Ψ + 14Ψ/P, 16Ψ/P.
:meth:`Zero.memory` measures what a rank holds from its arrays; stage 3 also holds, for a
while, the gathered parameters of the layer being computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from chainrule import dist, ops
from chainrule.comm_cost import ring_bytes
from chainrule.placement import Partial, Placement, Replicate, Shard, Transition, transition
from chainrule.tensor import Tensor, no_grad

STAGES = (0, 1, 2, 3)
ADAM_MIXED_PRECISION = (2, 2, 12)
"""Bytes per parameter of the ZeRO paper's model: fp16 θ, fp16 g, fp32 copy of θ, m and v."""

Params = list[list[np.ndarray]]  # the arrays of each layer


def _check_stage(stage: int) -> None:
    if stage not in STAGES:
        raise ValueError(f"ZeRO has stages 0, 1, 2 and 3, not {stage!r}")


# -- the model: layers that take their parameters as arguments --------------------------------


@dataclass(frozen=True)
class Linear:
    """``y = act(x Wᵀ + b)`` with W of ``(d_out, d_in)`` and b of ``(d_out,)``; no activation
    when ``activation`` is None. Its parameters are passed in, so they can come from a
    gathered buffer."""

    d_in: int
    d_out: int
    activation: str | None = "tanh"

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        return ((self.d_out, self.d_in), (self.d_out,))

    def __call__(self, params: Sequence[Tensor], x: Tensor) -> Tensor:
        weight, bias = params
        y = ops.add(ops.matmul(x, ops.transpose(weight)), bias)
        return y if self.activation is None else getattr(ops, self.activation)(y)


def mlp(widths: Sequence[int], activation: str = "tanh") -> list[Linear]:
    """The layers of an MLP ``d_0 → d_1 → … → d_n``, ``activation`` after all but the last."""
    pairs = list(zip(widths[:-1], widths[1:], strict=True))
    return [
        Linear(a, b, activation if i < len(pairs) - 1 else None) for i, (a, b) in enumerate(pairs)
    ]


def init_params(
    layers: Sequence[Linear], rng: np.random.Generator, dtype: type = np.float64
) -> Params:
    """Each layer's parameters, uniform in ``±1/√d_in`` (as :class:`chainrule.nn.Linear`)."""
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

    def flatten(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        """The arrays laid end to end, zero-padded to ``padded`` elements."""
        flat = np.concatenate([np.ravel(a) for a in arrays])
        return np.concatenate([flat, np.zeros(self.padded - self.numel, dtype=flat.dtype)])

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
    """Which layers share a flat buffer: all of them for stages 0–2, one each for stage 3."""
    _check_stage(stage)
    return [[i] for i in range(len(layers))] if stage == 3 else [list(range(len(layers)))]


def layouts(layers: Sequence[Linear], stage: int, world_size: int) -> list[FlatLayout]:
    """The :class:`FlatLayout` of each group of :func:`groups`."""
    return [
        FlatLayout(tuple(s for i in group for s in layers[i].shapes), world_size)
        for group in groups(layers, stage)
    ]


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
    them again in the backward (FSDP's ``reshard_after_forward``): one op whose VJP runs the
    layer again and backpropagates through it, the gather's reduce-scatter included.

    ``seen`` receives the bytes of each gathered buffer (the memory it holds for a while).
    """
    with no_grad():
        full = GATHER.apply(shard)
        seen.append(full.data.nbytes)
        out = layer([Tensor(v) for v in layout.views(full.data)], x).data
    del full  # resharded: the gathered θ is not kept for the backward

    def vjp(g: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        again = Tensor(shard.data, requires_grad=True)
        x_again = Tensor(x.data, requires_grad=x.requires_grad)
        layer(layout.unflatten(GATHER.apply(again)), x_again).backward(g)
        return again.grad, x_again.grad

    return Tensor.from_op(np.asarray(out), (shard, x), vjp, "resharded_layer")


# -- the sharded optimizer -----------------------------------------------------------------------


@dataclass
class Memory:
    """Bytes one rank holds: parameters, gradients, optimizer state, and the largest gathered
    parameter buffer it held for a while (stage 3)."""

    parameters: int
    gradients: int
    optimizer_state: int
    gathered: int = 0

    @property
    def model_states(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state

    @property
    def total(self) -> int:
        return self.model_states + self.gathered


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


@dataclass
class Zero:
    """One rank's model states at ZeRO stage ``stage`` (build it inside an SPMD function).

    ``flat[k]`` is group k's parameter buffer (the full one for stages 0–2, this rank's chunk
    for stage 3), ``grad[k]`` its gradient as held after the step's reduction (full for stages
    0–1, the chunk for 2–3), ``velocity[k]`` its momentum buffer v, the optimizer state (full
    for stage 0, the chunk otherwise); ``gathered`` the bytes of each layer's parameters
    gathered in the last forward pass (stage 3). ``reshard``: at stage 3, gather each layer's θ
    again in the backward instead of keeping it from the forward.
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
            zero.grad.append(np.zeros_like(mine if stage >= 2 else flat))
        return zero

    @property
    def layouts(self) -> list[FlatLayout]:
        return layouts(self.layers, self.stage, dist.world_size())

    def forward(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        """The model on ``x`` and the leaves that receive the gradients (one per parameter for
        stages 0–2, one shard per layer for stage 3)."""
        self.gathered = []
        if self.stage < 3:
            (layout,) = self.layouts
            leaves = [Tensor(v, requires_grad=True) for v in layout.views(self.flat[0])]
            start = 0
            for layer in self.layers:
                count = len(layer.shapes)
                x = layer(leaves[start : start + count], x)
                start += count
            return x, leaves
        shards = [Tensor(chunk, requires_grad=True) for chunk in self.flat]
        for layer, layout, shard in zip(self.layers, self.layouts, shards, strict=True):
            if self.reshard:
                x = resharded_layer(layer, layout, shard, x, self.gathered)
            else:
                x = gather_layer(layer, layout, shard, x, self.gathered)
        return x, shards

    def reduce_gradients(self, leaves: Sequence[Tensor]) -> list[np.ndarray]:
        """Each group's gradient as the optimizer needs it: the full sum (stage 0, all-reduce),
        this rank's chunk of it (stages 1–2, reduce-scatter; stage 3: the backward did it)."""
        if self.stage == 3:
            self.grad = [np.asarray(s.grad) for s in leaves]
            return self.grad
        (layout,) = self.layouts
        local = layout.flatten([np.asarray(leaf.grad) for leaf in leaves])  # Partial
        if self.stage == 0:
            self.grad = [np.asarray(dist.all_reduce(local))]  # Partial → Replicate
            return self.grad
        mine = np.asarray(dist.reduce_scatter(local))  # Partial → Shard(0)
        self.grad = [local if self.stage == 1 else mine]  # stage 1 keeps the full g
        return [mine]

    def update(self, grads: Sequence[np.ndarray]) -> None:
        """``v ← μ v + g``, ``θ ← θ − η v`` on what this rank owns; then stages 1–2 all-gather
        the updated θ (``Shard(0) → Replicate``)."""
        rank = dist.rank()
        for k, (layout, g) in enumerate(zip(self.layouts, grads, strict=True)):
            self.velocity[k] = self.momentum * self.velocity[k] + g
            if self.stage in (0, 3):
                self.flat[k] = self.flat[k] - self.lr * self.velocity[k]
            else:
                mine = self.flat[k][layout.owned(rank)] - self.lr * self.velocity[k]
                self.flat[k] = np.asarray(dist.all_gather(mine))

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        """One training step on this rank's shard (x, y) of the batch; returns its loss L_p.

        The rank backpropagates L_p/P, its term of ``L = Σ_p L_p/P``, so every reduction
        of the gradients is a sum.
        """
        out, leaves = self.forward(Tensor(x))
        loss = ops.mse_loss(out, y)
        (loss / dist.world_size()).backward()
        self.update(self.reduce_gradients(leaves))
        return float(loss.item())

    def memory(self) -> Memory:
        """The bytes this rank holds, measured from its arrays."""
        return Memory(
            parameters=sum(a.nbytes for a in self.flat),
            gradients=sum(a.nbytes for a in self.grad),
            optimizer_state=sum(a.nbytes for a in self.velocity),
            gathered=max(self.gathered, default=0) if self.reshard else sum(self.gathered),
        )


# -- training, and the one process it must equal -------------------------------------------------


@dataclass(frozen=True)
class Result:
    """Losses per step (the mean of the ranks' L_p, = the full-batch loss), the final
    parameters of each layer (assembled from the ranks' chunks at stage 3) and what rank 0
    holds (:meth:`Zero.memory`)."""

    losses: list[float]
    params: Params
    memory: Memory


def _shard_rows(array: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    rows = array.shape[0]
    if rows % world_size:
        raise ValueError(f"a batch of {rows} rows does not split into {world_size} equal shards")
    size = rows // world_size
    return array[rank * size : (rank + 1) * size]


def _train_rank(
    layers: list[Linear],
    params: Params,
    batches: list[tuple[np.ndarray, np.ndarray]],
    stage: int,
    lr: float,
    momentum: float,
    reshard: bool,
) -> tuple[list[float], list[np.ndarray], Memory]:
    """SPMD: train on this rank's shard of every batch; return losses, flat buffers, memory."""
    zero = Zero.create(layers, params, stage, lr, momentum=momentum, reshard=reshard)
    rank, P = dist.rank(), dist.world_size()
    losses = [zero.step(_shard_rows(x, rank, P), _shard_rows(y, rank, P)) for x, y in batches]
    return losses, zero.flat, zero.memory()


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
        _shard_rows(x, 0, world_size)  # equal shards, checked before any rank starts
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
    return Result(losses, final, results[0][2])


def train_one_process(
    layers: Sequence[Linear],
    params: Params,
    batches: Sequence[tuple[np.ndarray, np.ndarray]],
    lr: float = 0.1,
    momentum: float = 0.9,
) -> tuple[list[float], Params]:
    """The reference: the same SGD with momentum on the whole batch, in one process."""
    theta = [[a.copy() for a in layer] for layer in params]
    velocity = [[np.zeros_like(a) for a in layer] for layer in params]
    losses = []
    for x, y in batches:
        leaves = [[Tensor(a, requires_grad=True) for a in layer] for layer in theta]
        out = Tensor(x)
        for layer, p in zip(layers, leaves, strict=True):
            out = layer(p, out)
        loss = ops.mse_loss(out, y)
        loss.backward()
        losses.append(float(loss.item()))
        for i, layer_leaves in enumerate(leaves):
            for j, leaf in enumerate(layer_leaves):
                velocity[i][j] = momentum * velocity[i][j] + np.asarray(leaf.grad)
                theta[i][j] = theta[i][j] - lr * velocity[i][j]
    return losses, theta


# -- communication per step, from the placements --------------------------------------------------


def step_transitions(stage: int) -> list[tuple[str, str, Placement, Placement, bool]]:
    """``(when, tensor, from, to, fanned out)``: the placement changes of one step."""
    _check_stage(stage)
    if stage == 0:
        return [("backward", "g", Partial(), Replicate(), False)]
    if stage in (1, 2):
        return [
            ("step", "g", Partial(), Shard(0), False),
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
