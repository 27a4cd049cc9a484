"""Compute against communication: arithmetic intensity, the roofline, and a training step's
arithmetic set against its collectives.

**Arithmetic intensity** is ``I = FLOPs / bytes moved``. A processor of peak ``F`` FLOP/s fed by
a memory of bandwidth ``B`` bytes/s needs ``max(FLOPs/F, bytes/B)`` seconds when it overlaps the
two (:func:`roofline_time`), so it attains ``min(F, I·B)`` FLOP/s (:func:`attainable`, the
*roofline* of Williams, Waterman and Patterson, 2009). Below the **ridge** ``I* = F/B`` the bytes
decide (memory-bound), above it the arithmetic (compute-bound). A product of an ``m × k`` by a
``k × n`` matrix does ``2mkn`` FLOPs (a multiply and an add per term) and, reading both operands
and writing the result once, moves ``b(mk + kn + mn)`` bytes of ``b``-byte numbers: for square
matrices ``I = 2n/(3b)``, which grows with ``n``; an elementwise sum of two vectors does one FLOP
per ``3b`` bytes, whatever its size.

The network is a roofline of its own, with the link bandwidth for ``B`` and the bytes a rank
sends (:mod:`.comm_cost`) for the bytes. ``T_math = FLOPs / F`` and ``T_comm`` is the α–β time of
the collectives. A collective that nothing waits for can run *beside* computation: the two then
take ``max(T_math, T_comm)`` instead of ``T_math + T_comm``, and the collective is **hidden**
exactly when ``T_comm ≤`` the time of the computation that runs beside it.

One MLP block ``Y = tanh(X W₁) W₂`` (``X`` of ``T × d`` tokens, ``W₁`` of ``d × f``, ``W₂`` of
``f × d``) does ``2·2Tdf`` FLOPs forward and twice that backward (the gradients of each product's
two operands): ``12Tdf`` per training step (:func:`block_flops`), and data, tensor and sequence
parallelism all give each of ``P`` ranks ``1/P`` of it. What differs is the collectives
(:func:`block_collectives`, from the placements of lesson 12):

- **data parallel**: backward, an all-reduce of each weight's gradient (``N = dfb`` each). The
  backward goes on while they run (a layer's gradient is final before the layers below it
  are differentiated), so they can hide behind the backward's ``8Tdf/P`` FLOPs. Ignoring α,
  ``4·(P−1)/P·dfb/B ≤ 8(T/P)df/F`` holds exactly when the **tokens per rank**
  ``T/P ≥ (P−1)/P · (b/2) · F/B`` (:func:`data_parallel_tokens_to_hide`), whatever the model's
  width.
- **tensor parallel**: an all-reduce of ``Y`` forward and of ``X̄`` backward (``N = Tdb`` each).
  The next operation needs each result, so they add to the step. Ignoring α,
  ``T_comm / T_math = (P−1)·b·F / (3fB)``: the collectives cost less than the arithmetic when
  ``f ≥ (P−1)·(b/3)·F/B`` (:func:`tensor_parallel_width_to_match`), whatever the tokens.
- **sequence parallel**: an all-gather of ``X`` and a reduce-scatter of ``Y`` forward, the same
  pair backward: the bytes and latency steps of tensor parallelism, and on the path of the step
  as well (in this model; splitting each product into chunks lets one chunk's collective run
  beside the next chunk's product, which is beyond it).
"""

from __future__ import annotations

from dataclasses import dataclass

from chainrule.costs.comm_cost import alpha_beta_time

PARALLELISMS = ("data parallel", "tensor parallel", "sequence parallel")


