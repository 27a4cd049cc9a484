"""Expert parallelism: a mixture-of-experts layer whose E experts live E/P to a rank.

The layer (top-1 routing, as in the Switch Transformer). For a token x ∈ ℝᵈ the router gives
probabilities ``s = softmax(x W_r + b_r)`` over the E experts; the token goes to the expert
``e = argmax s`` only, with the gate ``g = s_e``, and the layer adds the expert's output to
the residual:

    y = x + g · FFN_e(x),      FFN_e(x) = tanh(x W₁ᵉ) W₂ᵉ.

**Capacity.** Each rank holds T tokens (its share of the batch). The buffers that travel must
have one size known before routing, so every rank reserves for every expert the same number
of slots, the capacity ``C = ⌈c · T / E⌉`` (c, the capacity factor). The tokens routed to an
expert fill its slots in token order; a token that finds them full is **dropped**: its expert
output is 0, so ``y = x`` and only the residual carries it. Its gate multiplies nothing, so no
gradient reaches the router or any expert from it. A slot that no token fills is **padding**:
zeros that travel and are computed on for nothing.

**The dispatch is an all-to-all.** Rank p writes its tokens into the buffer ``B_p`` of shape
(E, C, d): slot c of expert e holds the token that took it, or zeros. Cut ``B_p`` along the
expert axis into P chunks of E/P experts, chunk q being the experts rank q holds. The
all-to-all sends chunk q of rank p to rank q, which puts what it receives side by side along
the slot axis: rank q gets (E/P, P·C, d), every token of every rank for each of its experts.
As a map between global values it moves block (p, q) to block (q, p) and adds nothing: it is
a permutation Π of (rank, chunk) blocks. Its adjoint is Πᵀ = Π⁻¹, the inverse permutation,
block (q, p) back to (p, q): again an all-to-all, with the roles of the split axis and the concat
axis swapped (:func:`chainrule.parallel.duality.all_to_all_ranks`). The combine, the all-to-all that
brings the experts' outputs back, is that same inverse permutation, so its backward is the
dispatch's forward.

**Writing into the buffer and reading from it** are index maps on the rank. Dispatch gathers
rows, ``B[e, c] = x[t]`` for the token t in slot (e, c) (an appended zero row for padding);
its VJP adds each slot's cotangent back into its token's row, so a kept token gets the
cotangent of its slot, a dropped one nothing, and padding's cotangent is thrown away. Combine
gathers the other way, ``y_t += g_t · out[slot(t)]`` (a zero row for a dropped token).

:func:`expert_parallel_moe` is the layer on one rank of a :mod:`chainrule.dist` world,
:func:`one_process_moe` the same layer on one process (every expert on every token, each token
keeping its own expert's output when it is kept: no buffers, no all-to-all), with the same
routing, capacity and drops. :func:`expert_parallel_step` and :func:`one_process_step` run a
forward and backward pass of each and return the output and every gradient;
:func:`dispatch_report` counts loads, drops, padding and the bytes the all-to-alls move.

:func:`dropless_moe` routes without capacity: each rank sends each other rank exactly the
tokens of its experts, in one all-to-all of uneven sizes, so nothing is dropped or padded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from chainrule import dist
from chainrule.dist.chunks import chunk, chunk_slice
from chainrule.dist.collectives import ring_bytes
from chainrule.engine import ops
from chainrule.engine.tensor import ArrayLike, Tensor, as_tensor, no_grad
from chainrule.parallel import duality

# -- the weights ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExpertWeights:
    """The arrays of the layer (all of them, one rank's share, or their gradients).

    ``router`` (d, E) and ``router_bias`` (E,) are replicated on every rank; ``w1`` (E, d, h)
    and ``w2`` (E, h, d) hold the experts, E/P of them in one rank's share.
    """

    router: np.ndarray
    router_bias: np.ndarray
    w1: np.ndarray
    w2: np.ndarray

    @property
    def num_experts(self) -> int:
        """E, the number of experts of the whole layer (the router's columns)."""
        return int(self.router.shape[1])

    def as_tuple(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return (self.router, self.router_bias, self.w1, self.w2)

    def shard(self, rank: int, world_size: int) -> ExpertWeights:
        """Rank ``rank``'s share: the router whole, experts ``rank·E/P`` to ``(rank+1)·E/P − 1``."""
        experts = experts_of_rank(rank, self.num_experts, world_size)
        return ExpertWeights(
            self.router.copy(),
            self.router_bias.copy(),
            self.w1[experts].copy(),
            self.w2[experts].copy(),
        )


def skew_direction(num_experts: int) -> np.ndarray:
    """The router bias of skew 1: from +1 for expert 0 down to −1 for the last expert."""
    return np.linspace(1.0, -1.0, num_experts) if num_experts > 1 else np.zeros(1)


def init_expert_weights(
    d: int, hidden: int, num_experts: int, skew: float = 0.0, seed: int = 0
) -> ExpertWeights:
    """Random weights scaled by 1/√fan_in, float64, from ``seed``; the router's bias is
    ``skew · skew_direction(E)``: the larger the skew, the more tokens the first experts get."""
    rng = np.random.default_rng(seed)
    return ExpertWeights(
        router=rng.standard_normal((d, num_experts)) / np.sqrt(d),
        router_bias=skew * skew_direction(num_experts),
        w1=rng.standard_normal((num_experts, d, hidden)) / np.sqrt(d),
        w2=rng.standard_normal((num_experts, hidden, d)) / np.sqrt(hidden),
    )


def experts_of_rank(rank: int, num_experts: int, world_size: int) -> slice:
    """The experts rank ``rank`` holds: E/P consecutive ones (E must divide by P)."""
    return chunk_slice(num_experts, rank, world_size, "the experts' axis")


# -- routing ------------------------------------------------------------------------------------


def expert_capacity(tokens: int, num_experts: int, capacity_factor: float) -> int:
    """``C = ⌈c · T / E⌉`` slots per expert on each rank (c read as a decimal: 1.1 is 11/10)."""
    if not capacity_factor > 0:
        raise ValueError(f"the capacity factor must be positive, got {capacity_factor!r}")
    c = Fraction(capacity_factor).limit_denominator(10**6)
    return math.ceil(c * tokens / num_experts)


@dataclass(frozen=True)
class Routing:
    """Where one rank's T tokens go: top-1 expert, slot in that expert's buffer, or dropped.

    ``expert[t]`` is token t's expert; ``slot[t]`` its place among the tokens routed to that
    expert (in token order), kept when ``slot[t] < capacity``. The two index maps the layer
    gathers with: ``slot_token[e, c]`` is the token in slot c of expert e (T for padding, the
    row of zeros appended to the tokens), ``token_slot[t] = e·C + c`` the flat slot of a kept
    token (E·C for a dropped one, the row of zeros appended to the experts' outputs).
    """

    expert: np.ndarray
    slot: np.ndarray
    capacity: int
    num_experts: int

    @property
    def tokens(self) -> int:
        return int(self.expert.shape[0])

    @property
    def kept(self) -> np.ndarray:
        """Which tokens found a free slot (bool, one per token)."""
        return self.slot < self.capacity

    @property
    def load(self) -> np.ndarray:
        """Tokens routed to each expert, kept or not (E,)."""
        return np.bincount(self.expert, minlength=self.num_experts)

    @property
    def kept_per_expert(self) -> np.ndarray:
        """Tokens each expert computes: ``min(load, C)`` (E,)."""
        return np.minimum(self.load, self.capacity)

    @property
    def dropped(self) -> int:
        """Tokens that found their expert's slots full."""
        return int((~self.kept).sum())

    @property
    def padding(self) -> int:
        """Empty slots of the buffer: ``E·C − kept tokens``."""
        return int(self.num_experts * self.capacity - self.kept.sum())

    @property
    def slot_token(self) -> np.ndarray:
        index = np.full((self.num_experts, self.capacity), self.tokens)
        kept = np.flatnonzero(self.kept)
        index[self.expert[kept], self.slot[kept]] = kept
        return index

    @property
    def token_slot(self) -> np.ndarray:
        flat = self.expert * self.capacity + self.slot
        return np.where(self.kept, flat, self.num_experts * self.capacity)


def route(probabilities: np.ndarray, capacity: int) -> Routing:
    """Top-1 routing of T tokens (rows of router probabilities, T × E) into slots of
    ``capacity``: each token takes the next free slot of its expert, in token order."""
    expert = np.asarray(probabilities).argmax(axis=1)
    one_hot = np.eye(probabilities.shape[1], dtype=np.int64)[expert]
    slot = (np.cumsum(one_hot, axis=0) - 1)[np.arange(len(expert)), expert]
    return Routing(expert, slot, int(capacity), int(probabilities.shape[1]))


# -- the pieces of the layer, on engine tensors ---------------------------------------------------


def router_probabilities(x: Tensor, router: Tensor, router_bias: Tensor) -> Tensor:
    """``softmax(x W_r + b_r)`` over the experts, one row per token."""
    return ops.softmax(x @ router + router_bias, axis=-1)


def dispatch(x: Tensor, routing: Routing) -> Tensor:
    """The buffer (E, C, d) of one rank: ``B[e, c] = x[slot_token[e, c]]``, zeros for padding.

    VJP (of the gather): ``x̄[t] = B̄[e, c]`` for the slot (e, c) token t took, 0 for a dropped
    token; the cotangent of padding slots lands on the zero row and is discarded.
    """
    empty = np.zeros((1, x.shape[1]), dtype=x.dtype)
    return ops.concat([x, empty], axis=0)[routing.slot_token]


def combine(out: Tensor, gate: Tensor, routing: Routing) -> Tensor:
    """Each token's expert output, from the buffer (E, C, d), times its gate: (T, d).

    ``y_t = g_t · out[token_slot[t]]``, and 0 for a dropped token (it reads the zero row, so
    its gate, and through it the router, receives ``⟨ȳ_t, 0⟩ = 0``).
    """
    E, C, d = out.shape
    empty = np.zeros((1, d), dtype=out.dtype)
    rows = ops.concat([out.reshape(E * C, d), empty], axis=0)[routing.token_slot]
    return rows * gate.reshape(-1, 1)


def expert_ffn(tokens: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    """``tanh(X W₁ᵉ) W₂ᵉ`` for each expert e at once: tokens (E, n, d) or (n, d) for all."""
    return (tokens @ w1).tanh() @ w2


def expert_parallel_moe(
    x: ArrayLike,
    router: Tensor,
    router_bias: Tensor,
    w1: Tensor,
    w2: Tensor,
    capacity_factor: float,
) -> tuple[Tensor, Routing]:
    """The layer on one rank: this rank's tokens x (T, d), its experts w1 (E/P, d, h) and
    w2 (E/P, h, d), the replicated router. Returns ``y = x + g · FFN_e(x)`` and the routing.

    The router is replicated and each rank applies it to its own tokens, a fan-out over the
    ranks: it enters through ``copy_to_ranks``, whose backward all-reduces, so its gradient is
    the whole batch's on every rank. The experts' gradients need no collective: the combine's
    backward brings every token's cotangent to the rank that holds its expert.
    """
    x = as_tensor(x)
    router, router_bias = duality.copy_to_ranks(router), duality.copy_to_ranks(router_bias)
    probabilities = router_probabilities(x, router, router_bias)
    E = router.shape[1]
    routing = route(probabilities.data, expert_capacity(x.shape[0], E, capacity_factor))
    buffer = dispatch(x, routing)  # (E, C, d)
    mine = duality.all_to_all_ranks(buffer, split_axis=0, concat_axis=1)  # (E/P, P·C, d)
    out = expert_ffn(mine, w1, w2)
    back = duality.all_to_all_ranks(out, split_axis=1, concat_axis=0)  # (E, C, d)
    gate = probabilities[np.arange(x.shape[0]), routing.expert]  # g_t = s_t[e_t]
    return x + combine(back, gate, routing), routing


def dropless_moe(
    x: ArrayLike, router: Tensor, router_bias: Tensor, w1: Tensor, w2: Tensor
) -> tuple[Tensor, np.ndarray]:
    """The layer on one rank without capacity: ``y = x + g · FFN_e(x)`` for every token, and
    the tokens of each of this rank's experts that came from each rank (P, E/P).

    The tokens, sorted by expert, travel in one uneven all-to-all (rank p sends rank q all the
    tokens of q's experts), after an all-to-all of the counts per expert, which tells q which
    expert each row it receives is for. The combine sends every row back, counts transposed.
    """
    x = as_tensor(x)
    router, router_bias = duality.copy_to_ranks(router), duality.copy_to_ranks(router_bias)
    probabilities = router_probabilities(x, router, router_bias)
    P, share = dist.world_size(), w1.shape[0]
    expert = probabilities.data.argmax(axis=1)
    order = np.argsort(expert, kind="stable")
    counts = np.bincount(expert, minlength=P * share).reshape(P, share)  # row q: q's experts
    arriving = np.asarray(dist.all_to_all(counts))  # row p: from rank p, for each of mine
    send, receive = counts.sum(axis=1).tolist(), arriving.sum(axis=1).tolist()
    mine = duality.all_to_all_ranks(x[order], send_counts=send, recv_counts=receive)
    which = np.concatenate([np.repeat(np.arange(share), row) for row in arriving])
    out = expert_ffn(mine.reshape(-1, 1, x.shape[1]), w1[which], w2[which]).reshape(mine.shape)
    back = duality.all_to_all_ranks(out, send_counts=receive, recv_counts=send)
    gate = probabilities[np.arange(x.shape[0]), expert]
    return x + back[np.argsort(order)] * gate.reshape(-1, 1), arriving


def one_process_moe(
    x: ArrayLike,
    router: Tensor,
    router_bias: Tensor,
    w1: Tensor,
    w2: Tensor,
    capacity_factor: float,
    groups: int = 1,
) -> tuple[Tensor, list[Routing]]:
    """The same layer on one process, for all N tokens and all E experts.

    Capacity is per group of N/``groups`` consecutive tokens (on P ranks each rank's tokens
    are a group, so pass ``groups=P`` for the same drops). Every expert is applied to every
    token, and token t keeps its own expert's output, times its gate, when it is kept:
    ``y_t = x_t + [t kept] · g_t · FFN_{e_t}(x_t)``. No buffers, no padding, no all-to-all.
    """
    x = as_tensor(x)
    probabilities = router_probabilities(x, router, router_bias)
    N, E = probabilities.shape
    C = expert_capacity(N // groups, E, capacity_factor)
    routings = [route(chunk(probabilities.data, g, groups), C) for g in range(groups)]
    expert = np.concatenate([r.expert for r in routings])
    kept = np.concatenate([r.kept for r in routings])
    every = expert_ffn(x, w1, w2)  # (E, N, d): every expert on every token
    own = every[expert, np.arange(N)]  # (N, d): each token's own expert
    gate = probabilities[np.arange(N), expert] * kept
    return x + own * gate.reshape(-1, 1), routings


# -- a forward and backward pass of each -----------------------------------------------------------


@dataclass(frozen=True)
class StepResult:
    """Output and gradients of one pass with the loss ``Σ_t ⟨c_t, y_t⟩``.

    On a rank: this rank's tokens and experts; on one process: all of them.
    """

    y: np.ndarray
    x_grad: np.ndarray
    grads: ExpertWeights
    routings: list[Routing]


def _leaves(weights: ExpertWeights) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    router, router_bias, w1, w2 = (Tensor(a, requires_grad=True) for a in weights.as_tuple())
    return router, router_bias, w1, w2


def _grads(leaves: Sequence[Tensor]) -> ExpertWeights:
    return ExpertWeights(
        *(np.zeros_like(t.data) if t.grad is None else t.grad.copy() for t in leaves)
    )


def expert_parallel_step(
    weights: ExpertWeights, x: np.ndarray, cotangent: np.ndarray, capacity_factor: float
) -> StepResult:
    """On each rank of a world: the layer on tokens ``x[rank]`` (x: P × T × d) with this rank's
    experts, the loss ``Σ ⟨cotangent[rank], y⟩`` (each rank its own tokens' term), backward."""
    rank, P = dist.rank(), dist.world_size()
    leaves = _leaves(weights.shard(rank, P))
    x_leaf = Tensor(x[rank], requires_grad=True)
    y, routing = expert_parallel_moe(x_leaf, *leaves, capacity_factor=capacity_factor)
    (y * cotangent[rank]).sum().backward()
    assert x_leaf.grad is not None
    return StepResult(y.data, x_leaf.grad, _grads(leaves), [routing])


def one_process_step(
    weights: ExpertWeights, x: np.ndarray, cotangent: np.ndarray, capacity_factor: float
) -> StepResult:
    """The same pass on one process, x (P × T × d) taken as P groups of T tokens."""
    P, T, d = x.shape
    leaves = _leaves(weights)
    x_leaf = Tensor(x.reshape(P * T, d), requires_grad=True)
    y, routings = one_process_moe(x_leaf, *leaves, capacity_factor=capacity_factor, groups=P)
    (y * cotangent.reshape(P * T, d)).sum().backward()
    assert x_leaf.grad is not None
    return StepResult(
        y.data.reshape(P, T, d), x_leaf.grad.reshape(P, T, d), _grads(leaves), routings
    )


def largest_differences(ranks: Sequence[StepResult], one: StepResult) -> dict[str, float]:
    """Largest absolute difference of the output and each gradient, ranks against one process
    (the ranks' tokens and experts put back together; the router's gradient of every rank)."""
    experts = {
        name: np.concatenate([getattr(r.grads, name) for r in ranks]) for name in ("w1", "w2")
    }
    found = {
        "y": max(float(np.abs(r.y - one.y[p]).max()) for p, r in enumerate(ranks)),
        "x": max(float(np.abs(r.x_grad - one.x_grad[p]).max()) for p, r in enumerate(ranks)),
    }
    for name in ("router", "router_bias"):
        found[name] = max(
            float(np.abs(getattr(r.grads, name) - getattr(one.grads, name)).max()) for r in ranks
        )
    for name, grad in experts.items():
        found[name] = float(np.abs(grad - getattr(one.grads, name)).max())
    return found


# -- what the dispatch costs ---------------------------------------------------------------------


def routings_of(weights: ExpertWeights, x: np.ndarray, capacity_factor: float) -> list[Routing]:
    """Each rank's routing of its tokens ``x[p]`` (x: P × T × d), without running the layer."""
    with no_grad():
        leaves = [Tensor(a) for a in weights.as_tuple()[:2]]
        E, T = weights.num_experts, x.shape[1]
        C = expert_capacity(T, E, capacity_factor)
        return [route(router_probabilities(Tensor(xp), *leaves).data, C) for xp in x]


def all_to_all_bytes(
    num_experts: int, capacity: int, d: int, world_size: int, itemsize: int = 8
) -> float:
    """Bytes one rank sends in one all-to-all of its (E, C, d) buffer: all but its own chunk,
    ``(P−1)/P · E·C·d·itemsize`` (:func:`chainrule.costs.comm_cost.ring_bytes`). The dispatch and
    the combine each move this much forward, and their backwards as much again."""
    return ring_bytes("all_to_all", num_experts * capacity * d * itemsize, world_size)


@dataclass(frozen=True)
class DispatchReport:
    """Loads, drops and padding of every rank, and the bytes of the all-to-alls.

    ``load[p, e]``: tokens of rank p routed to expert e; ``kept[p, e] = min(load, C)``;
    ``dropped[p]`` and ``padding[p]`` per rank; ``bytes_per_all_to_all``: what one rank sends
    in one all-to-all (the same on every rank: the chunks have equal sizes);
    ``padding_bytes[p]``: how much of that is padding slots of rank p.
    """

    world_size: int
    num_experts: int
    tokens_per_rank: int
    capacity: int
    d: int
    load: np.ndarray
    kept: np.ndarray
    dropped: np.ndarray
    padding: np.ndarray
    bytes_per_all_to_all: float
    padding_bytes: np.ndarray

    @property
    def expert_load(self) -> np.ndarray:
        """Tokens routed to each expert from all ranks (E,)."""
        return self.load.sum(axis=0)

    @property
    def expert_kept(self) -> np.ndarray:
        """Tokens each expert computes, from all ranks (E,)."""
        return self.kept.sum(axis=0)

    @property
    def slots_per_expert(self) -> int:
        """What each expert receives: P·C slots, kept tokens and padding."""
        return self.world_size * self.capacity


def dispatch_report(routings: Sequence[Routing], d: int, itemsize: int = 8) -> DispatchReport:
    """The :class:`DispatchReport` of one routing per rank (rank order), for tokens of width d."""
    P, E, C = len(routings), routings[0].num_experts, routings[0].capacity
    share = experts_of_rank(0, E, P).stop
    load = np.stack([r.load for r in routings])
    kept = np.stack([r.kept_per_expert for r in routings])
    elsewhere = [np.arange(E) // share != p for p in range(P)]  # the chunks rank p sends away
    padding_bytes = np.array(
        [float((C - kept[p][elsewhere[p]]).sum() * d * itemsize) for p in range(P)]
    )
    return DispatchReport(
        world_size=P,
        num_experts=E,
        tokens_per_rank=routings[0].tokens,
        capacity=C,
        d=d,
        load=load,
        kept=kept,
        dropped=np.array([r.dropped for r in routings]),
        padding=np.array([r.padding for r in routings]),
        bytes_per_all_to_all=all_to_all_bytes(E, C, d, P, itemsize),
        padding_bytes=padding_bytes,
    )
