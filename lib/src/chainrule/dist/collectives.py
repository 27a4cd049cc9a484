"""One specification per collective, which every part of :mod:`chainrule.dist` reads.

The agreement check (:func:`chainrule.dist.calls.agree`), the trace's bytes
(:func:`chainrule.dist.calls.event`), the ring model (:mod:`chainrule.costs.comm_cost`) and
both backends know the collectives from :data:`COLLECTIVES` alone. Adding a collective is one
:class:`Collective` here, its function in :mod:`chainrule.dist.api`, and its two small
computations: numpy's in :data:`chainrule.dist.simulated.COMPUTE`, torch.distributed's in
:data:`chainrule.dist.torch_backend.COLLECTIVES` (a test checks that both cover this table).

The ring model, on P ranks, for a tensor of N bytes: an all-gather runs P − 1 steps in which
every rank passes a slice of N/P on to its neighbour, so each rank sends ``(P−1)/P · N`` (N the
gathered result); a reduce-scatter runs the same ring, adding instead of copying (N its whole
input); an all-reduce is the two in turn, ``2(P−1)/P · N`` in 2(P − 1) steps. An all-to-all of
one rank's buffer of N bytes keeps 1/P of it and sends ``(P−1)/P · N`` in P − 1 exchanges
(assuming a fully connected switch). A scatter's source sends the other ranks' chunks,
``(P−1)/P · N`` of its N bytes; a broadcast pipelined along the ring has every rank but the last
forward all N bytes. A barrier moves nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Collective:
    """What the ranks must agree on for one collective, and what it costs.

    ``params``: the arguments every rank passes alike, in order. ``own``: arguments each rank
    passes for itself (an uneven all-to-all's counts): every rank passes them or none does, the
    agreed call holds every rank's value in rank order, ranks' shapes may then differ along the
    axis the argument ``free_axis`` names, and rank r's ``own[1]``, when given, must be what the
    ranks' ``own[0]`` send it (column r). ``rooted``: a source rank ``src`` alone passes the
    data (the others pass nothing, or a value like the source's), so the source's call counts
    and its bytes are the trace's. ``gathers``: the ring model's N is the P contributions
    together (an all-gather's result), not one rank's. ``ring_factor(P)`` and ``steps(P)``: the
    bytes one rank sends per byte of N, and the latency steps, on P ≥ 2 ranks.
    """

    name: str
    params: tuple[str, ...]
    ring_factor: Callable[[int], float]
    steps: Callable[[int], int]
    own: tuple[str, ...] = ()
    free_axis: str | None = None
    rooted: bool = False
    gathers: bool = False


def _ring(times: int) -> Callable[[int], float]:
    return lambda P: times * (P - 1) / P


COLLECTIVES: dict[str, Collective] = {
    c.name: c
    for c in (
        Collective("all_reduce", ("op",), _ring(2), lambda P: 2 * (P - 1)),
        Collective("all_gather", ("axis",), _ring(1), lambda P: P - 1, gathers=True),
        Collective("reduce_scatter", ("op", "axis"), _ring(1), lambda P: P - 1),
        Collective(
            "all_to_all",
            ("split_axis", "concat_axis"),
            _ring(1),
            lambda P: P - 1,
            own=("send_counts", "recv_counts"),
            free_axis="split_axis",
        ),  # fmt: skip
        Collective("broadcast", ("src",), lambda P: 1.0, lambda P: P - 1, rooted=True),
        Collective("scatter", ("src", "axis"), _ring(1), lambda P: P - 1, rooted=True),
        Collective("barrier", (), lambda P: 0.0, lambda P: 0),
    )
}
"""Every collective, by the name its function and a trace give it."""


def collective(name: str) -> Collective:
    """The specification of the collective ``name`` (ValueError for one that is not)."""
    try:
        return COLLECTIVES[name]
    except KeyError:
        raise ValueError(
            f"no collective named {name!r}; the collectives are {', '.join(COLLECTIVES)}"
        ) from None


def ring_bytes(op: str, nbytes: float, world_size: int) -> float:
    """Bytes one rank sends for the collective ``op`` on a tensor of ``nbytes`` (N), by the
    ring model (see the module docstring); nothing on one rank."""
    factor = collective(op).ring_factor
    return 0.0 if world_size == 1 else factor(world_size) * nbytes
