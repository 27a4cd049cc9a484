"""One specification per collective, which every part of :mod:`chainrule.dist` reads.

The agreement check (:func:`chainrule.dist.calls.agree`), the trace's bytes
(:func:`chainrule.dist.calls.event`), the ring model (:mod:`chainrule.costs.comm_cost`) and
both backends know the collectives from :data:`COLLECTIVES` alone. Adding a collective is one
:class:`Collective` here, its function in :mod:`chainrule.dist.api`, and its two small
computations: numpy's in :data:`chainrule.dist.simulated.COMPUTE`, torch.distributed's in
:data:`chainrule.dist.torch_backend.COLLECTIVES` (a test checks that both cover this table).

The ring model on P ranks, N bytes: an all-gather passes slices of N/P along the ring in
P − 1 steps, ``(P−1)/P · N`` sent per rank (N the gathered result); a reduce-scatter the same,
adding (N its input); an all-reduce both, ``2(P−1)/P · N``. An all-to-all of N bytes a rank
keeps 1/P and sends the rest (on a fully connected switch); a scatter's source sends the others'
chunks, ``(P−1)/P · N``; a pipelined broadcast has every rank but the last forward all N.

Point to point: ``send``/``recv`` (:func:`chainrule.dist.api.send`) is one row, ``"send"``, for
the pair of calls: its source sends its N bytes to its destination in one step. Two ranks meet
in it, not the world: the backends meet them in ``point_to_point``, not in the tables above.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Collective:
    """What the ranks must agree on for one collective, and what it costs.

    ``params``: the arguments every rank passes alike. ``own``: arguments each rank passes for
    itself (an uneven all-to-all's counts), all ranks or none: the agreed call holds every
    rank's ``own[0]`` (rank order), shapes may differ along the axis ``free_axis`` names, and a
    rank's ``own[1]`` must be what the others' ``own[0]`` send it. ``rooted``: the source ``src``
    alone passes the data (the others nothing, or a value like it): its call and its bytes
    count. ``gathers``: the ring model's N is the P contributions together. ``ring_factor(P)``,
    ``steps(P)``: bytes one rank sends per byte of N, and latency steps, on P ≥ 2 ranks.
    ``point_to_point``: two ranks meet (a send and its recv), not the whole world.
    """

    name: str
    params: tuple[str, ...]
    ring_factor: Callable[[int], float]
    steps: Callable[[int], int]
    own: tuple[str, ...] = ()
    free_axis: str | None = None
    rooted: bool = False
    gathers: bool = False
    point_to_point: bool = False


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
        Collective("send", ("src", "dst"), lambda P: 1.0, lambda P: 1, point_to_point=True),
    )
}
"""Every collective, by the name its function and a trace give it."""


def collective(name: str) -> Collective:
    """The specification of the collective ``name`` (ValueError for one that is not)."""
    if name not in COLLECTIVES:
        raise ValueError(f"no collective named {name!r}; they are {', '.join(COLLECTIVES)}")
    return COLLECTIVES[name]


def ring_bytes(op: str, nbytes: float, world_size: int) -> float:
    """Bytes one rank sends for the collective ``op`` on a tensor of ``nbytes`` (N), by the
    ring model (see the module docstring); nothing on one rank."""
    factor = collective(op).ring_factor
    return 0.0 if world_size == 1 else factor(world_size) * nbytes