@dataclass(frozen=True)
class Machine:
    """A processor and its links: ``flops`` peak FLOP/s, ``memory_bandwidth`` bytes/s between
    its memory and its arithmetic, and the α–β model of its network: ``link_bandwidth`` B in
    bytes/s per rank and ``latency`` α in seconds per step."""

    name: str
    flops: float
    memory_bandwidth: float
    link_bandwidth: float
    latency: float

    @property
    def ridge(self) -> float:
        """FLOPs per byte of memory at which the arithmetic starts to decide: ``F / B_memory``."""
        return self.flops / self.memory_bandwidth

    @property
    def network_ridge(self) -> float:
        """FLOPs per byte sent at which the arithmetic starts to decide: ``F / B_link``."""
        return self.flops / self.link_bandwidth


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of an ``(m, k)·(k, n)`` product: ``2mkn`` (a multiply and an add per term)."""
    return 2 * m * k * n


def matmul_bytes(m: int, k: int, n: int, itemsize: int = 2) -> int:
    """Bytes an ``(m, k)·(k, n)`` product moves at the least: both operands read and the result
    written once, ``b(mk + kn + mn)``."""
    return itemsize * (m * k + k * n + m * n)


def intensity(flops: float, nbytes: float) -> float:
    """Arithmetic intensity, FLOPs per byte moved."""
    return flops / nbytes


def attainable(intensity: float, flops: float, bandwidth: float) -> float:
    """The roofline: FLOP/s attained at this intensity, ``min(F, I·B)``."""
    return min(flops, intensity * bandwidth)


def roofline_time(flops: float, nbytes: float, peak: float, bandwidth: float) -> float:
    """Seconds for ``flops`` and ``nbytes``, the two overlapped: ``max(FLOPs/F, bytes/B)``."""
    return max(flops / peak, nbytes / bandwidth)


# -- one MLP block, one training step --------------------------------------------------------------


def block_flops(tokens: int, hidden: int, ffn: int) -> int:
    """FLOPs of one training step of the block: ``12·T·d·f`` (forward ``4Tdf``, backward
    ``8Tdf``)."""
    return 12 * tokens * hidden * ffn


def block_collectives(
    parallelism: str, tokens: int, hidden: int, ffn: int, itemsize: int = 2
) -> list[tuple[str, str, float]]:
    """``(pass, collective, N in bytes)`` of one step of the block under ``parallelism`` (see
    the module docstring; the same collectives as lesson 12 reads from the placements)."""
    activations, weight = tokens * hidden * itemsize, hidden * ffn * itemsize
    if parallelism == "data parallel":
        return [("backward", "all_reduce", weight), ("backward", "all_reduce", weight)]
    if parallelism == "tensor parallel":
        return [("forward", "all_reduce", activations), ("backward", "all_reduce", activations)]
    if parallelism == "sequence parallel":
        return [
            (when, op, activations)
            for when in ("forward", "backward")
            for op in ("all_gather", "reduce_scatter")
        ]
    raise ValueError(f"unknown parallelism {parallelism!r}; known: {', '.join(PARALLELISMS)}")


@dataclass(frozen=True)
class StepTime:
    """One rank's step: ``forward`` and ``backward`` arithmetic (seconds), ``comm`` the α–β time
    of its collectives, and whether they may run beside the backward (``overlaps``)."""

    parallelism: str
    forward: float
    backward: float
    comm: float
    overlaps: bool

    @property
    def math(self) -> float:
        """``T_math``: the step's arithmetic."""
        return self.forward + self.backward

    @property
    def serial(self) -> float:
        """``T_math + T_comm``: nothing overlapped."""
        return self.math + self.comm

    @property
    def overlapped(self) -> float:
        """The step with what may overlap overlapped: ``T_fwd + max(T_bwd, T_comm)`` where the
        collectives run beside the backward, ``T_math + T_comm`` where the step waits for
        them."""
        if self.overlaps:
            return self.forward + max(self.backward, self.comm)
        return self.serial

    @property
    def hidden(self) -> bool:
        """Whether the collectives cost the step nothing: they overlap and ``T_comm ≤ T_bwd``."""
        return self.overlaps and self.comm <= self.backward

    @property
    def efficiency(self) -> float:
        """The share of the step spent on arithmetic: ``T_math / T_step`` (overlapped)."""
        return self.math / self.overlapped


def step_time(
    parallelism: str,
    tokens: int,
    hidden: int,
    ffn: int,
    world_size: int,
    machine: Machine,
    itemsize: int = 2,
) -> StepTime:
    """One rank's :class:`StepTime` for the block on ``tokens`` tokens in all, split over
    ``world_size`` ranks by ``parallelism``: ``12Tdf/P`` FLOPs at the machine's peak, and the
    α–β time of :func:`block_collectives` with its α and link bandwidth."""
    P = world_size
    flops = block_flops(tokens, hidden, ffn) / P
    comm = sum(
        alpha_beta_time(op, n, P, machine.latency, machine.link_bandwidth)
        for _, op, n in block_collectives(parallelism, tokens, hidden, ffn, itemsize)
    )
    return StepTime(
        parallelism,
        forward=flops / 3 / machine.flops,
        backward=2 * flops / 3 / machine.flops,
        comm=comm,
        overlaps=parallelism == "data parallel",
    )


def data_parallel_tokens_to_hide(world_size: int, machine: Machine, itemsize: int = 2) -> float:
    """Tokens per rank from which data parallelism's all-reduces hide behind the backward,
    latency left out: ``(P−1)/P · (b/2) · F/B_link``."""
    P = world_size
    return (P - 1) / P * itemsize / 2 * machine.network_ridge


def tensor_parallel_width_to_match(world_size: int, machine: Machine, itemsize: int = 2) -> float:
    """The MLP width ``f`` from which tensor parallelism's collectives take no longer than its
    arithmetic, latency left out: ``(P−1) · (b/3) · F/B_link``."""
    return (world_size - 1) * itemsize / 3 * machine.network_ridge
